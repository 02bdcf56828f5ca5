"""Grouping trace operations into like configurations, each a row of the report.

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

from ckptprof.memory import PEAK_RSS, TRAINING_RSS
from ckptprof.phases import Attr
from ckptprof.report.breakdown import (
    AfterResume,
    OperationGroup,
    OperationRow,
    RankSpread,
    Reads,
    ResumeMemory,
)
from ckptprof.report.checkpoint_cost import time_to_state, written_bytes
from ckptprof.report.comparison import ASYNC
from ckptprof.report.hints_group import group_hints
from ckptprof.report.medians import (
    build_breakdown,
    median_int,
    median_of,
    sort_value,
    spread,
    verify_coverage,
)
from ckptprof.report.outside import named_outside
from ckptprof.report.records import TraceOperation
from ckptprof.report.skew import skews

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
    (Attr.SAVE_BACKGROUND, "background"),  # an async save's background half, apart
)


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
        steps=int(median_of(op.attr(Attr.AFTER_RESUME_STEPS) for op in timed) or 0),
        step_median_s=median_of(op.attr(step) for op in timed) or 0.0,
        before_save_step_median_s=median_of(
            op.attr(Attr.AFTER_RESUME_BEFORE_SAVE_STEP_MEDIAN_S) for op in timed
        ),
        slowdown=median_of(op.attr(Attr.AFTER_RESUME_SLOWDOWN) for op in timed),
    )


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
        elif key == "background":
            parts.append("background" if value else "")
        else:
            parts.append(f"{_LABEL_PREFIX.get(key, '')}{value}")
    return " ".join(p for p in parts if p)


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
        return (kind != "restore", [(label, sort_value(v)) for label, v in config])

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
            breakdown = build_breakdown(
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
                breakdown.state_s = spread(time_to_state(op) for op in critical)
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
            # an async save's blocking part is a copy into memory: no share of the ceiling
            write_ceiling_gbps=None
            if any(op.attr(Attr.STRATEGY) == ASYNC for op in good)
            else median_of(op.attr(Attr.SAVE_CEILING_GBPS) for op in good),
            written_bytes=median_int(written_bytes(op) for op in good) if kind == "save" else None,
            skews=skews(kind, instances),
        )
        group.hints = group_hints(group)
        group.verify_coverage = verify_coverage(config_map.get("verify"), breakdown)
        groups.append(group)
    return groups
