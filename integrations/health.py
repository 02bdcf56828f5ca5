"""After-resume health: is training as fast after the resume as before the save?

Users report jobs 2-3x slower after resuming from a sharded checkpoint (a different
layout, a lost compile cache, a cold page cache under the data). The callbacks time the
steps before each save (their median goes into ckptprof's record of the save) and the
first ``HEALTH_STEPS`` steps after the resume's first step, and say so when training is
slower than before.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque

from ckptprof.phases import Attr

log = logging.getLogger("ckptprof")

HEALTH_STEPS = 10  # steps after the resume's first step that are timed
RECENT_STEPS = 32  # steps before a save whose median is recorded with it
SLOWER_RATIO = 1.25  # after/before above this is worth a warning
BEFORE_SAVE = Attr.BEFORE_SAVE_STEP_MEDIAN_S  # on the restore: the steps before its save


class StepClock:
    """Step durations from consecutive step ends (the time per training step)."""

    def __init__(self) -> None:
        self._last_ns: int | None = None
        self._recent: deque[float] = deque(maxlen=RECENT_STEPS)
        self._lock = threading.Lock()  # a background save's record reads the median

    def tick(self) -> float | None:
        """A step ended: its duration since the previous end (None for the first)."""
        now = time.time_ns()
        with self._lock:
            last, self._last_ns = self._last_ns, now
            if last is None:
                return None
            seconds = (now - last) / 1e9
            self._recent.append(seconds)
        return seconds

    def restart(self) -> None:
        """Count from now (the resume's first step just ended; it is in the RTO)."""
        with self._lock:
            self._last_ns = time.time_ns()
            self._recent.clear()

    def median(self) -> float | None:
        with self._lock:
            recent = list(self._recent)
        return statistics.median(recent) if recent else None


class AfterResume:
    """The steps after one resume, compared with the steps before its save."""

    def __init__(self, restore_context, before_s: float | None, steps: int = HEALTH_STEPS):
        self.restore_context = restore_context
        self.before_s = before_s
        self.steps = steps
        self.start_ns = time.time_ns()
        self.times: list[float] = []

    def add(self, seconds: float) -> bool:
        """One more step; True once ``steps`` are timed."""
        self.times.append(seconds)
        return len(self.times) >= self.steps

    @property
    def slowdown(self) -> float | None:
        if not self.times or not self.before_s:
            return None
        return statistics.median(self.times) / self.before_s

    def attributes(self) -> dict[str, float | int]:
        attrs: dict[str, float | int] = {
            Attr.AFTER_RESUME_STEPS: len(self.times),
            Attr.AFTER_RESUME_STEP_MEDIAN_S: round(statistics.median(self.times), 6),
        }
        if self.before_s:
            attrs[Attr.AFTER_RESUME_BEFORE_SAVE_STEP_MEDIAN_S] = round(self.before_s, 6)
            attrs[Attr.AFTER_RESUME_SLOWDOWN] = round(self.slowdown or 0.0, 4)
        return attrs

    def warn_if_slower(self) -> None:
        ratio = self.slowdown
        if ratio is not None and ratio > SLOWER_RATIO:
            log.warning(
                "ckptprof: training is %.2fx slower after the resume (median step %.3f s over "
                "%d steps vs %.3f s before the save)",
                ratio,
                statistics.median(self.times),
                len(self.times),
                self.before_s,
            )


__all__ = ["AfterResume", "StepClock"]
