"""``synth restore --simulate-interruption``: the interruption machinery without a framework.

Before the sweep, a notice is injected into a real :class:`NoticeWatcher` (source
``simulated``, the deadline ``--deadline`` seconds later), the shared
:class:`~ckptprof.interrupt.guard.InterruptionGuard` writes the pending record, and the
emergency save is real: the first_step model's weights and AdamW state, ``torch.save``d,
written beside the results, fsynced and renamed into place — traced as a ``ckpt.save``
under ``ckpt.emergency_save``. The sweep's first restore then links to it, so the report
tells the same story as a framework job: notice → save and its margin → downtime (here:
notice → the restore starts, in the same process) → restore → first step.
"""

from __future__ import annotations

import io
import logging
import time
from pathlib import Path

from ckptprof.atomic import replacing
from ckptprof.errors import CkptprofError
from ckptprof.interrupt.guard import InterruptionGuard
from ckptprof.interrupt.notice import Notice
from ckptprof.phases import Attr, Phase

log = logging.getLogger("ckptprof")

SOURCE = "simulated"


class _Host:
    """The guard's host for the synthetic runner (what an adapter's core provides)."""

    framework = "synthetic"
    rank = 0

    def __init__(self, tracer, telemetry) -> None:
        self.tracer = tracer
        self.telemetry = telemetry
        self.save_parent = None
        self.interruptions = None
        self._warned: set[str] = set()

    def start(self) -> None:
        pass

    def warn_once(self, where: str, exc: BaseException) -> None:
        if where not in self._warned:
            self._warned.add(where)
            log.warning("ckptprof: %s failed: %r", where, exc)


def simulate(
    first_step,
    tracer,
    step: int,
    out_dir: Path,
    telemetry,
    deadline_s: float,
    deadline_assumed: bool = True,
) -> InterruptionGuard:
    """Notice → emergency save of ``first_step``'s model and optimizer at ``step`` → record;
    returns the guard the first restore links to. ``deadline_assumed``: the deadline is
    the default (EC2 Spot's), not one the user gave."""
    if first_step.model is None:
        raise CkptprofError(
            "--simulate-interruption saves the first_step model, which is not in memory here "
            "(too big, or world size > 1); use a smaller --scale, or --world-size 1."
        )
    host = _Host(tracer, telemetry)
    guard = InterruptionGuard(
        host,
        location=lambda: str(out_dir),
        save=lambda: _emergency_save(first_step, tracer, host, Path(out_dir) / "emergency", step),
        sources=[],  # the notice is injected below, with the deadline
    )
    guard.start()
    now = time.time_ns()
    deadline_ns = now + int(deadline_s * 1e9)
    guard.watcher.inject(Notice(SOURCE, now, deadline_ns, deadline_assumed=deadline_assumed))
    guard.step_end(step)  # the job's step boundary: the save runs here
    guard.close()
    return guard


def _emergency_save(first_step, tracer, host: _Host, folder: Path, step: int) -> str:
    """A real save of the model and optimizer state: serialize, write + fsync, rename."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step-{step}.pt"
    attrs = {Attr.FORMAT: "torch", Attr.PATH: str(final), Attr.STEP: step}
    with tracer.save(attrs, parent=host.save_parent) as op:
        with op.phase(Phase.SERIALIZE):
            buffer = io.BytesIO()
            model, optimizer = first_step.model, first_step.optimizer
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, buffer)
        with replacing(final) as partial:  # on exit: fsync, rename, fsync the folder
            with op.phase(Phase.WRITE):
                with open(partial, "wb") as handle:
                    handle.write(buffer.getbuffer())
                op.add_bytes(Phase.WRITE, buffer.getbuffer().nbytes)
            committing = time.time_ns()
        op.add_interval(Phase.COMMIT, committing, time.time_ns())
    return str(final)
