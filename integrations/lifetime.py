"""This process's part of a job, for the goodput report: how long it lived and how much
of that was training steps.

A job that is preempted and restarted is several processes; ``ckptprof report
--goodput`` splits each one's life into buckets (restore, first step, save blocking,
background-save slowdown, steps, lost work, the rest) and needs from each process what
only it saw: when it started (the OS's record of the process), when it ended (the
adapter's close), and its steps, timed from one step's end to the next less the saves
and restores inside them (those are their own spans), with the steps that ran while a
background save was writing kept apart. :meth:`Lifetime.emit` writes them as one
``ckpt.run`` span at the end (and after every save, for a process that dies
without closing), every one in the process's one trace: a backend shows one trace per
process, its latest ``ckpt.run`` the longest.
"""

from __future__ import annotations

import os
import statistics
import threading
import time

from ckptprof.interrupt.guard import process_start_ns
from ckptprof.phases import RUN_SPAN, Attr


def job_identity(checkpoint_dir: str | None) -> str | None:
    """What every process of one job shares across its restarts, for the goodput report
    to keep jobs apart: the folder its checkpoints go to (where a restart resumes from),
    else the launcher's run id (``CKPTPROF_RUN_ID``, torchrun's ``TORCHELASTIC_RUN_ID``);
    None when neither is known (the report then takes the trace file's folder)."""
    if checkpoint_dir:
        folder = str(checkpoint_dir)
        return folder if "://" in folder else os.path.abspath(os.path.expanduser(folder))
    for name in ("CKPTPROF_RUN_ID", "TORCHELASTIC_RUN_ID"):
        if os.environ.get(name) not in (None, "", "none"):
            return os.environ[name]
    return None


_previous_end_ns = 0  # where this process's last Lifetime ended (a notebook's second fit)


class Lifetime:
    def __init__(self) -> None:
        # the process's start, or the end of its previous run (several fits in one process)
        self.started_ns = max(process_start_ns(), _previous_end_ns)
        self._lock = threading.Lock()
        self._blocked: list[tuple[int, int]] = []  # finished saves' and restores' intervals
        self._background: list = []  # background saves' operations (open while writing)
        self._last_end: int | None = None
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.steps = 0
        self.step_ns = 0
        self.background_steps = 0
        self.background_step_ns = 0
        self._clean: list[float] = []  # step seconds without a background save
        self.trace_id: int | None = None  # every ckpt.run snapshot's: one trace per process

    def blocked(self, start_ns: int, end_ns: int) -> None:
        """A save or restore the loop waited for (not step time)."""
        with self._lock:
            self._blocked.append((start_ns, end_ns))

    def background(self, op) -> None:
        with self._lock:
            self._background.append(op)

    def step_ended(self, step: int) -> None:
        now = time.time_ns()
        with self._lock:
            last, self._last_end = self._last_end, now
            self.last_step = step
            if last is None:
                self.first_step = step  # the steps are timed from here
                return
            inside = sum(max(0, min(e, now) - max(s, last)) for s, e in self._blocked)
            ns = max(0, now - last - inside)
            # later steps start from now: what ended is done with (the step stays O(1))
            self._blocked = [(s, e) for s, e in self._blocked if e > now]
            self._background = [op for op in self._background if not op.finished]
            self.steps += 1
            self.step_ns += ns
            if self._background:
                self.background_steps += 1
                self.background_step_ns += ns
            else:
                self._clean.append(ns / 1e9)

    def attributes(self, rank: int) -> dict:
        with self._lock:
            median = statistics.median(self._clean) if self._clean else None
            out = {
                Attr.RANK: rank,
                Attr.RUN_PID: os.getpid(),
                Attr.RUN_STEPS: self.steps,
                Attr.RUN_STEP_S: round(self.step_ns / 1e9, 6),
                Attr.RUN_BACKGROUND_STEPS: self.background_steps,
                Attr.RUN_BACKGROUND_STEP_S: round(self.background_step_ns / 1e9, 6),
            }
            if median is not None:
                out[Attr.RUN_STEP_MEDIAN_S] = round(median, 6)
            if self.first_step is not None:
                out[Attr.RUN_FIRST_STEP] = self.first_step
                out[Attr.RUN_LAST_STEP] = self.last_step
        return out

    def emit(self, tracer, rank: int, final: bool = True, job: str | None = None) -> None:
        """The ``ckpt.run`` span: from the process's start to now, with the ``job`` it
        belongs to (see :func:`job_identity`). Also written (not ``final``) after every
        save: a process killed later without closing (a Spot reclaim, SIGKILL) still
        tells its life up to its last save. Every one joins the first one's trace."""
        global _previous_end_ns
        attributes = {**self.attributes(rank), Attr.RUN_FINAL: final}
        if job:
            attributes[Attr.RUN_JOB] = job
        span = tracer.start_span(
            RUN_SPAN, attributes, start_ns=self.started_ns, trace_id=self.trace_id
        )
        self.trace_id = self.trace_id or span.get_span_context().trace_id
        end = time.time_ns()
        if final:
            _previous_end_ns = end
        span.end(end_time=end)


#: the trace folder's size up to which a resume reads it for the goodput so far
GOODPUT_READ_LIMIT = 16 << 20


class GoodputSoFar:
    """At a resume, the job's goodput up to this process's start, computed on a thread
    of its own (reading the earlier processes' traces must not slow the first steps):
    the ``ckpt.run`` spans in the trace folder, the downtime before this process and the
    work it redoes from ``restored_step``. Skipped when the folder holds more than
    :data:`GOODPUT_READ_LIMIT` bytes."""

    def __init__(self, session, restored_step: int | None, restore_attributes: dict) -> None:
        from ckptprof.report.goodput import interruption_record

        telemetry = session.telemetry
        self.trace = telemetry.trace_file if telemetry is not None else None
        self.resuming = (
            (session.lifetime.started_ns, int(restored_step)) if restored_step is not None else None
        )
        # the interruption record the restore read: a process killed before its last
        # ckpt.run ended where the record saw it, as the report has it
        self.record = interruption_record(restore_attributes)
        # the earlier processes of this job, not another's (the report's job for a
        # process that knew no identity: its trace folder)
        self.job = session.job() or (os.path.abspath(self.trace.parent) if self.trace else None)
        self.sent = False
        self._metrics: dict | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ckptprof-goodput", daemon=True)

    def start(self) -> GoodputSoFar:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._metrics = self._compute()
        except Exception:  # noqa: BLE001 - a guest: no figure rather than a broken job
            self._metrics = {}
        finally:
            self._done.set()

    def _compute(self) -> dict:
        if self.trace is None:
            return {}
        files = [f for f in self.trace.parent.glob("*.jsonl") if f != self.trace]
        if not files or sum(f.stat().st_size for f in files) > GOODPUT_READ_LIMIT:
            return {}
        from ckptprof.report.goodput import build_goodput, read_job_spans

        spans = read_job_spans([str(f) for f in files])
        goodput = build_goodput(spans, resuming=self.resuming, job=self.job, record=self.record)
        if goodput is None:
            return {}
        return {
            "ckptprof/goodput": round(goodput.goodput, 6),
            "ckptprof/goodput/wall_s": round(goodput.wall_s, 3),
            "ckptprof/goodput/lost_work_s": round(goodput.total["lost_work"], 3),
            "ckptprof/goodput/downtime_s": round(goodput.total["downtime"], 3),
        }

    def result(self, wait_s: float = 0.0) -> dict | None:
        """The metrics once computed (empty: none to give); None while still computing."""
        return self._metrics if self._done.wait(wait_s) else None

    def join(self) -> None:
        self._thread.join(timeout=5)


__all__ = ["GoodputSoFar", "Lifetime", "job_identity", "process_start_ns"]
