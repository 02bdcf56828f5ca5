"""``framework``: the layout's own writer as a job calls it (``torch.save`` into the file,
safetensors' ``save_file``, ``dcp.save`` with its ``FileSystemWriter``); it serializes
while it writes, so ``write`` is marked fused with ``serialize``."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ckptprof import activity
from ckptprof.atomic import fsync_dir, partial_path
from ckptprof.phases import Attr, Phase, fused_value
from ckptprof.synth.layouts import get_layout
from ckptprof.synth.savers.base import (
    SaveContext,
    Saver,
    Written,
    fsync_file,
    named,
    write_with_framework,
)


class Framework(Saver):
    name = "framework"

    def save(self, ctx: SaveContext) -> Written:
        """Each file through the layout's own writer into a temporary name, then renamed."""
        if ctx.plan.spec.layout == "dcp":  # DCP's module only now: ~0.8 s to import
            from ckptprof.synth.savers.dcp import dcp_save

            return dcp_save(ctx, asynchronous=False)
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
                with ctx.op.phase(Phase.WRITE, **fused), named(final), activity.growing(partial):
                    write_with_framework(layout, ctx.plan, file, partial, ctx.tensors)
                size = partial.stat().st_size
                ctx.op.add_file(Phase.WRITE, file.path, size, time.perf_counter() - start)
                total += size
                if ctx.fsync:
                    with ctx.op.phase(Phase.FSYNC), named(final):
                        fsync_file(partial)
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
