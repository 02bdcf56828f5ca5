"""DeepSpeed: ``instrument(engine)`` after ``deepspeed.initialize`` traces every
``engine.save_checkpoint`` and ``engine.load_checkpoint``, ZeRO stages 0-3, per rank.

Where each phase is measured (DeepSpeed 0.19, tested with 0.19.8):

* ``list``: reading ``latest`` (or ``latest_universal``) to resolve the tag, listing
  ``<dir>/<tag>`` and its ckptprof manifests, and counting the ZeRO partitions to detect a
  data-parallel world-size change (``ckpt.saved_world_size``).
* ``fetch`` / ``deserialize``: every ``checkpoint_engine.load`` of the default
  ``TorchCheckpointEngine`` runs ``torch.load`` on a file whose reads are timed (reads are
  fetch, the time between them deserialize; no extra copy). DeepSpeed reads the model
  states twice per load (once to check the MP world size); both reads are real cost and
  are shown (``ckpt.fetch.repeated_reads`` / ``…repeated_bytes``). Universal checkpoints'
  per-parameter files, which DeepSpeed reads with its own ``torch.load``, are fetched into
  the page cache first, so their reading shows as fetch and the rest as reshard.
* ``verify``: each file once, against the manifests the save wrote.
* ``reshard``: ``load_module_state_dict``, the non-ZeRO ``optimizer.load_state_dict`` and
  ``_load_zero_checkpoint`` (ZeRO re-partition) minus their file reads.
* ``universal_convert`` (its own span, when ``universal="convert"`` and the world size
  changed): DeepSpeed's ``ds_to_universal`` on rank 0, in process.
* ``first_step``: until the first ``engine.step()`` that advances ``global_steps``.
* save: ``write`` is each ``checkpoint_engine.save`` (per file, bytes), ``serialize`` the
  rest of ``_save_checkpoint`` / ``_save_zero_checkpoint`` (building the state dicts),
  ``commit`` DeepSpeed's ``checkpoint_engine.commit`` plus this rank's manifest
  (``<dir>/<tag>/ckptprof-manifest.rank<R>.json``). ``latest``, tag validation and the
  barriers are the rest of the ``ckpt.save`` span. With the decoupled writer, ``write`` is
  the blocking part (``ckpt.write.async``) and the commit at the next step (waiting for
  the writer process) is a background ``ckpt.save`` linked to it.

Nothing global: only the engine and its ``checkpoint_engine``/``optimizer`` instances are
patched; :func:`uninstrument` (or :meth:`DeepSpeedInstrumentation.close`) undoes it.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import time
from typing import Any

import torch

from ckptprof.errors import VerifyError
from ckptprof.integrations.base import (
    FolderCheckpoints,
    FolderListing,
    Instrumentation,
    TracedAdapter,
    timed,
)
from ckptprof.phases import Attr, Phase

log = logging.getLogger("ckptprof")

UNIVERSAL_CONVERT = "universal_convert"
_OPTIM_RE = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")
_ATTACHED = "_ckptprof_instrumentation"


class DeepSpeedInstrumentation(TracedAdapter):
    """Tracing of one DeepSpeed engine (see the module docstring); made by :func:`instrument`."""

    def __init__(
        self,
        engine,
        *,
        trace_dir=None,
        verify: str = "size",
        tracer_provider=None,
        universal: str | None = None,
        save_dir: str | None = None,
        interruptions: bool | dict = False,
        shared: Instrumentation | None = None,
    ) -> None:
        if universal not in (None, "convert"):
            from ckptprof.errors import CkptprofError

            raise CkptprofError(f"universal={universal!r} is not valid; use None or 'convert'.")
        self.engine = engine
        self.universal = universal
        self.save_dir = save_dir
        # inside another adapter (the HF Trainer's DeepSpeed path) its operations are ours
        self._shared = shared is not None
        self._inst = shared or Instrumentation(
            "deepspeed",
            trace_dir=trace_dir,
            verify=verify,
            tracer_provider=tracer_provider,
            rank=engine.global_rank,
        )
        self._patches = contextlib.ExitStack()
        self._folders = FolderCheckpoints(self._inst)
        self._listing: FolderListing | None = None
        self._reads: dict[str, int] = {}
        self._restored_step: int | None = None
        self._written: list[str] = []
        self._pending: tuple | None = None  # a decoupled save waiting for its commit
        self._interruptions = interruptions

    # ------------------------------------------------------------------ saving from outside
    def save(self, save_dir: str | None = None) -> str:
        """Save now through ``engine.save_checkpoint`` (traced); returns ``<dir>/<tag>``.

        For emergency saves; every rank must call it, as DeepSpeed requires.
        """
        save_dir = save_dir or self.save_dir
        if save_dir is None:
            raise RuntimeError("no save_dir: pass instrument(engine, save_dir=...) or save(dir)")
        engine = self.engine
        engine.save_checkpoint(save_dir)
        if engine.checkpoint_engine.is_decoupled():  # an emergency cannot wait for a step
            engine._commit_decoupled_checkpoint()
        return os.path.join(save_dir, f"global_step{engine.global_steps}")

    # ------------------------------------------------------------------ lifecycle
    def attach(self) -> DeepSpeedInstrumentation:
        try:
            return self._attach()
        except BaseException:
            self._patches.close()  # nothing half-attached stays on the engine
            raise

    def _attach(self) -> DeepSpeedInstrumentation:
        engine, inst = self.engine, self._inst
        inst.start()  # telemetry now, not inside the first restore

        def patch(obj, name, make):
            self._patches.enter_context(inst.temporarily(obj, name, make))

        patch(engine, "load_checkpoint", self._wrap_load_checkpoint)
        patch(engine, "_load_checkpoint", self._wrap_inner_load)
        patch(engine, "_load_zero_checkpoint", self._wrap_zero_load)
        patch(engine, "save_checkpoint", self._wrap_save_checkpoint)
        patch(engine, "_save_checkpoint", self._wrap_serialize)
        patch(engine, "_save_zero_checkpoint", self._wrap_serialize)
        if engine.checkpoint_engine.is_decoupled():
            patch(engine, "_commit_decoupled_checkpoint", self._wrap_decoupled_commit)
        ckpt_engine = engine.checkpoint_engine
        patch(ckpt_engine, "load", self._wrap_file_load)
        patch(ckpt_engine, "save", self._wrap_file_save)
        patch(ckpt_engine, "commit", self._wrap_commit)
        if not self._shared:  # else the host adapter ends restores and watches notices
            patch(engine, "step", self._wrap_step)
            inst.watch_interruptions(self._interruptions, lambda: self.save_dir, self.save)
        setattr(engine, _ATTACHED, self)
        return self

    def close(self) -> None:
        """Undo every patch; stop watching for notices, flush and close our own trace."""
        self._patches.close()
        if not self._shared:
            self._inst.close()
        if getattr(self.engine, _ATTACHED, None) is self:
            delattr(self.engine, _ATTACHED)

    # ------------------------------------------------------------------ restore
    def _wrap_load_checkpoint(self, original):
        def load_checkpoint(load_dir, tag=None, *args, **kwargs):
            engine, inst = self.engine, self._inst
            nested = self._shared and inst.restore_op is not None
            op = inst.restore_op if nested else inst.begin_restore(
                {
                    Attr.FORMAT: "deepspeed",
                    Attr.PATH: str(load_dir),
                    Attr.WORLD_SIZE: engine.world_size,
                    Attr.STORAGE_KIND: "posix",
                    "ckpt.strategy": f"zero{engine.zero_optimization_stage()}",
                }
            )  # fmt: skip
            self._reads = {}
            try:
                if op is not None:
                    tag = self._list(op, str(load_dir), tag)
                result = original(load_dir, tag, *args, **kwargs)
            except BaseException as exc:
                if not nested:
                    inst.end_restore(exc)
                raise
            if op is not None and not nested:
                if result == (None, None):  # DeepSpeed found no checkpoint and said so
                    inst.end_restore()
                else:
                    self._restored_step = engine.global_steps
                    op.set_attributes({Attr.RESTORED_STEP: engine.global_steps})
            return result

        return load_checkpoint

    def _list(self, op, load_dir: str, tag: str | None) -> str | None:
        """Resolve the tag, list ``<dir>/<tag>``, detect a world-size change (and convert)."""
        engine = self.engine
        with op.phase(Phase.LIST):
            universal = engine.load_universal_checkpoint()
            resolved = tag if tag is not None else _read_latest(load_dir, universal)
        if resolved is None:
            return tag  # DeepSpeed reports the missing `latest` in its own words
        folder = os.path.join(load_dir, str(resolved))
        try:
            self._listing = self._folders.list(folder, op)
        except VerifyError:
            raise  # a file the save wrote is missing: the job should hear it, by name
        except Exception as exc:  # noqa: BLE001 - ckptprof's own trouble
            self._inst.warn_once("list", exc)
            self._listing = None
        # nested in another adapter's restore, the path stays the host's (its checkpoint)
        path_key = "ckpt.deepspeed.path" if self._shared else Attr.PATH
        op.set_attributes({path_key: folder, "ckpt.universal": bool(universal)})
        if self._listing is None or universal or engine.zero_optimization_stage() == 0:
            if universal and self._listing is not None:
                self._fetch_tree(op, folder)
            return tag
        saved = len([n for n in self._listing.sizes if _OPTIM_RE.search(n)])
        current = getattr(engine, "seq_dp_world_size", None) or engine.dp_world_size
        if saved:
            op.set_attributes({Attr.SAVED_WORLD_SIZE: saved})
        if not saved or saved == current:
            return tag
        if self.universal != "convert":
            log.warning(
                "ckptprof: %s was saved by %d data-parallel ranks and this job has %d: ZeRO "
                "cannot re-partition it; instrument(engine, universal='convert') (or DeepSpeed's "
                "ds_to_universal + load_universal) converts it.",
                folder,
                saved,
                current,
            )
            return tag
        return self._convert(op, load_dir, str(resolved))

    def _convert(self, op, load_dir: str, tag: str) -> str:
        """``ds_to_universal`` on rank 0 (the others wait), then load the universal copy."""
        import argparse

        from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

        engine = self.engine
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
        engine._config.load_universal_checkpoint = True  # this engine's config object only
        path_key = "ckpt.deepspeed.path" if self._shared else Attr.PATH
        op.set_attributes({"ckpt.universal": True, path_key: os.path.join(load_dir, target)})
        self._fetch_tree(op, os.path.join(load_dir, target))
        return target

    def _fetch_tree(self, op, folder: str) -> None:
        """Universal checkpoints: DeepSpeed reads ``zero/<param>/*.pt`` with its own
        torch.load; bring them into the page cache first so their reading is fetch."""
        files = glob.glob(os.path.join(glob.escape(folder), "zero", "**", "*.pt"), recursive=True)
        for sub in sorted({os.path.dirname(p) for p in files}):
            sizes = {e.name: e.stat().st_size for e in os.scandir(sub) if e.is_file()}
            self._folders.fetch(FolderListing(sub, sizes, None), sorted(sizes), op)

    def _wrap_file_load(self, original):
        plain = type(self.engine.checkpoint_engine).__name__ == "TorchCheckpointEngine"

        def load(path, map_location=None, *args, **kwargs):
            op = self._inst.restore_op
            if op is None:
                return original(path, map_location, *args, **kwargs)
            key = str(path)
            self._reads[key] = self._reads.get(key, 0) + 1
            if self._reads[key] > 1:  # DeepSpeed reads the model states twice
                repeats = {p: n - 1 for p, n in self._reads.items() if n > 1}
                op.set_phase_attributes(
                    Phase.FETCH,
                    **{
                        "ckpt.fetch.repeated_reads": sum(repeats.values()),
                        "ckpt.fetch.repeated_bytes": sum(n * _size(p) for p, n in repeats.items()),
                    },
                )
            if not plain:  # a custom engine: timed whole
                op.set_phase_attributes(Phase.DESERIALIZE, **{"ckpt.fused_fetch": True})
                with op.phase(Phase.DESERIALIZE):
                    return original(path, map_location, *args, **kwargs)
            return self._folders.load(
                self._listing if self._in_listing(key) else None,
                key,
                op,
                lambda f: torch.load(f, map_location=map_location, weights_only=False),
            )

        return load

    def _in_listing(self, path: str) -> bool:
        return self._listing is not None and os.path.dirname(path) == self._listing.folder

    def _wrap_inner_load(self, original):
        def _load_checkpoint(*args, **kwargs):
            op = self._inst.restore_op
            engine = self.engine
            inner = [
                (engine.checkpoint_engine, "load", None),
                (engine, "load_module_state_dict", Phase.RESHARD),
            ]
            if not engine.zero_optimization():
                inner.append((engine.optimizer, "load_state_dict", Phase.RESHARD))
            return self._inst.split(op, Phase.DESERIALIZE, original, *args, inner=inner, **kwargs)

        return _load_checkpoint

    def _wrap_zero_load(self, original):
        def _load_zero_checkpoint(*args, **kwargs):
            op = self._inst.restore_op
            inner = [(self.engine.checkpoint_engine, "load", None)]
            return self._inst.split(op, Phase.RESHARD, original, *args, inner=inner, **kwargs)

        return _load_zero_checkpoint

    def _wrap_step(self, original):
        def step(*args, **kwargs):
            result = original(*args, **kwargs)
            engine, inst = self.engine, self._inst
            op = inst.restore_op
            restored = self._restored_step
            if op is not None and restored is not None and engine.global_steps > restored:
                self._restored_step = None
                inst.first_step_done(engine.global_steps, announce=engine.global_rank == 0)
            if inst.interruptions is not None:
                inst.interruptions.step_end(engine.global_steps)
            return result

        return step

    # ------------------------------------------------------------------ save
    def _wrap_save_checkpoint(self, original):
        def save_checkpoint(save_dir, tag=None, *args, **kwargs):
            engine, inst = self.engine, self._inst
            self.save_dir = str(save_dir)
            resolved = tag if tag is not None else f"global_step{engine.global_steps}"
            folder = os.path.join(str(save_dir), str(resolved))
            attrs = {
                Attr.FORMAT: "deepspeed",
                Attr.PATH: folder,
                Attr.STEP: engine.global_steps,
                Attr.WORLD_SIZE: engine.world_size,
                "ckpt.strategy": f"zero{engine.zero_optimization_stage()}",
            }
            nested = self._shared and inst.save_op is not None  # inside the host's save
            self._written = []
            with contextlib.nullcontext(inst.save_op) if nested else inst.saving(attrs) as op:
                result = original(save_dir, tag, *args, **kwargs)
                names = [os.path.basename(p) for p in self._written if os.path.dirname(p) == folder]
                if op is not None and engine.checkpoint_engine.is_decoupled():
                    # files are still being written by DeepSpeed's writer process; the commit
                    # (and this rank's manifest) happen at the next optimizer step
                    op.set_phase_attributes(Phase.WRITE, **{"ckpt.write.async": True})
                    self._pending = (folder, names, op.span_context, engine.global_steps)
                elif op is not None:
                    self._folders.commit(folder, names, op)
            return result

        return save_checkpoint

    def _wrap_decoupled_commit(self, original):
        """A decoupled save's second half, at the next step: waiting for the writer process
        and DeepSpeed's commit, as a background ``ckpt.save`` linked to the one that
        queued the files (``ckpt.save.background``)."""

        def commit_decoupled_checkpoint(*args, **kwargs):
            pending, self._pending = self._pending, None
            inst = self._inst
            if pending is None:
                return original(*args, **kwargs)
            folder, names, queued_by, step = pending
            attrs = {Attr.FORMAT: "deepspeed", Attr.PATH: folder, Attr.STEP: step}
            attrs[Attr.WORLD_SIZE] = self.engine.world_size
            op = inst.begin_background_save(attrs, queued_by)
            if op is not None:
                op.set_phase_attributes(Phase.COMMIT, **{"ckpt.commit.waits_for_writer": True})
            try:
                result = timed(op, Phase.COMMIT, original, *args, **kwargs)
            except BaseException as exc:
                if op is not None:
                    op.finish(exc)
                raise
            if op is not None:
                op.add_bytes(Phase.COMMIT, sum(_size(os.path.join(folder, n)) for n in names))
            self._folders.commit(folder, names, op)
            if op is not None:
                op.finish()
            return result

        return commit_decoupled_checkpoint

    def _wrap_serialize(self, original):
        def build_and_write(*args, **kwargs):
            inner = [(self.engine.checkpoint_engine, "save", None)]
            return self._inst.split(
                self._inst.save_op, Phase.SERIALIZE, original, *args, inner=inner, **kwargs
            )

        return build_and_write

    def _wrap_file_save(self, original):
        def save(*args, **kwargs):
            op = self._inst.save_op
            path = kwargs.get("path", args[1] if len(args) > 1 else None)
            start = time.time_ns()
            try:
                return original(*args, **kwargs)
            finally:
                if op is not None and path is not None:
                    end = time.time_ns()
                    op.add_interval(Phase.WRITE, start, end)
                    try:
                        size = os.path.getsize(path)
                    except OSError:
                        size = 0
                    op.add_file(Phase.WRITE, str(path), size, (end - start) / 1e9, start)
                    self._written.append(str(path))

        return save

    def _wrap_commit(self, original):
        def commit(*args, **kwargs):
            op = self._inst.save_op
            if op is None:
                return original(*args, **kwargs)
            with op.phase(Phase.COMMIT):
                return original(*args, **kwargs)

        return commit


def instrument(engine, **options: Any) -> DeepSpeedInstrumentation:
    """Trace ``engine``'s ``save_checkpoint`` / ``load_checkpoint`` (once per engine).

    Options: ``trace_dir``, ``verify`` (``size``/``full``/``none``), ``tracer_provider``,
    ``universal='convert'`` (convert a checkpoint saved with another data-parallel world
    size to a universal one, timed, and load that), ``save_dir`` (for :meth:`save`), and
    ``interruptions`` (``True`` or guard options: save on a Spot/preemption notice).
    """
    existing = getattr(engine, _ATTACHED, None)
    if existing is not None:
        return existing
    return DeepSpeedInstrumentation(engine, **options).attach()


def uninstrument(engine) -> None:
    existing = getattr(engine, _ATTACHED, None)
    if existing is not None:
        existing.close()


def _read_latest(load_dir: str, universal: bool) -> str | None:
    path = os.path.join(load_dir, "latest_universal" if universal else "latest")
    try:
        with open(path) as handle:
            return handle.read().strip()
    except FileNotFoundError:
        return None


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


__all__ = ["DeepSpeedInstrumentation", "instrument", "uninstrument"]
