"""A save or restore in numbers: what each phase did (its intervals, bytes, files,
attributes) and the finished operation's summary, which the recorder turns into phase
spans and the one-line log summary prints. A phase's busy time is the union of its
intervals, so overlapping stretches (from several threads) are counted once.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ckptprof.phases import Attr

AttrValue = str | bool | int | float


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    total, cur_start, cur_end = 0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def uncovered(start: int, end: int, intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``[start, end)`` not covered by ``intervals`` (time inside a call that
    was not spent in its timed parts: a loader's parsing between its reads)."""
    out, cursor = [], start
    for s, e in sorted(intervals):
        if s > cursor:
            out.append((cursor, s))
        cursor = max(cursor, e)
    if end > cursor:
        out.append((cursor, end))
    return out


@dataclass
class FileRecord:
    path: str
    nbytes: int
    seconds: float
    start_ns: int | None = None


@dataclass
class PhaseStats:
    """What one phase did within one operation; becomes the phase span."""

    phase: str
    intervals: list[tuple[int, int]] = field(default_factory=list)
    nbytes: int = 0
    files: list[FileRecord] = field(default_factory=list)
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    #: events on the phase's span, ``(name, time ns, attributes)`` (a stall, while open)
    events: list[tuple[str, int, dict]] = field(default_factory=list)

    @property
    def start_ns(self) -> int:
        return min(s for s, _ in self.intervals)

    @property
    def end_ns(self) -> int:
        return max(e for _, e in self.intervals)

    @property
    def busy_s(self) -> float:
        return _union_ns(self.intervals) / 1e9

    def span_attributes(self) -> dict[str, AttrValue]:
        attrs: dict[str, AttrValue] = {Attr.BUSY_S: round(self.busy_s, 6)}
        if self.nbytes:
            attrs[Attr.BYTES] = self.nbytes
            if self.busy_s > 0:
                attrs[Attr.THROUGHPUT_GBPS] = round(self.nbytes / self.busy_s / 1e9, 4)
        if self.files:
            lat = [f.seconds for f in self.files]
            attrs[Attr.FILES] = len(self.files)
            attrs[Attr.FILE_LATENCY_MIN_S] = round(min(lat), 6)
            attrs[Attr.FILE_LATENCY_MEDIAN_S] = round(statistics.median(lat), 6)
            attrs[Attr.FILE_LATENCY_MAX_S] = round(max(lat), 6)
        attrs.update(self.attributes)
        return attrs


@dataclass
class OperationSummary:
    """A finished save/restore in numbers (what the one-line log summary prints)."""

    kind: str
    wall_s: float
    phases: dict[str, PhaseStats]
    attributes: dict[str, AttrValue]

    @property
    def phase_sum_s(self) -> float:
        return sum(p.busy_s for p in self.phases.values())

    def largest_phase(self) -> tuple[str, float] | None:
        if not self.phases:
            return None
        name, stats = max(self.phases.items(), key=lambda kv: kv[1].busy_s)
        return name, stats.busy_s

    def metrics(self, prefix: str = "ckptprof") -> dict[str, float]:
        """Seconds and bytes as flat scalars for a framework's logger (TensorBoard, W&B,
        MLflow, CSV): ``ckptprof/restore_s`` (the RTO), ``ckptprof/restore/fetch_s`` …"""
        out = {f"{prefix}/{self.kind}_s": round(self.wall_s, 6)}
        for name, stats in self.phases.items():
            out[f"{prefix}/{self.kind}/{name}_s"] = round(stats.busy_s, 6)
        moved = "fetch" if self.kind == "restore" else "write"
        if moved in self.phases and self.phases[moved].nbytes:
            out[f"{prefix}/{self.kind}/{moved}_bytes"] = float(self.phases[moved].nbytes)
        return out

    def one_line(self) -> str:
        label = "RTO" if self.kind == "restore" else "save"
        parts = [f"ckptprof: {label} {self.wall_s:.3f}s"]
        largest = self.largest_phase()
        if largest:
            share = largest[1] / self.wall_s * 100 if self.wall_s else 0.0
            parts.append(f"largest phase {largest[0]} {largest[1]:.3f}s ({share:.0f}%)")
        parts.append(" ".join(f"{n}={p.busy_s:.3f}s" for n, p in self.phases.items()))
        return "; ".join(parts)
