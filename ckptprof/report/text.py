"""The whole report as plain text for a terminal: results sweeps (text_sweep.py), trace
groups (text_group.py), each save beside its restore, checkpoint intervals and the
operations cut short, blank-line separated."""

from __future__ import annotations

from ckptprof.report.aggregate import Report, aggregate
from ckptprof.report.cut_short import cut_short_lines
from ckptprof.report.records import ReportData
from ckptprof.report.text_group import render_group
from ckptprof.report.text_sweep import render_sweep
from ckptprof.units import UNITS_NOTE, fmt_gbps, fmt_pct, fmt_s


def render_save_restore(pairs) -> list[str]:
    """Each checkpoint's save beside its restore: GB/s both ways and their ratio."""
    lines = ["save vs restore of the same checkpoint (write/read as MLPerf Storage reports it):"]
    for p in pairs:
        what = "blocking part of the async save" if p.blocking_only else "save"
        ratio = f"{p.ratio:.2f}" if p.ratio is not None else "-"
        lines.append(f"  {p.location} ({p.strategy or 'save'}, median of {p.saves})")
        lines.append(
            f"    {what} {fmt_s(p.save_s)} s, {fmt_gbps(p.save_gbps)} GB/s; restore "
            f"({p.restore_label}) {fmt_s(p.restore_s)} s, {fmt_gbps(p.restore_gbps)} GB/s; "
            f"write/read ratio {ratio}"
        )
    return lines


def render_intervals(intervals) -> list[str]:
    """The checkpoint interval each save's cost asks for at the given MTBI (Young/Daly)."""
    mtbi = intervals[0].mtbi_s
    lines = [
        f"checkpoint interval for a mean time between interruptions of {_duration(mtbi)} "
        "(Young/Daly: sqrt(2 x save x MTBI)):"
    ]
    for i in intervals:
        restore = f", restores {fmt_pct(i.restore_share)}" if i.restore_share is not None else ""
        lines.append(
            f"  {i.location}: save {fmt_s(i.save_s)} s -> every {_duration(i.interval_s)}; "
            f"saving takes {fmt_pct(i.save_share)} of the time, work lost to interruptions "
            f"{fmt_pct(i.lost_share)}{restore} (total {fmt_pct(i.overhead_share)})"
        )
    return lines


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def render_text(report: Report | ReportData, by: str = "phase") -> str:
    """The whole report: results sweeps first, then trace groups, blank-line separated.

    Args:
        report: from :func:`ckptprof.report.aggregate` (or straight from ``load``,
            which is then aggregated here).
        by: ``phase`` for medians per phase, ``run`` for one row per operation.
    """
    if isinstance(report, ReportData):
        report = aggregate(report)
    blocks = [render_sweep(s, by) for s in report.sweeps]
    blocks += [render_group(g, by) for g in report.groups]
    if report.save_restore:
        blocks.append(render_save_restore(report.save_restore))
    if report.intervals:
        blocks.append(render_intervals(report.intervals))
    if report.cut_short:
        blocks.append(cut_short_lines(report.cut_short))
    blocks.append([UNITS_NOTE])  # said once, for every number above
    return "\n\n".join("\n".join(block) for block in blocks) + "\n"
