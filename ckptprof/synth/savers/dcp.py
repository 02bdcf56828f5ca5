"""DCP's own writers: ``dcp.save`` (the ``framework`` saver on a DCP layout) and
``async``, DCP's ``async_save``: the blocking part (``stage``: the state copied into the
buffers the background writer uses) is this save's span; the background write and
commit are their own ``ckpt.save`` marked ``ckpt.save.background`` and linked to it, as
the Lightning and DeepSpeed callbacks record an asynchronous save."""

from __future__ import annotations

import contextlib
import warnings

from ckptprof import activity
from ckptprof.errors import CkptprofError
from ckptprof.phases import Attr, Phase, fused_value
from ckptprof.synth.layouts.dcp import METADATA, fqn
from ckptprof.synth.savers.base import SaveContext, Saver, Written, named, size_of


class Async(Saver):
    name = "async"
    layouts = frozenset({"dcp"})

    def layout_refusal(self, layout: str) -> str:
        return (
            f"--strategy async is DCP's async_save; use --layout dcp, or framework/parallel "
            f"for {layout}."
        )

    def save(self, ctx: SaveContext) -> Written:
        return dcp_save(ctx, asynchronous=True)


def _dcp_state(ctx: SaveContext) -> dict:
    """DCP's flat state dict: one entry per tensor, keyed as the restore reads them."""
    return {fqn(p.group, p.name): ctx.tensors[p] for f in ctx.plan.data_files for p in f.pieces}


def dcp_save(ctx: SaveContext, asynchronous: bool) -> Written:
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
        with named(ctx.storage.uri), _quiet_dcp():
            dcp.save(state, storage_writer=writer, no_dist=True)
        return Written(writer.written + size_of(ctx.root / METADATA))
    from opentelemetry.trace import Link

    background = ctx.tracer.save(
        {Attr.SAVE_BACKGROUND: True, Attr.STRATEGY: "async"},
        links=[Link(ctx.op.span_context)] if ctx.op.span_context else None,
    )
    writer = _traced_writer(ctx, background)
    with ctx.op.phase(Phase.STAGE), named(ctx.storage.uri), _quiet_dcp():
        future = dcp.async_save(
            state, storage_writer=writer, async_stager=_stager(ctx), no_dist=True
        )
    ctx.op.add_bytes(Phase.STAGE, sum(t.nbytes for t in state.values()))
    ctx.op.finish()  # the blocking part ends here: training would go on now
    try:
        with named(ctx.storage.uri):
            future.result()
    except BaseException as exc:
        background.finish(error=exc)
        raise
    summary = background.finish()
    return Written(writer.written + size_of(ctx.root / METADATA), background_s=summary.wall_s)


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
