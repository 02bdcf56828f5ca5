"""Device figures for a restore onto a GPU: what the host→device copies add to reshard,
and the first step on the GPU, for each strategy, cold and hot (≤ 5 minutes).

For every strategy, interleaved repeats restore the same llama2-7b safetensors
checkpoint (with Adam state) into a state on ``cuda`` and, as the reference, into host
memory (no first step there: a CPU step says nothing about a GPU job); the first step
runs for real on the device. Prints medians of the RTO,
``reshard`` (device: including the copies), ``first_step``, host peak RSS and device
peak memory, and the device/host reshard ratio; writes them to ``--out`` as JSON.

Needs a CUDA build of torch and a GPU (exits 2 without one). Run from the repository root:
    .venv/bin/python benchmarks/gpu_restore.py --dir /tmp/bench-gpu --scale 0.05
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import checkpoint, environment, interleaved, median  # noqa: E402

from ckptprof.synth.options import RestoreOptions  # noqa: E402
from ckptprof.synth.runner import RestoreRunner  # noqa: E402
from ckptprof.tracing import CheckpointTracer, setup_telemetry  # noqa: E402


def runner_for(path: Path, strategies, device: str, concurrency: int, trace: Path):
    options = RestoreOptions(
        strategies=tuple(strategies), caches=("cold", "hot"), concurrency=(concurrency,),
        repeat=1, verify="full", ceiling_gbps=1.0, progress=False, device=device,
        first_step=device != "cpu",  # the reference: the same restore, no CPU step
    )  # fmt: skip
    telemetry = setup_telemetry(trace)
    runner = RestoreRunner(str(path), options, CheckpointTracer(telemetry.provider))
    runner.prepare()  # the model and state exist before the restore, as in a job
    return runner, telemetry


def once(runner, strategy: str, cache: str, concurrency: int) -> dict:
    run = runner.run_once(strategy, cache, concurrency, 0)
    phase = run.phases
    return {
        "rto_s": run.wall_s,
        "reshard_s": phase.get("reshard", {}).get("busy_s", 0.0),
        "first_step_s": phase.get("first_step", {}).get("busy_s", 0.0),
        "peak_rss": run.peak_rss_bytes,
        "device_peak": run.device_peak_bytes or 0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ckptprof-bench-gpu"))
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--strategies", default="pipelined,staged,framework")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a rehearsal without a GPU (host memory only)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"no CUDA device here (torch {torch.__version__}): nothing to measure")
        return 2
    strategies = args.strategies.split(",")
    path = args.dir / "safetensors"
    manifest = checkpoint(path, "llama2-7b", "safetensors", args.scale)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "no GPU (a rehearsal)"
    print(f"checkpoint {manifest.total_bytes / 1e9:.2f} GB at {path}; {gpu}")
    runners = {
        device: runner_for(path, strategies, device, args.concurrency, args.dir / f"t-{device}")
        for device in dict.fromkeys((args.device, "cpu"))
    }
    try:
        cases = {
            f"{strategy} {cache} {device}": partial(once, runners[device][0], strategy, cache,
                                                    args.concurrency)
            for strategy in strategies for cache in ("cold", "hot") for device in runners
        }  # fmt: skip
        samples = interleaved(cases, args.repeat)
    finally:
        for runner, telemetry in runners.values():
            runner.state.release()
            telemetry.shutdown()
    rows = {}
    print(f"{'case':<24}{'RTO s':>8}{'reshard s':>11}{'step s':>9}{'RSS GB':>8}{'dev GB':>8}")
    for name, runs in samples.items():
        row = {key: median(r[key] for r in runs) for key in runs[0]}
        rows[name] = row
        print(
            f"{name:<24}{row['rto_s']:>8.2f}{row['reshard_s']:>11.2f}{row['first_step_s']:>9.2f}"
            f"{row['peak_rss'] / 1e9:>8.2f}{row['device_peak'] / 1e9:>8.2f}"
        )
    for strategy in strategies:
        for cache in ("cold", "hot"):
            if args.device == "cpu":
                break
            gpu, cpu = rows[f"{strategy} {cache} cuda"], rows[f"{strategy} {cache} cpu"]
            if cpu["reshard_s"]:
                ratio = gpu["reshard_s"] / cpu["reshard_s"]
                print(f"{strategy} {cache}: reshard onto the GPU / into host memory = {ratio:.2f}x")
    if args.out:
        figures = {"rows": rows, "environment": environment(path), "bytes": manifest.total_bytes}
        args.out.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
