"""This process's part of a job, for the goodput report: how long it lived and how much
of that was training steps.

A job that is preempted and restarted is several processes; ``ckptprof report
--goodput`` splits each one's life into buckets (restore, first step, save blocking,
background-save slowdown, steps, lost work, the rest) and needs from each process what
only it saw: when it started (the OS's record of the process), when it ended (the
adapter's close), and its steps, timed from one step's end to the next less the saves
and restores inside them (those are their own spans), with the steps that ran while a
background save was writing kept apart. :meth:`Lifetime.emit` writes them as one
``ckpt.run`` span at the end.
"""

from __future__ import annotations

import os
import statistics
import threading
import time

from ckptprof.phases import RUN_SPAN, Attr


def process_start_ns() -> int:
    """When the OS started this process (the restart's first sign of life): its start
    in clock ticks since boot (``/proc/self/stat``) against the boot-time clock now, so
    no rounding of the boot time (psutil's whole seconds) gets in."""
    try:
        with open("/proc/self/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        since_boot_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot_s
        return time.time_ns() - int(age_s * 1e9)
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import psutil

        return int(psutil.Process().create_time() * 1e9)
    except Exception:  # noqa: BLE001 - no process table: the adapter's own start
        return time.time_ns()


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
            self.steps += 1
            self.step_ns += ns
            if any(not op.finished for op in self._background):
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

    def emit(self, tracer, rank: int) -> None:
        """The ``ckpt.run`` span: from the process's start to now."""
        global _previous_end_ns
        span = tracer.start_span(RUN_SPAN, self.attributes(rank), start_ns=self.started_ns)
        _previous_end_ns = time.time_ns()
        span.end(end_time=_previous_end_ns)


__all__ = ["Lifetime", "process_start_ns"]
