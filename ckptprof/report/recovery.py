"""An interruption's downtime and recovery, defined once for every view (``report
--interruptions``, ``report --goodput``, the HTML page).

Downtime is the job's: from the interrupted process's end to the new process's start
(the OS's start of it), as report/goodput.py measures it between any two processes of a
job. That end is its latest ``ckpt.run`` (written at its close or at its last save: the
emergency save), or, for a process killed before it wrote one after the notice, the
latest its interruption record saw it alive (the notice, its last step), which the
resumed restore carries. Where the interrupted process left no ``ckpt.run`` among the
traces read, the downtime is not known; the resumed restore's own record measures from
the notice (``ckpt.interruption.notice_to_start_s``: the notice → the new process's
start, the wind-down and the downtime together) and stands in for the two.

Recovery, the notice → the first training step done after the restore, is told in parts
that add up (each as measured, to the rounding of each):

* wind-down: the notice → the interrupted process's end (the emergency save, the flush);
* downtime;
* start-up: the new process's start → its restore began (the callback's first record:
  imports, the framework's set-up, the data loaders);
* restore: its RTO, to the first step done.

No part is negative: an end the traces place before the notice (a process killed
before it wrote its end, traced before the record said when it was last seen) leaves
the wind-down unknown, and recovery is told from the notice instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptprof.phases import Attr
from ckptprof.report.goodput import Goodput
from ckptprof.report.json_values import number
from ckptprof.tracing.times import span_ns

#: how the interrupted process's end is known: its own ``ckpt.run``, or the record
END_TRACED, END_RECORDED = "traced", "recorded"


@dataclass(frozen=True)
class Recovery:
    wind_down_s: float | None  # None: the interrupted process's end is not known
    downtime_s: float | None  # None: the interrupted process's traces are not here
    notice_to_start_s: float | None  # the resumed restore's record: the two together
    startup_s: float | None
    rto_s: float | None
    recovery_s: float | None
    end: str | None = None  # END_TRACED or END_RECORDED (None: not known)

    def parts(self) -> list[tuple[str, float | None]]:
        """The named parts recovery is made of, in order: from the notice through the
        interrupted process's end where it is known, else the notice → the new start."""
        if self.wind_down_s is not None and self.downtime_s is not None:
            named = [("wind-down", self.wind_down_s), ("downtime", self.downtime_s)]
        else:
            named = [("notice → start", self.notice_to_start_s)]
        return [*named, ("start-up", self.startup_s), ("RTO", self.rto_s)]


def recovery_of(
    attributes: Mapping[str, Any],
    restore_start_ns: int | None = None,
    notice_ns: int | None = None,
    goodput: Goodput | None = None,
) -> Recovery:
    """The parts of one resumed restore's recovery (``attributes``: the restore's): with
    the job's ``goodput``, its downtime before the process that ran the restore."""
    recorded = number(attributes.get(Attr.INTERRUPTION_NOTICE_TO_START_S))
    rto = number(attributes.get(Attr.WALL_S))
    recovery = number(attributes.get(Attr.INTERRUPTION_RECOVERY_S))
    startup = number(attributes.get(Attr.INTERRUPTION_STARTUP_S))
    if startup is None and None not in (recorded, rto, recovery):  # written before start-up was
        startup = round(max(0.0, recovery - recorded - rto), 3)
    if notice_ns is None:
        notice_ns = span_ns(attributes.get(Attr.INTERRUPTION_NOTICE_AT))
    downtime = wind_down = end = None
    lifetimes = goodput.lifetimes if goodput is not None and restore_start_ns else []
    for i, after in enumerate(lifetimes[1:], start=1):
        if after.start_ns <= restore_start_ns <= after.end_ns:
            before = lifetimes[i - 1]
            downtime = goodput.downtimes_s[i - 1]
            if notice_ns is None and recorded is not None:
                notice_ns = after.start_ns - int(recorded * 1e9)
            if notice_ns is not None and before.end_ns >= notice_ns:
                wind_down = round((before.end_ns - notice_ns) / 1e9, 3)
                end = END_RECORDED if before.unseen_s else END_TRACED
            break
    return Recovery(wind_down, downtime, recorded, startup, rto, recovery, end)


__all__ = ["END_RECORDED", "END_TRACED", "Recovery", "recovery_of"]
