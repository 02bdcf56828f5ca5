"""Finding the files the PATHs given to ``ckptprof report`` name, and reading them all
into one :class:`ReportData`: each trace, results file and save.json once, with the
records two of them share kept once.

The on-disk shapes are read by :mod:`ckptprof.report.traces` (span JSON lines) and
:mod:`ckptprof.report.json_files` (``results.json``, ``save.json``); this module only
decides which file is which and joins what they give.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ckptprof.errors import CkptprofError
from ckptprof.report.json_files import read_results, read_save, refuse_newer
from ckptprof.report.records import ReportData
from ckptprof.report.traces import (
    TRACE_SUFFIX,
    cut_short_from_spans,
    operations_from_spans,
    read_json_lines,
    skipped_lines_warning,
)
from ckptprof.results_schema import RESULTS_NAME, RESULTS_SCHEMA_VERSION
from ckptprof.save_schema import SAVE_NAME, SAVE_SCHEMA_VERSION, looks_like_save


# --------------------------------------------------------------------- finding files
def _discover(
    paths: Iterable[str | os.PathLike], warnings: list[str] | None = None
) -> tuple[list[Path], list[Path], list[Path]]:
    """Split PATHs into results files, save files (``save.json``) and trace files.

    A directory holding a ``results.json`` stands for that file: its traces are
    the same runs, so they are not read again. Other ``*.jsonl`` files under a
    directory are traces; under a ``save.json``'s folder, only those of its own saves (a
    folder a second run wrote into keeps the first one's traces: they are left out, and
    ``warnings`` says so). A ``save.json`` is read beside its traces: the records it
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
        for save in found_saves:
            found_traces = own_traces(save, found_traces, warnings)
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


def _record_ids(summary: Path) -> set[str]:
    """The trace ids of the runs (results.json) or saves (save.json) ``summary`` holds."""
    try:
        doc = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return set()
    if summary.name == SAVE_NAME:
        refuse_newer(doc, str(summary), SAVE_NAME, SAVE_SCHEMA_VERSION)
    else:
        refuse_newer(doc, str(summary), RESULTS_NAME, RESULTS_SCHEMA_VERSION)
    records = [*(doc.get("runs") or []), *(doc.get("saves") or [])] if isinstance(doc, dict) else []
    return {str(r["trace_id"]).removeprefix("0x") for r in records
            if isinstance(r, dict) and r.get("trace_id")}  # fmt: skip


def own_traces(summary: Path, traces: list[Path], warnings: list[str] | None = None) -> list[Path]:
    """``traces`` less those under ``summary``'s folder (a results.json or save.json) that
    hold none of its records: an earlier run's, written into the same ``--out``. Their
    count and folder go into ``warnings``, so that they are left out in words."""
    ids = _record_ids(summary)
    if not ids:
        return traces
    kept, older = [], []
    for trace in traces:
        if trace.is_relative_to(summary.parent):
            text = trace.read_text(encoding="utf-8", errors="replace")
            if not any(i in text for i in ids):
                older.append(trace)
                continue
        kept.append(trace)
    if older and warnings is not None:
        warnings.append(
            f"{summary.parent}: {len(older)} trace file(s) of an earlier run into the same "
            f"folder left out (none of {summary.name}'s records), e.g. {older[0]}"
        )
    return kept


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


def files_read(paths: Iterable[str | os.PathLike]) -> set[Path]:
    """Every file reading the PATHs may open (resolved): each file named, and under each
    folder every results, save and trace file: what an output must not replace."""
    found: set[Path] = set()
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_file():
            found.add(path.resolve())
        elif path.is_dir():
            for pattern in (RESULTS_NAME, SAVE_NAME, f"*{TRACE_SUFFIX}"):
                found.update(p.resolve() for p in path.rglob(pattern) if p.is_file())
    return found


# --------------------------------------------------------------------- entry
def trace_files(
    paths: Iterable[str | os.PathLike],
    beside_results: bool = False,
    warnings: list[str] | None = None,
) -> list[Path]:
    """The trace files the PATHs name, each once; with ``beside_results`` also the traces
    under a results directory, or beside a results.json named (the same runs, span by
    span: timelines, exports). Under a results or save file's folder, an earlier run's
    traces are left out, and ``warnings`` says so (:func:`own_traces`)."""
    results, _, trace_paths = _discover(list(paths), warnings)
    if beside_results:
        for found in results:
            beside = sorted(p for p in found.parent.rglob(f"*{TRACE_SUFFIX}") if p.is_file())
            trace_paths += own_traces(found, beside, warnings)
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
    data = ReportData()
    results_paths, save_paths, trace_paths = _discover(paths, data.warnings)
    for path in results_paths:
        data.results.append(read_results(path, data.warnings))
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
        data.operations += [op for op in read_save(path) if op.trace_id not in traced]
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
