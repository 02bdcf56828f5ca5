"""``ckptprof report``: where restore (and save) time went, from traces or results."""

from __future__ import annotations

import argparse
import sys

from ckptprof import schema
from ckptprof.cli.options import HelpFormatter, duration, real

DESCRIPTION = """\
Read ckptprof trace files (*.jsonl, one OpenTelemetry span per line) and/or results.json
files from the synthetic restore, and print where the time went.

Traces: operations are grouped by configuration (framework, format, cache, concurrency,
world size, storage); each group shows the median RTO (wall time, min-max) and one row per
phase: median busy seconds, share of the RTO, bytes, GB/s and files. Phases may overlap, so
the sum of phases is printed next to the wall time (the critical path).

Results: the ceiling (best read GB/s, Little's Law queue depth), the environment, and a
sweep table of cache state x concurrency. Hints are added only where the numbers call
for them."""

EPILOG = """\
examples:
  ckptprof report ckptprof-traces/
  ckptprof report runs/llama2-7b/results.json --plot restore.png
  ckptprof report runs/ --html report.html      # one page, opens offline
  ckptprof report ckptprof-traces/ --by run
  ckptprof report runs/ --format json > report.json
  ckptprof report --interruptions ckptprof-traces/
  ckptprof report ckptprof-save/ runs/ --mtbi 6h   # save vs restore, checkpoint interval
  ckptprof report --goodput ckptprof-traces/ --price-per-hour 32.77 --plot goodput.png

A directory is searched recursively; one holding a results.json is read from that file
rather than from its traces."""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``report`` on the top-level ``ckptprof`` parser."""
    parser = subparsers.add_parser(
        "report",
        help="show where checkpoint restore/save time went (from traces or results.json)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="trace file (*.jsonl), results.json, or a directory holding them",
    )
    parser.add_argument(
        "--by",
        choices=("phase", "run"),
        default="phase",
        help="phase: medians per phase (default); run: one row per operation as measured",
    )
    parser.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table for people (default), json for scripts",
    )
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw phase bars (and GB/s vs concurrency) to this image; needs matplotlib",
    )
    parser.add_argument(
        "--html",
        metavar="FILE.html",
        help="also write one self-contained page (charts inline, opens offline): phase "
        "breakdown, GB/s vs concurrency, cold vs hot, per-rank spread, a restore's "
        "timeline, interruptions, environment and hints",
    )
    parser.add_argument(
        "--interruptions",
        action="store_true",
        help="tell each interruption's story: notice, emergency save and its margin, "
        "downtime, restore, steps lost, cost",
    )
    parser.add_argument(
        "--goodput",
        action="store_true",
        help="where a job's wall time went across its restarts (traces of every process): "
        "productive steps, restore, first step, save blocking, background-save slowdown, "
        "lost work, downtime, the rest; with --plot, its picture",
    )
    parser.add_argument(
        "--price-per-hour",
        metavar="PRICE",
        type=real(schema.number(above=0)),
        help="with --goodput: what an hour of the job costs, to price each bucket",
    )
    parser.add_argument(
        "--mtbi",
        metavar="DURATION",
        type=duration(schema.number(above=0)),
        help="mean time between interruptions (e.g. 6h for Spot): each save's checkpoint "
        "interval that loses the least time (Young/Daly), and what saving and lost work "
        "then cost",
    )
    parser.set_defaults(func=run)
    return parser


def print_report(
    paths: list[str],
    plot: str | None = None,
    by: str = "phase",
    fmt: str = "table",
    html: str | None = None,
    mtbi_s: float | None = None,
) -> None:
    """Print the report for ``paths``; other commands call this after writing results.

    Raises:
        CkptprofError: a path is missing or unreadable, or the plot cannot be drawn.
    """
    from ckptprof.report import aggregate, load, render_json, render_text, write_plot

    data = load(paths)
    for warning in data.warnings:
        print(f"ckptprof: warning: {warning}", file=sys.stderr)
    report = aggregate(data, mtbi_s)
    sys.stdout.write(render_json(report) if fmt == "json" else render_text(report, by=by))
    sys.stdout.flush()
    if plot:
        written = write_plot(report, plot)
        print(f"ckptprof: plot written to {written}", file=sys.stderr)
    if html:
        written = _write_html(paths, report, data.sources, html)
        print(f"ckptprof: HTML report written to {written}", file=sys.stderr)


def _write_html(paths: list[str], report, sources: list[str], target: str):
    from ckptprof.report.goodput import build_goodput
    from ckptprof.report.html import write_html
    from ckptprof.report.interruptions import build_stories
    from ckptprof.report.load import read_trace_spans
    from ckptprof.report.timeline import representative, timelines

    spans = read_trace_spans(paths, beside_results=True)
    stories = build_stories(spans)
    goodput = build_goodput(spans)  # a job's processes, when their traces are here
    line = representative(timelines(spans))
    return write_html(report, target, line, stories, sources, goodput)


def run_goodput(args: argparse.Namespace) -> int:
    """``--goodput``: the job's wall time across its processes, as a table (or JSON)."""
    import json

    from ckptprof.errors import CkptprofError
    from ckptprof.report.cut_short import cut_short_json
    from ckptprof.report.goodput import build_goodput, goodput_json, render_goodput
    from ckptprof.report.load import cut_short_from_spans, read_trace_spans

    spans = read_trace_spans(args.paths)
    goodput = build_goodput(spans, args.price_per_hour)
    if goodput is None:
        raise CkptprofError(
            f"{', '.join(args.paths)}: no ckpt.run spans (one per process of a job): trace "
            "the job with a ckptprof callback (CkptProf, CkptProfCallback), then report on "
            "every process's trace files together."
        )
    cuts = cut_short_from_spans(spans)
    if args.format == "json":
        doc = {**goodput_json(goodput), "cut_short": cut_short_json(cuts)}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(render_goodput(goodput) + _cut_short_block(cuts))
    if args.plot:
        from ckptprof.report.plot import goodput_figure, save_figure

        written = save_figure(lambda: goodput_figure(goodput), args.plot, "--plot")
        print(f"ckptprof: plot written to {written}", file=sys.stderr)
    return 0


def _cut_short_block(cuts) -> str:
    """The saves and restores cut short, after a blank line (nothing when none)."""
    from ckptprof.report.cut_short import cut_short_lines

    lines = cut_short_lines(cuts)
    return "\n" + "\n".join(lines) + "\n" if lines else ""


def run(args: argparse.Namespace) -> int:
    """Entry for ``ckptprof report``: the table (or JSON) on stdout, warnings on stderr."""
    if getattr(args, "goodput", False):
        return run_goodput(args)
    if getattr(args, "interruptions", False):
        from ckptprof.report.interruptions import (
            build_stories,
            render_stories,
            render_stories_json,
        )
        from ckptprof.report.load import cut_short_from_spans, read_trace_spans

        spans = read_trace_spans(args.paths)
        stories = build_stories(spans)
        if args.format == "json":
            sys.stdout.write(render_stories_json(stories))
        else:
            cut = _cut_short_block(cut_short_from_spans(spans))
            if stories or not cut:  # none of either: render_stories says what to do
                sys.stdout.write(render_stories(stories) + cut)
            else:
                sys.stdout.write(cut.lstrip("\n"))
        return 0
    print_report(
        args.paths,
        plot=getattr(args, "plot", None),
        by=getattr(args, "by", "phase"),
        fmt=getattr(args, "format", "table"),
        html=getattr(args, "html", None),
        mtbi_s=getattr(args, "mtbi", None),
    )
    return 0
