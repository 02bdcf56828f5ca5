"""``parallel``: the same bytes through ckptprof's I/O core: each file serialized
(``serialize``: the archive's or header's small parts, and views of the tensors' memory
for their bytes: nothing copied), then cut at the part size and written with
``concurrency`` parts in flight (``pwritev`` at offsets on a POSIX file, a multipart
upload on S3)."""

from __future__ import annotations

import time

from ckptprof.atomic import fsync_dir
from ckptprof.io.writes import cut_parts, write_parts
from ckptprof.phases import Attr, Phase
from ckptprof.storage.base import FileWriter
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
                with op.phase(Phase.WRITE), named(where):
                    write_parts(writer, parts, ctx.concurrency)
                op.add_file(Phase.WRITE, file.path, size, time.perf_counter() - start)
                del segments, parts  # the archive's small parts: freed before the next file
                total += size
                if ctx.fsync and not ctx.storage.object_store:
                    with op.phase(Phase.FSYNC), named(where):
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
