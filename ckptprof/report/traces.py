"""Reading trace files: the OpenTelemetry SDK's span JSON (one span per line,
docs/design.md §2) into operations (a root span with its phase children) and the
saves and restores cut short (their in-progress records without a root).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ckptprof.errors import CkptprofError
from ckptprof.phases import (
    AFTER_RESUME_SPAN,
    FILE_SPAN,
    NAMESPACE,
    PROGRESS_SPAN,
    RESTORE_SPAN,
    SAVE_SPAN,
    Attr,
)
from ckptprof.redact import scrub_read
from ckptprof.report.json_values import flag, integer, number
from ckptprof.report.records import CutShort, PhaseSample, TraceOperation
from ckptprof.results_schema import RESULTS_NAME

TRACE_SUFFIX = ".jsonl"
_ROOT_KINDS = {RESTORE_SPAN: "restore", SAVE_SPAN: "save"}
_PHASE_PREFIX = NAMESPACE


def _parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max((end - start).total_seconds(), 0.0)


@dataclass
class TraceLines:
    """What one trace file's lines held: the documents kept, and the lines skipped."""

    path: Path
    docs: list[dict[str, Any]]
    bad_lines: int
    first_bad_line: int | None


def read_json_lines(path: Path, keep: Callable[[Any], bool] | None = None) -> TraceLines:
    """The JSON documents of a JSON-lines trace file that ``keep`` accepts (spans by
    default). A malformed line (a job killed mid-write cuts its last one) is counted and
    skipped, never fatal; a file none of whose lines is kept is not a trace file."""
    keep = keep or is_span
    docs: list[dict[str, Any]] = []
    bad, first_bad, nonblank = 0, None, 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            nonblank += 1
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                doc = None
            doc = scrub_read(doc, line)  # a trace from elsewhere: its URLs' secrets never shown
            if not keep(doc):
                bad += 1
                first_bad = first_bad or number
                continue
            docs.append(doc)
    if nonblank and not docs:
        raise CkptprofError(
            f"{path}: not a ckptprof trace file (no line is an OpenTelemetry span as JSON) — "
            f"pass the *{TRACE_SUFFIX} files ckptprof writes (ckptprof-traces/ by default) "
            f"or a {RESULTS_NAME}"
        )
    return TraceLines(path, docs, bad, first_bad)


def skipped_lines_warning(reads: Iterable[TraceLines]) -> str | None:
    """One line about the malformed lines skipped in ``reads``, or None when there were none."""
    damaged = [r for r in reads if r.bad_lines]
    if not damaged:
        return None
    total, files = sum(r.bad_lines for r in damaged), len(damaged)
    first = f"{damaged[0].path} line {damaged[0].first_bad_line}"
    return (
        f"skipped {total} malformed line{'s' if total != 1 else ''} in "
        f"{files} trace file{'s' if files != 1 else ''} (first: {first})"
    )


def is_span(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("name"), str)
        and isinstance(obj.get("context"), dict)
        and "span_id" in obj["context"]
    )


def _phase_sample(name: str, span: Mapping[str, Any]) -> PhaseSample:
    attrs = span.get("attributes") or {}
    busy = number(attrs.get(Attr.BUSY_S))
    if busy is None:
        busy = (
            _seconds_between(_parse_time(span.get("start_time")), _parse_time(span.get("end_time")))
            or 0.0
        )
    reason = attrs.get(Attr.EMULATION_REASON)
    fused = attrs.get(Attr.FUSED)
    return PhaseSample(
        phase=name,
        busy_s=busy,
        nbytes=integer(attrs.get(Attr.BYTES)),
        files=integer(attrs.get(Attr.FILES)),
        gbps=number(attrs.get(Attr.THROUGHPUT_GBPS)),
        emulated=flag(attrs.get(Attr.EMULATED, False)),
        emulation_reason=str(reason) if reason is not None else None,
        of_bytes=integer(attrs.get(Attr.VERIFY_OF_BYTES)),
        details=_details(name, attrs),
        fused=str(fused) if isinstance(fused, str) and fused else None,
        lazy=flag(attrs.get(Attr.FETCH_LAZY, False)),
    )


def _details(phase: str, attrs: Mapping[str, Any]) -> dict[str, float]:
    prefix = Attr.phase_prefix(phase)
    return {
        key.removeprefix(prefix): float(value)
        for key, value in attrs.items()
        if key.startswith(prefix)
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
    }


def operations_from_spans(
    spans: Iterable[Mapping[str, Any]], source: str = ""
) -> list[TraceOperation]:
    """Assemble root spans and their phase children (``ckpt.file`` spans are skipped)."""
    roots: dict[tuple[str, str], TraceOperation] = {}
    children: list[Mapping[str, Any]] = []
    after: list[Mapping[str, Any]] = []
    for span in spans:
        ctx = span.get("context") or {}
        key = (str(ctx.get("trace_id")), str(ctx.get("span_id")))
        name = span.get("name", "")
        if name == AFTER_RESUME_SPAN:
            after.append(span)
        elif name in _ROOT_KINDS:
            if key in roots:
                continue
            attrs = dict(span.get("attributes") or {})
            start = _parse_time(span.get("start_time"))
            wall = number(attrs.get(Attr.WALL_S))
            if wall is None:
                wall = _seconds_between(start, _parse_time(span.get("end_time"))) or 0.0
            status = span.get("status") or {}
            roots[key] = TraceOperation(
                kind=_ROOT_KINDS[name],
                trace_id=key[0],
                span_id=key[1],
                wall_s=wall,
                start=start,
                attributes=attrs,
                resource=dict((span.get("resource") or {}).get("attributes") or {}),
                failed=status.get("status_code") == "ERROR",
                status_message=status.get("description"),
                source=source,
            )
        elif name.startswith(_PHASE_PREFIX) and name not in (FILE_SPAN, PROGRESS_SPAN):
            children.append(span)
    for span in children:
        ctx = span.get("context") or {}
        parent = roots.get((str(ctx.get("trace_id")), str(span.get("parent_id"))))
        if parent is None:
            continue
        phase = span["name"][len(_PHASE_PREFIX) :]
        parent.phases.setdefault(phase, _phase_sample(phase, span))
    for span in after:  # its numbers join the restore it links to
        for link in span.get("links") or []:
            target = link.get("context") or {}
            op = roots.get((str(target.get("trace_id")), str(target.get("span_id"))))
            if op is not None:
                op.attributes.update(
                    (k, v)
                    for k, v in (span.get("attributes") or {}).items()
                    if k.startswith(AFTER_RESUME_SPAN + ".")
                )
    return list(roots.values())


def cut_short_from_spans(spans: Iterable[Mapping[str, Any]], source: str = "") -> list[CutShort]:
    """The operations whose in-progress records are here and whose root span is not: each
    as its latest record tells it (a trace without its root is read for what it holds)."""
    spans = list(spans)
    written = {_span_key(span) for span in spans if span.get("name") in _ROOT_KINDS}
    latest: dict[tuple[str, str], Mapping[str, Any]] = {}
    stalled: set[tuple[str, str]] = set()
    for span in spans:
        if span.get("name") != PROGRESS_SPAN:
            continue
        key = (str((span.get("context") or {}).get("trace_id")), str(span.get("parent_id")))
        if key in written:
            continue
        attrs = span.get("attributes") or {}
        if attrs.get(Attr.PROGRESS_REASON) == "stall":
            stalled.add(key)
        kept = latest.get(key)
        elapsed = number(attrs.get(Attr.PROGRESS_ELAPSED_S)) or 0.0
        if kept is None or elapsed >= (
            number(kept["attributes"].get(Attr.PROGRESS_ELAPSED_S)) or 0
        ):
            latest[key] = span
    return [_cut_short(key, span, key in stalled, source) for key, span in latest.items()]


def _span_key(span: Mapping[str, Any]) -> tuple[str, str]:
    ctx = span.get("context") or {}
    return str(ctx.get("trace_id")), str(ctx.get("span_id"))


def _cut_short(key, span: Mapping[str, Any], stalled: bool, source: str) -> CutShort:
    attrs = dict(span.get("attributes") or {})
    names = [str(n) for n in attrs.get(Attr.PROGRESS_PHASES) or []]
    busy = [number(b) or 0.0 for b in attrs.get(Attr.PROGRESS_PHASE_BUSY_S) or []]
    total = integer(attrs.get(Attr.CHECKPOINT_BYTES)) or integer(attrs.get(Attr.STATE_BYTES))
    waiting = attrs.get(Attr.PROGRESS_WAITING_ON)
    open_phase = attrs.get(Attr.PROGRESS_OPEN_PHASE)
    return CutShort(
        kind=str(attrs.get(Attr.PROGRESS_OF) or "restore"),
        trace_id=key[0],
        span_id=key[1],
        elapsed_s=number(attrs.get(Attr.PROGRESS_ELAPSED_S)) or 0.0,
        open_phase=str(open_phase) if open_phase else None,
        phases=dict(zip(names, busy, strict=False)),
        nbytes=integer(attrs.get(Attr.PROGRESS_BYTES)) or 0,
        of_bytes=total,
        in_flight=integer(attrs.get(Attr.PROGRESS_IN_FLIGHT)) or 0,
        waiting_on=str(waiting) if waiting else None,
        reason=str(attrs.get(Attr.PROGRESS_REASON) or ""),
        stalled=stalled,
        at=_parse_time(span.get("end_time")),
        attributes=attrs,
        source=source,
    )
