"""The GPU path's first check, as one script for the first machine with a GPU (inside 7
minutes on one H100/H200, to fit a 15-minute lease with its start and one rerun: no step
starts after 6 minutes, and each step in a subprocess is bounded).

1. The device and its link: name, driver, CUDA, PCIe generation and width.
2. A host→device ceiling from pinned, pageable and mapped (page-cache) sources: 1 GiB,
   best of 3, timed by CUDA events.
3. Each strategy restoring the same checkpoint onto the device and into host memory:
   equal state digests; reshard GB/s against the pinned ceiling; window_pinned.
4. A profiler count of pageable vs pinned host→device copies in a pipelined restore.
5. A fresh process's first step on the device (CUDA context and handles included).
6. The out-of-memory message, with the device nearly full.
7. ``benchmarks/gpu_restore.py`` at a small scale.

Writes ``--out``/gpu_check.json after every step (a run cut short keeps what it
measured) and prints each step's figures. Without CUDA it says so and exits 2, unless
``--device cpu``: a rehearsal where there is no GPU, every step that needs CUDA skipped
and said so, the rest run with the state in host memory, so that the script's own code
is checked before the one GPU run it gets (tests/test_gpu_path.py runs it so). The
command for the device machine is in benchmarks/README.md; from the repository root:
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

from harness import checkpoint, environment  # noqa: E402

BUDGET_S = 6 * 60  # no step starts later
STEP_TIMEOUT_S = 150  # each step run as a subprocess
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


def restores(path: Path, scratch: Path, strategies: list[str], device: str) -> dict:
    """Each strategy onto ``device`` and into host memory, hot: the state digests equal
    (the bytes on the device are the checkpoint's), and what reshard costs on each."""
    from ckptprof.synth.options import RestoreOptions
    from ckptprof.synth.runner import RestoreRunner
    from ckptprof.tracing import CheckpointTracer, setup_telemetry

    out: dict = {}
    for strategy in strategies:
        digests = {}
        for target in dict.fromkeys((device, "cpu")):
            options = RestoreOptions(
                strategies=(strategy,), caches=("hot",), concurrency=(8,), repeat=1,
                verify="full", ceiling_gbps=1.0, progress=False, device=target, first_step=False,
            )  # fmt: skip
            telemetry = setup_telemetry(scratch / f"traces-{strategy}-{target}")
            runner = RestoreRunner(str(path), options, CheckpointTracer(telemetry.provider))
            try:
                runner.prepare()
                run = runner.run_once(strategy, "hot", 8, 0)
                digests[target] = runner.state.digest()
                reshard = run.phases.get("reshard", {})
                out[f"{strategy} {target}"] = {
                    "rto_s": run.wall_s,
                    "reshard_s": reshard.get("busy_s"),
                    "reshard_gbps": reshard.get("gbps"),
                    "device_peak": run.device_peak_bytes,
                }
            finally:
                runner.state.release()
                telemetry.shutdown()
        if len(digests) == 2:
            out[f"{strategy} digests equal"] = digests[device] == digests["cpu"]
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


def fresh_first_step(path: Path, scratch: Path, device: str) -> dict:
    """A new process's restore and first step on ``device``: the one-time set-up (on a
    GPU the CUDA context and library handles) in the step, as a resumed job pays it."""
    out = scratch / "fresh"
    argv = [sys.executable, "-m", "ckptprof", "synth", "restore", str(path), "--device", device,
            "--cache", "hot", "--concurrency", "8", "--repeat", "1", "--no-report",
            "--ceiling-gbps", "1", "--out", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
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
                          timeout=STEP_TIMEOUT_S)  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.startswith("ckptprof: error")]
    return {"exit": done.returncode, "line": lines[-1] if lines else done.stderr[-500:]}


def gpu_restore(scratch: Path, device: str, scale: float) -> list[str]:
    """``benchmarks/gpu_restore.py`` at a small scale: its printed table."""
    argv = [sys.executable, str(Path(__file__).with_name("gpu_restore.py")),
            "--dir", str(scratch / "bench"), "--scale", str(scale), "--repeat", "2",
            "--device", device]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout.splitlines()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ckptprof-gpu-check"))
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--bench-scale", type=float, default=0.02, help="gpu_restore.py's")
    ap.add_argument("--strategies", default="pipelined,staged,framework")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a rehearsal without a GPU (the CUDA steps skipped)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="a folder for gpu_check.json")
    args = ap.parse_args()
    import torch

    gpu = args.device == "cuda"
    if gpu and not torch.cuda.is_available():
        print(f"no CUDA device here (torch {torch.__version__}): nothing to check")
        return 2
    began = time.monotonic()
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / "safetensors"
    checkpoint(path, "llama2-7b", "safetensors", args.scale)
    needs_cuda = {
        "link": link,
        "h2d_gbps": lambda: h2d_ceiling(args.dir),
        "copy_kinds": lambda: copy_kinds(path, args.dir),
        "out_of_memory": lambda: out_of_memory(path, args.dir),
    }
    steps = {
        "environment": lambda: environment(args.dir),
        "link": needs_cuda["link"],
        "h2d_gbps": needs_cuda["h2d_gbps"],
        "restores": lambda: restores(path, args.dir, args.strategies.split(","), args.device),
        "copy_kinds": needs_cuda["copy_kinds"],
        "fresh_first_step": lambda: fresh_first_step(path, args.dir, args.device),
        "out_of_memory": needs_cuda["out_of_memory"],
        "gpu_restore": lambda: gpu_restore(args.dir, args.device, args.bench_scale),
    }
    report: dict = {"device": args.device, "scale": args.scale}
    for name, step in steps.items():
        started = time.monotonic()
        if not gpu and name in needs_cuda:
            report[name] = "skipped: needs a GPU (--device cpu)"
        elif started - began > BUDGET_S:
            report[name] = "skipped: the time budget was spent"
        else:
            try:
                report[name] = step()
            except Exception as exc:  # noqa: BLE001 - one step's failure is its figure
                report[name] = f"failed: {type(exc).__name__}: {exc}"
        print(
            f"== {name} ({time.monotonic() - started:.1f} s)\n{json.dumps(report[name], indent=1)}",
            flush=True,
        )
        if args.out:  # after every step: a run cut short keeps what it measured
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
