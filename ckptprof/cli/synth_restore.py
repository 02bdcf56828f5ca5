"""``ckptprof synth restore``: time a synthetic checkpoint's restore phase by phase, cold
and hot, across concurrency, as one process or as the ranks of a job."""

from __future__ import annotations

import argparse
import os

from ckptprof.cli.options import (
    HelpFormatter,
    Moot,
    add_device_option,
    checkpoint,
    choice_list,
    directory,
    real,
    refuse_moot,
    size,
    size_text,
    whole,
)
from ckptprof.cli.synth_options import RESTORE_DEFAULTS as DEFAULTS
from ckptprof.cli.synth_options import (
    add_concurrency_option,
    add_memory_budget_option,
    add_rank_option,
    add_repeat_option,
    add_stall_option,
    add_strategy_option,
    add_world_size_option,
    memory_budget_moot,
    stall_after_s,
    stall_option,
    without_nproc,
)
from ckptprof.manifest import VERIFY_MODES
from ckptprof.synth import ranges
from ckptprof.synth.ranges import DEFAULT_STEP_TOKENS, STEP_SEQ_MAX

RESTORE_EXAMPLES = """examples:
  ckptprof synth restore ./ckpt --strategy staged,pipelined,framework --cache cold --concurrency 8
  ckptprof synth restore ./ckpt --world-size 8 --rank 0 --memory-budget 1G   # one rank of 8
  ckptprof synth restore /mnt/fsx/ckpt                       # cold+hot, 1..64 in flight, 3 repeats
  ckptprof synth restore ./ckpt --cache cold --concurrency 1,16 --repeat 5 --verify sample
  ckptprof synth restore ./ckpt --world-size 1                # reshard a 2-rank DCP save into 1
  ckptprof synth restore ./ckpt --nproc-per-node 4            # 4 ranks, one process each
  torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
      -m ckptprof synth restore /mnt/fsx/ckpt                 # a 16-rank job on two nodes
"""


def add_parser(sub) -> None:
    res = sub.add_parser(
        "restore",
        help="time list/fetch/verify/deserialize/reshard/first_step",
        description="Restore a synthetic checkpoint phase by phase, cold and hot, across "
        "concurrency levels, repeated; writes results.json, results.csv and traces.",
        epilog=RESTORE_EXAMPLES,
        formatter_class=HelpFormatter,
    )
    res.add_argument(
        "dest", metavar="DEST", type=checkpoint, help="checkpoint written by `synth generate`"
    )
    _add_sweep(res)
    _add_job(res)
    _add_reads(res)
    _add_first_step(res)
    _add_outputs(res)
    _add_interruptions(res)
    res.set_defaults(func=run_restore)
    refuse_moot(res, *MOOT)


#: options the others leave without effect, refused where given
MOOT = (
    Moot(("first_step_s", "first_step_tokens"), lambda args: not args.first_step,
         "--no-first-step skips the step", "drop them, or drop --no-first-step"),
    Moot(("first_step_tokens",), lambda args: args.first_step and args.first_step_s is not None,
         "--first-step-s gives the step's time, so no step runs or is estimated here",
         "drop one of them"),
    Moot(("deadline",), lambda args: not args.simulate_interruption,
         "it is the notice's deadline, and only --simulate-interruption gives one",
         "add --simulate-interruption, or drop --deadline"),
    Moot(("drop_caches",), lambda args: "cold" not in args.cache,
         "it empties the cache before cold runs, and --cache asks for none",
         "add cold to --cache, or drop --drop-caches"),
    Moot(("stage",), lambda args: "staged" not in args.strategy,
         lambda args: f"it is where --strategy staged downloads to, and --strategy is "
         f"{','.join(args.strategy)}", "add staged to --strategy, or drop --stage"),
    memory_budget_moot(lambda args: args.strategy),
)  # fmt: skip


def _add_sweep(parser) -> None:
    group = parser.add_argument_group("the sweep: strategies, caches and concurrency, repeated")
    add_strategy_option(group)
    group.add_argument(
        "--cache",
        type=choice_list(ranges.CACHES),
        default=DEFAULTS.caches,
        help=f"cold, hot or cold,hot (default {','.join(DEFAULTS.caches)})",
    )
    add_concurrency_option(group)
    add_repeat_option(group)
    group.add_argument(
        "--verify",
        choices=VERIFY_MODES,
        default=DEFAULTS.verify,
        help=f"full xxh3, sampled ranges, sizes only, or none (default {DEFAULTS.verify})",
    )


def _add_job(parser) -> None:
    group = parser.add_argument_group("the job: the ranks it plays, where the state lives")
    add_world_size_option(group)
    group.add_argument(
        "--nproc-per-node",
        type=whole(ranges.RANKS),
        default=None,
        metavar="N",
        help="run as N ranks of a job on this machine, one process each, through PyTorch's "
        "launcher (torch.distributed.run); across nodes, start `torchrun ... -m ckptprof "
        "synth restore` on each node instead (the job's RTO is its slowest rank's)",
    )
    add_rank_option(group)
    add_device_option(group)


def _add_reads(parser) -> None:
    group = parser.add_argument_group("reads: memory, request size, ceiling, cache, staging")
    add_memory_budget_option(group)
    group.add_argument(
        "--part-size",
        type=size(ranges.PART_SIZE),
        default=DEFAULTS.part_size,
        help=f"bytes per read request, 4K to 1G (default {size_text(DEFAULTS.part_size)})",
    )
    group.add_argument(
        "--ceiling-gbps",
        type=real(ranges.GBPS),
        default=None,
        help="known path bandwidth; skips the probe",
    )
    group.add_argument(
        "--drop-caches",
        action="store_true",
        help="if fadvise leaves pages cached, drop caches machine-wide (root)",
    )
    group.add_argument(
        "--stage",
        type=directory,
        default=None,
        metavar="DIR",
        help="download to a local DIR first, then read from there (like s5cmd cp)",
    )
    group.add_argument(
        "--direct-io",
        action="store_true",
        help="POSIX: read with O_DIRECT, bypassing the page cache (falls back where refused)",
    )


def _add_first_step(parser) -> None:
    group = parser.add_argument_group("the first step after the restore")
    group.add_argument(
        "--no-first-step",
        dest="first_step",
        action="store_false",
        help="skip the first training step",
    )
    group.add_argument(
        "--first-step-s",
        type=real(ranges.STEP_SECONDS),
        default=None,
        metavar="SECONDS",
        help="the first step's time measured in the real job (e.g. a callback's first_step), "
        "counted in the RTO where the step cannot run here (default: estimated beside it)",
    )
    group.add_argument(
        "--first-step-tokens",
        type=whole(ranges.STEP_TOKENS),
        default=None,
        metavar="N",
        help="tokens in the step that runs here or is estimated: the job's micro-batch x "
        f"sequence length, in sequences of at most {STEP_SEQ_MAX} (default: "
        f"{DEFAULT_STEP_TOKENS['cuda']} on a GPU, a step the device is busy with rather than "
        f"one its kernel launches time; {DEFAULT_STEP_TOKENS['cpu']} on the CPU)",
    )


def _add_outputs(parser) -> None:
    group = parser.add_argument_group("outputs: results, traces and the report")
    group.add_argument(
        "--out",
        type=directory,
        default="ckptprof-out",
        help="directory for results and traces (default ./ckptprof-out)",
    )
    group.add_argument(
        "--trace-dir",
        type=directory,
        default=None,
        help="trace file directory (default $CKPTPROF_TRACE_DIR or OUT/traces)",
    )
    group.add_argument(
        "--per-file-spans",
        action="store_true",
        help="also emit one ckpt.file span per file (default: aggregated on the phase)",
    )
    group.add_argument(
        "--report",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="print the report at the end",
    )


def _add_interruptions(parser) -> None:
    group = parser.add_argument_group("interruptions and stalls")
    group.add_argument(
        "--simulate-interruption",
        action="store_true",
        help="first a Spot-style notice, an emergency save and its record; the first restore "
        "is the recovery (see `ckptprof report --interruptions OUT/traces`)",
    )
    group.add_argument(
        "--deadline",
        type=real(ranges.SECONDS),
        default=None,
        metavar="SECONDS",
        help="notice-to-termination time for --simulate-interruption (default "
        f"{DEFAULTS.deadline:g}: EC2 Spot)",
    )
    add_stall_option(group)


def _check_launch(nproc: int, options) -> None:
    """What each launched rank would refuse (``RestoreRunner._check_job_options``), said
    once before the ranks start."""
    from ckptprof.errors import CkptprofError

    if options.world_size not in (None, nproc) or options.rank is not None:
        raise CkptprofError(
            f"--nproc-per-node {nproc} starts {nproc} ranks, each its own rank of a world of "
            f"{nproc}; drop --world-size/--rank (they choose ranks for one process to play)."
        )
    if options.simulate_interruption:
        raise CkptprofError(
            "--simulate-interruption runs in one process; drop it, or --nproc-per-node."
        )


def run_restore(args) -> int:
    from ckptprof.synth.options import RestoreOptions
    from ckptprof.synth.restore import run_restore

    options = RestoreOptions(
        strategies=args.strategy,
        caches=args.cache,
        concurrency=args.concurrency,
        repeat=args.repeat,
        verify=args.verify,
        world_size=args.world_size,
        rank=args.rank,
        memory_budget=args.memory_budget,
        part_size=args.part_size,  # argparse applies the size type to the "16M" default too
        ceiling_gbps=args.ceiling_gbps,
        first_step=args.first_step,
        first_step_s=args.first_step_s,
        first_step_tokens=args.first_step_tokens,
        drop_caches=args.drop_caches,
        per_file_spans=args.per_file_spans,
        stage_dir=args.stage,
        direct_io=args.direct_io,
        simulate_interruption=args.simulate_interruption,
        deadline_s=args.deadline,
        device=args.device,
        stall_after_s=stall_option(args.stall_after),
    )
    from ckptprof.synth import distributed
    from ckptprof.synth.device import check_job_device

    processes = int(os.environ.get("WORLD_SIZE", 1)) if distributed.launched() else 1
    check_job_device(options.device, args.nproc_per_node or processes)
    if args.nproc_per_node and not distributed.launched():
        options.validate()  # a bad option is one line here, not one per rank
        _check_launch(args.nproc_per_node, options)
        return distributed.launch(args.nproc_per_node, without_nproc(args.argv))
    if not distributed.launched():
        run_restore(args.dest, options, args.out, args.trace_dir)
        report = args.report
    else:
        from ckptprof.synth.device import resolve_device
        from ckptprof.synth.job import joined

        device_type = resolve_device(options.device).type
        with joined(device_type, stall_after_s(options.stall_after_s)) as job:
            quiet = job.rank != 0  # one display for the whole job: rank 0's
            if quiet:
                options.progress = False
            echo = (lambda *_: None) if quiet else print
            run_restore(args.dest, options, args.out, args.trace_dir, echo, job)
        report = args.report and not quiet
    if report:
        from ckptprof.cli.report import print_report

        print_report([str(args.out / "results.json")])
    return 0
