"""``ckptprof predict``: the save and restore of a job you are planning, from a small run."""

from __future__ import annotations

import argparse
import json
import sys

from ckptprof import schema
from ckptprof.cli.options import (
    HelpFormatter,
    Moot,
    choice_list,
    directory,
    duration,
    input_path,
    location,
    output_file,
    real,
    refuse_moot,
    whole,
)
from ckptprof.cost import MAX_PRICE_PER_HOUR
from ckptprof.predict.check import CASES, FILE_BASES, FILE_TARGET
from ckptprof.synth import ranges
from ckptprof.synth.presets import PRESETS

#: S3's documented request rates per partitioned prefix (AWS S3 performance guidelines)
S3_GETS_PER_S, S3_PUTS_PER_S = 5_500.0, 3_500.0
#: a GPU node's front-end network when none is given: 100 Gbit/s
DEFAULT_NODE_GBPS = 12.5

DESCRIPTION = """\
Predict a checkpoint's save and restore for a job you are planning, from what one node
measured on the target storage (the results.json of `ckptprof synth restore` and the
save.json of `ckptprof synth save`, at small scale) and the limits one node cannot
measure. Each rank's bytes follow from the model, the ranks and the sharding; they then
meet, in turn, the rank's own client (its measured fetch or write rate), the node's
network, the storage's aggregate bandwidth and, on an object store, its request rate per
prefix. The slowest of these is the transfer time; the CPU phases (verify, deserialize,
reshard; a save's commit) and the rest of a rank's wall time (other: set-up, the gaps
between phases) are added after it. A rank's own costs are a fixed part plus a part per
byte where the runs given measured two sizes (or more), plus a part per file where they
measured two file counts; from one size, per byte alone. The output names the limit that
binds, how far the next one is, and the source of every number (measured, fitted, given or
assumed)."""

EPILOG = f"""\
defaults, each named in the output as assumed:
  --node-gbps      {DEFAULT_NODE_GBPS:g} GB/s: a 100 Gbit/s front-end network per node
  --get-rate       {S3_GETS_PER_S:,.0f}/s, --put-rate {S3_PUTS_PER_S:,.0f}/s on s3://
                   (S3's documented rates per partitioned prefix); none on a file system
  --storage-gbps   none: without it the storage is taken to scale without limit

examples:
  ckptprof predict ckptprof-out/ ckptprof-save/ --model llama3-405b --nodes 64 \\
      --ranks-per-node 8 --sharding fsdp --storage-gbps 157.9
  ckptprof predict runs/s3/ --model llama3-70b --nodes 16 --ranks-per-node 8 --mtbi 24h \\
      --price-per-hour 98.32 --plot predict.png"""


def add_parser(commands) -> None:
    from ckptprof.predict.model import SHARDINGS

    parser = commands.add_parser(
        "predict",
        help="predict a planned job's checkpoint save and restore from a small measured run",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "paths", nargs="*", metavar="PATH", type=input_path,
        help="results.json and save.json measured on the target storage, or their folders",
    )  # fmt: skip
    parser.add_argument(
        "--model", default="llama2-7b", choices=tuple(PRESETS), metavar="NAME",
        help="the planned model: %(choices)s",
    )  # fmt: skip
    parser.add_argument(
        "--nodes", type=whole(schema.integer(1, 100_000)), default=1, help="nodes of the job"
    )
    parser.add_argument(
        "--ranks-per-node", type=whole(schema.integer(1, 1024)), default=8,
        help="ranks (GPUs) per node",
    )  # fmt: skip
    parser.add_argument(
        "--sharding", choices=SHARDINGS, default="fsdp",
        help="replicated: rank 0 saves everything and every rank reads everything; zero1/"
        "zero2: optimizer sharded; zero3/fsdp: everything sharded",
    )  # fmt: skip
    parser.add_argument(
        "--optimizer", action=argparse.BooleanOptionalAction, default=True,
        help="Adam's two fp32 moments in the checkpoint",
    )  # fmt: skip
    parser.add_argument("--master-weights", action="store_true", help="fp32 master weights too")
    parser.add_argument(
        "--files-per-rank", type=whole(schema.integer(1, 1_000_000)), default=1,
        help="files each rank writes and reads (each costs a request more)",
    )  # fmt: skip
    _add_limits(parser)
    parser.add_argument(
        "--format", choices=("table", "json"), default="table",
        help="table for people, json for scripts",
    )  # fmt: skip
    parser.add_argument(
        "--plot", metavar="FILE.png", type=output_file,
        help="time against nodes (1, 2, 4 … --nodes), the binding limit at each point",
    )  # fmt: skip
    _add_check(parser)
    parser.set_defaults(func=run)
    refuse_moot(
        parser,
        Moot(PREDICTION_ONLY, lambda args: bool(args.check),
             "--check {check} predicts its own cases from what it measures there",
             "drop them, or predict without --check"),
        Moot(CHECK_ONLY, lambda args: not args.check, "they say how --check measures",
             "add --check DEST, or drop them"),
    )  # fmt: skip


#: what only ``--check`` uses, and what only a prediction from PATHs uses (``--model``
#: serves both); the test holds every option of the command to one of the three
CHECK_ONLY = ("direct_io", "cases", "scale", "repeat", "out")
PREDICTION_ONLY = (
    "paths", "nodes", "ranks_per_node", "sharding", "optimizer", "master_weights",
    "files_per_rank", "storage_gbps", "node_gbps", "cores_per_node", "get_rate", "put_rate",
    "mtbi", "price_per_hour", "format", "plot",
)  # fmt: skip
BOTH = ("model", "check")


def _add_limits(parser) -> None:
    """What one node cannot measure (each given, or defaulted with its source), and the
    job's interruptions and price."""
    gbps = real(schema.number(maximum=100_000, above=0))
    parser.add_argument("--storage-gbps", type=gbps, help="the storage's aggregate GB/s")
    parser.add_argument(
        "--node-gbps", type=gbps, help=f"one node's network GB/s (default {DEFAULT_NODE_GBPS:g})"
    )
    parser.add_argument(
        "--cores-per-node", type=real(schema.number(maximum=100_000, above=0)),
        help="a node's CPU cores, which its ranks' CPU phases share (default: one per rank)",
    )  # fmt: skip
    rate = real(schema.number(maximum=1e9, above=0))
    parser.add_argument("--get-rate", type=rate, help="an object store's GETs per second")
    parser.add_argument("--put-rate", type=rate, help="an object store's PUTs per second")
    parser.add_argument(
        "--mtbi", metavar="DURATION", type=duration(schema.number(minimum=60, maximum=3.2e8)),
        help="mean time between interruptions of ONE node (e.g. 24h): the job's, its "
        "Young/Daly checkpoint interval and the shares of saving, restoring and lost work",
    )  # fmt: skip
    parser.add_argument(
        "--price-per-hour", metavar="PRICE",
        type=real(schema.number(maximum=MAX_PRICE_PER_HOUR, above=0)),
        help="what one node costs an hour: the price of one save and one restore",
    )  # fmt: skip


def _add_check(parser) -> None:
    """``--check``: the predictions measured on the storage at hand."""
    check = parser.add_argument_group(
        "checking the predictions here",
        "--check DEST measures base saves and restores at DEST (a folder or s3://bucket/"
        "prefix on the storage to check), predicts each target from them, measures the target "
        "and prints both with the error",
    )
    check.add_argument(
        "--check", metavar="DEST", type=location, help="where the checks save and restore"
    )
    check.add_argument(
        "--cases", type=choice_list(CASES), default=CASES,
        help="ranks: 2 and 4 ranks from 1 rank at the base scale and twice it; scale: 5x the "
        f"base scale from the same two; files: {FILE_TARGET} files from those and "
        f"{' and '.join(map(str, FILE_BASES))} files",
    )  # fmt: skip
    check.add_argument("--scale", type=real(ranges.SCALE), default=0.002, help="the base's scale")
    check.add_argument(
        "--repeat", type=whole(ranges.REPEAT), default=2,
        help="saves and restores of each measured setting (their medians)",
    )  # fmt: skip
    check.add_argument(
        "--out", type=directory, default="ckptprof-predict-check",
        help="where the checks' results go",
    )  # fmt: skip
    check.add_argument(
        "--direct-io", action="store_true",
        help="every save through the parallel writer with O_DIRECT (synth save --direct-io): "
        "the device's time, not the page cache's (a path only)",
    )  # fmt: skip


def limits_for(args, object_store: bool):
    from ckptprof.predict.model import Given, Limits

    def given(value, default, what):
        if value is not None:
            return Given(value, f"given ({what})")
        return None if default is None else Given(default, f"assumed ({what} default)")

    return Limits(
        storage_gbps=given(args.storage_gbps, None, "--storage-gbps"),
        node_gbps=given(args.node_gbps, DEFAULT_NODE_GBPS, "--node-gbps"),
        get_rate=given(args.get_rate, S3_GETS_PER_S if object_store else None, "--get-rate"),
        put_rate=given(args.put_rate, S3_PUTS_PER_S if object_store else None, "--put-rate"),
        cores=given(args.cores_per_node, None, "--cores-per-node"),
    )


def run_check(args) -> int:
    from ckptprof.predict.check import check, render_check
    from ckptprof.preflight import OutputClaim

    args.out.mkdir(parents=True, exist_ok=True)
    with OutputClaim(args.out, "--out"):
        rows, note = check(args.check, args.out, args.cases, args.model, args.scale,
                           args.repeat, direct_io=args.direct_io)  # fmt: skip
    table = render_check(rows, note)
    from ckptprof.atomic import atomic_write

    atomic_write(args.out / "check.txt", table)
    atomic_write(args.out / "check.json", json.dumps([row.to_dict() for row in rows], indent=2))
    sys.stdout.write(table)
    return 0


def run(args) -> int:
    from ckptprof.errors import CkptprofError
    from ckptprof.storage import is_object_store

    if args.plot:
        from ckptprof.report.plot import check_image_path

        check_image_path(args.plot)
    if args.direct_io and is_object_store(args.check):
        raise CkptprofError(
            f"predict: --direct-io applies to local or mounted paths only, not {args.check}; "
            "drop it."
        )
    if args.check:
        return run_check(args)
    if not args.paths:
        raise CkptprofError(
            "predict: give the results measured on the target storage (PATH: results.json, "
            "save.json or their folders), or --check DEST to check the predictions here"
        )
    return run_prediction(args)


def run_prediction(args) -> int:
    from ckptprof.predict.measured import measured
    from ckptprof.predict.model import JobPlan, interval, predict_restore, predict_save
    from ckptprof.predict.render import Prediction, figure, render_json, render_text

    plan = JobPlan(
        model=args.model, params=PRESETS[args.model].params, nodes=args.nodes,
        ranks_per_node=args.ranks_per_node, sharding=args.sharding, optimizer=args.optimizer,
        master_weights=args.master_weights, files_per_rank=args.files_per_rank,
    )  # fmt: skip
    found = measured(args.paths)
    limits = limits_for(args, found.object_store)
    restore = predict_restore(plan, found.costs, limits)
    save = predict_save(plan, found.costs, limits) if found.costs.write else None
    every = interval(plan, save, restore, args.mtbi) if args.mtbi and save else None
    if args.mtbi and save is None:
        print("ckptprof: warning: --mtbi needs a save measured (save.json)", file=sys.stderr)
    prediction = Prediction(plan, found, limits, restore, save, every, args.price_per_hour)
    if args.format == "json":
        sys.stdout.write(json.dumps(render_json(prediction), indent=2) + "\n")
    else:
        sys.stdout.write(render_text(prediction))
    if args.plot:
        from ckptprof.report.plot import save_figure

        written = save_figure(lambda: figure(prediction), args.plot, "--plot")
        print(f"ckptprof: plot written to {written}", file=sys.stderr)
    return 0
