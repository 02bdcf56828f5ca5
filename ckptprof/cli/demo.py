"""``ckptprof demo``: save a small checkpoint on local disk (timed), restore it, report."""

from __future__ import annotations

import argparse
from pathlib import Path

from ckptprof.cli.options import (
    HelpFormatter,
    add_device_option,
    choice_list,
    directory,
    int_list,
    size,
    whole,
)
from ckptprof.cli.synth_options import add_spec_arguments
from ckptprof.synth import ranges
from ckptprof.synth.strategies import registry as strategy_registry

DEMO_EXAMPLES = """examples:
  ckptprof demo                                   # llama2-7b at 1% scale, ~0.7 GB, a few minutes
  ckptprof demo --layout dcp --ranks 2 --world-size 1
  ckptprof demo --full --no-optimizer             # full-size 7B weights (13.5 GB of disk)
  ckptprof demo --full --world-size 8 --rank 0    # one rank of 8 restoring a full 7B + Adam
"""


def add_parser(commands) -> None:
    demo = commands.add_parser(
        "demo",
        help="save a small checkpoint locally, restore it cold and hot, print the report",
        description="The main job in one command on the local disk: synth save (the state "
        "built in memory, saved and timed; with --full, too big to hold: synth generate) + "
        "synth restore + report, the save beside its restores.",
        epilog=DEMO_EXAMPLES,
        formatter_class=HelpFormatter,
    )
    demo.add_argument(
        "--dir",
        type=directory,
        default="ckptprof-demo",
        help="working directory (default ./ckptprof-demo)",
    )
    add_spec_arguments(demo, scale=0.01)
    demo.add_argument(
        "--world-size",
        type=whole(ranges.RANKS),
        default=None,
        help="ranks of the job that restores it (default: the saved ranks)",
    )
    demo.add_argument(
        "--rank",
        type=whole(ranges.RANK),
        default=None,
        help="restore only this rank of --world-size (default: every rank)",
    )
    demo.add_argument("--full", action="store_true", help="full size (--scale 1)")
    demo.add_argument(
        "--strategy",
        type=choice_list(strategy_registry.NAMES),
        default=None,
        help="restore strategies side by side (default staged,pipelined; pipelined with --full)",
    )
    demo.add_argument(
        "--concurrency",
        type=int_list(ranges.CONCURRENCY),
        default=None,
        help="requests in flight (default 1,8; 8 with --full)",
    )
    demo.add_argument(
        "--repeat",
        type=whole(ranges.REPEAT),
        default=None,
        help="repeats per setting (default 3; 1 with --full)",
    )
    demo.add_argument(
        "--memory-budget",
        type=size(ranges.MEMORY_BUDGET),
        default=None,
        metavar="SIZE",
        help="bytes the pipelined strategy may hold in flight (default: from free memory)",
    )
    add_device_option(demo)
    demo.add_argument(
        "--plot",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also write DIR/report.png",
    )
    demo.set_defaults(func=run)


def run(args) -> int:
    from ckptprof.cli.report import print_report
    from ckptprof.synth.generate import generate
    from ckptprof.synth.options import RestoreOptions
    from ckptprof.synth.plan import SynthSpec
    from ckptprof.synth.restore import run_restore

    ckpt = args.dir / "checkpoint"
    out = args.dir / "results"
    scale = 1.0 if args.full else args.scale
    spec = SynthSpec(
        model=args.model, layout=args.layout, scale=scale, ranks=args.ranks,
        optimizer=args.optimizer, master_weights=args.master_weights, files=args.files,
        step=args.step, seed=args.seed,
    )  # fmt: skip
    full = args.full
    options = RestoreOptions(
        strategies=args.strategy or (("pipelined",) if full else ("staged", "pipelined")),
        caches=("cold", "hot"),
        concurrency=args.concurrency or ((8,) if full else (1, 8)),
        repeat=args.repeat or (1 if full else 3),
        world_size=args.world_size,
        rank=args.rank,
        memory_budget=args.memory_budget,
        device=args.device,
    )
    options.validate()  # before writing: a bad option costs nothing
    reported = [str(out / "results.json")]
    if full or (args.layout == "dcp" and args.ranks > 1):
        # a full-size state does not fit in memory to be saved; a multi-rank DCP save
        # needs one process per rank: the checkpoint is generated (not timed)
        print(f"== generate {args.model} x{scale:g} ({args.layout}) in {ckpt} (not timed)")
        result = generate(str(ckpt), spec, force=True)
        print(f"wrote {len(result.manifest.files)} files, {result.total_bytes / 1e9:.3f} GB")
    else:
        reported.append(str(_save(ckpt, spec, args.dir / "save", options.repeat)))
    levels = ",".join(map(str, options.concurrency))
    how = ", ".join(options.strategies)
    print(f"== restore ({how}; cold and hot, {levels} in flight, {options.repeat} repeats)")
    run_restore(str(ckpt), options, out)
    print("== report")
    print_report(reported, plot=args.dir / "report.png" if args.plot else None)
    return 0


def _save(ckpt: Path, spec, out: Path, repeat: int) -> Path:
    """``synth save`` of the spec's state into ``ckpt``, timed; returns its trace folder."""
    from ckptprof.synth.job import traced
    from ckptprof.synth.options import SaveOptions
    from ckptprof.synth.save import run_save, write_results

    strategy = "framework"
    print(
        f"== save {spec.model} {spec.scale_label()} ({spec.layout}) in {ckpt}: the layout's "
        f"own writer, fsync on, {repeat} saves"
    )
    traces = out / "traces"
    with traced(traces) as (_, tracer):
        options = SaveOptions(repeat=repeat, force=True, strategy=strategy)
        result = run_save(str(ckpt), spec, options, tracer)
        write_results(out, spec, options, result)
    return traces
