"""One setup for every synthetic job (save, restore, the demo): this process's place in a
launched job, and the telemetry and tracer its runs are recorded with.

Both are context managers, so what they start (a process group, the straggler board's
thread, the trace exporter) ends on every exit path, a refusal or Ctrl-C included.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from ckptprof.synth import distributed
from ckptprof.synth.distributed import Job
from ckptprof.synth.stragglers import PhaseBoard
from ckptprof.tracing.export import Telemetry, setup_telemetry
from ckptprof.tracing.tracer import CheckpointTracer


@contextmanager
def joined(device_type: str = "cpu", stall_after_s: float | None = None) -> Iterator[Job]:
    """This process as one rank of the job the launcher started, with the straggler board
    (``stall_after_s``: None, no board). It leaves the job on exit: after a last barrier
    when the body finished, at once when it failed (the launcher stops the others)."""
    job = distributed.join(device_type)
    board = PhaseBoard(job, stall_after_s).start()
    finished = False
    try:
        yield job
        finished = True
    finally:
        board.stop()
        job.close(finished)


@contextmanager
def traced(
    trace_dir: str | os.PathLike, job: Job | None = None, **tracer_options
) -> Iterator[tuple[Telemetry, CheckpointTracer]]:
    """Telemetry writing into ``trace_dir`` and the synthetic runs' tracer
    (``tracer_options``: :class:`CheckpointTracer`'s). A job's ranks share rank 0's run
    id, so the report puts their spans of a run together. Shut down (flushed) on exit."""
    telemetry = setup_telemetry(trace_dir)
    try:
        run_id = job.broadcast(telemetry.run_id) if job is not None else telemetry.run_id
        tracer = CheckpointTracer(
            telemetry.provider, framework="synthetic", run_id=run_id, **tracer_options
        )
        yield telemetry, tracer
    finally:
        telemetry.shutdown()


__all__ = ["joined", "traced"]
