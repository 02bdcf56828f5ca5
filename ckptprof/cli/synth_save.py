"""``ckptprof synth save``: time a checkpoint's save on a storage, as one process or as
the ranks of a job."""

from __future__ import annotations

import argparse
import contextlib
import os

from ckptprof.cli.options import (
    HelpFormatter,
    Moot,
    directory,
    location,
    real,
    refuse_moot,
    size,
    size_text,
    whole,
)
from ckptprof.cli.synth_options import (
    add_force_option,
    add_spec_arguments,
    add_stall_option,
    stall_after_s,
    stall_option,
    without_nproc,
)
from ckptprof.synth import ranges
from ckptprof.synth.options import SaveOptions
from ckptprof.synth.savers import registry as saver_registry

#: what a save does when not told: the options' own defaults
DEFAULTS = SaveOptions()

SAVE_EXAMPLES = """examples:
  ckptprof synth save /mnt/fsx/ckpt --model llama2-7b --layout safetensors --scale 0.05
  ckptprof synth save ./ckpt --layout torch --scale 0.01 --repeat 5 --no-fsync
  ckptprof synth save s3://bucket/ckpt --strategy parallel --concurrency 16
  ckptprof synth save ./ckpt --layout dcp --strategy async    # the blocking part vs the rest
  ckptprof synth restore ./ckpt --cache cold      # then the restore of the same bytes
"""


def add_parser(sub) -> None:
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
        "--concurrency", type=whole(ranges.CONCURRENCY), default=DEFAULTS.concurrency,
        help=f"parts in flight per file (parallel), and the write probe's widest "
        f"(default {DEFAULTS.concurrency})",
    )  # fmt: skip
    save.add_argument(
        "--part-size", type=size(ranges.PART_SIZE), default=DEFAULTS.part_size,
        help="bytes per write request / multipart part, 4K to 1G (default "
        f"{size_text(DEFAULTS.part_size)}); on S3 at "
        "least 5M and at most 10,000 parts per file (checked before anything is written)",
    )  # fmt: skip
    save.add_argument(
        "--repeat",
        type=whole(ranges.REPEAT),
        default=DEFAULTS.repeat,
        help=f"saves to time (medians; default {DEFAULTS.repeat})",
    )
    save.add_argument(
        "--ceiling-gbps", type=real(ranges.GBPS), default=None,
        help="the storage's write bandwidth, if known (skips the write probe: a short "
        "sequential write with fsync at --concurrency)",
    )  # fmt: skip
    save.add_argument(
        "--direct-io",
        action="store_true",
        help="parallel on a path: write with O_DIRECT from staged, aligned buffers, "
        "bypassing the page cache (falls back where refused)",
    )
    save.add_argument(
        "--fsync",
        action=argparse.BooleanOptionalAction,
        default=DEFAULTS.fsync,
        help="force every file to the device before the commit",
    )
    save.add_argument(
        "--out", type=directory, default="ckptprof-save",
        help="where save.json (environment, ceiling, every save, medians) and traces go",
    )  # fmt: skip
    add_force_option(save)
    save.add_argument(
        "--nproc-per-node", type=whole(ranges.RANKS), default=None, metavar="N",
        help="save as N ranks of a job on this machine, one process each, every rank writing "
        "its own files at once (torch.distributed.run); across nodes, start `torchrun ... -m "
        "ckptprof synth save` on each node (the job's save time is its slowest rank's)",
    )  # fmt: skip
    add_stall_option(save)
    save.set_defaults(func=run_save)
    refuse_moot(
        save,
        Moot(("concurrency", "part_size"),
             lambda args: _strategy(args) != "parallel" and args.ceiling_gbps is not None,
             lambda args: f"--strategy {_strategy(args)} writes as its framework does, and "
             "--ceiling-gbps skips the write probe that uses them",
             "drop them, or drop --ceiling-gbps"),
    )  # fmt: skip


def _strategy(args) -> str:
    """The save's strategy: as given, or the layout's default."""
    return args.strategy or saver_registry.default_strategy(args.layout)


def run_save(args) -> int:
    from ckptprof.synth import distributed
    from ckptprof.synth.job import joined
    from ckptprof.synth.options import SaveOptions
    from ckptprof.synth.plan import SynthSpec
    from ckptprof.synth.save import check

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
        strategy=_strategy(args),
        concurrency=args.concurrency, part_size=args.part_size, ceiling_gbps=args.ceiling_gbps,
        direct_io=args.direct_io,
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
    from ckptprof.preflight import OutputClaim, earlier_results
    from ckptprof.save_schema import SAVE_NAME
    from ckptprof.synth.job import traced
    from ckptprof.synth.save import check, run_save, write_results

    lead = job is None or job.rank == 0
    check(args.dest, spec, options, job and job.world)  # refused: nothing made, --out included
    with contextlib.ExitStack() as held:
        if lead:  # a second save into this --out is refused before it measures anything
            args.out.mkdir(parents=True, exist_ok=True)
            held.callback(OutputClaim(args.out, "--out").release)
            earlier = earlier_results(args.out / SAVE_NAME)
            if earlier is not None:
                print(earlier)
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
    background = any(r.background_s is not None for r in result.records)
    speed = (
        f"{result.median_gbps:.2f} GB/s to the storage"
        if background
        else (f"{result.median_gbps:.2f} GB/s")
    )
    print(
        f"save of {spec.model} {spec.scale_label()} ({spec.layout}, {options.strategy}) to "
        f"{args.dest}: median {result.median_s:.3f} s{' blocking' if background else ''}, "
        f"{speed}{share} over {len(result.records)} saves{who}; results: {written}; {trace}"
    )
    return 0
