"""A results file's sweep table: one row per strategy × cache state × concurrency, every
figure from the runs (their medians as ``summarize`` gives them: the file's ``summary``
was recomputed when read, so the table, the hints and ``compare`` agree).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ckptprof.phases import Phase
from ckptprof.report.breakdown import Breakdown, OperationRow, PhaseRow, Sweep, SweepRow
from ckptprof.report.checkpoint_cost import time_to_state
from ckptprof.report.hints_sweep import sweep_hints
from ckptprof.report.medians import (
    build_breakdown,
    median_int,
    median_of,
    phase_order,
    sort_value,
    spread,
    verify_coverage,
)
from ckptprof.report.records import ResultsFile, ResultsRun
from ckptprof.report.skew import results_skews
from ckptprof.results_schema import STEP_ESTIMATE, STEP_USER, fetch_unbounded, fraction_of_ceiling

_CACHE_ORDER = {"cold": 0, "hot": 1}


def _summary_for(results: ResultsFile, key: tuple) -> dict[str, Any] | None:
    for entry in results.summary:
        if (entry.get("strategy"), entry.get("cache"), entry.get("concurrency")) == key:
            return entry
    return None


def _apply_summary(b: Breakdown, entry: dict[str, Any]) -> None:
    """The medians ``summarize`` gives the cell's runs, the ones the runner writes."""
    rto = entry.get("rto_s") or {}
    for attr, key in (("wall_median_s", "median"), ("wall_min_s", "min"), ("wall_max_s", "max")):
        if isinstance(rto.get(key), (int, float)):
            setattr(b, attr, float(rto[key]))
    if isinstance(entry.get("repeats"), int):
        b.repeats = entry["repeats"]
    phases = entry.get("phases") or {}
    for name, stats in phases.items():
        median = stats.get("median_s") if isinstance(stats, dict) else None
        if not isinstance(median, (int, float)):
            continue
        row = b.phase(name)
        if row is None:
            b.phases.append(PhaseRow(name, float(median), None, None, None, None))
        else:
            row.busy_s = float(median)
    b.phases = [b.phase(n) for n in phase_order(b.kind, [r.phase for r in b.phases])]
    for row in b.phases:
        row.share = row.busy_s / b.wall_median_s if b.wall_median_s > 0 else None


def _run_row(run: ResultsRun) -> OperationRow:
    return OperationRow(
        wall_s=run.wall_s,
        phases={name: s.busy_s for name, s in run.phases.items()},
        cache=run.cache,
        concurrency=run.concurrency,
        repeat=run.repeat,
    )


def _sweep_row(b: Breakdown, fetch_gbps: float | None, fraction: float | None) -> SweepRow:
    """Where a fraction of the ceiling applies (a cold read, a ceiling): a fused or lazy
    fetch is no storage read of its own, so none is computed; one above 1 (the ceiling is
    an estimate) is capped at 1 and marked."""
    if fraction is None:
        return SweepRow(b, fetch_gbps, None)
    mark = fetch_unbounded({r.phase: {"fused": r.fused, "lazy": r.lazy} for r in b.phases})
    if mark:
        return SweepRow(b, fetch_gbps, None, mark)
    if fraction > 1.0:
        return SweepRow(b, fetch_gbps, 1.0, "capped", fraction)
    return SweepRow(b, fetch_gbps, fraction)


def sweep_from_results(results: ResultsFile) -> Sweep:
    """The sweep table of one results file, one row per strategy × cache state ×
    concurrency."""
    cells = _cells(results)
    strategies = [s for s in dict.fromkeys(k[0] for k in cells) if s]
    rows = []
    for key in sorted(cells, key=lambda k: _cell_order(k, strategies)):
        rows.append(_cell_row(results, key, cells[key], _summary_for(results, key), strategies))
    sweep = Sweep(
        path=results.path,
        version=results.version,
        created=results.created,
        spec=results.spec,
        environment=results.environment,
        ceiling=results.ceiling,
        rows=rows,
        operations=[_run_row(r) for r in results.runs],
        options=results.options,
        reliability=results.reliability,
        job=results.job,
        skews=results_skews(results.rank_runs),
    )
    sweep.hints = sweep_hints(sweep)
    sweep.verify_coverage = verify_coverage(
        results.options.get("verify"), rows[0].breakdown if rows else None
    )
    return sweep


def _cells(results: ResultsFile) -> dict[tuple[Any, Any, Any], list[ResultsRun]]:
    """The runs of each strategy × cache state × concurrency."""
    cells: dict[tuple[Any, Any, Any], list[ResultsRun]] = defaultdict(list)
    for run in results.runs:
        cells[(run.strategy, run.cache, run.concurrency)].append(run)
    return cells


def _cell_order(key: tuple[Any, Any, Any], strategies: list[Any]) -> tuple:
    """Cold before hot, then by concurrency, then the strategies in the order they ran."""
    strategy, cache, conc = key
    rank = strategies.index(strategy) if strategy in strategies else -1
    return (_CACHE_ORDER.get(cache, 2), str(cache), sort_value(conc), rank)


def _cell_label(key: tuple[Any, Any, Any], strategies: list[Any]) -> str:
    """The row's name: its strategy (where several ran), cache state and concurrency."""
    strategy, cache, conc = key
    label = " ".join(
        p
        for p in (
            strategy if len(strategies) > 1 else "",
            str(cache) if cache else "",
            f"c={conc}" if conc else "",
        )
        if p
    )
    return label or "runs"


def _cell_breakdown(
    key: tuple[Any, Any, Any], runs: list[ResultsRun], entry: dict[str, Any] | None, label: str
) -> Breakdown:
    """The medians of one cell's runs (``entry``: their summary, where ``summarize`` made
    one)."""
    strategy, cache, conc = key
    b = build_breakdown(
        label=label,
        kind="restore",
        walls=[r.wall_s for r in runs],
        samples=[r.phases for r in runs],
        cache=cache,
        concurrency=conc,
        residency=(r.resident_fraction for r in runs),
        cache_method=next((r.cache_method for r in runs if r.cache_method), None),
    )
    if entry is not None:
        _apply_summary(b, entry)
    b.strategy = strategy
    b.synthetic = True
    b.state_s = spread(time_to_state(r) for r in runs)
    b.peak_rss_bytes = max((r.peak_rss_bytes or 0 for r in runs), default=0) or None
    b.read_bytes = median_int(r.read_bytes for r in runs)
    b.first_step_estimate_s = median_of(
        r.first_step_estimate_s for r in runs if r.first_step == STEP_ESTIMATE
    )
    b.first_step_tokens = next((r.first_step_tokens for r in runs if r.first_step_tokens), None)
    b.first_step_given = all(r.first_step == STEP_USER for r in runs)
    return b


def _cell_row(
    results: ResultsFile,
    key: tuple[Any, Any, Any],
    runs: list[ResultsRun],
    entry: dict[str, Any] | None,
    strategies: list[Any],
) -> SweepRow:
    """One cell's row: its breakdown, fetch throughput and fraction of the ceiling (as
    ``summarize`` gives them, where it does)."""
    b = _cell_breakdown(key, runs, entry, _cell_label(key, strategies))
    fetch = b.phase(Phase.FETCH)
    fetch_gbps = entry.get("fetch_gbps_median") if entry else None
    if not isinstance(fetch_gbps, (int, float)):
        fetch_gbps = fetch.gbps if fetch else None
    fraction = entry.get("fraction_of_ceiling") if entry else None
    if not isinstance(fraction, (int, float)):
        ceiling = results.ceiling
        fraction = fraction_of_ceiling(fetch_gbps, ceiling and ceiling.read_gbps, key[1])
    return _sweep_row(b, fetch_gbps, fraction)
