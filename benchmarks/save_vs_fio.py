"""``ckptprof synth save`` next to fio's sequential write with fsync on the same filesystem:
how close a real checkpoint save (the layout's own writer, every file fsynced, renamed
into place) comes to what the storage takes.

For each layout, interleaved: fio writing the checkpoint's bytes as one sequential file
(``--rw=write --end_fsync=1``, 16 MiB blocks, one job: the writers write each file
sequentially from one thread), then one ``synth save`` of the same state (the state is
built once, untimed). Prints median seconds, GB/s and the save's ratio to fio.

Target (issue: the synthetic save): the ``framework`` save ≥ 0.9× fio's write.

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

from harness import environment, interleaved, median  # noqa: E402

from ckptprof.synth.layouts import get_layout  # noqa: E402
from ckptprof.synth.plan import SynthSpec  # noqa: E402
from ckptprof.synth.save import build_state, save_once  # noqa: E402
from ckptprof.tracing import CheckpointTracer, setup_telemetry  # noqa: E402

TARGET = 0.9


def fio_write(folder: Path, nbytes: int, block: str) -> dict:
    """fio writing ``nbytes`` sequentially into one new file, fsync at the end."""
    if shutil.which("fio") is None:
        raise SystemExit("fio is not installed: apt-get install fio")
    target = folder / "fio-write"
    command = [
        "fio", "--name=write", "--rw=write", "--ioengine=psync", f"--bs={block}",
        f"--size={nbytes}", "--end_fsync=1", "--numjobs=1", f"--filename={target}",
        "--output-format=json",
    ]  # fmt: skip
    started = time.perf_counter()
    out = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    seconds = time.perf_counter() - started  # the fsync included (fio's runtime is not)
    target.unlink(missing_ok=True)
    written = out["jobs"][0]["write"]["io_bytes"]
    return {"bytes": written, "seconds": seconds, "gbps": written / seconds / 1e9}


def save(root: Path, plan, tensors, tracer) -> dict:
    """One timed save (``save_once``), then its files removed (the next save is fresh)."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    with tracer.save({}) as op:
        nbytes = save_once(root, plan, tensors, op, fsync=True)
    seconds = op.summary.wall_s
    shutil.rmtree(root, ignore_errors=True)
    return {"bytes": nbytes, "seconds": seconds, "gbps": nbytes / seconds / 1e9}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ckptprof-bench-save"))
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--layouts", default="safetensors,torch")
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    telemetry = setup_telemetry(args.dir / "traces")
    tracer = CheckpointTracer(telemetry.provider, framework="synthetic")
    report: dict = {"layouts": {}}
    try:
        for layout in [s for s in args.layouts.split(",") if s]:
            spec = SynthSpec(args.model, layout, args.scale)
            plan = get_layout(layout).plan(spec)
            tensors = build_state(plan, spec.seed)
            first = save(args.dir / "ckpt", plan, tensors, tracer)  # its size, for fio
            methods = {
                "fio": lambda n=first["bytes"]: fio_write(args.dir, n, "16M"),
                "save": lambda p=plan, t=tensors: save(args.dir / "ckpt", p, t, tracer),
            }
            runs = interleaved(methods, args.repeat)
            del tensors
            fio, ours = (median(r["gbps"] for r in runs[n]) for n in ("fio", "save"))
            ratio = ours / fio
            print(
                f"\n{layout}: {args.model} x{args.scale:g}, {first['bytes'] / 1e9:.2f} GB in "
                f"{len(plan.files)} files, fsync on, {args.repeat} repeats after a warm-up "
                "(medians, min-max)"
            )
            for name, found in runs.items():
                seconds = [r["seconds"] for r in found]
                print(
                    f"  {name:5} {median(seconds):6.2f} s ({min(seconds):.2f}-{max(seconds):.2f})"
                    f"  {median(r['gbps'] for r in found):5.2f} GB/s"
                )
            verdict = "met" if ratio >= TARGET else "NOT met"
            print(f"  save / fio write: {ratio:.2f}x (target >= {TARGET}x: {verdict})")
            report["layouts"][layout] = {"ratio": ratio, "runs": runs}
    finally:
        telemetry.shutdown()
    report["environment"] = environment(args.dir)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
