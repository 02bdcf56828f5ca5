"""``ckptprof compare``: runs side by side, ranked, priced, and a regression gate for CI."""

from __future__ import annotations

import argparse
import sys

from ckptprof import schema
from ckptprof.cli.options import HelpFormatter, input_path, output_file, real, text_value, whole
from ckptprof.cost import MAX_PRICE_PER_HOUR

DESCRIPTION = """\
Put several runs side by side — storage targets, ckptprof or framework versions,
strategies — from what `ckptprof report` reads (results.json, traces, folders). Like
settings are matched across them and ranked by their medians: a synthetic restore by its
time to state (list -> reshard, what the storage controls; its first step, this machine's
compute, beside it), a callback's real resume by its RTO, a save by its wall time; with
each phase's median and what one restore costs. Saves (save.json, save traces) and
restores mix freely; a storage table sets each PATH's write and read GB/s side by side.
Repeats that overlap get no verdict: the repeats that would separate them are named.
The first PATH is the base. The runs one PATH holds (a folder of several sweeps), and
those of PATHs given one --label, are one source: pooled per setting where they restored
the same checkpoint, refused in one line where they did not. Only later PATHs are judged,
against the base.

With --fail-if-slower, exits 1 when a setting (or one of its phases) of a later PATH is
slower than the base by more than the limit in every repeat (its fastest repeat slower
than the base's slowest by more than the limit; at least 3 repeats each): the limit
clears the spread, so noise does not fail a build. It also exits 1 when it could not
judge what the base measured: a later PATH with nothing in common with the base, or
lacking a setting the base ran 3 times or more (no run of it, or too few repeats).
Saves are judged as restores are; saves by different writers (--strategy) are not."""

EPILOG = """\
examples:
  ckptprof compare runs/local/ runs/fsx/ runs/s3/
  ckptprof compare base/results.json new/results.json --fail-if-slower 10%
  ckptprof compare a/ b/ --label ext4 --label efs --format json > compare.json"""


def percent(text: str) -> float:
    """``10%`` or ``0.1`` → 0.1; a bare number above 1 that is a percentage (``10``) is
    refused with the ``10%`` it likely meant."""
    value = text.strip()
    scale = 100 if value.endswith("%") else 1
    parse = real(schema.number(minimum=0, maximum=100 if scale == 100 else 1))
    try:
        return parse(value.removesuffix("%")) / scale
    except argparse.ArgumentTypeError as exc:
        if scale == 1 and _is_percentage(value):
            raise argparse.ArgumentTypeError(f"{exc}; for a percentage write {value}%") from None
        raise


def _is_percentage(text: str) -> bool:
    """A bare number above 1 and at most 100: a share cannot be that, a percentage can."""
    try:
        return schema.number(above=1, maximum=100)(float(text)) is None
    except ValueError:
        return False


percent.kind = "percent"  # type: ignore[attr-defined]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "compare",
        help="several runs side by side, ranked, priced; a regression gate for CI",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", type=input_path, help="the base first, then others"
    )
    parser.add_argument(
        "--label",
        action="append",
        default=None,
        type=text_value("a name"),
        help="a name per PATH, in order (default: each path's folder name); PATHs given "
        "the same name are one source (a save folder and a restore folder, say), their "
        "runs of a setting pooled; runs of different checkpoints are refused",
    )
    parser.add_argument(
        "--fail-if-slower",
        type=percent,
        default=None,
        metavar="LIMIT",
        help="exit 1 when a later PATH is slower than the base by more than LIMIT (10%% or "
        "0.1) beyond the repeats' spread",
    )
    parser.add_argument(
        "--by",
        choices=("tts", "rto"),
        default=None,
        help="what ranks a restore: tts (time to state, list -> reshard) or rto (with the "
        "first step); default: tts for synthetic restores, rto for a callback's real resume",
    )
    parser.add_argument(
        "--cost-per-hour",
        type=real(schema.number(minimum=0, maximum=MAX_PRICE_PER_HOUR)),
        default=None,
        metavar="USD",
        help="price of one instance-hour (default $CKPTPROF_COST_PER_HOUR, else 32.77: "
        "an 8-GPU p4d.24xlarge on demand)",
    )
    parser.add_argument(
        "--instances",
        type=whole(schema.integer(1, 1_000_000)),
        default=1,
        help="instances waiting while the job restores (default 1)",
    )
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        type=output_file,
        help="also draw the comparison: per setting one bar per PATH, phases stacked",
    )
    parser.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table for people (default), json for scripts (with a schema_version)",
    )
    parser.set_defaults(func=run)
    return parser


def _cut_short_text(paths: list[str], labels: list[str] | None) -> str:
    """Each PATH's saves and restores cut short (not compared: they never ended)."""
    from ckptprof.report.cut_short import cut_short_lines
    from ckptprof.report.load import read_trace_spans
    from ckptprof.report.traces import cut_short_from_spans

    blocks = []
    for n, path in enumerate(paths):
        lines = cut_short_lines(cut_short_from_spans(read_trace_spans([path])))
        if lines:
            label = labels[n] if labels else path
            blocks.append("\n".join([f"{label}: {lines[0]}", *lines[1:]]))
    return "".join(f"\n{block}\n" for block in blocks)


def run(args: argparse.Namespace) -> int:
    from ckptprof.errors import CkptprofError
    from ckptprof.report.compare import compare
    from ckptprof.report.compare_json import render_json
    from ckptprof.report.compare_text import render_text

    if args.label is not None and len(args.label) != len(args.paths):
        raise CkptprofError(
            f"--label was given {len(args.label)} times for {len(args.paths)} paths; give one "
            "per PATH, in order, or none."
        )
    if args.plot:
        from ckptprof.report.plot import check_image_path

        check_image_path(args.plot)
    result = compare(
        args.paths, args.label, args.fail_if_slower, args.cost_per_hour, args.instances,
        args.by or "auto",
    )  # fmt: skip
    sys.stdout.write(render_json(result) if args.format == "json" else render_text(result))
    if args.format != "json":
        sys.stdout.write(_cut_short_text(args.paths, args.label))
    if args.plot:
        from ckptprof.report.plot import compare_figure, save_figure

        written = save_figure(lambda: compare_figure(result), args.plot, "--plot")
        print(f"ckptprof: plot written to {written}", file=sys.stderr)
    failure = result.gate_failure()
    if result.regressions:
        first = result.regressions[0]
        more = len(result.regressions) - 1
        print(
            f"ckptprof: slower than the base: {first.line(result.limit)}"
            + (f" (and {more} more)" if more else ""),
            file=sys.stderr,
        )
    if failure:
        print(f"ckptprof: {failure}", file=sys.stderr)
    return 1 if failure or result.regressions else 0
