"""``ckptprof demo``: save a small checkpoint on local disk (timed), restore it, report."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ckptprof.cli.options import HelpFormatter, Moot, add_device_option, directory, refuse_moot
from ckptprof.cli.synth_options import (
    add_concurrency_option,
    add_memory_budget_option,
    add_rank_option,
    add_repeat_option,
    add_spec_arguments,
    add_strategy_option,
    add_world_size_option,
    memory_budget_moot,
)

DEMO_EXAMPLES = """examples:
  ckptprof demo                                   # llama2-7b at 1% scale, ~0.7 GB, a few minutes
  ckptprof demo --layout dcp --ranks 2 --world-size 1
  ckptprof demo --full --no-optimizer             # full-size 7B weights (13.5 GB of disk)
  ckptprof demo --full --world-size 8 --rank 0    # one rank of 8 restoring a full 7B + Adam
"""


@dataclass(frozen=True)
class _BySize:
    """A restore option's demo default: one value for the small demo, another with
    --full; --help shows both."""

    small: object
    full: object

    def __str__(self) -> str:  # what --help shows as the default
        return f"{_text(self.small)}; {_text(self.full)} with --full"

    @staticmethod
    def chosen(value, full: bool):
        """An option's value: as given, or the demo's default for its size."""
        if isinstance(value, _BySize):
            return value.full if full else value.small
        return value


def _text(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


DEMO_SCALE = 0.01  # the checkpoint's size without --full: ~0.7 GB of llama2-7b

#: where the demo restores differently from ``synth restore`` when not told
DEMO_DEFAULTS = {
    "strategy": _BySize(("staged", "pipelined"), ("pipelined",)),
    "concurrency": _BySize((1, 8), (8,)),
    "repeat": _BySize(3, 1),
}


def add_parser(commands) -> None:
    demo = commands.add_parser(
        "demo",
        help="save a small checkpoint locally, restore it cold and hot, print the report",
        description="The main job in one command on the local disk: synth save (the state "
        "built in memory, saved and timed, --repeat times; with --full, too big to hold: "
        "synth generate) + synth restore (cold and hot) + report, the save beside its "
        "restores.",
        epilog=DEMO_EXAMPLES,
        formatter_class=HelpFormatter,
    )
    demo.add_argument(
        "--dir",
        type=directory,
        default="ckptprof-demo",
        help="working directory: checkpoint/, save/, results/ and report.png go there, an "
        "earlier demo's replaced (default ./ckptprof-demo)",
    )
    demo.add_argument(
        "--plot",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also write DIR/report.png",
    )
    spec = demo.add_argument_group("the checkpoint: what is saved")
    add_spec_arguments(spec, scale=DEMO_SCALE)
    spec.add_argument("--full", action="store_true", help="full size (--scale 1)")
    restore = demo.add_argument_group("the restore: options as in `ckptprof synth restore`")
    for add_option in (
        add_strategy_option, add_concurrency_option, add_repeat_option, add_world_size_option,
        add_rank_option, add_memory_budget_option, add_device_option,
    ):  # fmt: skip
        add_option(restore)
    demo.set_defaults(func=run, **DEMO_DEFAULTS)
    refuse_moot(
        demo,
        Moot(("scale",), lambda args: args.full, "--full is --scale 1", "drop one of them"),
        memory_budget_moot(lambda args: _BySize.chosen(args.strategy, args.full)),
    )


def _check_before_saving(args, options) -> None:
    """What the restore would refuse after the timed saves, known from the options alone:
    a folder whose own files it would replace, a rank outside the ranks saved, a strategy
    for another layout."""
    from ckptprof.errors import CkptprofError
    from ckptprof.storage import open_storage
    from ckptprof.synth.layouts import get_layout
    from ckptprof.synth.strategies.registry import get_strategy

    _check_dir(args.dir, args.plot)
    if args.rank is not None and args.world_size is None and args.rank >= args.ranks:
        raise CkptprofError(
            f"--rank {args.rank} is not a rank of the {args.ranks} saved (--ranks "
            f"{args.ranks}); pass --world-size, or a rank below {args.ranks}."
        )
    storage = open_storage(str(args.dir), max(options.concurrency))
    for name in options.strategies:
        get_strategy(name).check(storage)
        get_strategy(name).check_layout(get_layout(args.layout))


#: what the demo writes in its --dir (an earlier demo's are replaced)
OUTPUTS = ("checkpoint", "save", "results")
PLOT_NAME = "report.png"


def _check_dir(folder: Path, plot: bool) -> None:
    """The demo writes ``OUTPUTS`` (and the plot) in ``folder``, replacing an earlier
    demo's; a folder the user chose that holds files of those names that no demo wrote
    (no ckptprof checkpoint in ``checkpoint/``) is refused before anything is written."""
    from ckptprof.errors import CkptprofError
    from ckptprof.manifest import MANIFEST_NAME

    if (folder / "checkpoint" / MANIFEST_NAME).is_file():
        return  # an earlier demo's folder: its outputs are the demo's to replace
    names = OUTPUTS + ((PLOT_NAME,) if plot else ())
    taken = [name for name in names if (folder / name).exists()]
    if taken:
        raise CkptprofError(
            f"--dir {folder} holds {', '.join(taken)}, which the demo would replace and no "
            "demo wrote; name a new or empty folder (default ./ckptprof-demo)."
        )


def run(args) -> int:
    from ckptprof.cli.report import print_report
    from ckptprof.synth.generate import generate
    from ckptprof.synth.options import RestoreOptions
    from ckptprof.synth.plan import SynthSpec
    from ckptprof.synth.restore import run_restore

    ckpt, save, out = (args.dir / name for name in OUTPUTS)
    scale = 1.0 if args.full else args.scale
    spec = SynthSpec(
        model=args.model, layout=args.layout, scale=scale, ranks=args.ranks,
        optimizer=args.optimizer, master_weights=args.master_weights, files=args.files,
        step=args.step, seed=args.seed,
    )  # fmt: skip
    full = args.full
    options = RestoreOptions(
        strategies=_BySize.chosen(args.strategy, full),
        caches=("cold", "hot"),
        concurrency=_BySize.chosen(args.concurrency, full),
        repeat=_BySize.chosen(args.repeat, full),
        world_size=args.world_size,
        rank=args.rank,
        memory_budget=args.memory_budget,
        device=args.device,
    )
    options.validate()  # before writing: a bad option costs nothing
    _check_before_saving(args, options)
    reported = [str(out / "results.json")]
    if full or (args.layout == "dcp" and args.ranks > 1):
        # a full-size state does not fit in memory to be saved; a multi-rank DCP save
        # needs one process per rank: the checkpoint is generated (not timed)
        print(f"== generate {args.model} x{scale:g} ({args.layout}) in {ckpt} (not timed)")
        result = generate(str(ckpt), spec, force=True)
        files = len(result.manifest.files)
        print(f"wrote {files} files and the manifest, {result.total_bytes / 1e9:.3f} GB")
    else:
        reported.append(str(_save(ckpt, spec, save, options.repeat)))
    levels = ",".join(map(str, options.concurrency))
    how = ", ".join(options.strategies)
    print(f"== restore ({how}; cold and hot, {levels} in flight, {options.repeat} repeats)")
    run_restore(str(ckpt), options, out)
    print("== report")
    print_report(reported, plot=args.dir / PLOT_NAME if args.plot else None)
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
