"""``parallel``: the same bytes through ckptprof's I/O core: each file serialized
(``serialize``: the archive's or header's small parts, and views of the tensors' memory
for their bytes: nothing copied), then cut at the part size, and every file's parts
written through the window with ``concurrency`` parts in flight (``pwritev`` at offsets
on a POSIX file, a multipart upload on S3)."""

from __future__ import annotations

from ckptprof.atomic import fsync_dir
from ckptprof.io.buffers import BufferPool, HostBuffer
from ckptprof.io.writes import FileParts, cut_parts, write_files
from ckptprof.phases import Attr, Phase
from ckptprof.synth.layouts import get_layout
from ckptprof.synth.savers.base import SaveContext, Saver, Written, named


class Parallel(Saver):
    name = "parallel"
    refused_layouts = {
        "dcp": "a DCP checkpoint is laid out by DCP's own writer; use --strategy framework "
        "(dcp.save) or async (dcp.async_save)."
    }
    object_store = True

    def save(self, ctx: SaveContext) -> Written:
        """Every file serialized, then every part of every file written through the I/O
        core, ``concurrency`` parts at once; then each file forced to the device, and all
        renamed into place."""
        layout = get_layout(ctx.plan.spec.layout)
        op = ctx.op
        files: list[FileParts] = []
        op.set_phase_attributes(Phase.WRITE, **{Attr.CONCURRENCY: ctx.concurrency})
        try:
            for file in ctx.plan.files:
                with op.phase(Phase.SERIALIZE):
                    parts = cut_parts(layout.serialize_file(ctx.plan, file, ctx.tensors),
                                      ctx.part_size)  # fmt: skip
                size = sum(p.size for p in parts)
                writer = ctx.storage.open_writer(file.path, size, ctx.part_size)
                files.append(FileParts(file.path, writer, parts))
            # a direct writer's staging buffers: made by the first save, kept for the next
            pool = ctx.kept.setdefault("write_buffers", BufferPool(HostBuffer))
            with named(ctx.storage.uri):
                total = write_files(files, ctx.concurrency, op, pool=pool)
            if ctx.fsync and not ctx.storage.object_store:
                for f in files:
                    with op.phase(Phase.FSYNC), named(f"{ctx.storage.uri}/{f.path}"):
                        f.writer.sync()
                op.add_bytes(Phase.FSYNC, total)
            with op.phase(Phase.COMMIT):
                while files:  # a writer leaves the list once committed
                    files[0].writer.commit()
                    files.pop(0)
                if ctx.fsync and not ctx.storage.object_store:
                    for folder in sorted({(ctx.root / f.path).parent for f in ctx.plan.files}):
                        fsync_dir(folder)
        except BaseException:  # an unfinished save, interrupted in its commit too, leaves nothing
            for f in files:
                f.writer.abort()
            raise
        op.set_attributes({Attr.FILES: len(ctx.plan.files)})
        return Written(total)
