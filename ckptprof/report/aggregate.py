"""Turning everything ``load`` read into the :class:`Report` the renderers print: the
trace operations grouped (:mod:`ckptprof.report.groups`), each results file's sweep
(:mod:`ckptprof.report.sweep`), saves paired with restores and, given a mean time
between interruptions, each save's checkpoint interval.
"""

from __future__ import annotations

from ckptprof.report.breakdown import Report
from ckptprof.report.checkpoint_cost import intervals, pair_saves
from ckptprof.report.groups import group_operations
from ckptprof.report.records import ReportData
from ckptprof.report.sweep import sweep_from_results


def aggregate(data: ReportData, mtbi_s: float | None = None) -> Report:
    """Group and summarise everything ``load`` read; hints are attached here. With
    ``mtbi_s`` (a mean time between interruptions), each save's checkpoint interval."""
    pairs = pair_saves(data.operations, data.results)
    return Report(
        groups=group_operations(data.operations),
        sweeps=[sweep_from_results(r) for r in data.results],
        warnings=list(data.warnings),
        save_restore=pairs,
        intervals=intervals(pairs, data.operations, mtbi_s) if mtbi_s else [],
        cut_short=list(data.cut_short),
    )
