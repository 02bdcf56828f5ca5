"""An interruption's downtime and recovery, defined once for every view (``report
--interruptions``, ``report --goodput``, the HTML page).

Downtime is the job's: from the interrupted process's end (its latest ``ckpt.run``,
written at its close or at its last save: the emergency save) to the new process's start
(the OS's start of it), as report/goodput.py measures it between any two processes of a
job. Where the interrupted process left no ``ckpt.run`` among the traces read, the resumed
restore's own record stands in (``ckpt.interruption.downtime_s``: the notice → the new
process's start).

Recovery, the notice → the first training step done after the restore, is told in parts
that add up (each as measured, to the rounding of each):

* wind-down: the notice → the interrupted process's end (the emergency save, the flush);
* downtime;
* start-up: the new process's start → its restore began (the callback's first record:
  imports, the framework's set-up, the data loaders);
* restore: its RTO, to the first step done.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptprof.phases import Attr
from ckptprof.report.goodput import Goodput


@dataclass(frozen=True)
class Recovery:
    wind_down_s: float | None  # None: the interrupted process's end is not in the traces
    downtime_s: float | None
    startup_s: float | None
    rto_s: float | None
    recovery_s: float | None

    def parts(self) -> list[tuple[str, float | None]]:
        """The named parts recovery is made of, in order (wind-down only where seen)."""
        named = [("downtime", self.downtime_s), ("start-up", self.startup_s)]
        named.append(("RTO", self.rto_s))
        if self.wind_down_s is not None:
            named.insert(0, ("wind-down", self.wind_down_s))
        return named


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def recovery_of(
    attributes: Mapping[str, Any],
    restore_start_ns: int | None = None,
    notice_ns: int | None = None,
    goodput: Goodput | None = None,
) -> Recovery:
    """The parts of one resumed restore's recovery (``attributes``: the restore's): with
    the job's ``goodput``, its downtime before the process that ran the restore."""
    recorded = _seconds(attributes.get(Attr.INTERRUPTION_DOWNTIME_S))
    rto = _seconds(attributes.get(Attr.WALL_S))
    recovery = _seconds(attributes.get(Attr.INTERRUPTION_RECOVERY_S))
    startup = _seconds(attributes.get(Attr.INTERRUPTION_STARTUP_S))
    if startup is None and None not in (recorded, rto, recovery):  # written before start-up was
        startup = round(max(0.0, recovery - recorded - rto), 3)
    downtime, wind_down = recorded, None
    lifetimes = goodput.lifetimes if goodput is not None and restore_start_ns else []
    for i, after in enumerate(lifetimes[1:], start=1):
        if after.start_ns <= restore_start_ns <= after.end_ns:
            before = lifetimes[i - 1]
            downtime = goodput.downtimes_s[i - 1]
            if notice_ns is None and recorded is not None:
                notice_ns = after.start_ns - int(recorded * 1e9)
            if notice_ns is not None:
                wind_down = round((before.end_ns - notice_ns) / 1e9, 3)
            break
    return Recovery(wind_down, downtime, startup, rto, recovery)


__all__ = ["Recovery", "recovery_of"]
