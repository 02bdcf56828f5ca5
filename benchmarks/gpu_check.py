"""The GPU path's first check, as one script for the first machine with a GPU (well
inside 13 minutes on one H100/H200; each step bounded and skipped, said so, when the
time is spent).

1. The device and its link: name, driver, CUDA, PCIe generation and width.
2. A host→device ceiling from pinned, pageable and mapped (page-cache) sources: 1 GiB,
   best of 3, timed by CUDA events.
3. Each strategy restoring the same checkpoint onto the device and into host memory:
   equal state digests; reshard GB/s against the pinned ceiling; window_pinned.
4. A profiler count of pageable vs pinned host→device copies in a pipelined restore.
5. A fresh process's first step on the device (CUDA context and handles included).
6. The out-of-memory message, with the device nearly full.
7. ``benchmarks/gpu_restore.py`` at a small scale.

Writes everything to ``--out`` (gpu_check.json) and prints a summary. Without CUDA it
says so and exits 2. From the repository root:
    .venv/bin/python benchmarks/gpu_check.py --dir /tmp/gpu-check --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import checkpoint  # noqa: E402

BUDGET_S = 12 * 60
GIB = 1 << 30


def link() -> dict:
    import torch

    info = {"name": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
            "torch": torch.__version__,
            "capability": torch.cuda.get_device_capability(0)}  # fmt: skip
    query = "driver_version,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout  # fmt: skip
        driver, gen, gen_max, width = [v.strip() for v in out.splitlines()[0].split(",")]
        info.update(driver=driver, pcie_gen=gen, pcie_gen_max=gen_max, pcie_width=width)
    except (OSError, IndexError, ValueError, subprocess.SubprocessError) as exc:
        info["nvidia_smi"] = f"unavailable: {exc}"
    return info


def h2d_ceiling(scratch: Path) -> dict:
    """GB/s of one 1 GiB host→device copy from each kind of host memory, best of 3."""
    import numpy as np
    import torch

    device = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    mapped_file = scratch / "h2d.bin"
    with open(mapped_file, "wb") as handle:
        handle.write(os.urandom(16 << 20) * 64)
    sources = {
        "pinned": torch.empty(GIB, dtype=torch.uint8, pin_memory=True),
        "pageable": torch.empty(GIB, dtype=torch.uint8),
        "mapped": torch.from_numpy(np.memmap(mapped_file, dtype=np.uint8, mode="r+")),
    }
    out = {}
    for name, source in sources.items():
        source[::4096] = 1  # touched: resident before it is timed
        best = float("inf")
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            device.copy_(source, non_blocking=name == "pinned")
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        out[name] = GIB / best / 1e9
    del sources, device
    mapped_file.unlink()
    torch.cuda.empty_cache()
    return out


def restores(path: Path, scratch: Path, strategies: list[str]) -> dict:
    from ckptprof.synth.options import RestoreOptions
    from ckptprof.synth.runner import RestoreRunner
    from ckptprof.tracing import CheckpointTracer, setup_telemetry

    out: dict = {}
    for strategy in strategies:
        digests = {}
        for device in ("cuda", "cpu"):
            options = RestoreOptions(
                strategies=(strategy,), caches=("hot",), concurrency=(8,), repeat=1,
                verify="full", ceiling_gbps=1.0, progress=False, device=device, first_step=False,
            )  # fmt: skip
            telemetry = setup_telemetry(scratch / f"traces-{strategy}-{device}")
            runner = RestoreRunner(str(path), options, CheckpointTracer(telemetry.provider))
            try:
                runner.prepare()
                run = runner.run_once(strategy, "hot", 8, 0)
                digests[device] = runner.state.digest()
                reshard = run.phases.get("reshard", {})
                out[f"{strategy} {device}"] = {
                    "rto_s": run.wall_s,
                    "reshard_s": reshard.get("busy_s"),
                    "reshard_gbps": reshard.get("gbps"),
                    "device_peak": run.device_peak_bytes,
                }
            finally:
                runner.state.release()
                telemetry.shutdown()
        out[f"{strategy} digests equal"] = digests["cuda"] == digests["cpu"]
    return out


def copy_kinds(path: Path, scratch: Path) -> dict:
    """Host→device memcpy activities of one pipelined restore, by source kind."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ckptprof.synth.options import RestoreOptions
    from ckptprof.synth.runner import RestoreRunner
    from ckptprof.tracing import CheckpointTracer, setup_telemetry

    options = RestoreOptions(strategies=("pipelined",), caches=("hot",), concurrency=(8,),
                             repeat=1, verify="none", ceiling_gbps=1.0, progress=False,
                             device="cuda", first_step=False)  # fmt: skip
    telemetry = setup_telemetry(scratch / "traces-profile")
    runner = RestoreRunner(str(path), options, CheckpointTracer(telemetry.provider))
    try:
        runner.prepare()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            runner.run_once("pipelined", "hot", 8, 0)
            torch.cuda.synchronize()
    finally:
        runner.state.release()
        telemetry.shutdown()
    names = [e.name for e in prof.events()]
    return {kind: sum(1 for n in names if "HtoD" in n and kind in n)
            for kind in ("Pageable", "Pinned")}  # fmt: skip


def fresh_first_step(path: Path, scratch: Path) -> dict:
    out = scratch / "fresh"
    argv = [sys.executable, "-m", "ckptprof", "synth", "restore", str(path), "--device", "cuda",
            "--cache", "hot", "--concurrency", "8", "--repeat", "1", "--no-report",
            "--ceiling-gbps", "1", "--out", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    run = json.loads((out / "results.json").read_text())["runs"][0]
    step = run["phases"].get("first_step", {})
    return {"first_step": run.get("first_step"), "first_step_s": step.get("busy_s"),
            "tokens": run.get("first_step_tokens"),
            "first_in_process": step.get("first_in_process", False),
            "rto_s": run["wall_s"]}  # fmt: skip


def out_of_memory(path: Path, scratch: Path) -> dict:
    code = (
        "import sys, torch; free, _ = torch.cuda.mem_get_info(); "
        "hog = torch.empty(free - (256 << 20), dtype=torch.uint8, device='cuda'); "
        "from ckptprof.cli import main; "
        f"sys.exit(main(['synth', 'restore', {str(path)!r}, '--device', 'cuda', '--cache', "
        f"'hot', '--concurrency', '8', '--repeat', '1', '--no-report', '--ceiling-gbps', '1', "
        f"'--out', {str(scratch / 'oom')!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.startswith("ckptprof: error")]
    return {"exit": done.returncode, "line": lines[-1] if lines else done.stderr[-500:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ckptprof-gpu-check"))
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--strategies", default="pipelined,staged,framework")
    ap.add_argument("--out", type=Path, default=None, help="a folder for gpu_check.json")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(f"no CUDA device here (torch {torch.__version__}): nothing to check")
        return 2
    began = time.monotonic()
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / "safetensors"
    checkpoint(path, "llama2-7b", "safetensors", args.scale)
    steps = {
        "link": lambda: link(),
        "h2d_gbps": lambda: h2d_ceiling(args.dir),
        "restores": lambda: restores(path, args.dir, args.strategies.split(",")),
        "copy_kinds": lambda: copy_kinds(path, args.dir),
        "fresh_first_step": lambda: fresh_first_step(path, args.dir),
        "out_of_memory": lambda: out_of_memory(path, args.dir),
        "gpu_restore": lambda: subprocess.run(
            [
                sys.executable,
                str(Path(__file__).with_name("gpu_restore.py")),
                "--dir",
                str(args.dir / "bench"),
                "--scale",
                "0.02",
                "--repeat",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=240,
        ).stdout.splitlines(),  # fmt: skip
    }
    report: dict = {}
    for name, step in steps.items():
        if time.monotonic() - began > BUDGET_S:
            report[name] = "skipped: the time budget was spent"
            continue
        started = time.monotonic()
        try:
            report[name] = step()
        except Exception as exc:  # noqa: BLE001 - one step's failure is its figure
            report[name] = f"failed: {type(exc).__name__}: {exc}"
        print(
            f"== {name} ({time.monotonic() - started:.1f} s)\n{json.dumps(report[name], indent=1)}"
        )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
