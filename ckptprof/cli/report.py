"""``ckptprof report``: where restore (and save) time went, from traces or results."""

from __future__ import annotations

import argparse
import sys

from ckptprof import schema
from ckptprof.cli.options import HelpFormatter, duration, input_path, output_file, real
from ckptprof.cost import MAX_PRICE_PER_HOUR

#: the Young/Daly interval needs interruptions rarer than a save takes: under a minute
#: it means nothing; beyond ten years there is nothing to plan
MIN_MTBI_S, MAX_MTBI_S = 60.0, 10 * 365 * 86_400.0

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
        type=input_path,
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
        type=output_file,
        help="also draw phase bars (and GB/s vs concurrency) to this image; needs matplotlib",
    )
    parser.add_argument(
        "--html",
        metavar="FILE.html",
        type=output_file,
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
        type=real(schema.number(maximum=MAX_PRICE_PER_HOUR, above=0)),
        help="with --goodput: what an hour of the job costs, to price each bucket",
    )
    parser.add_argument(
        "--mtbi",
        metavar="DURATION",
        type=duration(schema.number(minimum=MIN_MTBI_S, maximum=MAX_MTBI_S)),
        help="mean time between interruptions (e.g. 6h for Spot): each save's checkpoint "
        "interval that loses the least time (Young/Daly), and what saving and lost work "
        "then cost",
    )
    parser.set_defaults(func=run)
    return parser


#: each option's value when not given (library callers may pass fewer)
OPTION_DEFAULTS = {"by": "phase", "format": "table", "plot": None, "html": None,
                   "interruptions": False, "goodput": False, "price_per_hour": None,
                   "mtbi": None}  # fmt: skip

#: per view (None: the restore/save report), the options it cannot honour and why:
#: refused up front, never ignored
UNHONOURED: dict[str | None, dict[str, str]] = {
    None: {
        "price_per_hour": "prices the buckets of --goodput (restores are priced at "
        "$CKPTPROF_COST_PER_HOUR); add --goodput or leave it out",
    },
    "goodput": {
        "by": "chooses the restore/save report's rows, not the goodput table's; leave it out",
        "mtbi": "gives the checkpoint interval in the restore/save report; report without "
        "--goodput for it",
        "interruptions": "is another view; give one (the --html page shows both)",
    },
    "interruptions": {
        "by": "chooses the rows of the restore/save report, not of the stories; leave it out",
        "mtbi": "gives the checkpoint interval in the restore/save report; report without "
        "--interruptions for it",
        "plot": "has no picture of the stories; --html FILE puts them beside the charts",
        "price_per_hour": "prices the buckets of --goodput; the stories are priced at the "
        "rate their job recorded",
    },
}


def refuse_unhonoured(args: argparse.Namespace) -> None:
    """One line, before any work, for an option the chosen view would not honour (one
    left at its default asks nothing of it)."""
    from ckptprof.errors import CkptprofError

    view = "goodput" if args.goodput else "interruptions" if args.interruptions else None
    for dest, why in UNHONOURED[view].items():
        if getattr(args, dest) != OPTION_DEFAULTS[dest]:
            flag = "--" + dest.replace("_", "-")
            shown = f"report --{view}" if view else "report"
            raise CkptprofError(f"{shown}: {flag} {why}.")


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
    if mtbi_s and not report.intervals:
        from ckptprof.errors import CkptprofError

        raise CkptprofError(
            f"--mtbi: {', '.join(map(str, paths))} hold no finished save to set an interval "
            "for; add the save's folder (synth save --out) or a job's traces, or drop --mtbi"
        )
    sys.stdout.write(render_json(report) if fmt == "json" else render_text(report, by=by))
    sys.stdout.flush()
    if plot:
        written = write_plot(report, plot)
        print(f"ckptprof: plot written to {written}", file=sys.stderr)
    if html:
        written = _write_html(paths, report, data.sources, html)
        print(f"ckptprof: HTML report written to {written}", file=sys.stderr)


def _write_html(paths: list[str], report, sources: list[str], target: str):
    from ckptprof.report.goodput import build_goodputs, read_job_spans
    from ckptprof.report.html import write_html
    from ckptprof.report.interruptions import build_stories
    from ckptprof.report.timeline import representative, timelines

    spans = read_job_spans(paths, beside_results=True)
    stories = build_stories(spans)
    goodputs = build_goodputs(spans)  # a job's processes, when their traces are here
    if len(goodputs) > 1:
        print(f"ckptprof: warning: the page leaves out the goodput: {_jobs(goodputs)}; "
              "`report --goodput` shows each", file=sys.stderr)  # fmt: skip
    goodput = goodputs[0] if len(goodputs) == 1 else None
    line = representative(timelines(spans))
    return write_html(report, target, line, stories, sources, goodput, paths)


def _jobs(goodputs) -> str:
    return f"these traces hold {len(goodputs)} jobs ({'; '.join(g.job or '?' for g in goodputs)})"


def _write_page(args: argparse.Namespace) -> None:
    """``--html`` beside another view: the whole page (it has that view's section)."""
    from ckptprof.report import aggregate, load

    data = load(args.paths)
    written = _write_html(args.paths, aggregate(data), data.sources, args.html)
    print(f"ckptprof: HTML report written to {written}", file=sys.stderr)


def run_goodput(args: argparse.Namespace) -> int:
    """``--goodput``: each job's wall time across its processes, as a table (or JSON)."""
    import json

    from ckptprof.errors import CkptprofError
    from ckptprof.report.cut_short import cut_short_json
    from ckptprof.report.goodput import build_goodputs, read_job_spans
    from ckptprof.report.goodput_text import goodput_json, render_goodput
    from ckptprof.report.traces import cut_short_from_spans

    spans = read_job_spans(args.paths)
    goodputs = build_goodputs(spans, args.price_per_hour)
    if not goodputs:
        raise CkptprofError(
            f"{', '.join(args.paths)}: no ckpt.run spans (one per process of a job): trace "
            "the job with a ckptprof callback (CkptProf, CkptProfCallback), then report on "
            "every process's trace files together."
        )
    pictured = [f"--{d}" for d in ("plot", "html") if getattr(args, d)]
    if len(goodputs) > 1 and pictured:
        raise CkptprofError(
            f"{' and '.join(pictured)}: a picture of one job's goodput, and {_jobs(goodputs)}; "
            "report on one job's trace files (the table shows each)."
        )
    if args.html:
        _write_page(args)
    cuts = cut_short_from_spans(spans)
    if args.format == "json":
        docs = [goodput_json(g) for g in goodputs]
        doc = docs[0] if len(docs) == 1 else {"jobs": docs}
        sys.stdout.write(json.dumps({**doc, "cut_short": cut_short_json(cuts)}, indent=2))
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n".join(render_goodput(g) for g in goodputs) + _cut_short_block(cuts))
    if args.plot:
        from ckptprof.report.plot import goodput_figure, save_figure

        [goodput] = goodputs
        written = save_figure(lambda: goodput_figure(goodput), args.plot, "--plot")
        print(f"ckptprof: plot written to {written}", file=sys.stderr)
    return 0


def _cut_short_block(cuts) -> str:
    """The saves and restores cut short, after a blank line (nothing when none)."""
    from ckptprof.report.cut_short import cut_short_lines

    lines = cut_short_lines(cuts)
    return "\n" + "\n".join(lines) + "\n" if lines else ""


def run_interruptions(args: argparse.Namespace) -> int:
    """``--interruptions``: each interruption's story, as text (or JSON), and the
    operations cut short."""
    from ckptprof.report.interruptions import build_stories, render_stories, render_stories_json
    from ckptprof.report.load import read_trace_spans
    from ckptprof.report.traces import cut_short_from_spans

    # a results folder's stories are in the traces beside its results.json
    spans = read_trace_spans(args.paths, beside_results=True)
    stories = build_stories(spans)
    if args.format == "json":
        text = render_stories_json(stories)
    else:
        cut = _cut_short_block(cut_short_from_spans(spans))
        # none of either: render_stories says what to do (one line, before any file)
        text = render_stories(stories) + cut if stories or not cut else cut.lstrip("\n")
    if args.html:
        _write_page(args)
    sys.stdout.write(text)
    return 0


def run(args: argparse.Namespace) -> int:
    """Entry for ``ckptprof report``: the table (or JSON) on stdout, warnings on stderr.
    A caller's ``args`` may leave out options: they take their defaults."""
    for dest, default in OPTION_DEFAULTS.items():
        if not hasattr(args, dest):
            setattr(args, dest, default)
    refuse_unhonoured(args)
    if args.plot:
        from ckptprof.report.plot import check_image_path

        check_image_path(args.plot)
    if args.goodput:
        return run_goodput(args)
    if args.interruptions:
        return run_interruptions(args)
    print_report(
        args.paths, plot=args.plot, by=args.by, fmt=args.format, html=args.html, mtbi_s=args.mtbi
    )
    return 0
