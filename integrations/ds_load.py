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

from ckptprof.errors import CkptprofError, VerifyError
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
        tag of a universal copy when ckptprof converted one (``convert``; else None).

        With ``convert`` every rank takes part in the conversion's collectives on every
        path (ckptprof's own trouble, a strict refusal, no change found): rank 0's finding
        decides for all, so no rank waits on another that returned early."""
        found: str | None = None
        try:
            found = self._inspect(engine, op, load_dir, tag, convert)
        finally:
            if convert:
                converted = self.convert(engine, op, load_dir, found)
        return converted if convert else None

    def _inspect(self, engine, op, load_dir: str, tag: str | None, convert: bool) -> str | None:
        """:meth:`list`'s finding: the tag to convert to a universal copy, or None."""
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
        return str(resolved)

    def convert(self, engine, op, load_dir: str, tag: str | None) -> str | None:
        """``ds_to_universal`` of ``tag`` on rank 0 (the others wait), then load that copy.

        Every rank calls this once per load with ``universal='convert'`` (``op`` None where
        its restore could not be traced): two collectives, reached by all, carry rank 0's
        decision and then its outcome; a failed conversion is raised after them on every
        rank. Returns the universal tag, or None when rank 0 found nothing to convert."""
        import torch

        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if distributed:  # rank 0's finding decides (every rank loads the same checkpoint)
            decision = [tag]
            torch.distributed.broadcast_object_list(decision, src=0)
            tag = decision[0]
        if tag is None:
            return None
        target = f"{tag}_universal"
        failure: BaseException | None = None
        with op.phase(UNIVERSAL_CONVERT) if op is not None else contextlib.nullcontext():
            try:
                if engine.global_rank == 0 and not os.path.isdir(os.path.join(load_dir, target)):
                    _ds_to_universal(load_dir, tag, target)
            except Exception as exc:  # noqa: BLE001 - raised below, after the others know
                failure = exc
            outcome = [None if failure is None else repr(failure)]
            if distributed:  # the barrier: the others wait for rank 0's copy (or failure)
                torch.distributed.broadcast_object_list(outcome, src=0)
        if failure is not None:
            raise failure
        if outcome[0] is not None:
            raise CkptprofError(
                f"the universal conversion of {os.path.join(load_dir, tag)} failed on rank 0: "
                f"{outcome[0]}"
            )
        if op is not None:
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


def _ds_to_universal(load_dir: str, tag: str, target: str) -> None:
    """DeepSpeed's own ``ds_to_universal``, in process."""
    import argparse

    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

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
