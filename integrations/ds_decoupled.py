"""DeepSpeed's decoupled checkpoint writer, traced: a save queues its files for a writer
process and returns; DeepSpeed commits them later (at the next ``step()``, or in
``checkpoint_engine.cleanup()`` at ``engine.destroy()``), one commit waiting for every
save queued so far. Each queued save gets its background ``ckpt.save`` (linked to the
save that queued it, ``ckpt.save.background``) and its record when that commit ends."""

from __future__ import annotations

import contextlib
import os

from ckptprof.errors import CkptprofError
from ckptprof.integrations.ds_load import file_size
from ckptprof.phases import Attr, Phase


class DecoupledSaves:
    """The saves queued to the writer process and not committed yet, in order."""

    def __init__(self, instrumentor) -> None:
        self.inst = instrumentor
        self.pending: list[tuple] = []  # (folder, file names, queued by, step)

    def queue(self, folder: str, names: list[str], queued_by, step: int) -> None:
        self.pending.append((folder, names, queued_by, step))

    def _begin_background(self, folder: str, step: int, queued_by):
        attrs = {Attr.FORMAT: "deepspeed", Attr.PATH: folder, Attr.STEP: step}
        attrs[Attr.WORLD_SIZE] = self.inst.engine.world_size
        return self.inst.session.begin_background_save(attrs, queued_by)

    def commit(self, original, *args, **kwargs):
        """DeepSpeed's commit of the saves queued so far: each one's background span
        (its ``commit`` phase the wait for the writer) and record."""
        pending, self.pending = self.pending, []
        if not pending:
            return original(*args, **kwargs)
        ops = [(self._begin_background(p[0], p[3], p[2]), p) for p in pending]
        for op, _ in ops:
            if op is not None:
                op.set_phase_attributes(Phase.COMMIT, **{Attr.COMMIT_WAITS_FOR_WRITER: True})
        try:
            with contextlib.ExitStack() as phases:
                for op, _ in ops:
                    if op is not None:
                        phases.enter_context(op.phase(Phase.COMMIT))
                result = original(*args, **kwargs)
        except BaseException as exc:
            for op, _ in ops:
                if op is not None:
                    op.finish(exc)
            raise
        for op, (folder, names, _, step) in ops:
            if op is not None:
                op.add_bytes(Phase.COMMIT, sum(file_size(os.path.join(folder, n)) for n in names))
            self.inst.files.commit_folder(folder, names, op, step)
            if op is not None:
                op.finish()
        return result

    def abandon(self) -> None:
        """Saves DeepSpeed has not committed yet (ckptprof removed before the next step
        or ``engine.destroy()``): their background spans end now, marked as not seen
        committed, and no record is written (their files may still be arriving)."""
        pending, self.pending = self.pending, []
        for folder, _names, queued_by, step in pending:
            op = self._begin_background(folder, step, queued_by)
            if op is not None:
                op.finish(
                    CkptprofError(
                        f"{folder}: ckptprof was removed before DeepSpeed committed this save "
                        "(at the next step or engine.destroy()); no record of its files"
                    )
                )


__all__ = ["DecoupledSaves"]
