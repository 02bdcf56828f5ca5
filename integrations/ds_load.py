"""The files one DeepSpeed ``load_checkpoint`` reads: the tag ``latest`` names, the
folder listed and checked against its records, a data-parallel world-size change read
from the ZeRO partitions (and, when asked, the conversion to a universal checkpoint),
and each file fetched and verified just before DeepSpeed's own read of it.

Why apart from :mod:`~ckptprof.integrations.deepspeed`: that module is the engine's
patch table and the timing of its methods; this is what a load finds on disk, which
the wrappers only ask for (:class:`LoadFiles`).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re

from ckptprof.errors import VerifyError
from ckptprof.integrations.files import CheckpointFiles, FolderListing
from ckptprof.phases import Attr, Phase

log = logging.getLogger("ckptprof")

UNIVERSAL_CONVERT = "universal_convert"
_OPTIM_RE = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


class LoadFiles:
    """What the loads of one engine read (see the module docstring).

    Args:
        files: the instrumentor's file side (list, fetch, verify).
        session: its session (for the one warning about ckptprof's own trouble).
        nested: inside another adapter's restore (the HF Trainer's DeepSpeed path): the
            checkpoint path on the span stays the host's, DeepSpeed's goes beside it.
    """

    def __init__(self, files: CheckpointFiles, session, nested: bool) -> None:
        self.files = files
        self.session = session
        self.nested = nested
        self.listing: FolderListing | None = None
        self.reads: dict[str, int] = {}  # times each file was read in this load

    def list(self, engine, op, load_dir: str, tag: str | None, convert: bool) -> str | None:
        """Resolve the tag, list ``<dir>/<tag>``, detect a world-size change; returns the
        tag of a universal copy when ckptprof converted one (``convert``; else None)."""
        with op.phase(Phase.LIST):
            universal = engine.load_universal_checkpoint()
            resolved = tag if tag is not None else _read_latest(load_dir, universal)
        if resolved is None:
            return None  # DeepSpeed reports the missing `latest` in its own words
        folder = os.path.join(load_dir, str(resolved))
        try:
            self.listing = self.files.list_folder(folder, op)
            self.files.report_missing(self.listing, self.files.missing(self.listing), op)
        except VerifyError:
            raise  # strict verification refused it, naming the file
        except Exception as exc:  # noqa: BLE001 - ckptprof's own trouble
            self.session.warn_once("list", exc)
            self.listing = None
        # nested in another adapter's restore, the path stays the host's (its checkpoint)
        path_key = Attr.DEEPSPEED_PATH if self.nested else Attr.PATH
        op.set_attributes({path_key: folder, Attr.UNIVERSAL: bool(universal)})
        if self.listing is None or universal or engine.zero_optimization_stage() == 0:
            if universal and self.listing is not None:
                self.fetch_tree(op, folder)
            return None
        saved = len([n for n in self.listing.sizes if _OPTIM_RE.search(n)])
        current = getattr(engine, "seq_dp_world_size", None) or engine.dp_world_size
        if saved:
            op.set_attributes({Attr.SAVED_WORLD_SIZE: saved})
        if not saved or saved == current:
            return None
        if not convert:
            log.warning(
                "ckptprof: %s was saved by %d data-parallel ranks and this job has %d: ZeRO "
                "cannot re-partition it; instrument(engine, universal='convert') (or DeepSpeed's "
                "ds_to_universal + load_universal) converts it.",
                folder,
                saved,
                current,
            )
            return None
        return self._convert(engine, op, load_dir, str(resolved))

    def _convert(self, engine, op, load_dir: str, tag: str) -> str:
        """``ds_to_universal`` on rank 0 (the others wait), then load the universal copy."""
        import argparse

        import torch
        from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

        target = f"{tag}_universal"
        with op.phase(UNIVERSAL_CONVERT):
            if engine.global_rank == 0 and not os.path.isdir(os.path.join(load_dir, target)):
                ds_to_universal(
                    argparse.Namespace(
                        input_folder=os.path.join(load_dir, tag),
                        output_folder=os.path.join(load_dir, target),
                        num_extract_workers=1,
                        num_merge_workers=1,
                        keep_temp_folder=False,
                        strict=True,
                        inject_missing_state=True,
                    )
                )
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.barrier()
        path_key = Attr.DEEPSPEED_PATH if self.nested else Attr.PATH
        op.set_attributes({Attr.UNIVERSAL: True, path_key: os.path.join(load_dir, target)})
        self.fetch_tree(op, os.path.join(load_dir, target))
        return target

    def fetch_tree(self, op, folder: str) -> None:
        """Universal checkpoints: DeepSpeed reads ``zero/<param>/*.pt`` with its own
        torch.load; bring them into the page cache first so their reading is fetch."""
        files = glob.glob(os.path.join(glob.escape(folder), "zero", "**", "*.pt"), recursive=True)
        for sub in sorted({os.path.dirname(p) for p in files}):
            sizes = {e.name: e.stat().st_size for e in os.scandir(sub) if e.is_file()}
            self.files.fetch_from_folder(FolderListing(sub, sizes, None), sorted(sizes), op)

    def before_read(self, op, path: str) -> None:
        """Before ``checkpoint_engine.load(path)``: count a repeated read, and fetch +
        verify the file (once) from the folder listed, or on its own."""
        self.reads[path] = self.reads.get(path, 0) + 1
        if self.reads[path] > 1:  # DeepSpeed reads the model states twice
            repeats = {p: n - 1 for p, n in self.reads.items() if n > 1}
            op.set_phase_attributes(
                Phase.FETCH,
                **{
                    Attr.FETCH_REPEATED_READS: sum(repeats.values()),
                    Attr.FETCH_REPEATED_BYTES: sum(n * file_size(p) for p, n in repeats.items()),
                },
            )
        listing = self.listing
        if listing is None or os.path.dirname(path) != listing.folder:
            sizes = {os.path.basename(path): file_size(path)} if os.path.isfile(path) else {}
            listing = FolderListing(os.path.dirname(path), sizes, None)
        try:
            self.files.fetch_from_folder(listing, [os.path.basename(path)], op)
        except VerifyError:
            raise
        except Exception as exc:  # noqa: BLE001
            self.session.warn_once("fetch", exc)


@contextlib.contextmanager
def loading_universal(engine):
    """DeepSpeed reads a universal checkpoint when its config says so: for this load
    only; the engine's config is left as it was found."""
    config = engine._config
    before = config.load_universal_checkpoint
    config.load_universal_checkpoint = True
    try:
        yield
    finally:
        config.load_universal_checkpoint = before


def _read_latest(load_dir: str, universal: bool) -> str | None:
    """The tag DeepSpeed's ``latest`` (or ``latest_universal``) file names, if any."""
    path = os.path.join(load_dir, "latest_universal" if universal else "latest")
    try:
        with open(path) as handle:
            return handle.read().strip()
    except FileNotFoundError:
        return None


def file_size(path: str) -> int:
    """The file's size; 0 when it is gone."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


__all__ = ["UNIVERSAL_CONVERT", "LoadFiles", "file_size", "loading_universal"]
