"""ckptprof next to the tools people would pick instead, on the same files in one run:
fio (direct and through the page cache), the Run:ai Model Streamer, and ckptprof's own
strategies — cold, interleaved, medians over the repeats.

What each measures (so the ratios are read fairly):

* ``fio``, ``fio-buf``: sequential reads of every file, bytes discarded — the storage's
  bound, no tensors at all;
* ``runai``: ``SafetensorsStreamer`` streaming every weight shard into host tensors (its
  own parallel reader); no state to fill, no optimizer files, no verify;
* ``staged`` / ``pipelined`` / ``framework``: ckptprof's restore through ``reshard`` into
  a preallocated state, every byte hashed (``--verify full``), no first step.

The checkpoint is llama2-7b safetensors *without* Adam state, so every tool reads the
same bytes (the weight shards and the small files). Tools that are not installed are a
skip line, not a crash: ``pip install 'ckptprof[bench]'`` and ``apt-get install fio``.

A second table puts ckptprof next to DLIO's checkpoint read on a DeepSpeed ZeRO
checkpoint *with* Adam (1 rank): ``dlio-read`` is that read as DLIO's PyTorch
checkpointing does it — ``torch.load`` of each of the rank's files, the objects dropped
(bytes in host memory, no ``load_state_dict``, no reshard) — re-implemented here, because
the PyPI ``dlio-benchmark`` (2.0.0) only writes checkpoints and pulls TensorFlow and a
CUDA build of NVIDIA DALI. s3torchconnector reads S3 only: it is in
``benchmarks/s3_vs_s5cmd.py``, on the same objects as s5cmd.

Run from the repository root:
    .venv/bin/python benchmarks/peers.py --dir /tmp/bench-peers --scale 0.1 --zero-scale 0.05
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import checkpoint, cold, environment, interleaved, median  # noqa: E402
from restore_vs_fio import fio_cold, restore_once  # noqa: E402


def runai_cold(path: Path, manifest, concurrency: int) -> dict:
    """The Run:ai streamer over every shard, cold; tensors kept until the last is out."""
    import os

    from runai_model_streamer import SafetensorsStreamer

    os.environ["RUNAI_STREAMER_CONCURRENCY"] = str(concurrency)
    resident = cold(path, manifest)
    shards = [str(path / p) for p in sorted(manifest.files) if p.endswith(".safetensors")]
    start = time.perf_counter()
    nbytes, kept = 0, []
    with SafetensorsStreamer() as streamer:
        streamer.stream_files(shards)
        for _, tensor in streamer.get_tensors():
            kept.append(tensor.clone())  # the streamer reuses its buffers: keep a copy
            nbytes += tensor.numel() * tensor.element_size()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "gbps": nbytes / seconds / 1e9, "resident_before": resident,
            "bytes": nbytes}  # fmt: skip


def dlio_read_cold(path: Path, manifest) -> dict:
    """DLIO's checkpoint read: every file of the rank ``torch.load``-ed, then dropped."""
    import torch

    resident = cold(path, manifest)
    files = sorted(p for p in manifest.files if p.endswith(".pt"))
    start = time.perf_counter()
    for name in files:
        obj = torch.load(path / name, map_location="cpu", weights_only=False)
        del obj
    seconds = time.perf_counter() - start
    nbytes = sum(manifest.files[p].size for p in files)
    return {"seconds": seconds, "gbps": nbytes / seconds / 1e9, "resident_before": resident,
            "bytes": nbytes}  # fmt: skip


def table(title: str, runs: dict, does: dict, against: str = "pipelined") -> dict:
    """Print one table (medians, min-max, ``against``'s speed-up over each); its rows."""
    print(title)
    print(f"  {'tool':10} {'seconds':>18} {'GB/s':>6} {against + '/tool':>15}  does")
    rows = {}
    reference = median(r["seconds"] for r in runs[against])
    for name, found in runs.items():
        seconds = [r["seconds"] for r in found]
        med = median(seconds)
        gbps = median(r["gbps"] for r in found)
        rows[name] = {"median_s": med, "gbps": gbps, "runs": found}
        # the reference's throughput as a multiple of this tool's (> 1: it is faster)
        ratio = med / reference if reference else 0.0
        span = f"{med:.2f} ({min(seconds):.2f}-{max(seconds):.2f})"
        print(f"  {name:10} {span:>18} {gbps:6.2f} {ratio:15.2f}  {does[name]}")
    return rows


def zero_table(args, part: int) -> dict:
    """ckptprof next to DLIO's checkpoint read on a ZeRO checkpoint with Adam."""
    path = args.dir / f"llama2-7b-deepspeed-{args.zero_scale:g}"
    manifest = checkpoint(path, "llama2-7b", "deepspeed", args.zero_scale)
    methods = {"dlio-read": partial(dlio_read_cold, path, manifest)}
    for strategy in ("pipelined", "staged", "framework"):
        methods[strategy] = partial(
            restore_once, path, manifest, strategy, args.concurrency, part, args.dir / "traces"
        )
    runs = interleaved(methods, args.repeat)
    does = {
        "dlio-read": "torch.load each file, dropped",
        "pipelined": "-> state (ZeRO unflatten), verified",
        "staged": "all in memory, then state, verified",
        "framework": "torch.load(mmap) -> state, verified",
    }
    title = (
        f"\nllama2-7b x{args.zero_scale:g} DeepSpeed ZeRO with Adam, 1 rank: "
        f"{manifest.total_bytes / 1e9:.2f} GB in {len(manifest.files)} files; cold, "
        f"{args.concurrency} in flight, {args.repeat} repeats (medians, min-max)"
    )
    return {"bytes": manifest.total_bytes, "rows": table(title, runs, does)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ckptprof-bench-peers"))
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--part-size-mib", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--zero-scale", type=float, default=0.05, help="the ZeRO table's scale")
    ap.add_argument("--no-zero", action="store_true", help="skip the ZeRO / DLIO table")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    path = args.dir / f"llama2-7b-safetensors-{args.scale:g}-weights"
    manifest = checkpoint(path, "llama2-7b", "safetensors", args.scale, optimizer=False)
    total = manifest.total_bytes
    part, block = args.part_size_mib << 20, f"{args.part_size_mib}M"
    methods, skipped = {}, []
    if shutil.which("fio"):
        methods["fio"] = partial(fio_cold, path, manifest, args.concurrency, block, True)
        methods["fio-buf"] = partial(fio_cold, path, manifest, args.concurrency, block, False)
    else:
        skipped.append("fio: not installed (apt-get install fio)")
    if importlib.util.find_spec("runai_model_streamer"):
        methods["runai"] = partial(runai_cold, path, manifest, args.concurrency)
    else:
        skipped.append("runai: runai-model-streamer not installed (pip install 'ckptprof[bench]')")
    for strategy in ("pipelined", "staged", "framework"):
        methods[strategy] = partial(
            restore_once, path, manifest, strategy, args.concurrency, part, args.dir / "traces"
        )
    skipped += [
        "dlio-benchmark itself: not run (PyPI 2.0.0 has no checkpoint read; the ZeRO table's "
        "dlio-read does what its read does)",
        "s3torchconnector: S3 only, in benchmarks/s3_vs_s5cmd.py",
    ]
    runs = interleaved(methods, args.repeat)
    title = (
        f"\nllama2-7b x{args.scale:g} safetensors, weights only: {total / 1e9:.2f} GB in "
        f"{len(manifest.files)} files; cold, {args.concurrency} in flight, {block} requests, "
        f"{args.repeat} repeats (medians, min-max)"
    )
    does = {
        "fio": "reads (direct I/O), discards",
        "fio-buf": "reads (page cache), discards",
        "runai": "weight shards -> host tensors",
        "pipelined": "-> state, verified",
        "staged": "all in memory, then state, verified",
        "framework": "safetensors load_file -> state, verified",
    }
    rows = table(title, runs, does)
    zero = None if args.no_zero else zero_table(args, part)
    for line in skipped:
        print(f"  skipped: {line}")
    figures = {"bytes": total, "rows": rows, "zero": zero, "skipped": skipped,
               "environment": environment(path)}  # fmt: skip
    env = figures["environment"]
    print("  environment: " + ", ".join(f"{k}={v}" for k, v in env.items()
                                         if k.startswith(("version.torch", "cpu.", "storage.fs",
                                                          "fio"))))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
