"""How ``ckptprof synth save`` writes one save: the strategies, each timed phase by phase.

* ``framework``: the layout's own writer as a job calls it (``torch.save`` into the file,
  safetensors' ``save_file``, ``dcp.save`` with its ``FileSystemWriter``); it serializes
  while it writes, so ``write`` is marked fused with ``serialize``.
* ``parallel``: the same bytes through ckptprof's I/O core: each file serialized
  (``serialize``: the archive's or header's small parts, and views of the tensors'
  memory for their bytes: nothing copied), then cut at the part size and written with
  ``concurrency`` parts in flight (``pwritev`` at offsets on a POSIX file, a multipart
  upload on S3).
* ``async``: DCP's ``async_save``: the blocking part (``stage``: the state copied into
  the buffers the background writer uses) is this save's span; the background write and
  commit are their own ``ckpt.save`` marked ``ckpt.save.background`` and linked to it, as
  the Lightning and DeepSpeed callbacks record an asynchronous save.

Every strategy writes under temporary names (DCP: its ``.metadata`` last) and makes the
files visible in ``commit``; ``fsync`` (on unless told otherwise) forces each file to the
device first. A failed save removes what it wrote.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ckptprof import activity
from ckptprof.atomic import fsync_dir, partial_path
from ckptprof.errors import CkptprofError, StorageError
from ckptprof.io.writes import cut_parts, write_parts
from ckptprof.phases import Attr, Phase, fused_value
from ckptprof.storage.base import FileWriter, Storage
from ckptprof.synth.layouts import get_layout
from ckptprof.synth.layouts.dcp import METADATA, fqn
from ckptprof.synth.plan import CheckpointPlan
from ckptprof.synth.ranges import SAVE_STRATEGIES

if TYPE_CHECKING:
    from ckptprof.tracing.recorder import CheckpointTracer, Operation


@dataclass(frozen=True, kw_only=True)
class SaveContext:
    """What one timed save works with."""

    storage: Storage
    plan: CheckpointPlan
    tensors: dict  # {Piece: tensor}: the state being saved
    op: Operation  # the save's
    fsync: bool
    concurrency: int
    part_size: int
    tracer: CheckpointTracer  # for the background half of an async save
    #: what a job keeps from one save to the next (an async save's staging buffers)
    kept: dict = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return Path(self.storage.uri)


@dataclass
class Written:
    """What a save wrote: bytes, and for an async save its background half."""

    nbytes: int
    background_s: float | None = None


def default_strategy(layout: str) -> str:
    """The writer ``synth save`` uses unless told: ``parallel`` on every storage, so two
    storages saved with the defaults are compared through the same writer (the layout's
    own writers cannot write to S3); DCP lays out its own files: ``framework``."""
    return "framework" if layout == "dcp" else "parallel"


def check_strategy(strategy: str, layout: str, object_store: bool) -> None:
    """Refuse a strategy x layout x storage this save cannot do (one line, with the fix)."""
    if strategy not in SAVE_STRATEGIES:
        raise CkptprofError(f"--strategy {strategy}: choose one of {', '.join(SAVE_STRATEGIES)}.")
    if layout == "dcp" and strategy == "parallel":
        raise CkptprofError(
            "--strategy parallel: a DCP checkpoint is laid out by DCP's own writer; use "
            "--strategy framework (dcp.save) or async (dcp.async_save)."
        )
    if strategy == "async" and layout != "dcp":
        raise CkptprofError(
            f"--strategy async is DCP's async_save; use --layout dcp, or framework/parallel "
            f"for {layout}."
        )
    if object_store and strategy != "parallel":
        raise CkptprofError(
            f"--strategy {strategy} writes to a local or mounted path; on S3 use --strategy "
            "parallel (a multipart upload per file)."
        )


def save(strategy: str, ctx: SaveContext) -> Written:
    return {"framework": save_framework, "parallel": save_parallel, "async": save_async}[strategy](
        ctx
    )


# ------------------------------------------------------------------ framework


def save_framework(ctx: SaveContext) -> Written:
    """Each file through the layout's own writer into a temporary name, then renamed."""
    if ctx.plan.spec.layout == "dcp":
        return _dcp_save(ctx, asynchronous=False)
    layout = get_layout(ctx.plan.spec.layout)
    written: list[tuple[Path, Path]] = []
    total = 0
    fused = {Attr.FUSED: fused_value((Phase.SERIALIZE, Phase.WRITE), "the layout's writer")}
    try:  # an unfinished save, interrupted in its commit too, leaves none of its temp files
        for file in ctx.plan.files:
            final = ctx.root / file.path
            final.parent.mkdir(parents=True, exist_ok=True)
            partial = partial_path(final)
            written.append((partial, final))
            start = time.perf_counter()
            with ctx.op.phase(Phase.WRITE, **fused), _named(final), activity.growing(partial):
                layout.save_file(ctx.plan, file, partial, ctx.tensors)
            size = partial.stat().st_size
            ctx.op.add_file(Phase.WRITE, file.path, size, time.perf_counter() - start)
            total += size
            if ctx.fsync:
                with ctx.op.phase(Phase.FSYNC), _named(final):
                    _fsync(partial)
                ctx.op.add_bytes(Phase.FSYNC, size)
        with ctx.op.phase(Phase.COMMIT):
            for partial, final in written:
                os.replace(partial, final)
            if ctx.fsync:
                for folder in sorted({final.parent for _, final in written}):
                    fsync_dir(folder)
    except BaseException:
        for partial, _ in written:  # those not renamed yet
            partial.unlink(missing_ok=True)
        raise
    ctx.op.set_attributes({Attr.FILES: len(written)})
    return Written(total)


# ------------------------------------------------------------------ parallel


def save_parallel(ctx: SaveContext) -> Written:
    """Each file serialized, then written part by part, ``concurrency`` parts at once."""
    layout = get_layout(ctx.plan.spec.layout)
    op = ctx.op
    writers: list[FileWriter] = []
    total = 0
    op.set_phase_attributes(Phase.WRITE, **{Attr.CONCURRENCY: ctx.concurrency})
    try:
        for file in ctx.plan.files:
            with op.phase(Phase.SERIALIZE):
                segments = layout.serialize_file(ctx.plan, file, ctx.tensors)
                parts = cut_parts(segments, ctx.part_size)
            size = sum(p.size for p in parts)
            writer = ctx.storage.open_writer(file.path, size, ctx.part_size)
            writers.append(writer)
            start = time.perf_counter()
            where = f"{ctx.storage.uri}/{file.path}"
            with op.phase(Phase.WRITE), _named(where):
                write_parts(writer, parts, ctx.concurrency)
            op.add_file(Phase.WRITE, file.path, size, time.perf_counter() - start)
            del segments, parts  # the archive's small parts: freed before the next file
            total += size
            if ctx.fsync and not ctx.storage.object_store:
                with op.phase(Phase.FSYNC), _named(where):
                    writer.sync()
                op.add_bytes(Phase.FSYNC, size)
        with op.phase(Phase.COMMIT):
            while writers:  # a writer leaves the list once committed
                writers[0].commit()
                writers.pop(0)
            if ctx.fsync and not ctx.storage.object_store:
                for folder in sorted({(ctx.root / f.path).parent for f in ctx.plan.files}):
                    fsync_dir(folder)
    except BaseException:  # an unfinished save, interrupted in its commit too, leaves nothing
        for writer in writers:
            writer.abort()
        raise
    op.set_attributes({Attr.FILES: len(ctx.plan.files)})
    return Written(total)


# ------------------------------------------------------------------ DCP


def save_async(ctx: SaveContext) -> Written:
    return _dcp_save(ctx, asynchronous=True)


def _dcp_state(ctx: SaveContext) -> dict:
    """DCP's flat state dict: one entry per tensor, keyed as the restore reads them."""
    return {fqn(p.group, p.name): ctx.tensors[p] for f in ctx.plan.data_files for p in f.pieces}


def _dcp_save(ctx: SaveContext, asynchronous: bool) -> Written:
    """``dcp.save`` (or ``async_save``) with DCP's FileSystemWriter, timed by its steps:
    ``write_data`` (serialize, write and, with fsync, the sync: DCP fuses them) and
    ``finish`` (``.metadata``, DCP's commit)."""
    import torch.distributed.checkpoint as dcp

    if ctx.plan.spec.ranks != 1:
        raise CkptprofError(
            f"--ranks {ctx.plan.spec.ranks}: a DCP save in one process writes one rank's "
            "files; use --ranks 1."
        )
    state = _dcp_state(ctx)
    if not asynchronous:
        writer = _traced_writer(ctx, ctx.op)
        with _named(ctx.storage.uri), _quiet_dcp():
            dcp.save(state, storage_writer=writer, no_dist=True)
        return Written(writer.written + _size(ctx.root / METADATA))
    from opentelemetry.trace import Link

    background = ctx.tracer.save(
        {Attr.SAVE_BACKGROUND: True, Attr.STRATEGY: "async"},
        links=[Link(ctx.op.span_context)] if ctx.op.span_context else None,
    )
    writer = _traced_writer(ctx, background)
    with ctx.op.phase(Phase.STAGE), _named(ctx.storage.uri), _quiet_dcp():
        future = dcp.async_save(
            state, storage_writer=writer, async_stager=_stager(ctx), no_dist=True
        )
    ctx.op.add_bytes(Phase.STAGE, sum(t.nbytes for t in state.values()))
    ctx.op.finish()  # the blocking part ends here: training would go on now
    try:
        with _named(ctx.storage.uri):
            future.result()
    except BaseException as exc:
        background.finish(error=exc)
        raise
    summary = background.finish()
    return Written(writer.written + _size(ctx.root / METADATA), background_s=summary.wall_s)


@contextlib.contextmanager
def _quiet_dcp():
    """DCP warns that it saves "in a single process" when no process group is up: here
    that is the point."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        warnings.filterwarnings("ignore", message=".*Detected an existing checkpoint.*")
        yield


def _stager(ctx: SaveContext):
    """The async save's stager, one for every save of the run: it keeps the host buffers
    it copies the state into (DCP's advice for periodic saves; only the first save
    allocates them), pinned where there is an accelerator to copy from."""
    stager = ctx.kept.get("dcp_stager")
    if stager is None:
        import torch
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        pinned = torch.cuda.is_available()
        options = StagingOptions(
            use_pinned_memory=pinned, use_shared_memory=False, use_async_staging=False,
            use_non_blocking_copy=pinned,
        )  # fmt: skip
        stager = ctx.kept["dcp_stager"] = DefaultStager(options)
    return stager


def _traced_writer(ctx: SaveContext, op):
    """DCP's FileSystemWriter into the checkpoint folder, its steps recorded on ``op``."""
    from torch.distributed.checkpoint import FileSystemWriter

    fused = (Phase.SERIALIZE, Phase.WRITE) + ((Phase.FSYNC,) if ctx.fsync else ())

    class TracedWriter(FileSystemWriter):
        written = 0  # bytes DCP's writer reported

        def write_data(self, plan, planner):
            fused_attr = {Attr.FUSED: fused_value(fused, "DCP's writer")}
            with op.phase(Phase.WRITE, **fused_attr), activity.growing(ctx.root):
                future = super().write_data(plan, planner)
                future.wait()
            size = sum(r.size_in_bytes for r in future.value())
            op.add_bytes(Phase.WRITE, size)
            self.written += size
            return future

        def finish(self, metadata, results) -> None:
            with op.phase(Phase.COMMIT):
                super().finish(metadata, results)

    op.set_attributes({Attr.FILES: len(ctx.plan.files)})
    return TracedWriter(ctx.root, thread_count=1, sync_files=ctx.fsync)


# ------------------------------------------------------------------ helpers


class _named:
    """A failed write is one line naming the file and the fix (torch.save reports ENOSPC
    as a RuntimeError, DCP wraps its writers' errors)."""

    def __init__(self, where) -> None:
        self.where = where

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if not _write_failure(exc):
            return False
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StorageError(
            f"{self.where}: could not be written ({first[:200]}); check free space and "
            "permissions there."
        ) from None


def _write_failure(exc: BaseException | None) -> bool:
    """A writer's I/O failure (not ours, not a bug in the caller's code)."""
    if exc is None or isinstance(exc, CkptprofError):
        return False
    return isinstance(exc, (OSError, RuntimeError)) or type(exc).__name__ == "CheckpointException"


def _size(path: Path) -> int:
    return path.stat().st_size


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["SaveContext", "Written", "check_strategy", "save"]
