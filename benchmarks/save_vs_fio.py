"""``ckptprof synth save`` next to fio's sequential write with fsync on the same filesystem:
how close a real checkpoint save (every file fsynced, renamed into place) comes to what
the storage takes, and how much of a DCP save an ``async_save`` blocks for.

For each of torch and safetensors, interleaved: fio writing the checkpoint's bytes as
one sequential file (``--rw=write --end_fsync=1``, 16 MiB blocks) at each of its
engines and queue depths (``psync`` one at a time; ``libaio`` with ``--direct=1`` and
``io_uring``, 8 in flight), then one ``framework`` save (the layout's own writer) and one
``parallel`` save (ckptprof's writer: 16 MiB parts, ``--concurrency`` in flight, 8 by
default as ``synth save`` runs it) through the page cache and with ``--direct-io``
(staged in aligned buffers, ``O_DIRECT``) of the same state (built once, untimed). For DCP: a
sync ``dcp.save`` and an ``async_save``'s blocking part. Prints median seconds, GB/s and
the ratios.

Targets: ``parallel`` ≥ 0.9× the faster of the framework writer and fio at its best
engine and queue depth; framework ≥ 0.9× fio; the async blocking part ≤ 15% of the sync
save.

Run from the repository root:
    .venv/bin/python benchmarks/save_vs_fio.py --dir /tmp/bench-save --scale 0.05
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import environment, interleaved, median, require_fio  # noqa: E402

from ckptprof.storage import open_storage  # noqa: E402
from ckptprof.synth.layouts import get_layout  # noqa: E402
from ckptprof.synth.plan import SynthSpec  # noqa: E402
from ckptprof.synth.save import build_state  # noqa: E402
from ckptprof.synth.savers import SaveContext  # noqa: E402
from ckptprof.synth.savers import save as save_with  # noqa: E402
from ckptprof.tracing import CheckpointTracer, setup_telemetry  # noqa: E402

TARGET = 0.9
ASYNC_TARGET = 0.15


#: fio's engines and queue depths tried: one write at a time, and 8 in flight
FIO_ENGINES = {
    "fio-psync": ["--ioengine=psync"],
    "fio-aio-direct": ["--ioengine=libaio", "--direct=1", "--iodepth=8"],
    "fio-uring": ["--ioengine=io_uring", "--iodepth=8"],
}


def fio_write(folder: Path, nbytes: int, block: str, engine: list[str]) -> dict:
    """fio writing ``nbytes`` sequentially into one new file, fsync at the end."""
    require_fio()
    target = folder / "fio-write"
    command = [
        "fio", "--name=write", "--rw=write", *engine, f"--bs={block}",
        f"--size={nbytes}", "--end_fsync=1", "--numjobs=1", f"--filename={target}",
        "--output-format=json",
    ]  # fmt: skip
    started = time.perf_counter()
    out = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    seconds = time.perf_counter() - started  # the fsync included (fio's runtime is not)
    target.unlink(missing_ok=True)
    written = out["jobs"][0]["write"]["io_bytes"]
    return {"bytes": written, "seconds": seconds, "gbps": written / seconds / 1e9}


KEPT: dict = {}  # what a job keeps between its saves (DCP's async staging buffers)


def save(
    root: Path, plan, tensors, tracer, strategy: str, concurrency: int = 1, direct: bool = False
) -> dict:
    """One timed save, then its files removed (the next save is fresh)."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    storage = open_storage(str(root), direct_io=direct)
    with tracer.save({}) as op:
        ctx = SaveContext(
            storage=storage, plan=plan, tensors=tensors, op=op, fsync=True,
            concurrency=concurrency, part_size=16 << 20, tracer=tracer, kept=KEPT,
        )  # fmt: skip
        written = save_with(strategy, ctx)
    seconds = op.summary.wall_s
    shutil.rmtree(root, ignore_errors=True)
    phases = {name: stats.busy_s for name, stats in op.summary.phases.items()}
    return {"bytes": written.nbytes, "seconds": seconds, "gbps": written.nbytes / seconds / 1e9,
            "background_s": written.background_s, "phases": phases}  # fmt: skip


def show(runs: dict) -> None:
    for name, found in runs.items():
        seconds = [r["seconds"] for r in found]
        print(
            f"  {name:9} {median(seconds):6.2f} s ({min(seconds):.2f}-{max(seconds):.2f})"
            f"  {median(r['gbps'] for r in found):5.2f} GB/s"
        )
        if "phases" in found[0]:  # where a save's time went (median busy seconds)
            phases = ", ".join(
                f"{phase} {median(r['phases'].get(phase, 0.0) for r in found):.2f}"
                for phase in found[0]["phases"]
            )
            print(f"  {'':9} {phases}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ckptprof-bench-save"))
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--layouts", default="safetensors,torch")
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="parts in flight (parallel; default 8, as synth save)",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    telemetry = setup_telemetry(args.dir / "traces")
    tracer = CheckpointTracer(telemetry.provider, framework="synthetic")
    report: dict = {"layouts": {}}
    root = args.dir / "ckpt"
    try:
        for layout in [s for s in args.layouts.split(",") if s] + ["dcp"]:
            spec = SynthSpec(args.model, layout, args.scale)
            plan = get_layout(layout).plan(spec)
            tensors = build_state(plan, spec.seed)
            KEPT.clear()
            if layout == "dcp":
                methods = {
                    "sync": lambda p=plan, t=tensors: save(root, p, t, tracer, "framework"),
                    "async": lambda p=plan, t=tensors: save(root, p, t, tracer, "async"),
                }
                methods["sync"]()  # warm-up
                methods["async"]()  # and the staging buffers a periodic async save keeps
                runs = interleaved(methods, args.repeat)
                share = median(r["seconds"] for r in runs["async"]) / median(
                    r["seconds"] for r in runs["sync"]
                )
                print(f"\ndcp: {args.model} x{args.scale:g}, async_save's blocking part vs "
                      f"dcp.save, fsync on, {args.repeat} repeats (medians, min-max)")  # fmt: skip
                show(runs)
                verdict = "met" if share <= ASYNC_TARGET else "NOT met"
                print(f"  async blocking / sync save: {share:.2f} (target <= {ASYNC_TARGET}: "
                      f"{verdict})")  # fmt: skip
                report["layouts"][layout] = {"async_share": share, "runs": runs}
                del tensors
                continue
            first = save(root, plan, tensors, tracer, "framework")  # warm-up; its size for fio
            methods = {
                name: lambda n=first["bytes"], e=engine: fio_write(args.dir, n, "16M", e)
                for name, engine in FIO_ENGINES.items()
            }
            methods["framework"] = lambda p=plan, t=tensors: save(root, p, t, tracer, "framework")
            methods["parallel"] = lambda p=plan, t=tensors: save(
                root, p, t, tracer, "parallel", args.concurrency
            )
            methods["parallel-direct"] = lambda p=plan, t=tensors: save(
                root, p, t, tracer, "parallel", args.concurrency, direct=True
            )
            runs = interleaved(methods, args.repeat)
            del tensors
            gbps = {name: median(r["gbps"] for r in found) for name, found in runs.items()}
            best_fio = max(FIO_ENGINES, key=gbps.__getitem__)
            bound = max(gbps["framework"], gbps[best_fio])
            ratios = {
                f"framework / {best_fio}": gbps["framework"] / gbps[best_fio],
                f"parallel / {best_fio}": gbps["parallel"] / gbps[best_fio],
                "parallel / the faster of framework and fio": gbps["parallel"] / bound,
                "parallel --direct-io / the faster of framework and fio": (
                    gbps["parallel-direct"] / bound
                ),
            }
            print(
                f"\n{layout}: {args.model} x{args.scale:g}, {first['bytes'] / 1e9:.2f} GB in "
                f"{len(plan.files)} files, fsync on, {args.repeat} repeats after a warm-up "
                f"(medians, min-max; parallel: {args.concurrency} parts of 16 MiB in flight)"
            )
            show(runs)
            for name, ratio in ratios.items():
                verdict = "met" if ratio >= TARGET else "NOT met"
                print(f"  {name}: {ratio:.2f}x (target >= {TARGET}x: {verdict})")
            report["layouts"][layout] = {"ratios": ratios, "runs": runs}
    finally:
        telemetry.shutdown()
    report["environment"] = environment(args.dir)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
