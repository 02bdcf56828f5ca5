"""Parsing the synthetic runner's JSON files into records: a restore sweep's
``results.json`` and a save's ``save.json``, each checked against its schema first.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ckptprof import schema
from ckptprof.errors import CkptprofError
from ckptprof.phases import Attr
from ckptprof.report.json_values import flag, integer, number
from ckptprof.report.records import (
    PhaseSample,
    RecordedCeiling,
    ResultsFile,
    ResultsRun,
    TraceOperation,
)
from ckptprof.results_schema import RESULTS_NAME, RESULTS_SCHEMA, RESULTS_SCHEMA_VERSION, summarize
from ckptprof.save_schema import SAVE_NAME, SAVE_SCHEMA, SAVE_SCHEMA_VERSION


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
            busy_s=number(entry.get("busy_s")) or 0.0,
            nbytes=integer(entry.get("bytes")),
            files=integer(entry.get("files")),
            gbps=number(entry.get("gbps")),
            emulated=flag(entry.get("emulated", False)),
            emulation_reason=str(reason) if reason is not None else None,
            of_bytes=integer(entry.get("of_bytes")),
            details={
                str(k): float(v)
                for k, v in (entry.get("details") or {}).items()
                if number(v) is not None
            },  # fmt: skip
            fused=fused if isinstance(fused, str) and fused else None,
            lazy=flag(entry.get("lazy", False)),
        )
    return phases


def refuse_newer(doc: Any, path: str, name: str, readable: int) -> None:
    """A file a newer ckptprof wrote (its ``schema_version`` above what this one reads) is
    one line saying to upgrade, not a field-by-field complaint to re-run; every reader of
    a results.json or save.json asks, whatever it reads of it."""
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > readable:
        raise CkptprofError(
            f"{path}: written by a newer ckptprof ({name} schema {version}; this one reads "
            f"{readable}) — upgrade ckptprof to read it"
        )


def _summary_agrees(written: Any, summary: list[dict]) -> bool:
    """Whether a written ``summary`` holds the figures :func:`summarize` gives its runs:
    absent agrees (an older or hand-made file); a field one side lacks is not held
    against it, a cell or figure that differs is."""
    if not written:
        return True
    fresh = {(s["strategy"], s["cache"], s["concurrency"]): s for s in summary}
    cells = {(e.get("strategy"), e.get("cache"), e.get("concurrency")): e for e in written}
    return cells.keys() == fresh.keys() and all(
        _same(cells[key], entry) for key, entry in fresh.items()
    )


def _same(written: Any, fresh: Any) -> bool:
    """``written`` holds ``fresh``'s figures, to float rounding (a hand-made file's
    medians); a key only one of them has is not a disagreement."""
    if isinstance(written, dict) and isinstance(fresh, dict):
        return all(_same(written[k], v) for k, v in fresh.items() if k in written)
    if isinstance(written, (int, float)) and isinstance(fresh, (int, float)):
        return math.isclose(written, fresh, rel_tol=1e-9, abs_tol=1e-12)
    return written == fresh


def parse_results(
    doc: Mapping[str, Any], path: str = RESULTS_NAME, warnings: list[str] | None = None
) -> ResultsFile:
    """Turn a decoded ``results.json`` into records, after checking it against
    :data:`RESULTS_SCHEMA` (a wrong type names the field); unknown keys are ignored.
    Every figure comes from ``runs``; a written ``summary`` that disagrees with them is
    one line in ``warnings``."""
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        raise CkptprofError(
            f"{path}: not a ckptprof results file (no 'runs' list) — pass the {RESULTS_NAME} "
            f"written by the synthetic restore, the {SAVE_NAME} of a synthetic save, or the "
            "trace *.jsonl files"
        )
    refuse_newer(doc, path, RESULTS_NAME, RESULTS_SCHEMA_VERSION)
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
            read_gbps=number(raw_ceiling.get("read_gbps")),
            source=raw_ceiling.get("source"),
            request_latency_s=number(raw_ceiling.get("request_latency_s")),
            part_size=integer(raw_ceiling.get("part_size")),
            littles_law_inflight=number(raw_ceiling.get("littles_law_inflight")),
            lower_bound_fetch_s=number(raw_ceiling.get("lower_bound_fetch_s")),
            nbytes=integer(raw_ceiling.get("bytes")),
        )
    # one source of truth: the runs, summarized as the runner does, whatever summary is written
    summary = summarize(doc["runs"], ceiling.read_gbps if ceiling else None)
    if warnings is not None and not _summary_agrees(doc.get("summary"), summary):
        warnings.append(
            f"{path}: its summary disagrees with its runs (edited, or written by another "
            "ckptprof); every figure shown is from the runs"
        )
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
                concurrency=integer(entry.get("concurrency")),
                repeat=integer(entry.get("repeat")),
                wall_s=number(entry.get("wall_s")) or 0.0,
                nbytes=integer(entry.get("bytes")),
                resident_fraction=number(entry.get("resident_fraction")),
                cache_method=entry.get("cache_method"),
                trace_id=entry.get("trace_id"),
                phases=_results_phases(entry.get("phases")),
                strategy=entry.get("strategy"),
                peak_rss_bytes=integer(entry.get("peak_rss_bytes")),
                read_bytes=integer(entry.get("read_bytes")),
                first_step=entry.get("first_step"),
                first_step_estimate_s=number(entry.get("first_step_estimate_s")),
                first_step_tokens=integer(entry.get("first_step_tokens")),
                rank=integer(entry.get("rank")),
                host=entry.get("host") if isinstance(entry.get("host"), str) else None,
                start_s=number(entry.get("start_s")),
            )
        )
    return runs


def read_results(path: Path, warnings: list[str] | None = None) -> ResultsFile:
    """A ``results.json`` read and parsed (:func:`parse_results`)."""
    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CkptprofError(
            f"{path}: not valid JSON ({exc}) — the file may be truncated; re-run the sweep or "
            "report on its trace *.jsonl files instead"
        ) from None
    return parse_results(doc, str(path), warnings)


# --------------------------------------------------------------------- save.json
#: the save phases whose bytes are what a save wrote (``checkpoint_cost.written_bytes``)
_WRITTEN_PHASES = ("write", "stage")


def parse_save(doc: Mapping[str, Any], path: str = SAVE_NAME) -> list[TraceOperation]:
    """A decoded ``save.json`` as the save operations it records, after checking it
    against :data:`SAVE_SCHEMA` (a wrong type names the field): each save becomes what its
    trace would have given, so every view reads saves one way."""
    refuse_newer(doc, path, SAVE_NAME, SAVE_SCHEMA_VERSION)
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


def read_save(path: Path) -> list[TraceOperation]:
    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CkptprofError(
            f"{path}: not valid JSON ({exc}) — the file may be truncated; re-run the save or "
            "report on its traces/ folder instead"
        ) from None
    return parse_save(doc, str(path))
