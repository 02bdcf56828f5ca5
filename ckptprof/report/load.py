"""Reading trace files and results files into plain dataclasses.

Only this module knows the on-disk shapes: the OpenTelemetry SDK's span JSON
(one span per line, docs/design.md §2) and the synthetic runner's ``results.json``.
Everything downstream (aggregation, hints, rendering) works on these records,
so it can be tested without files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ckptprof import schema
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
from ckptprof.results_schema import RESULTS_NAME, RESULTS_SCHEMA, summarize
from ckptprof.save_schema import SAVE_NAME, SAVE_SCHEMA, SAVE_SCHEMA_VERSION, looks_like_save

TRACE_SUFFIX = ".jsonl"
_ROOT_KINDS = {RESTORE_SPAN: "restore", SAVE_SPAN: "save"}
_PHASE_PREFIX = NAMESPACE


# --------------------------------------------------------------------- records
@dataclass(frozen=True)
class PhaseSample:
    """One phase of one operation: a phase span, or a phase entry of a results run."""

    phase: str
    busy_s: float
    nbytes: int | None = None
    files: int | None = None
    gbps: float | None = None
    emulated: bool = False
    emulation_reason: str | None = None
    of_bytes: int | None = None  # verify: the bytes of the files it checked
    #: the phase's own numeric ``ckpt.<phase>.*`` attributes (first_step's split)
    details: Mapping[str, float] = field(default_factory=dict)
    fused: str | None = None  # Attr.FUSED: the phases that ran as this one interval
    lazy: bool = False  # Attr.FETCH_LAZY: pages read on demand, some after the fetch


@dataclass
class TraceOperation:
    """One ``ckpt.restore`` or ``ckpt.save`` root span with its phase children."""

    kind: str
    trace_id: str
    span_id: str
    wall_s: float
    start: datetime | None
    attributes: dict[str, Any]
    resource: dict[str, Any]
    phases: dict[str, PhaseSample] = field(default_factory=dict)
    failed: bool = False
    status_message: str | None = None
    source: str = ""

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attributes.get(key, default)


@dataclass
class CutShort:
    """A save or restore whose root span was never written (the process was killed, or
    is still in it), as its latest in-progress record (``ckpt.progress``) tells it."""

    kind: str
    trace_id: str
    span_id: str  # the root's, never written
    elapsed_s: float
    open_phase: str | None
    phases: dict[str, float]  # the phases begun, their busy seconds so far
    nbytes: int
    of_bytes: int | None  # what the whole operation moves, where the record says
    in_flight: int
    waiting_on: str | None
    reason: str  # of the latest record: phase, bytes, stall
    stalled: bool  # any of its records was a stall warning
    at: datetime | None  # the latest record's time
    attributes: dict[str, Any]
    source: str = ""


@dataclass(frozen=True)
class RecordedCeiling:
    """The runner's estimate of the best a fetch could do (docs/design.md §9), as read
    back from its results (the measuring side is :class:`ckptprof.synth.ceiling.Ceiling`)."""

    read_gbps: float | None
    source: str | None = None
    request_latency_s: float | None = None
    part_size: int | None = None
    littles_law_inflight: float | None = None
    lower_bound_fetch_s: float | None = None
    nbytes: int | None = None


@dataclass
class ResultsRun:
    """One timed restore of the synthetic runner (one entry of ``runs``)."""

    cache: str | None
    concurrency: int | None
    repeat: int | None
    wall_s: float
    nbytes: int | None
    resident_fraction: float | None
    cache_method: str | None
    trace_id: str | None
    phases: dict[str, PhaseSample]
    strategy: str | None = None
    peak_rss_bytes: int | None = None
    read_bytes: int | None = None
    first_step: str | None = None  # measured | estimated | user | skipped
    first_step_estimate_s: float | None = None
    rank: int | None = None  # a distributed job's rank (``rank_runs``)
    host: str | None = None
    start_s: float | None = None  # when it began, seconds since the epoch


@dataclass
class ResultsFile:
    """A parsed ``results.json``; ``summary`` stays raw (the runner's own medians)."""

    path: str
    version: str | None
    created: str | None
    spec: dict[str, Any]
    environment: dict[str, Any]
    ceiling: RecordedCeiling | None
    runs: list[ResultsRun]
    summary: list[dict[str, Any]]
    options: dict[str, Any] = field(default_factory=dict)
    #: success_rate, failures, requests (requests/retries/errors) and partial, as written
    reliability: dict[str, Any] = field(default_factory=dict)
    #: a distributed job's spread across its ranks (``job`` of results.json), as written
    job: dict[str, Any] = field(default_factory=dict)
    #: every rank's runs of a distributed job (``runs`` holds each run's slowest rank)
    rank_runs: list[ResultsRun] = field(default_factory=list)


@dataclass
class ReportData:
    """Everything read from the PATHs given to ``ckptprof report``."""

    operations: list[TraceOperation] = field(default_factory=list)
    results: list[ResultsFile] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: saves and restores whose process ended inside them (their in-progress records)
    cut_short: list[CutShort] = field(default_factory=list)


# --------------------------------------------------------------------- helpers
def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    number = _num(value)
    return None if number is None else int(number)


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes"}
    return bool(value)


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


# --------------------------------------------------------------------- finding files
def _discover(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[Path], list[Path]]:
    """Split PATHs into results files, save files (``save.json``) and trace files.

    A directory holding a ``results.json`` stands for that file: its traces are
    the same runs, so they are not read again. Other ``*.jsonl`` files under a
    directory are traces. A ``save.json`` is read beside its traces: the records it
    holds whose traces are missing join them (``load`` keeps one of each save).
    """
    results: list[Path] = []
    saves: list[Path] = []
    traces: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise CkptprofError(
                f"{raw}: no such file or directory — pass trace files (*.jsonl), a results.json, "
                f"a {SAVE_NAME}, or a directory holding them (ckptprof-traces/ by default)"
            )
        if path.is_file():
            kind = _file_kind(path)
            {"results": results, "save": saves, "trace": traces}[kind].append(path)
            continue
        found_results = sorted(path.rglob(RESULTS_NAME))
        covered = [r.parent for r in found_results]
        found_saves = [s for s in sorted(path.rglob(SAVE_NAME)) if s.is_file()]
        found_traces = [
            t
            for t in sorted(path.rglob(f"*{TRACE_SUFFIX}"))
            if t.is_file() and not any(t.is_relative_to(c) for c in covered)
        ]
        if not found_results and not found_traces and not found_saves:
            raise CkptprofError(
                f"{raw}: no trace files (*{TRACE_SUFFIX}), {RESULTS_NAME} or {SAVE_NAME} under "
                "it — point at the trace directory (ckptprof-traces/ by default), a results "
                "directory or a synth save --out directory"
            )
        results.extend(found_results)
        saves.extend(found_saves)
        traces.extend(found_traces)
    return _unique(results), _unique(saves), _unique(traces)


def _unique(paths: list[Path]) -> list[Path]:
    seen: set[Path] = set()
    out = []
    for path in paths:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            out.append(path)
    return out


def _file_kind(path: Path) -> str:
    """``.jsonl`` is a trace; ``.json`` a save.json when it holds ``saves``, else a
    results file; anything else is sniffed."""
    if path.suffix == TRACE_SUFFIX:
        return "trace"
    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return "results" if path.suffix == ".json" else "trace"
    if looks_like_save(doc):
        return "save"
    if path.suffix == ".json" or (isinstance(doc, dict) and isinstance(doc.get("runs"), list)):
        return "results"
    return "trace"


# --------------------------------------------------------------------- traces
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
    busy = _num(attrs.get(Attr.BUSY_S))
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
        nbytes=_int(attrs.get(Attr.BYTES)),
        files=_int(attrs.get(Attr.FILES)),
        gbps=_num(attrs.get(Attr.THROUGHPUT_GBPS)),
        emulated=_flag(attrs.get(Attr.EMULATED, False)),
        emulation_reason=str(reason) if reason is not None else None,
        of_bytes=_int(attrs.get(Attr.VERIFY_OF_BYTES)),
        details=_details(name, attrs),
        fused=str(fused) if isinstance(fused, str) and fused else None,
        lazy=_flag(attrs.get(Attr.FETCH_LAZY, False)),
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
            wall = _num(attrs.get(Attr.WALL_S))
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
        elapsed = _num(attrs.get(Attr.PROGRESS_ELAPSED_S)) or 0.0
        if kept is None or elapsed >= (_num(kept["attributes"].get(Attr.PROGRESS_ELAPSED_S)) or 0):
            latest[key] = span
    return [_cut_short(key, span, key in stalled, source) for key, span in latest.items()]


def _span_key(span: Mapping[str, Any]) -> tuple[str, str]:
    ctx = span.get("context") or {}
    return str(ctx.get("trace_id")), str(ctx.get("span_id"))


def _cut_short(key, span: Mapping[str, Any], stalled: bool, source: str) -> CutShort:
    attrs = dict(span.get("attributes") or {})
    names = [str(n) for n in attrs.get(Attr.PROGRESS_PHASES) or []]
    busy = [_num(b) or 0.0 for b in attrs.get(Attr.PROGRESS_PHASE_BUSY_S) or []]
    total = _int(attrs.get(Attr.CHECKPOINT_BYTES)) or _int(attrs.get(Attr.STATE_BYTES))
    waiting = attrs.get(Attr.PROGRESS_WAITING_ON)
    open_phase = attrs.get(Attr.PROGRESS_OPEN_PHASE)
    return CutShort(
        kind=str(attrs.get(Attr.PROGRESS_OF) or "restore"),
        trace_id=key[0],
        span_id=key[1],
        elapsed_s=_num(attrs.get(Attr.PROGRESS_ELAPSED_S)) or 0.0,
        open_phase=str(open_phase) if open_phase else None,
        phases=dict(zip(names, busy, strict=False)),
        nbytes=_int(attrs.get(Attr.PROGRESS_BYTES)) or 0,
        of_bytes=total,
        in_flight=_int(attrs.get(Attr.PROGRESS_IN_FLIGHT)) or 0,
        waiting_on=str(waiting) if waiting else None,
        reason=str(attrs.get(Attr.PROGRESS_REASON) or ""),
        stalled=stalled,
        at=_parse_time(span.get("end_time")),
        attributes=attrs,
        source=source,
    )


# --------------------------------------------------------------------- results
def _results_phases(raw: Any) -> dict[str, PhaseSample]:
    phases: dict[str, PhaseSample] = {}
    if not isinstance(raw, dict):
        return phases
    for name, entry in raw.items():
        if not isinstance(entry, dict):
            continue
        reason = entry.get("emulation_reason")
        fused = entry.get("fused")
        phases[str(name)] = PhaseSample(
            phase=str(name),
            busy_s=_num(entry.get("busy_s")) or 0.0,
            nbytes=_int(entry.get("bytes")),
            files=_int(entry.get("files")),
            gbps=_num(entry.get("gbps")),
            emulated=_flag(entry.get("emulated", False)),
            emulation_reason=str(reason) if reason is not None else None,
            of_bytes=_int(entry.get("of_bytes")),
            details={
                str(k): float(v)
                for k, v in (entry.get("details") or {}).items()
                if _num(v) is not None
            },  # fmt: skip
            fused=fused if isinstance(fused, str) and fused else None,
            lazy=_flag(entry.get("lazy", False)),
        )
    return phases


def parse_results(doc: Mapping[str, Any], path: str = RESULTS_NAME) -> ResultsFile:
    """Turn a decoded ``results.json`` into records, after checking it against
    :data:`RESULTS_SCHEMA` (a wrong type names the field); unknown keys are ignored."""
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        raise CkptprofError(
            f"{path}: not a ckptprof results file (no 'runs' list) — pass the {RESULTS_NAME} "
            f"written by the synthetic restore, the {SAVE_NAME} of a synthetic save, or the "
            "trace *.jsonl files"
        )
    schema.require(
        doc,
        RESULTS_SCHEMA,
        f"{path}: not a valid ckptprof results file",
        "re-run the sweep, or report on its trace *.jsonl files instead",
    )
    raw_ceiling = doc.get("ceiling")
    ceiling = None
    if isinstance(raw_ceiling, dict):
        ceiling = RecordedCeiling(
            read_gbps=_num(raw_ceiling.get("read_gbps")),
            source=raw_ceiling.get("source"),
            request_latency_s=_num(raw_ceiling.get("request_latency_s")),
            part_size=_int(raw_ceiling.get("part_size")),
            littles_law_inflight=_num(raw_ceiling.get("littles_law_inflight")),
            lower_bound_fetch_s=_num(raw_ceiling.get("lower_bound_fetch_s")),
            nbytes=_int(raw_ceiling.get("bytes")),
        )
    summary = [s for s in doc.get("summary") or [] if isinstance(s, dict)]
    if not summary:  # an older or hand-made file: the same medians the runner writes
        summary = summarize(doc["runs"], ceiling.read_gbps if ceiling else None)
    return ResultsFile(
        path=path,
        version=doc.get("ckptprof_version"),
        created=doc.get("created"),
        spec=dict(doc.get("spec") or {}),
        environment=dict(doc.get("environment") or {}),
        ceiling=ceiling,
        runs=_results_runs(doc["runs"]),
        summary=summary,
        options=dict(doc.get("options") or {}) if isinstance(doc.get("options"), dict) else {},
        reliability={
            k: doc[k] for k in ("success_rate", "failures", "requests", "partial") if k in doc
        },
        job=dict(doc["job"]) if isinstance(doc.get("job"), dict) else {},
        rank_runs=_results_runs(doc.get("rank_runs") or []),  # the schema checked it
    )


def _results_runs(entries: Iterable[Any]) -> list[ResultsRun]:
    runs = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        runs.append(
            ResultsRun(
                cache=entry.get("cache"),
                concurrency=_int(entry.get("concurrency")),
                repeat=_int(entry.get("repeat")),
                wall_s=_num(entry.get("wall_s")) or 0.0,
                nbytes=_int(entry.get("bytes")),
                resident_fraction=_num(entry.get("resident_fraction")),
                cache_method=entry.get("cache_method"),
                trace_id=entry.get("trace_id"),
                phases=_results_phases(entry.get("phases")),
                strategy=entry.get("strategy"),
                peak_rss_bytes=_int(entry.get("peak_rss_bytes")),
                read_bytes=_int(entry.get("read_bytes")),
                first_step=entry.get("first_step"),
                first_step_estimate_s=_num(entry.get("first_step_estimate_s")),
                rank=_int(entry.get("rank")),
                host=entry.get("host") if isinstance(entry.get("host"), str) else None,
                start_s=_num(entry.get("start_s")),
            )
        )
    return runs


def _read_results(path: Path) -> ResultsFile:
    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CkptprofError(
            f"{path}: not valid JSON ({exc}) — the file may be truncated; re-run the sweep or "
            "report on its trace *.jsonl files instead"
        ) from None
    return parse_results(doc, str(path))


# --------------------------------------------------------------------- save.json
#: the save phases whose bytes are what a save wrote (``checkpoint_cost.written_bytes``)
_WRITTEN_PHASES = ("write", "stage")


def parse_save(doc: Mapping[str, Any], path: str = SAVE_NAME) -> list[TraceOperation]:
    """A decoded ``save.json`` as the save operations it records, after checking it
    against :data:`SAVE_SCHEMA` (a wrong type names the field): each save becomes what its
    trace would have given, so every view reads saves one way."""
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > SAVE_SCHEMA_VERSION:
        raise CkptprofError(
            f"{path}: written by a newer ckptprof ({SAVE_NAME} schema {version}; this one "
            f"reads {SAVE_SCHEMA_VERSION}) — upgrade ckptprof to read it"
        )
    schema.require(
        doc,
        SAVE_SCHEMA,
        f"{path}: not a valid ckptprof {SAVE_NAME}",
        "re-run `ckptprof synth save`, or report on its traces/ folder instead",
    )
    spec, options = doc.get("spec") or {}, doc.get("options") or {}
    environment, ceiling = doc.get("environment") or {}, doc.get("ceiling") or {}
    common = {
        Attr.FRAMEWORK: "synthetic",
        Attr.MODEL: spec.get("model"),
        Attr.LAYOUT: spec.get("layout"),
        Attr.STORAGE_KIND: environment.get("storage.kind"),
        Attr.STORAGE_URI: environment.get("storage.uri"),
        Attr.SAVE_CEILING_GBPS: ceiling.get("write_gbps"),
        Attr.CONCURRENCY: options.get("concurrency"),
        Attr.RUN_ID: path,
    }
    operations = []
    for record in doc["saves"]:
        phases = {
            name: PhaseSample(name, float(seconds)) for name, seconds in record["phases"].items()
        }
        written = next((p for p in _WRITTEN_PHASES if p in phases), None)
        if written is not None:
            phases[written] = PhaseSample(written, phases[written].busy_s, int(record["bytes"]))
        attrs = {
            **common,
            Attr.STRATEGY: record.get("strategy", options.get("strategy")),
            Attr.SAVE_FSYNC: record.get("fsync", options.get("fsync")),
            Attr.REPEAT: record.get("repeat"),
        }
        operations.append(
            TraceOperation(
                kind="save",
                trace_id=str(record.get("trace_id") or f"{path}#{record.get('repeat')}"),
                span_id="",
                wall_s=float(record["wall_s"]),
                start=None,
                attributes={k: v for k, v in attrs.items() if v is not None},
                resource={},
                phases=phases,
                source=path,
            )
        )
    return operations


def _read_save(path: Path) -> list[TraceOperation]:
    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CkptprofError(
            f"{path}: not valid JSON ({exc}) — the file may be truncated; re-run the save or "
            "report on its traces/ folder instead"
        ) from None
    return parse_save(doc, str(path))


# --------------------------------------------------------------------- entry
def trace_files(paths: Iterable[str | os.PathLike], beside_results: bool = False) -> list[Path]:
    """The trace files the PATHs name, each once; with ``beside_results`` also the traces
    under a results directory (the same runs, span by span: timelines)."""
    results, _, trace_paths = _discover(list(paths))
    if beside_results:
        for found in results:
            trace_paths += sorted(p for p in found.parent.rglob(f"*{TRACE_SUFFIX}") if p.is_file())
    return _unique(trace_paths)


def read_trace_spans(
    paths: Iterable[str | os.PathLike], beside_results: bool = False
) -> list[dict[str, Any]]:
    """Every span (as a dict) of the trace files the PATHs name (see :func:`trace_files`)."""
    return [span for path in trace_files(paths, beside_results)
            for span in read_json_lines(path).docs]  # fmt: skip


def load(paths: Iterable[str | os.PathLike]) -> ReportData:
    """Read every trace and results file the PATHs name.

    Raises:
        CkptprofError: a PATH is missing, a file is not a trace or results file,
            or nothing with checkpoint data was found.
    """
    paths = list(paths)
    if not paths:
        raise CkptprofError("report: no PATH given — name trace files, results.json or a directory")
    results_paths, save_paths, trace_paths = _discover(paths)
    data = ReportData()
    for path in results_paths:
        data.results.append(_read_results(path))
        data.sources.append(str(path))
    seen: set[tuple[str, str]] = set()
    reads = []
    for path in trace_paths:
        read = read_json_lines(path)
        reads.append(read)
        for op in operations_from_spans(read.docs, str(path)):
            if (op.trace_id, op.span_id) not in seen:
                seen.add((op.trace_id, op.span_id))
                data.operations.append(op)
        data.cut_short += cut_short_from_spans(read.docs, str(path))
        data.sources.append(str(path))
    traced = {op.trace_id.removeprefix("0x") for op in data.operations}
    for path in save_paths:  # the saves whose traces were not read
        data.operations += [op for op in _read_save(path) if op.trace_id not in traced]
        data.sources.append(str(path))
    # a root written to another file than its records (a process's files are one each)
    data.cut_short = [c for c in data.cut_short if (c.trace_id, c.span_id) not in seen]
    skipped = skipped_lines_warning(reads)
    if skipped:
        data.warnings.append(skipped)
    # a results.json and the traces of its own runs (its folder's traces/): the same
    # restores twice; the results keep them, once
    summarized = {str(run.trace_id).removeprefix("0x") for results in data.results
                  for run in results.runs if run.trace_id}  # fmt: skip
    data.operations = [
        op for op in data.operations if op.trace_id.removeprefix("0x") not in summarized
    ]
    if not data.operations and not data.results and not data.cut_short:
        names = ", ".join(str(p) for p in paths)
        raise CkptprofError(
            f"{names}: no ckpt.restore or ckpt.save spans found — was the run traced with "
            "ckptprof (check CKPTPROF_TRACE_DIR), and did it finish?"
        )
    return data
