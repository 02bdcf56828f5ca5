"""ckptprof's restore strategies next to fio on the same files: how close a full restore
(list → fetch → verify → deserialize → reshard into the state) comes to the storage's
lower bound, and what each strategy holds in memory.

The lower bound is the checkpoint's bytes ÷ fio's sequential read bandwidth on the same
files at the same request size and queue depth, measured in the same run: the faster of
fio with direct I/O (libaio) and fio through the page cache (io_uring), whichever this
storage favours. For
every layout, interleaved and cold (evicted, residency checked): fio, then each strategy
through ``ckptprof.synth.restore`` (``--no-first-step``: the RTO ends with the state
restored; ``--verify full``: every byte hashed). Prints median seconds, GB/s, the ratio
to the bound, and peak RSS.

``pipelined+step`` is the default strategy with the real first step on (the model and its
optimizer train on the restored tensors): only its peak RSS is compared, with the state.

Targets (issue: the engine package): pipelined ≤ 1.1× the lower bound for llama2-7b
safetensors and torch at ``--scale`` ≥ 0.05 (after a warm-up pass); peak RSS with the
first step on ≤ 1.2× the restored state.

Run from the repository root:
    .venv/bin/python benchmarks/restore_vs_fio.py --dir /tmp/bench-restore --scale 0.05
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import checkpoint, cold, environment, fio_read, interleaved, median  # noqa: E402

from ckptprof.synth.options import RestoreOptions  # noqa: E402
from ckptprof.synth.runner import RestoreRunner  # noqa: E402
from ckptprof.tracing import CheckpointTracer, setup_telemetry  # noqa: E402

TARGET = 1.1
RSS_TARGET = 1.2


def fio_cold(path: Path, manifest, queue_depth: int, block: str, direct: bool) -> dict:
    """fio on the evicted files (direct I/O, or through the page cache)."""
    resident = cold(path, manifest)
    return {**fio_read(path, manifest, queue_depth, block, direct), "resident_before": resident}


def restore_once(
    path: Path, manifest, strategy: str, concurrency: int, part: int, trace: Path,
    first_step: bool = False,
):  # fmt: skip
    """One cold restore with ``strategy``; its RTO, bytes read and peak memory."""
    options = RestoreOptions(
        strategies=(strategy,), caches=("cold",), concurrency=(concurrency,), repeat=1,
        verify="full", part_size=part, first_step=first_step, ceiling_gbps=1.0,
        progress=False,
    )  # fmt: skip
    telemetry = setup_telemetry(trace)
    try:
        runner = RestoreRunner(str(path), options, CheckpointTracer(telemetry.provider))
        runner.prepare()
        resident = cold(path, manifest)
        run = runner.run_once(strategy, "cold", concurrency, 0)
        runner.state.release()
    finally:
        telemetry.shutdown()
    return {
        "seconds": run.wall_s,
        "gbps": run.bytes / run.wall_s / 1e9,
        "peak_rss": run.peak_rss_bytes,
        "state": run.state_bytes,
        "read": run.read_bytes,
        "resident_before": resident,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ckptprof-bench-restore"))
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--layouts", default="safetensors,torch")
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--strategies", default="pipelined,staged,framework")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--part-size-mib", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--no-first-step", dest="first_step", action="store_false",
        help="skip the pipelined run with the real first step (its peak RSS)",
    )  # fmt: skip
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    part = args.part_size_mib << 20
    strategies = [s for s in args.strategies.split(",") if s]
    report: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "layouts": {}}
    for layout in [s for s in args.layouts.split(",") if s]:
        path = args.dir / f"{args.model}-{layout}-{args.scale:g}"
        manifest = checkpoint(path, args.model, layout, args.scale)
        total = manifest.total_bytes

        block = f"{args.part_size_mib}M"
        methods = {
            "fio": partial(fio_cold, path, manifest, args.concurrency, block, True),
            "fio-buf": partial(fio_cold, path, manifest, args.concurrency, block, False),
        }
        for strategy in strategies:
            methods[strategy] = partial(
                restore_once, path, manifest, strategy, args.concurrency, part, args.dir / "traces"
            )
        if "pipelined" in strategies and args.first_step:
            methods["pipelined+step"] = partial(
                restore_once, path, manifest, "pipelined", args.concurrency, part,
                args.dir / "traces", first_step=True,
            )  # fmt: skip
        runs = interleaved(methods, args.repeat)
        best = max(median(r["gbps"] for r in runs[name]) for name in ("fio", "fio-buf"))
        # the step's time is not a read: only its memory is compared below
        step_runs = runs.pop("pipelined+step", None)
        bound = total / best / 1e9
        print(
            f"\n{layout}: {args.model} x{args.scale:g}, {total / 1e9:.2f} GB in "
            f"{len(manifest.files)} files; cold, {args.concurrency} in flight, "
            f"{args.part_size_mib} MiB requests, {args.repeat} repeats (medians, min-max)"
        )
        print(
            f"  lower bound: {bound:.2f} s (bytes / the faster fio's median GB/s: direct I/O, "
            "or through the page cache)"
        )
        print(f"  {'method':10} {'seconds':>18} {'GB/s':>6} {'x bound':>8} {'peak RSS GB':>12}")
        rows = {}
        for name, found in runs.items():
            seconds = [r["seconds"] for r in found]
            med = median(seconds)
            ratio = med / bound
            peak = max(r.get("peak_rss", 0) for r in found)
            rows[name] = {"median_s": med, "ratio_to_bound": ratio, "peak_rss": peak,
                          "runs": found}  # fmt: skip
            span = f"{med:.2f} ({min(seconds):.2f}-{max(seconds):.2f})"
            gbps = median(r["gbps"] for r in found)
            peak_text = f"{peak / 1e9:.2f}" if peak else "-"
            print(f"  {name:10} {span:>18} {gbps:6.2f} {ratio:8.2f} {peak_text:>12}")
        if "pipelined" in rows:
            ratio = rows["pipelined"]["ratio_to_bound"]
            verdict = "met" if ratio <= TARGET else "NOT met"
            print(f"  pipelined / lower bound: {ratio:.2f} (target <= {TARGET}: {verdict})")
        if "staged" in rows and "pipelined" in rows:
            staged, piped = rows["staged"]["peak_rss"], rows["pipelined"]["peak_rss"]
            state = rows["pipelined"]["runs"][0]["state"]
            print(
                f"  peak RSS: staged {staged / 1e9:.2f} GB, pipelined {piped / 1e9:.2f} GB "
                f"(the restored state: {state / 1e9:.2f} GB)"
            )
        if step_runs:
            peak = max(r["peak_rss"] for r in step_runs)
            state = step_runs[0]["state"]
            verdict = "met" if peak <= RSS_TARGET * state else "NOT met"
            print(
                f"  peak RSS with the real first step on: {peak / 1e9:.2f} GB = "
                f"{peak / state:.2f}x the restored state ({state / 1e9:.2f} GB; target <= "
                f"{RSS_TARGET}x: {verdict})"
            )
            rows["pipelined+step"] = {"peak_rss": peak, "runs": step_runs}
        report["layouts"][layout] = {"bytes": total, "lower_bound_s": bound, "methods": rows}
    report["environment"] = environment(args.dir)
    print("\nenvironment: " + ", ".join(f"{k}={v}" for k, v in report["environment"].items()
                                         if k.startswith(("version.", "cpu", "memory", "kernel",
                                                          "storage.fs", "fio"))))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
