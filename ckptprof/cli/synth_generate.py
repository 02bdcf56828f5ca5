"""``ckptprof synth generate``: write a synthetic checkpoint (not timed), or with
``--dry-run`` print its plan."""

from __future__ import annotations

from ckptprof.cli.options import HelpFormatter, Moot, location, real, refuse_moot
from ckptprof.cli.synth_options import add_force_option, add_spec_arguments
from ckptprof.synth import ranges

GENERATE_EXAMPLES = """examples:
  ckptprof synth generate /mnt/fsx/ckpt --model llama2-7b --layout safetensors
  ckptprof synth generate ./ckpt --model llama3-8b --layout dcp --ranks 8 --scale 0.01
  ckptprof synth generate ./ckpt --model llama2-7b --layout torch --files 1000 --no-optimizer
  ckptprof synth generate ./ckpt --model llama3-405b --layout dcp --ranks 512 --dry-run
"""


def add_parser(sub) -> None:
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
    add_force_option(gen)
    gen.set_defaults(func=run_generate)
    refuse_moot(
        gen,
        Moot(("bandwidth_gbps",), lambda args: not args.dry_run,
             "it sets --dry-run's time estimates", "add --dry-run, or drop it"),
        Moot(("force",), lambda args: args.dry_run, "--dry-run writes nothing to replace",
             "drop one of them"),
    )  # fmt: skip


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
        f"wrote {len(result.manifest.files)} files and the manifest, "
        f"{result.total_bytes / 1e9:.3f} GB to "
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
        f"bytes: {plan.payload_bytes / 1e9:.2f} GB of tensors; disk space needed: at most "
        f"{total_bytes / 1e9:.2f} GB (headers, whole blocks, small files)",
        "theoretical lower bound to read the tensors once: "
        + ", ".join(f"{plan.payload_bytes / (bw * 1e9):.1f} s at {bw:g} GB/s" for bw in bandwidths),
    ]
    biggest = sorted(plan.files, key=lambda f: -f.payload_bytes)[:5]
    lines.append(
        "largest files: "
        + ", ".join(
            f"{f.path} ({f.payload_bytes / 1e9:.2f} GB)" for f in biggest if f.payload_bytes
        )
    )
    return "\n".join(lines)
