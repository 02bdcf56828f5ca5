"""``ckptprof demo``: generate a small checkpoint on local disk, restore it, report."""

from __future__ import annotations

import argparse
from pathlib import Path

DEMO_EXAMPLES = """examples:
  ckptprof demo                                   # llama2-7b at 1% scale, ~0.7 GB, about a minute
  ckptprof demo --layout dcp --ranks 2 --world-size 1
  ckptprof demo --full --no-optimizer             # full-size 7B weights (13.5 GB of disk)
"""


def add_parser(commands) -> None:
    demo = commands.add_parser(
        "demo",
        help="generate a small checkpoint locally, restore it cold and hot, print the report",
        description="The main job in one command: synth generate + synth restore + report on "
        "the local disk.",
        epilog=DEMO_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument(
        "--dir",
        type=Path,
        default=Path("ckptprof-demo"),
        help="working directory (default ./ckptprof-demo)",
    )
    demo.add_argument("--model", default="llama2-7b")
    demo.add_argument("--layout", default="torch")
    demo.add_argument("--ranks", type=int, default=1)
    demo.add_argument("--world-size", type=int, default=None)
    demo.add_argument("--scale", type=float, default=0.01)
    demo.add_argument("--full", action="store_true", help="full size (--scale 1)")
    demo.add_argument("--optimizer", action=argparse.BooleanOptionalAction, default=True)
    demo.add_argument("--concurrency", default="1,8")
    demo.add_argument("--repeat", type=int, default=3)
    demo.add_argument(
        "--plot",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also write DIR/report.png",
    )
    demo.set_defaults(func=run)


def run(args) -> int:
    from ckptprof.cli import synth
    from ckptprof.cli.report import print_report

    ckpt = args.dir / "checkpoint"
    out = args.dir / "results"
    scale = 1.0 if args.full else args.scale
    print(f"== generate {args.model} x{scale:g} ({args.layout}) in {ckpt}")
    synth.run_generate(
        argparse.Namespace(
            dest=str(ckpt),
            model=args.model,
            layout=args.layout,
            ranks=args.ranks,
            scale=scale,
            optimizer=args.optimizer,
            master_weights=False,
            files=None,
            step=1000,
            seed=0,
            dry_run=False,
            bandwidth_gbps=None,
            force=True,
        )
    )
    print(f"== restore (cold and hot, {args.concurrency} in flight, {args.repeat} repeats)")
    synth.run_restore(
        argparse.Namespace(
            dest=str(ckpt),
            cache="cold,hot",
            concurrency=synth._int_list(args.concurrency),
            repeat=args.repeat,
            verify="full",
            world_size=args.world_size,
            part_size=16 << 20,
            ceiling_gbps=None,
            first_step=True,
            drop_caches=False,
            per_file_spans=False,
            stage=None,
            out=out,
            trace_dir=None,
            report=False,
        )
    )
    print("== report")
    plot = args.dir / "report.png" if args.plot else None
    print_report([str(out / "results.json")], plot=plot)
    return 0
