"""One save or restore as a timeline: its phases (a phase that ran in pieces, as its busy
stretches) and, where recorded, each file's read, packed into lanes (the fetch streams in
flight at once). The HTML report draws it and
``ckptprof export --format perfetto`` writes it as tracks.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ckptprof.phases import (
    FILE_SPAN,
    NAMESPACE,
    PIECE_SPAN,
    PROGRESS_SPAN,
    RESTORE_SPAN,
    SAVE_SPAN,
    Attr,
)
from ckptprof.tracing.times import span_ns

ROOTS = {RESTORE_SPAN: "restore", SAVE_SPAN: "save"}


@dataclass
class Slice:
    """A named interval of a timeline (a phase, or one file's read on a lane)."""

    name: str
    start_ns: int
    end_ns: int
    lane: int = 0
    attributes: dict[str, Any] = field(default_factory=dict)
    phase: str = ""  # a file's read: the phase it belongs to (fetch, verify, deserialize)
    #: a phase that ran in pieces: its busy stretches (its ``ckpt.piece`` spans)
    pieces: list[tuple[int, int]] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def busy(self) -> list[tuple[int, int]]:
        """When it was busy: its pieces, else its whole extent (one stretch)."""
        return sorted(self.pieces) or [(self.start_ns, self.end_ns)]


@dataclass
class Timeline:
    """One operation (a root ``ckpt.restore`` / ``ckpt.save`` span) laid out in time."""

    kind: str
    trace_id: str
    span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    phases: list[Slice] = field(default_factory=list)
    files: list[Slice] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def rank(self) -> int:
        value = self.attributes.get(Attr.RANK)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    @property
    def host(self) -> str:
        return str(self.resource.get("host.name") or "host")

    def lanes(self) -> list[tuple[str, int]]:
        """(phase, lane) of the file reads, in phase order: one row each on a chart."""
        order = {p.name: i for i, p in enumerate(self.phases)}
        found = {(f.phase, f.lane) for f in self.files}
        return sorted(found, key=lambda key: (order.get(key[0], len(order)), key))

    def label(self) -> str:
        a = self.attributes
        parts = [self.kind]
        for key, fmt in (
            (Attr.STRATEGY, "{}"),
            (Attr.CACHE, "{}"),
            (Attr.CONCURRENCY, "x{}"),
            (Attr.REPEAT, "#{}"),
        ):
            if a.get(key) is not None:
                parts.append(fmt.format(a[key]))
        parts.append(f"rank {self.rank}")
        return " ".join(parts)


def pack_lanes(slices: Iterable[Slice]) -> list[list[Slice]]:
    """``slices`` in lanes where none overlaps another: each takes the first lane free
    at its start (so the lanes in use at a moment are the slices in flight then)."""
    lanes: list[list[Slice]] = []
    for item in sorted(slices, key=lambda s: (s.start_ns, s.end_ns)):
        free = next((lane for lane in lanes if lane[-1].end_ns <= item.start_ns), None)
        if free is None:
            lanes.append([item])
        else:
            free.append(item)
    return lanes


def _pack(files: list[Slice]) -> None:
    """Number each read's lane within its phase (lanes = reads in flight at once)."""
    by_phase: dict[str, list[Slice]] = defaultdict(list)
    for item in files:
        by_phase[item.phase].append(item)
    for group in by_phase.values():
        for index, lane in enumerate(pack_lanes(group)):
            for item in lane:
                item.lane = index


def timelines(spans: Iterable[dict[str, Any]]) -> list[Timeline]:
    """Every save and restore in ``spans`` (span dicts as the trace files hold them)."""
    spans = list(spans)
    children: dict[str, list[dict]] = defaultdict(list)
    for span in spans:
        if span.get("parent_id"):
            children[str(span["parent_id"])].append(span)
    found = []
    for root in spans:
        kind = ROOTS.get(root.get("name", ""))
        start, end = span_ns(root.get("start_time")), span_ns(root.get("end_time"))
        context = root.get("context") or {}
        if kind is None or start is None or end is None:
            continue
        line = Timeline(
            kind=kind,
            trace_id=str(context.get("trace_id", "")),
            span_id=str(context.get("span_id", "")),
            start_ns=start,
            end_ns=end,
            attributes=dict(root.get("attributes") or {}),
            resource=dict((root.get("resource") or {}).get("attributes") or {}),
        )
        _fill(line, children)
        found.append(line)
    found.sort(key=lambda t: t.start_ns)
    return found


def _fill(line: Timeline, children: dict[str, list[dict]]) -> None:
    """``line``'s phases (each with its pieces) and file reads, from its root's children."""
    pieces: dict[str, list[tuple[int, int]]] = defaultdict(list)  # by the phase's span id
    by_id: dict[str, Slice] = {}
    stack = [(span, None) for span in children.get(line.span_id, ())]
    while stack:
        span, phase = stack.pop()
        s, e = span_ns(span.get("start_time")), span_ns(span.get("end_time"))
        name = str(span.get("name", ""))
        inner = phase if name in (FILE_SPAN, PIECE_SPAN) else name.removeprefix(NAMESPACE)
        own_id = str((span.get("context") or {}).get("span_id"))
        stack.extend((child, inner) for child in children.get(own_id, ()))
        if s is None or e is None:
            continue
        attrs = dict(span.get("attributes") or {})
        if name == FILE_SPAN:
            path = str(attrs.get(Attr.PATH, "file"))
            line.files.append(Slice(path, s, e, 0, attrs, phase=phase or "file"))
        elif name == PIECE_SPAN:
            pieces[str(span.get("parent_id"))].append((s, e))
        elif name.startswith(NAMESPACE) and name != PROGRESS_SPAN:
            by_id[own_id] = Slice(inner, s, e, 0, attrs)
    for own_id, stretches in pieces.items():
        if own_id in by_id:
            by_id[own_id].pieces = sorted(stretches)
    line.phases = sorted(by_id.values(), key=lambda p: p.start_ns)
    _pack(line.files)


def representative(found: list[Timeline]) -> Timeline | None:
    """The restore to show: the median-length cold one, preferring those with per-file
    reads (``--per-file-spans``), else any restore, else any save."""
    for pick in (
        lambda t: t.kind == "restore" and t.files and t.attributes.get(Attr.CACHE) == "cold",
        lambda t: t.kind == "restore" and t.files,
        lambda t: t.kind == "restore",
        lambda t: True,
    ):
        chosen = [t for t in found if pick(t)]
        if chosen:
            middle = statistics.median_low(t.wall_s for t in chosen)
            return next(t for t in chosen if t.wall_s == middle)
    return None


__all__ = ["Slice", "Timeline", "pack_lanes", "representative", "span_ns", "timelines"]
