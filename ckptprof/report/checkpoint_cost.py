"""A save beside the restore of the same checkpoint, and the checkpoint interval its cost asks for.

MLPerf Storage reports a checkpoint's write and read bandwidth side by side; here a
save and a restore are paired by the checkpoint they touched (``ckpt.storage.uri``),
and their ratio is write GB/s over read GB/s.

The interval: a save that blocks training for C seconds, taken every τ seconds, costs
C/τ of the time; an interruption, on average every M seconds (the mean time between
interruptions a person gives, e.g. Spot's), loses τ/2 of work since the last save, τ/(2M)
of the time. Young's (and Daly's first-order) optimum is τ = √(2·C·M); the restore adds
R/M whatever τ is.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING

from ckptprof.phases import Attr, Phase

if TYPE_CHECKING:
    from ckptprof.report.records import ResultsFile, TraceOperation


@dataclass(frozen=True)
class SaveRestore:
    """The median save of one checkpoint and its best median restore."""

    location: str
    strategy: str | None
    save_s: float  # the blocking part for an async save
    save_bytes: int
    restore_s: float  # list -> reshard (its first step left out)
    restore_bytes: int
    restore_label: str  # which restore: its cache state, concurrency, strategy
    saves: int
    blocking_only: bool = False  # an async save: save_s is what blocked training

    @property
    def save_gbps(self) -> float:
        return self.save_bytes / self.save_s / 1e9 if self.save_s else 0.0

    @property
    def restore_gbps(self) -> float:
        return self.restore_bytes / self.restore_s / 1e9 if self.restore_s else 0.0

    @property
    def ratio(self) -> float | None:
        """Write GB/s over read GB/s (MLPerf Storage's write/read ratio)."""
        return self.save_gbps / self.restore_gbps if self.restore_gbps else None


@dataclass(frozen=True)
class CheckpointInterval:
    """The checkpoint interval that minimises lost time (Young/Daly) for one save cost."""

    location: str
    save_s: float
    mtbi_s: float
    restore_s: float | None = None

    @property
    def interval_s(self) -> float:
        return math.sqrt(2 * self.save_s * self.mtbi_s)

    @property
    def save_share(self) -> float:
        """Of the training time, the share spent blocked in saves at that interval."""
        return self.save_s / self.interval_s

    @property
    def lost_share(self) -> float:
        """The share lost to work redone after interruptions (τ/2 each, every MTBI)."""
        return self.interval_s / (2 * self.mtbi_s)

    @property
    def restore_share(self) -> float | None:
        return self.restore_s / self.mtbi_s if self.restore_s is not None else None

    @property
    def overhead_share(self) -> float:
        return self.save_share + self.lost_share + (self.restore_share or 0.0)


def pair_saves(
    operations: Sequence[TraceOperation], results: Sequence[ResultsFile]
) -> list[SaveRestore]:
    """Every checkpoint with both a save and a restore in what was read."""
    saves: dict[tuple[str, str | None], list[TraceOperation]] = defaultdict(list)
    for op in operations:
        location = op.attr(Attr.STORAGE_URI)
        if op.kind == "save" and location and not op.failed and not op.attr(Attr.SAVE_BACKGROUND):
            saves[(str(location), op.attr(Attr.STRATEGY))].append(op)
    restores = _restores(operations, results)
    pairs = []
    for (location, strategy), ops in sorted(saves.items(), key=lambda kv: str(kv[0])):
        best = restores.get(location)
        if best is None:
            continue
        restore_s, restore_bytes, label = best
        pairs.append(
            SaveRestore(
                location=location,
                strategy=strategy,
                save_s=median(op.wall_s for op in ops),
                save_bytes=int(median(written_bytes(op) for op in ops)),
                restore_s=restore_s,
                restore_bytes=restore_bytes,
                restore_label=label,
                saves=len(ops),
                blocking_only=strategy == "async",
            )
        )
    return pairs


def written_bytes(op: TraceOperation) -> int:
    """What a save wrote: its write (or upload, or async stage) phase's bytes."""
    phases = [op.phases.get(p.value) for p in (Phase.WRITE, Phase.STAGE)]
    return max((p.nbytes or 0) for p in phases if p is not None) if any(phases) else 0


def _restores(
    operations: Sequence[TraceOperation], results: Sequence[ResultsFile]
) -> dict[str, tuple[float, int, str]]:
    """Per checkpoint, the fastest median restore among its configurations (cold ones
    first: a restore after a failure starts cold), list -> reshard: (seconds, bytes,
    label)."""
    cells: dict[str, dict[tuple, list[tuple[float, int]]]] = defaultdict(lambda: defaultdict(list))
    for op in operations:
        location = op.attr(Attr.STORAGE_URI)
        if op.kind != "restore" or not location or op.failed:
            continue
        fetch = op.phases.get(Phase.FETCH.value)
        key = (op.attr(Attr.CACHE), op.attr(Attr.CONCURRENCY), op.attr(Attr.STRATEGY))
        cells[str(location)][key].append((time_to_state(op), (fetch.nbytes or 0) if fetch else 0))
    for result in results:
        location = result.environment.get("storage.uri")
        if not location:
            continue
        for run in result.runs:
            fetch = run.phases.get(Phase.FETCH.value)
            nbytes = bytes_read(run) or ((fetch.nbytes or 0) if fetch else 0)
            key = (run.cache, run.concurrency, run.strategy)
            cells[str(location)][key].append((time_to_state(run), nbytes))
    best: dict[str, tuple[float, int, str]] = {}
    for location, by_key in cells.items():
        cold = {k: v for k, v in by_key.items() if k[0] == "cold"} or by_key
        key, runs = min(cold.items(), key=lambda kv: median(w for w, _ in kv[1]))
        cache, concurrency, strategy = key
        label = (
            " ".join(
                str(part)
                for part in (cache, f"c={concurrency}" if concurrency else None, strategy)
                if part
            )
            + ", list->reshard"
        )
        best[location] = (median(w for w, _ in runs), int(median(b for _, b in runs)), label)
    return best


def bytes_read(run) -> int | None:
    """What a synthetic restore's read GB/s is of: the bytes it read (one rank of a job
    reads its share: the whole checkpoint's size would be 4x too fast for one of four),
    never more than the checkpoint's (a re-read is not throughput)."""
    if run.read_bytes and run.nbytes:
        return min(run.read_bytes, run.nbytes)
    return run.read_bytes or run.nbytes


def time_to_state(run) -> float:
    """A restore's time to state, list -> reshard: its wall time less its first step (what
    the storage and the loader control; the read bandwidth MLPerf Storage sets beside the
    write is the storage's, not the step's)."""
    step = run.phases.get(Phase.FIRST_STEP.value)
    return run.wall_s - (step.busy_s if step is not None else 0.0)


def intervals(
    pairs: Sequence[SaveRestore], operations: Sequence[TraceOperation], mtbi_s: float
) -> list[CheckpointInterval]:
    """The Young/Daly interval for each checkpoint's save (with its restore when paired)."""
    restore_of = {p.location: p.restore_s for p in pairs}
    saves: dict[str, list[float]] = defaultdict(list)
    for op in operations:
        location = op.attr(Attr.STORAGE_URI) or op.attr(Attr.PATH) or "?"
        if op.kind == "save" and not op.failed and not op.attr(Attr.SAVE_BACKGROUND):
            saves[str(location)].append(op.wall_s)
    return [
        CheckpointInterval(location, median(walls), mtbi_s, restore_of.get(location))
        for location, walls in sorted(saves.items())
        if median(walls) > 0
    ]


__all__ = [
    "CheckpointInterval",
    "bytes_read",
    "SaveRestore",
    "intervals",
    "pair_saves",
    "time_to_state",
    "written_bytes",
]
