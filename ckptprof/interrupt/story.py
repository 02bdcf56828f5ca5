"""What the spans and the record of one interruption say: the notice's attributes, the
pending record, the emergency save's outcome, and on the resumed run the link back to
the notice with the time from the notice to this process's start, recovery and cost.

The resumed run measures from the notice, which the record gives: the interrupted
process's end is in that process's traces only, so the downtime (that end → this
process's start) is the report's (report/recovery.py), and the span's interval has a
name of its own, ``ckpt.interruption.notice_to_start_s`` (the wind-down and the
downtime together).

Why apart from :mod:`ckptprof.interrupt.guard`: the guard decides *when* (its thread,
the signal, step boundaries, the ranks' agreement, handing the signal on); this module
is *what* is written then, values worked out from the notice, the record and the clock.
"""

from __future__ import annotations

import time
from typing import Any

from ckptprof.interrupt.notice import Notice
from ckptprof.interrupt.record import FAILED, MISSED, SAVED, InterruptionRecord, as_attributes
from ckptprof.phases import Attr


def notice_attributes(notice: Notice, step: int) -> dict[str, Any]:
    """The ``ckpt.interruption`` and ``ckpt.notice`` spans' attributes."""
    attrs: dict[str, Any] = {
        Attr.INTERRUPTION_SOURCE: notice.source,
        Attr.INTERRUPTION_STEP: step,
        Attr.INTERRUPTION_DEADLINE_ASSUMED: notice.deadline_assumed,
    }
    if notice.deadline_ns is not None:
        attrs[Attr.INTERRUPTION_DEADLINE_S] = round(
            (notice.deadline_ns - notice.received_ns) / 1e9, 3
        )
    if notice.detail:
        attrs[Attr.INTERRUPTION_DETAIL] = notice.detail
    return attrs


def pending_record(
    root, notice: Notice, run_id: str | None, step: int, step_ns: int | None, framework: str
) -> InterruptionRecord:
    """The record written as soon as the notice comes, pointing at its ``root`` span."""
    sc = root.get_span_context()
    return InterruptionRecord(
        run_id=run_id or "",
        trace_id=f"{sc.trace_id:032x}",
        span_id=f"{sc.span_id:016x}",
        source=notice.source,
        notice_ns=notice.received_ns,
        deadline_ns=notice.deadline_ns,
        deadline_assumed=notice.deadline_assumed,
        step=step,
        framework=framework,
        last_step_ns=step_ns,
        last_step=step,
    )


def record_outcome(
    record: InterruptionRecord, path: str | None, step: int, error: BaseException | None
) -> None:
    """The emergency save's end on the record: what it saved, and ``saved``,
    ``missed_deadline`` (it ended past the deadline) or ``failed``."""
    record.save_end_ns = time.time_ns()
    record.checkpoint, record.checkpoint_step = path, step
    if error is not None:
        record.outcome, record.error = FAILED, f"{type(error).__name__}: {error}"
    elif record.deadline_ns is not None and record.save_end_ns > record.deadline_ns:
        record.outcome = MISSED
    else:
        record.outcome = SAVED


def interrupted_by(record: InterruptionRecord, restart_ns: int) -> tuple[list, dict[str, Any]]:
    """A resumed restore's link to the notice span, and its attributes: the record's and
    the time from the notice to ``restart_ns`` (this process's start)."""
    from opentelemetry.trace import Link, SpanContext, TraceFlags

    ctx = SpanContext(
        int(record.trace_id, 16),
        int(record.span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    attrs = {
        **as_attributes(record),
        Attr.INTERRUPTION_NOTICE_TO_START_S: round((restart_ns - record.notice_ns) / 1e9, 3),
    }
    return [Link(ctx, {Attr.LINK: "interrupted_by"})], attrs


def recovery_attributes(
    record: InterruptionRecord, op, now: int, started: int, restored_step: int, rate: float
) -> dict[str, Any]:
    """At the first step (``now``) after the restore ``op`` of a process started at
    ``started``: its startup and recovery time, the steps lost, what the time from the
    notice to this process's start and the restore cost."""
    notice_to_start_s = (started - record.notice_ns) / 1e9
    rto_s = (now - op.start_ns) / 1e9
    lost = max(0, (record.last_step or record.step) - restored_step)
    return {
        Attr.INTERRUPTION_STARTUP_S: round(max(0, op.start_ns - started) / 1e9, 3),
        Attr.INTERRUPTION_RECOVERY_S: round((now - record.notice_ns) / 1e9, 3),
        Attr.INTERRUPTION_STEPS_LOST: lost,
        Attr.INTERRUPTION_RESTORED_STEP: restored_step,
        Attr.INTERRUPTION_COST_PER_HOUR: rate,
        Attr.INTERRUPTION_NOTICE_TO_START_COST: round(notice_to_start_s / 3600 * rate, 4),
        Attr.INTERRUPTION_RESTORE_COST: round(rto_s / 3600 * rate, 4),
    }


__all__ = [
    "interrupted_by",
    "notice_attributes",
    "pending_record",
    "record_outcome",
    "recovery_attributes",
]
