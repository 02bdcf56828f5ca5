"""``ckptprof synth generate|restore``: the standalone synthetic mode."""

from __future__ import annotations

import argparse
import contextlib
import os

from ckptprof.cli.options import (
    HelpFormatter,
    add_device_option,
    checkpoint,
    choice_list,
    directory,
    int_list,
    location,
    real,
    seconds_or_off,
    size,
    whole,
)
from ckptprof.manifest import VERIFY_MODES
from ckptprof.synth import ranges
from ckptprof.synth.layouts import LAYOUT_NAMES
from ckptprof.synth.presets import PRESETS
from ckptprof.synth.savers import registry as saver_registry
from ckptprof.synth.strategies import registry as strategy_registry

SAVE_EXAMPLES = """examples:
  ckptprof synth save /mnt/fsx/ckpt --model llama2-7b --layout safetensors --scale 0.05
  ckptprof synth save ./ckpt --layout torch --scale 0.01 --repeat 5 --no-fsync
  ckptprof synth save s3://bucket/ckpt --strategy parallel --concurrency 16
  ckptprof synth save ./ckpt --layout dcp --strategy async    # the blocking part vs the rest
  ckptprof synth restore ./ckpt --cache cold      # then the restore of the same bytes
"""

GENERATE_EXAMPLES = """examples:
  ckptprof synth generate /mnt/fsx/ckpt --model llama2-7b --layout safetensors
  ckptprof synth generate ./ckpt --model llama3-8b --layout dcp --ranks 8 --scale 0.01
  ckptprof synth generate ./ckpt --model llama2-7b --layout torch --files 1000 --no-optimizer
  ckptprof synth generate ./ckpt --model llama3-405b --layout dcp --ranks 512 --dry-run
"""

RESTORE_EXAMPLES = """examples:
  ckptprof synth restore ./ckpt --strategy staged,pipelined,framework --cache cold --concurrency 8
  ckptprof synth restore ./ckpt --world-size 8 --rank 0 --memory-budget 1G   # one rank of 8
  ckptprof synth restore /mnt/fsx/ckpt                       # cold+hot, 1..64 in flight, 3 repeats
  ckptprof synth restore ./ckpt --cache cold --concurrency 1,16 --repeat 5 --verify sample
  ckptprof synth restore ./ckpt --world-size 1                # reshard a 2-rank DCP save into 1
  ckptprof synth restore ./ckpt --nproc-per-node 4            # 4 ranks, one process each
  torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \
      -m ckptprof synth restore /mnt/fsx/ckpt                 # a 16-rank job on two nodes
"""


def add_parser(commands) -> None:
    synth = commands.add_parser(
        "synth",
        help="generate synthetic checkpoints and time their restore",
        description="Synthetic mode: realistic checkpoints (real tensor names, shapes and file "
        "layouts) on a target storage, restored phase by phase.",
    )
    sub = synth.add_subparsers(dest="synth_command", metavar="SUBCOMMAND")
    sub.required = True

    gen = sub.add_parser(
        "generate",
        help="write a synthetic checkpoint (not timed)",
        description="Write a realistic checkpoint of random, incompressible bytes, with a "
        "manifest of sizes and xxh3 hashes beside it.",
        epilog=GENERATE_EXAMPLES,
        formatter_class=HelpFormatter,
    )
    gen.add_argument(
        "dest", metavar="DEST", type=location, help="target directory (created if missing)"
    )
    add_spec_arguments(gen)
    gen.add_argument(
        "--dry-run",
        action="store_true",
        help="print files, bytes and the time it would take; write nothing",
    )
    gen.add_argument(
        "--bandwidth-gbps",
        type=real(ranges.GBPS),
        action="append",
        default=None,
        help="bandwidths for --dry-run's time estimates (repeatable)",
    )
    gen.add_argument(
        "--force",
        action="store_true",
        help="replace the ckptprof checkpoint in DEST (only the files ckptprof wrote there)",
    )
    gen.set_defaults(func=run_generate)

    save = sub.add_parser(
        "save",
        help="time a checkpoint's save (write, fsync, commit) on a storage",
        description="Build the training state in memory (real tensors of the preset's "
        "shapes, filled and touched), then save it through the layout's own writer, timed "
        "phase by phase as ckpt.save traces; the result is a checkpoint `synth restore` "
        "reads back.",
        epilog=SAVE_EXAMPLES,
        formatter_class=HelpFormatter,
    )
    save.add_argument(
        "dest", metavar="DEST", type=location, help="target directory (created if missing)"
    )
    add_spec_arguments(save)
    save.add_argument(
        "--strategy", default=None, choices=saver_registry.NAMES,
        help="framework: the layout's own writer, as a job calls it; parallel: ckptprof's "
        "writer, the same bytes in part-size writes, --concurrency at once (the one for "
        "S3: a multipart upload); async: DCP's async_save (the blocking part is the save). "
        "Default: parallel on every storage, so storages compare through one writer "
        "(framework for --layout dcp)",
    )  # fmt: skip
    save.add_argument(
        "--concurrency", type=whole(ranges.CONCURRENCY), default=8,
        help="parts in flight per file (parallel; default 8)",
    )  # fmt: skip
    save.add_argument(
        "--part-size", type=size(ranges.PART_SIZE), default="16M",
        help="bytes per write request / multipart part, 4K to 1G (default 16M); on S3 at "
        "least 5M and at most 10,000 parts per file (checked before anything is written)",
    )  # fmt: skip
    save.add_argument(
        "--repeat", type=whole(ranges.REPEAT), default=3, help="saves to time (medians)"
    )
    save.add_argument(
        "--ceiling-gbps", type=real(ranges.GBPS), default=None,
        help="the storage's write bandwidth, if known (skips the write probe: a short "
        "sequential write with fsync at --concurrency)",
    )  # fmt: skip
    save.add_argument(
        "--fsync",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="force every file to the device before the commit",
    )
    save.add_argument(
        "--out", type=directory, default="ckptprof-save",
        help="where save.json (environment, ceiling, every save, medians) and traces go",
    )  # fmt: skip
    save.add_argument(
        "--force",
        action="store_true",
        help="replace the ckptprof checkpoint in DEST (only the files ckptprof wrote there)",
    )
    save.add_argument(
        "--nproc-per-node", type=whole(ranges.RANKS), default=None, metavar="N",
        help="save as N ranks of a job on this machine, one process each, every rank writing "
        "its own files at once (torch.distributed.run); across nodes, start `torchrun ... -m "
        "ckptprof synth save` on each node (the job's save time is its slowest rank's)",
    )  # fmt: skip
    save.add_argument(
        "--stall-after", type=seconds_or_off(ranges.SECONDS), default=None, metavar="SECONDS",
        help="warn (with every thread's stack, also in the trace) when a phase makes no "
        "progress for this long; the run goes on; 0 or off: never (default: "
        "$CKPTPROF_STALL_AFTER or 120)",
    )  # fmt: skip
    save.set_defaults(func=run_save)

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
    res.add_argument(
        "--strategy",
        type=choice_list(strategy_registry.NAMES),
        default=("pipelined",),
        help="how bytes become state, comma-separated to compare side by side: staged "
        "(everything into memory, then load), pipelined (only what the rank needs, loaded "
        "as it lands, inside --memory-budget), framework (the layout's own loader on the "
        "path), runai (the Run:ai Model Streamer on safetensors; pip install "
        "runai-model-streamer), s3torchconnector (AWS's S3 client for PyTorch, s3:// only; "
        "pip install s3torchconnector); default pipelined",
    )
    res.add_argument(
        "--cache",
        type=choice_list(ranges.CACHES),
        default=ranges.CACHES,
        help="cold, hot or cold,hot",
    )
    res.add_argument(
        "--concurrency",
        type=int_list(ranges.CONCURRENCY),
        default=(1, 8, 16, 32, 64),
        help="requests in flight, comma-separated (default 1,8,16,32,64)",
    )
    res.add_argument(
        "--repeat", type=whole(ranges.REPEAT), default=3, help="repeats per setting (medians)"
    )
    res.add_argument(
        "--verify",
        choices=VERIFY_MODES,
        default="full",
        help="full xxh3, sampled ranges, sizes only, or none",
    )
    res.add_argument(
        "--world-size",
        type=whole(ranges.RANKS),
        default=None,
        help="target ranks to reshard into (default: the saved ranks)",
    )
    res.add_argument(
        "--nproc-per-node",
        type=whole(ranges.RANKS),
        default=None,
        metavar="N",
        help="run as N ranks of a job on this machine, one process each, through PyTorch's "
        "launcher (torch.distributed.run); across nodes, start `torchrun ... -m ckptprof "
        "synth restore` on each node instead (the job's RTO is its slowest rank's)",
    )
    res.add_argument(
        "--rank",
        type=whole(ranges.RANK),
        default=None,
        help="restore only this rank of --world-size (what one process of the job holds and "
        "reads); default: every rank, in this one process",
    )
    res.add_argument(
        "--memory-budget",
        type=size(ranges.MEMORY_BUDGET),
        default=None,
        metavar="SIZE",
        help="bytes the pipelined strategy may hold in flight, e.g. 1G (default: a quarter "
        "of free memory, at most 2G)",
    )
    res.add_argument(
        "--part-size",
        type=size(ranges.PART_SIZE),
        default="16M",
        help="bytes per read request, 4K to 1G (default 16M)",
    )
    res.add_argument(
        "--ceiling-gbps",
        type=real(ranges.GBPS),
        default=None,
        help="known path bandwidth; skips the probe",
    )
    res.add_argument(
        "--no-first-step",
        dest="first_step",
        action="store_false",
        help="skip the first training step",
    )
    res.add_argument(
        "--first-step-s",
        type=real(ranges.STEP_SECONDS),
        default=None,
        metavar="SECONDS",
        help="the first step's time measured in the real job (e.g. a callback's first_step), "
        "counted in the RTO where the step cannot run here (default: estimated beside it)",
    )
    add_device_option(res)
    res.add_argument(
        "--drop-caches",
        action="store_true",
        help="if fadvise leaves pages cached, drop caches machine-wide (root)",
    )
    res.add_argument(
        "--out",
        type=directory,
        default="ckptprof-out",
        help="directory for results and traces (default ./ckptprof-out)",
    )
    res.add_argument(
        "--trace-dir",
        type=directory,
        default=None,
        help="trace file directory (default $CKPTPROF_TRACE_DIR or OUT/traces)",
    )
    res.add_argument(
        "--stage",
        type=directory,
        default=None,
        metavar="DIR",
        help="download to a local DIR first, then read from there (like s5cmd cp)",
    )
    res.add_argument(
        "--direct-io",
        action="store_true",
        help="POSIX: read with O_DIRECT, bypassing the page cache (falls back where refused)",
    )
    res.add_argument(
        "--per-file-spans",
        action="store_true",
        help="also emit one ckpt.file span per file (default: aggregated on the phase)",
    )
    res.add_argument(
        "--simulate-interruption",
        action="store_true",
        help="first a Spot-style notice, an emergency save and its record; the first restore "
        "is the recovery (see `ckptprof report --interruptions OUT/traces`)",
    )
    res.add_argument(
        "--stall-after", type=seconds_or_off(ranges.SECONDS), default=None, metavar="SECONDS",
        help="warn (with every thread's stack, also in the trace) when a phase makes no "
        "progress for this long; the run goes on; 0 or off: never (default: "
        "$CKPTPROF_STALL_AFTER or 120)",
    )  # fmt: skip
    res.add_argument(
        "--deadline",
        type=real(ranges.SECONDS),
        default=120.0,
        metavar="SECONDS",
        help="notice-to-termination time for --simulate-interruption (default 120: EC2 Spot)",
    )
    res.add_argument(
        "--report",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="print the report at the end",
    )
    res.set_defaults(func=run_restore)


def add_spec_arguments(parser, scale: float = 1.0) -> None:
    """What the checkpoint is: model, layout, ranks, scale, optimizer, files, step, seed
    (``synth generate``, ``synth save`` and the demo: one declaration of each)."""
    parser.add_argument(
        "--model",
        default="llama2-7b",
        choices=tuple(PRESETS),
        metavar="NAME",
        help="preset: %(choices)s",
    )
    parser.add_argument(
        "--layout", default="torch", choices=LAYOUT_NAMES, help="file layout: %(choices)s"
    )
    parser.add_argument(
        "--ranks", type=whole(ranges.RANKS), default=1, help="ranks that saved it (sharding)"
    )
    parser.add_argument(
        "--scale",
        type=real(ranges.SCALE),
        default=scale,
        help=f"0 < S <= 1: fraction of full-size bytes; names and layout unchanged "
        f"(default {scale:g})",
    )
    parser.add_argument(
        "--optimizer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="include Adam moments (fp32)",
    )
    parser.add_argument("--master-weights", action="store_true", help="include fp32 master weights")
    parser.add_argument(
        "--files",
        type=whole(ranges.FILES),
        default=None,
        help="split the tensor data into N files (many small vs few packed)",
    )
    parser.add_argument(
        "--step", type=whole(ranges.STEP), default=1000, help="training step the checkpoint is at"
    )
    parser.add_argument(
        "--seed", type=whole(ranges.SEED), default=0, help="seed of the random bytes"
    )


def stall_option(given: float | None) -> float | bool:
    """``--stall-after`` as the options take it: True (not given: the environment's or the
    default), 0.0 (off) or the seconds."""
    return True if given is None else given


def stall_after_s(option: float | bool | None) -> float | None:
    """The seconds an option gives (True: the environment's, or the default)."""
    from ckptprof.tracing.watchdog import stall_after_from_env

    return stall_after_from_env() if option is True else (option or None)


def run_save(args) -> int:
    from ckptprof.synth import distributed
    from ckptprof.synth.job import joined
    from ckptprof.synth.plan import SynthSpec
    from ckptprof.synth.save import SaveOptions, check

    launched = distributed.launched()
    world = int(os.environ["WORLD_SIZE"]) if launched else args.nproc_per_node
    ranks = world if world and args.ranks == 1 else args.ranks  # a job's ranks, by default
    spec = SynthSpec(
        model=args.model, layout=args.layout, scale=args.scale, ranks=ranks,
        optimizer=args.optimizer, master_weights=args.master_weights, files=args.files,
        step=args.step, seed=args.seed,
    )  # fmt: skip
    options = SaveOptions(
        repeat=args.repeat, fsync=args.fsync, force=args.force,
        strategy=args.strategy or saver_registry.default_strategy(args.layout),
        concurrency=args.concurrency, part_size=args.part_size, ceiling_gbps=args.ceiling_gbps,
        stall_after_s=stall_option(args.stall_after),
    )  # fmt: skip
    if args.nproc_per_node and not launched:
        # a bad option is one line here, before any rank starts, not one per rank
        check(args.dest, spec, options, args.nproc_per_node)
        argv = without_nproc(args.argv) + ["--ranks", str(ranks)]
        return distributed.launch(args.nproc_per_node, argv, what="save")
    if not launched:
        return _save(args, spec, options)
    with joined(stall_after_s=stall_after_s(options.stall_after_s)) as job:
        return _save(args, spec, options, job)


def _save(args, spec, options, job=None) -> int:
    """One process's part of ``synth save``: the whole save, or one rank's of a job."""
    from ckptprof.preflight import OutputClaim
    from ckptprof.synth.job import traced
    from ckptprof.synth.save import check, run_save, write_results

    lead = job is None or job.rank == 0
    check(args.dest, spec, options, job and job.world)  # refused: nothing made, --out included
    with contextlib.ExitStack() as held:
        if lead:  # a second save into this --out is refused before it measures anything
            args.out.mkdir(parents=True, exist_ok=True)
            held.callback(OutputClaim(args.out, "--out").release)
        telemetry, tracer = held.enter_context(
            traced(args.out / "traces", job, stall_after_s=options.stall_after_s)
        )
        echo = print if lead else (lambda *_: None)
        result = run_save(
            args.dest, spec, options, tracer, echo, job,
            keep_partial=lambda partial: write_results(args.out, spec, options, partial, True),
        )  # fmt: skip
    trace = telemetry.describe_trace()  # shut down: the file holds every span (or it says)
    if not lead:
        return 0
    written = write_results(args.out, spec, options, result)
    share = f", {result.of_ceiling:.0%} of the write ceiling" if result.of_ceiling else ""
    who = f", {job.world} ranks at once (the slowest rank's time)" if job else ""
    print(
        f"save of {spec.model} {spec.scale_label()} ({spec.layout}, {options.strategy}) to "
        f"{args.dest}: median {result.median_s:.3f} s, {result.median_gbps:.2f} GB/s{share} "
        f"over {len(result.records)} saves{who}; results: {written}; {trace}"
    )
    return 0


def run_generate(args) -> int:
    from ckptprof.synth.generate import estimated_bytes, generate, plan_checkpoint
    from ckptprof.synth.plan import SynthSpec

    spec = SynthSpec(
        model=args.model,
        layout=args.layout,
        scale=args.scale,
        ranks=args.ranks,
        optimizer=args.optimizer,
        master_weights=args.master_weights,
        files=args.files,
        step=args.step,
        seed=args.seed,
    )
    if args.dry_run:
        plan = plan_checkpoint(spec)
        print(describe_plan(plan, estimated_bytes(plan), args.bandwidth_gbps or [1, 10, 100]))
        return 0
    result = generate(args.dest, spec, force=args.force)
    print(
        f"wrote {len(result.manifest.files)} files, {result.total_bytes / 1e9:.3f} GB to "
        f"{result.location} ({spec.model} {spec.scale_label()}, {spec.layout}, {spec.ranks} ranks)"
    )
    return 0


def describe_plan(plan, total_bytes: int, bandwidths: list[float]) -> str:
    from collections import Counter

    preset = plan.spec.full_preset()
    kinds = Counter(f.kind for f in plan.files)
    lines = [
        f"model {plan.spec.model}: {preset.params / 1e9:.2f} B params "
        f"({len(preset.tensors())} tensors, {preset.layers} layers)"
        + (
            f"; scaled {plan.spec.scale_label()} to {plan.preset.params / 1e6:.1f} M params"
            if plan.spec.scale != 1
            else ""
        ),
        f"layout {plan.spec.layout}, saved by {plan.spec.ranks} ranks: {len(plan.files)} files "
        f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})",
        f"bytes: {total_bytes / 1e9:.2f} GB (tensor payload {plan.payload_bytes / 1e9:.2f} GB)",
        "theoretical lower bound to read it once: "
        + ", ".join(f"{total_bytes / (bw * 1e9):.1f} s at {bw:g} GB/s" for bw in bandwidths),
    ]
    biggest = sorted(plan.files, key=lambda f: -f.payload_bytes)[:5]
    lines.append(
        "largest files: "
        + ", ".join(
            f"{f.path} ({f.payload_bytes / 1e9:.2f} GB)" for f in biggest if f.payload_bytes
        )
    )
    return "\n".join(lines)


def run_restore(args) -> int:
    from ckptprof.synth.restore import RestoreOptions, run_restore

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


def without_nproc(argv: list[str]) -> list[str]:
    """The command line, less ``--nproc-per-node N``: what each rank runs."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc-per-node":
            skip = True
        elif not arg.startswith("--nproc-per-node="):
            out.append(arg)
    return out
