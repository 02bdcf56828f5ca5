"""After-resume health: is training as fast after the resume as before the save?

Users report jobs 2-3x slower after resuming from a sharded checkpoint (a different
layout, a lost compile cache, a cold page cache under the data). The callbacks time the
steps before each save (their median goes into ckptprof's record of the save) and the
first ``HEALTH_STEPS`` steps after the resume's first step, and say so when training is
slower than before. A step a save ran in is left out on both sides (the save, not
training, made it slow), and fewer than ``HEALTH_STEPS`` steps on either side are no
verdict: a few steps are noise.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque

from ckptprof.phases import Attr

log = logging.getLogger("ckptprof")

HEALTH_STEPS = 10  # steps timed after the resume's first step; fewer on a side: no verdict
RECENT_STEPS = 32  # steps before a save whose median is recorded with it
SLOWER_RATIO = 1.25  # after/before above this is worth a warning
BEFORE_SAVE = Attr.BEFORE_SAVE_STEP_MEDIAN_S  # on the restore: the steps before its save


class StepClock:
    """Step durations from consecutive step ends (the time per training step)."""

    def __init__(self) -> None:
        self._last_ns: int | None = None
        self._recent: deque[float] = deque(maxlen=RECENT_STEPS)
        self._saving = False  # a save began since the last step's end
        self._lock = threading.Lock()  # a background save's record reads the median

    def tick(self) -> float | None:
        """A step ended: its duration since the previous end; None for the first, and for
        one a save ran in (the save's time is no training step's)."""
        now = time.time_ns()
        with self._lock:
            last, self._last_ns = self._last_ns, now
            saved, self._saving = self._saving, False
            if last is None or saved:
                return None
            seconds = (now - last) / 1e9
            self._recent.append(seconds)
        return seconds

    def restart(self) -> None:
        """Count from now (the resume's first step just ended; it is in the RTO)."""
        with self._lock:
            self._last_ns = time.time_ns()
            self._saving = False
            self._recent.clear()

    def saving(self) -> None:
        """A save begins: the step it runs in is not timed (the save made it slow)."""
        with self._lock:
            self._saving = True

    def median(self) -> float | None:
        """The pace before a save; None on fewer than ``HEALTH_STEPS`` steps, too few to
        judge a resume against."""
        with self._lock:
            recent = list(self._recent)
        return statistics.median(recent) if len(recent) >= HEALTH_STEPS else None


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
        """After / before; None unless ``steps`` steps were timed after the resume and the
        save recorded a pace (itself over ``HEALTH_STEPS`` steps): fewer are noise."""
        if len(self.times) < self.steps or not self.before_s:
            return None
        return statistics.median(self.times) / self.before_s

    def attributes(self) -> dict[str, float | int]:
        """The steps timed; the comparison with the save only when it is judged."""
        attrs: dict[str, float | int] = {
            Attr.AFTER_RESUME_STEPS: len(self.times),
            Attr.AFTER_RESUME_STEP_MEDIAN_S: round(statistics.median(self.times), 6),
        }
        slowdown = self.slowdown
        if slowdown is not None:
            attrs[Attr.AFTER_RESUME_BEFORE_SAVE_STEP_MEDIAN_S] = round(self.before_s, 6)
            attrs[Attr.AFTER_RESUME_SLOWDOWN] = round(slowdown, 4)
        return attrs

    def warn_if_slower(self) -> None:
        """A warning when slower; when too few steps ran to judge, a line that says so
        (silence would read as "as fast as before")."""
        ratio = self.slowdown
        if ratio is None:
            log.info(
                "ckptprof: speed after the resume not judged: %d steps timed after it, %s "
                "before the save; %d are needed on each side (steps with a save left out)",
                len(self.times),
                "enough" if self.before_s else "too few (or none recorded)",
                self.steps,
            )
        elif ratio > SLOWER_RATIO:
            log.warning(
                "ckptprof: training is %.2fx slower after the resume (median step %.3f s over "
                "%d steps vs %.3f s before the save)",
                ratio,
                statistics.median(self.times),
                len(self.times),
                self.before_s,
            )


__all__ = ["AfterResume", "StepClock"]
