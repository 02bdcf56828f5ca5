"""``ckptprof export``: trace files as a Perfetto timeline or OTLP JSON, or replayed into
an OTLP backend later (training nodes often have no collector)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ckptprof.cli.options import HelpFormatter, Moot, input_path, output_file, refuse_moot
from ckptprof.errors import CkptprofError

DESCRIPTION = """\
Convert ckptprof trace files (*.jsonl, written by every traced run) for other tools:

  perfetto    a native Perfetto trace: open it at ui.perfetto.dev (offline: the file
              stays on your machine) — each rank a process, each phase and each stream
              of file reads a thread, with the ckpt.* attributes as slice arguments
  otlp-json   OTLP JSON lines (the OpenTelemetry file-exporter format: one
              ExportTraceServiceRequest per line), readable by OTLP tools and by
              `ckptprof export --otlp` later

--otlp sends the spans (from trace files or OTLP JSON lines) to the OTLP/HTTP endpoint
named by OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT), with
OTEL_EXPORTER_OTLP_HEADERS, waiting at most OTEL_EXPORTER_OTLP_TIMEOUT seconds (10) for
each request."""

EPILOG = """\
examples:
  ckptprof export --format perfetto ckptprof-traces/ -o restore.perfetto-trace
  ckptprof export --format otlp-json ckptprof-traces/ -o spans.otlp.jsonl
  OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 ckptprof export --otlp spans.otlp.jsonl"""

FORMATS = ("perfetto", "otlp-json")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "export",
        help="write traces as a Perfetto timeline or OTLP JSON, or replay them over OTLP",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        type=input_path,
        help="trace files (*.jsonl), OTLP JSON lines (for --otlp), a results.json or save.json "
        "(its runs' traces), or folders holding them (an earlier run's traces in a reused "
        "--out left out, as report does)",
    )
    parser.add_argument(
        "--format", choices=FORMATS, help="what to write to -o: perfetto or otlp-json"
    )
    parser.add_argument(
        "-o", "--output", metavar="FILE", type=output_file, help="the file to write"
    )
    parser.add_argument(
        "--otlp",
        action="store_true",
        help="send the spans to the OTLP/HTTP endpoint of the OTEL_* variables instead",
    )
    parser.set_defaults(func=run)
    refuse_moot(
        parser,
        Moot(("output",), lambda args: args.otlp, "--otlp sends the spans, it writes no file",
             "drop -o, or --otlp for --format"),
    )  # fmt: skip
    return parser


def _files(paths: list[str]) -> list[Path]:
    """The trace files the PATHs name, found as ``ckptprof report`` finds them: a folder's
    or a results.json's own runs (an earlier run's traces in the same ``--out`` left out,
    with a warning), a save.json's saves, any other ``*.jsonl``."""
    from ckptprof.report.load import trace_files

    warnings: list[str] = []
    found = trace_files(paths, beside_results=True, warnings=warnings)
    for warning in warnings:
        print(f"ckptprof: warning: {warning}", file=sys.stderr)
    if not found:
        raise CkptprofError(
            f"{', '.join(paths)}: no trace files (*.jsonl) under it or beside it — pass the "
            "trace files, or the folder holding them (ckptprof-traces/ by default)"
        )
    return found


def _read(paths: list[str]) -> tuple[list[dict], list[dict]]:
    """(spans of trace files, OTLP/JSON requests of OTLP JSON-lines files); malformed
    lines are skipped with one warning, as ``ckptprof report`` does."""
    from ckptprof.report.traces import is_span, read_json_lines, skipped_lines_warning
    from ckptprof.tracing.otlp_json import is_otlp_document

    reads = [
        read_json_lines(path, lambda doc: is_span(doc) or is_otlp_document(doc))
        for path in _files(paths)
    ]
    spans = [doc for read in reads for doc in read.docs if is_span(doc)]
    requests = [doc for read in reads for doc in read.docs if not is_span(doc)]
    skipped = skipped_lines_warning(reads)
    if skipped:
        print(f"ckptprof: warning: {skipped}", file=sys.stderr)
    return spans, requests


def run(args: argparse.Namespace) -> int:
    from ckptprof.atomic import atomic_open

    if args.otlp == bool(args.format):
        raise CkptprofError(
            "export: give either --format perfetto|otlp-json with -o FILE, or --otlp"
        )
    if args.format and not args.output:
        raise CkptprofError(f"export --format {args.format}: name the file to write with -o FILE")
    folder = Path(args.output or ".").expanduser().parent
    if not folder.is_dir():
        raise CkptprofError(f"-o {args.output}: folder {folder} does not exist — create it first")
    if args.otlp:
        from ckptprof.tracing.otlp_json import otlp_endpoint

        otlp_endpoint()  # a variable that names no URL: one line before the traces are read
    spans, requests = _read(args.paths)
    if not spans and not requests:  # every mode alike: an empty file is nothing to export
        raise CkptprofError(f"{', '.join(args.paths)}: no spans in the trace files there")
    if args.otlp:
        from ckptprof.tracing.otel_settings import otlp_timeout_s
        from ckptprof.tracing.otlp_json import replay, requests_of

        sent, count = replay([*requests, *requests_of(spans)], otlp_timeout_s())
        requests_word = "request" if sent == 1 else "requests"
        print(f"ckptprof: sent {count} spans in {sent} {requests_word}", file=sys.stderr)
        return 0
    if requests and not spans:
        raise CkptprofError(
            "export: these are OTLP JSON lines already; --otlp replays them, and --format "
            "needs ckptprof's own trace files"
        )
    if args.format == "perfetto":
        from ckptprof.report.perfetto import perfetto_trace
        from ckptprof.report.timeline import timelines

        lines = timelines(spans)
        if not lines:
            raise CkptprofError(f"{', '.join(args.paths)}: no ckpt.restore or ckpt.save spans")
        with atomic_open(args.output, "wb") as handle:
            handle.write(perfetto_trace(lines))
        what = f"{len(lines)} operations"
    else:
        from ckptprof.tracing.otlp_json import requests_of

        with atomic_open(args.output, "w", encoding="utf-8") as handle:
            for document in requests_of(spans):
                handle.write(json.dumps(document, separators=(",", ":")) + "\n")
        what = f"{len(spans)} spans"
    print(f"ckptprof: wrote {what} to {args.output} ({args.format})", file=sys.stderr)
    return 0
