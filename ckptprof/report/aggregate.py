"""Grouping like operations and taking medians: the numbers the report prints.

A restore's RTO is its wall time (the critical path); phase times are each
phase's ``busy_s`` (docs/design.md §2), which may add up to more than the wall time
when phases overlap. With several ranks, one restore is the set of rank roots
that share a run (``ckpt.run_id`` + ``ckpt.repeat``): its RTO is the slowest
rank's, and that rank's phases are the ones shown.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from ckptprof.manifest import VERIFY_MODES
from ckptprof.memory import PEAK_RSS, TRAINING_RSS
from ckptprof.phases import RESTORE_PHASES, SAVE_PHASES, Attr, Phase
from ckptprof.report import hints as hint_rules
from ckptprof.report.breakdown import (
    AfterResume,
    Breakdown,
    OperationGroup,
    OperationRow,
    PhaseRow,
    RankSpread,
    Reads,
    Report,
    ResumeMemory,
    Sweep,
    SweepRow,
    VerifyCoverage,
)
from ckptprof.report.checkpoint_cost import intervals, pair_saves, time_to_state, written_bytes
from ckptprof.report.load import (
    PhaseSample,
    ReportData,
    ResultsFile,
    ResultsRun,
    TraceOperation,
)
from ckptprof.report.outside import named_outside
from ckptprof.report.skew import results_skews, skews
from ckptprof.results_schema import fetch_unbounded, fraction_of_ceiling

# (attribute, short label) that make two operations "the same configuration".
CONFIG_ATTRS: tuple[tuple[str, str], ...] = (
    (Attr.FRAMEWORK, "framework"),
    (Attr.MODEL, "model"),
    (Attr.FORMAT, "format"),
    (Attr.LAYOUT, "layout"),
    (Attr.STORAGE_KIND, "storage"),
    (Attr.VERIFY_MODE, "verify"),
    (Attr.STRATEGY, "strategy"),
    (Attr.CACHE, "cache"),
    (Attr.CONCURRENCY, "concurrency"),
    (Attr.WORLD_SIZE, "world_size"),
    (Attr.SAVED_WORLD_SIZE, "saved_world_size"),
)
_CACHE_ORDER = {"cold": 0, "hot": 1}


def _reads(instances: list[list[TraceOperation]]) -> Reads | None:
    """Bytes fetched by every rank of each restore against the checkpoint's size."""
    found = []
    for inst in instances:
        sizes = [op.attr(Attr.CHECKPOINT_BYTES) for op in inst]
        sizes = [s for s in sizes if isinstance(s, int) and s > 0]
        read = [op.phases["fetch"].nbytes for op in inst if "fetch" in op.phases]
        if sizes and read and all(isinstance(r, int) for r in read):
            found.append((len(inst), sum(read), max(sizes)))
    if not found:
        return None
    return Reads(
        ranks=max(r for r, _, _ in found),
        read_bytes=int(statistics.median(b for _, b, _ in found)),
        checkpoint_bytes=int(statistics.median(c for _, _, c in found)),
    )


def _memory(ops: Sequence[TraceOperation]) -> ResumeMemory | None:
    pairs = [
        (op.attr(PEAK_RSS), op.attr(TRAINING_RSS))
        for op in ops
        if isinstance(op.attr(PEAK_RSS), int) and isinstance(op.attr(TRAINING_RSS), int)
    ]
    if not pairs:
        return None
    return ResumeMemory(
        int(statistics.median(p for p, _ in pairs)), int(statistics.median(t for _, t in pairs))
    )


def after_resume(ops: Sequence[TraceOperation]) -> AfterResume | None:
    """Medians over the resumes that timed their steps (``ckpt.after_resume.*``)."""
    step = Attr.AFTER_RESUME_STEP_MEDIAN_S
    timed = [op for op in ops if isinstance(op.attr(step), (int, float))]
    if not timed:
        return None
    return AfterResume(
        resumes=len(timed),
        steps=int(_median(op.attr(Attr.AFTER_RESUME_STEPS) for op in timed) or 0),
        step_median_s=_median(op.attr(step) for op in timed) or 0.0,
        before_save_step_median_s=_median(
            op.attr(Attr.AFTER_RESUME_BEFORE_SAVE_STEP_MEDIAN_S) for op in timed
        ),
        slowdown=_median(op.attr(Attr.AFTER_RESUME_SLOWDOWN) for op in timed),
    )


# --------------------------------------------------------------------- helpers
def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _spread(values: Iterable[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    found = sorted(values)
    return statistics.median(found), found[0], found[-1]


def _median_int(values: Iterable[int | None]) -> int | None:
    value = _median(values)
    return None if value is None else int(round(value))


def _sort_value(value: Any) -> tuple[int, float, str]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def phase_order(kind: str, names: Iterable[str]) -> list[str]:
    """Canonical order (docs/design.md §2) first, then other known phases, then the rest."""
    canonical = [p.value for p in (RESTORE_PHASES if kind == "restore" else SAVE_PHASES)]
    known = canonical + [p.value for p in Phase if p.value not in canonical]
    present = set(names)
    return [n for n in known if n in present] + sorted(present - set(known))


def phase_rows(
    kind: str, samples: Sequence[dict[str, PhaseSample]], wall_s: float
) -> list[PhaseRow]:
    """One row per phase present in any operation, with medians over those operations."""
    names = phase_order(kind, {name for phases in samples for name in phases})
    rows = []
    for name in names:
        found = [phases[name] for phases in samples if name in phases]
        busy = _median(s.busy_s for s in found) or 0.0
        computed = [s.nbytes / s.busy_s / 1e9 for s in found if s.nbytes and s.busy_s > 0]
        gbps = _median(computed) if computed else _median(s.gbps for s in found)
        reasons = [s.emulation_reason for s in found if s.emulation_reason]
        fused = [s.fused for s in found if s.fused]
        rows.append(
            PhaseRow(
                phase=name,
                busy_s=busy,
                share=busy / wall_s if wall_s > 0 else None,
                nbytes=_median_int(s.nbytes for s in found),
                files=_median_int(s.files for s in found),
                gbps=gbps,
                emulated=any(s.emulated for s in found),
                emulation_reason=reasons[0] if reasons else None,
                of_bytes=_median_int(s.of_bytes for s in found),
                details={
                    key: statistics.median(s.details[key] for s in found if key in s.details)
                    for key in sorted({k for s in found for k in s.details})
                },
                fused=max(set(fused), key=fused.count) if fused else None,
                lazy=any(s.lazy for s in found),
            )
        )
    return rows


def _breakdown(
    label: str,
    kind: str,
    walls: Sequence[float],
    samples: Sequence[dict[str, PhaseSample]],
    cache: str | None,
    concurrency: int | None,
    residency: Iterable[float | None],
    cache_method: str | None,
) -> Breakdown:
    wall = statistics.median(walls)
    resident = [r for r in residency if r is not None]
    return Breakdown(
        label=label,
        kind=kind,
        repeats=len(walls),
        wall_median_s=wall,
        wall_min_s=min(walls),
        wall_max_s=max(walls),
        phases=phase_rows(kind, samples, wall),
        cache=cache,
        concurrency=concurrency,
        resident_fraction=max(resident) if resident else None,
        cache_method=cache_method,
    )


# --------------------------------------------------------------------- traces
_LABEL_PREFIX = {"concurrency": "c=", "world_size": "ws=", "saved_world_size": "saved_ws="}


def short_label(config: dict[str, Any]) -> str:
    """A compact name for a configuration, for plots and merged hints ("torch cold c=8")."""
    parts = []
    for key, value in config.items():
        if key == "framework" and value == "synthetic":
            continue
        if key == "layout" and value == config.get("format"):  # "safetensors", once
            continue
        if key == "verify":
            parts.append(f"verify={value}")
        else:
            parts.append(f"{_LABEL_PREFIX.get(key, '')}{value}")
    return " ".join(parts)


def _config(op: TraceOperation) -> tuple[tuple[str, Any], ...]:
    return tuple((label, op.attributes[key]) for key, label in CONFIG_ATTRS if key in op.attributes)


def rank_instances(ops: Sequence[TraceOperation]) -> list[list[TraceOperation]]:
    """Cluster rank roots into restores: same run (or trace), repeat and step.

    When one rank appears several times in a cluster (repeats without a
    ``ckpt.repeat``), its n-th operation by start time joins the n-th restore.
    """
    clusters: dict[tuple, list[TraceOperation]] = defaultdict(list)
    for op in ops:
        run = op.attr(Attr.RUN_ID) or op.trace_id
        clusters[(str(run), str(op.attr(Attr.REPEAT)), str(op.attr(Attr.STEP)))].append(op)
    instances: list[list[TraceOperation]] = []
    for members in clusters.values():
        by_rank: dict[Any, list[TraceOperation]] = defaultdict(list)
        for op in members:
            by_rank[op.attr(Attr.RANK)].append(op)
        depth = max(len(v) for v in by_rank.values())
        for series in by_rank.values():
            series.sort(key=lambda o: (o.start is None, o.start or 0))
        for index in range(depth):
            instances.append([series[index] for series in by_rank.values() if index < len(series)])
    return instances


def _rank_spread(instances: list[list[TraceOperation]]) -> RankSpread | None:
    if not any(len({op.attr(Attr.RANK) for op in inst}) > 1 for inst in instances):
        return None
    walls: dict[int, list[float]] = defaultdict(list)
    hosts: dict[int, str] = {}
    for inst in instances:
        for op in inst:
            rank = op.attr(Attr.RANK)
            if isinstance(rank, int):
                walls[rank].append(op.wall_s)
                if op.resource.get("host.name"):
                    hosts[rank] = str(op.resource["host.name"])
    if len(walls) < 2:
        return None
    medians = {rank: statistics.median(v) for rank, v in walls.items()}
    slowest = max(medians, key=lambda r: (medians[r], -r))
    fastest = min(medians, key=lambda r: (medians[r], r))
    host = hosts.get(slowest) if len(set(hosts.values())) > 1 else None
    return RankSpread(len(walls), slowest, medians[slowest], fastest, medians[fastest], host)


def _operation_row(op: TraceOperation) -> OperationRow:
    return OperationRow(
        wall_s=op.wall_s,
        phases={name: s.busy_s for name, s in op.phases.items()},
        cache=op.attr(Attr.CACHE),
        concurrency=op.attr(Attr.CONCURRENCY),
        repeat=op.attr(Attr.REPEAT),
        rank=op.attr(Attr.RANK),
        start=op.start.isoformat() if op.start else None,
        failed=op.failed,
    )


def verify_coverage(mode: Any, b: Breakdown | None) -> VerifyCoverage | None:
    """What the verify phase of ``b`` checked under ``mode`` (a manifest verify mode)."""
    if mode not in VERIFY_MODES or b is None:
        return None
    checked, fetched = b.phase(Phase.VERIFY), b.phase(Phase.FETCH)
    whole = checked.of_bytes if checked is not None else None
    if whole is None and fetched is not None:
        whole = fetched.nbytes
    return VerifyCoverage(mode, checked.nbytes or 0 if checked is not None else None, whole)


def _count(ops: Iterable[TraceOperation], key: str) -> int:
    total = 0
    for op in ops:
        value = op.attr(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            total += int(value)
    return total


def group_operations(operations: Sequence[TraceOperation]) -> list[OperationGroup]:
    """Restores first, then saves; within a kind, sorted by configuration."""
    buckets: dict[tuple[str, tuple], list[TraceOperation]] = defaultdict(list)
    for op in operations:
        buckets[(op.kind, _config(op))].append(op)

    def order(item):
        (kind, config), _ = item
        return (kind != "restore", [(label, _sort_value(v)) for label, v in config])

    groups = []
    for (kind, config), ops in sorted(buckets.items(), key=order):
        good = [op for op in ops if not op.failed]
        failed = [op for op in ops if op.failed]
        instances = rank_instances(good)
        critical = [max(inst, key=lambda o: o.wall_s) for inst in instances]
        config_map = dict(config)
        breakdown = None
        if critical:
            synthetic = config_map.get("framework") == "synthetic"
            breakdown = _breakdown(
                label=short_label(config_map) or kind,
                kind=kind,
                walls=[op.wall_s for op in critical],
                samples=[op.phases for op in critical],
                cache=config_map.get("cache"),
                concurrency=config_map.get("concurrency"),
                residency=(op.attr(Attr.CACHE_RESIDENT_FRACTION) for op in good),
                cache_method=next(
                    (op.attr(Attr.CACHE_METHOD) for op in good if op.attr(Attr.CACHE_METHOD)), None
                ),
            )
            breakdown.synthetic = synthetic
            breakdown.outside_named = named_outside([op.attributes for op in critical])
            if synthetic and kind == "restore":
                breakdown.state_s = _spread(time_to_state(op) for op in critical)
        ordered = sorted(ops, key=lambda o: (o.start is None, o.start or 0))
        group = OperationGroup(
            kind=kind,
            config=config_map,
            breakdown=breakdown,
            operations=[_operation_row(op) for op in ordered],
            ranks=_rank_spread(instances),
            failed=len(failed),
            failure=next((op.status_message for op in failed if op.status_message), None),
            retries=_count(ops, Attr.RETRIES),
            errors=_count(ops, Attr.ERRORS),
            after_resume=after_resume(ops) if kind == "restore" else None,
            reads=_reads(instances) if kind == "restore" else None,
            memory=_memory(ops) if kind == "restore" else None,
            write_ceiling_gbps=_median(op.attr(Attr.SAVE_CEILING_GBPS) for op in good),
            written_bytes=_median_int(written_bytes(op) for op in good) if kind == "save" else None,
            skews=skews(kind, instances),
        )
        group.hints = hint_rules.group_hints(group)
        group.verify_coverage = verify_coverage(config_map.get("verify"), breakdown)
        groups.append(group)
    return groups


# --------------------------------------------------------------------- results
def _summary_for(results: ResultsFile, key: tuple) -> dict[str, Any] | None:
    for entry in results.summary:
        if (entry.get("strategy"), entry.get("cache"), entry.get("concurrency")) == key:
            return entry
    return None


def _apply_summary(b: Breakdown, entry: dict[str, Any]) -> None:
    """Prefer the runner's own medians where it wrote them."""
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
    cells: dict[tuple[Any, Any, Any], list[ResultsRun]] = defaultdict(list)
    for run in results.runs:
        cells[(run.strategy, run.cache, run.concurrency)].append(run)
    for entry in results.summary:
        cells.setdefault((entry.get("strategy"), entry.get("cache"), entry.get("concurrency")), [])
    strategies = [s for s in dict.fromkeys(k[0] for k in cells) if s]

    def order(key):
        strategy, cache, conc = key
        rank = strategies.index(strategy) if strategy in strategies else -1
        return (_CACHE_ORDER.get(cache, 2), str(cache), _sort_value(conc), rank)

    ceiling = results.ceiling
    rows = []
    for key in sorted(cells, key=order):
        strategy, cache, conc = key
        runs = cells[key]
        entry = _summary_for(results, key)
        if not runs and entry is None:
            continue
        label = " ".join(
            p
            for p in (
                strategy if len(strategies) > 1 else "",
                str(cache) if cache else "",
                f"c={conc}" if conc else "",
            )
            if p
        )
        b = _breakdown(
            label=label or "runs",
            kind="restore",
            walls=[r.wall_s for r in runs] or [0.0],
            samples=[r.phases for r in runs],
            cache=cache,
            concurrency=conc,
            residency=(r.resident_fraction for r in runs),
            cache_method=next((r.cache_method for r in runs if r.cache_method), None),
        )
        if not runs:
            b.repeats = 0
        if entry is not None:
            _apply_summary(b, entry)
        b.strategy = strategy
        b.synthetic = True
        b.state_s = _spread(time_to_state(r) for r in runs) if runs else None
        b.peak_rss_bytes = max((r.peak_rss_bytes or 0 for r in runs), default=0) or None
        b.read_bytes = _median_int(r.read_bytes for r in runs)
        b.first_step_estimate_s = _median(
            r.first_step_estimate_s for r in runs if r.first_step == "estimated"
        )
        fetch = b.phase(Phase.FETCH)
        fetch_gbps = entry.get("fetch_gbps_median") if entry else None
        if not isinstance(fetch_gbps, (int, float)):
            fetch_gbps = fetch.gbps if fetch else None
        fraction = entry.get("fraction_of_ceiling") if entry else None
        if not isinstance(fraction, (int, float)):
            fraction = fraction_of_ceiling(fetch_gbps, ceiling and ceiling.read_gbps, cache)
        rows.append(_sweep_row(b, fetch_gbps, fraction))
    sweep = Sweep(
        path=results.path,
        version=results.version,
        created=results.created,
        spec=results.spec,
        environment=results.environment,
        ceiling=ceiling,
        rows=rows,
        operations=[_run_row(r) for r in results.runs],
        options=results.options,
        reliability=results.reliability,
        job=results.job,
        skews=results_skews(results.rank_runs),
    )
    sweep.hints = hint_rules.sweep_hints(sweep)
    sweep.verify_coverage = verify_coverage(
        results.options.get("verify"), rows[0].breakdown if rows else None
    )
    return sweep


# --------------------------------------------------------------------- entry
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
