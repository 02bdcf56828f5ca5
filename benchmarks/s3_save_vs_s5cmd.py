"""ckptprof's S3 save next to ``s5cmd cp`` uploading the same files, same server, same
part size and concurrency.

Starts SeaweedFS on 127.0.0.1 (the ``tests/s3infra.py`` the tests use), builds the
training state once (untimed), writes its checkpoint files once into a tmpfs folder
(so s5cmd reads them from memory, not from a disk), then for each concurrency level,
interleaved per repeat:

* ``s5cmd``    — ``s5cmd --numworkers N cp -c N -p <part MiB> 'DIR/*' s3://…/``: every file
  uploaded (multipart, N parts in flight);
* ``parallel`` — ``synth save --strategy parallel`` of the same state: each file
  serialized (views of the tensors, no copy) and uploaded as a multipart upload with N
  parts in flight, the ``ckpt.save`` span's wall time (serialize → commit).

Prints GB/s (median, min–max) per tool and the ratio to s5cmd. Target (issue: the
synthetic save): parallel ≥ 0.9× s5cmd at 8 and 16 in flight. Client and server share
this machine's cores, so both tools run under identical conditions, interleaved.

Run from the repository root:  .venv/bin/python benchmarks/s3_save_vs_s5cmd.py --help
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from s3_vs_s5cmd import configure_env, s5cmd_binary  # noqa: E402

from ckptprof.storage import open_storage  # noqa: E402
from ckptprof.synth.layouts import get_layout  # noqa: E402
from ckptprof.synth.plan import SynthSpec  # noqa: E402
from ckptprof.synth.save import build_state  # noqa: E402
from ckptprof.synth.savers import SaveContext, save  # noqa: E402
from ckptprof.tracing import CheckpointTracer, setup_telemetry  # noqa: E402
from tests.s3infra import DUMMY_CREDENTIALS, SeaweedS3  # noqa: E402

TARGET = 0.9


def run_s5cmd(binary: str, endpoint: str, source: Path, location: str, conc: int, part: int):
    cmd = [
        binary, "--endpoint-url", endpoint, "--numworkers", str(conc),
        "cp", "-c", str(conc), "-p", str(max(5, part >> 20)), f"{source}/*", f"{location}/",
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(
        cmd, check=True, capture_output=True, env={**os.environ, "S3_USE_PATH_STYLE": "1"}
    )
    return time.perf_counter() - started


def run_parallel(location: str, plan, tensors, tracer, conc: int, part: int) -> float:
    storage = open_storage(location, conc)
    with tracer.save({}) as op:
        ctx = SaveContext(
            storage=storage, plan=plan, tensors=tensors, op=op, fsync=False,
            concurrency=conc, part_size=part, tracer=tracer,
        )  # fmt: skip
        save("parallel", ctx)
    return op.summary.wall_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--scale", type=float, default=0.05, help="llama2-7b scale (no optimizer)")
    ap.add_argument("--layout", default="torch", choices=["torch", "safetensors", "deepspeed"])
    ap.add_argument("--concurrency", type=lambda t: [int(v) for v in t.split(",")], default=[8, 16])
    ap.add_argument("--part-size", type=int, default=16 << 20, help="bytes per part")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--source", type=Path, default=Path("/dev/shm"), help="tmpfs for s5cmd's files")
    ap.add_argument("--json", type=Path, help="write every run here")
    args = ap.parse_args(argv)

    binary = s5cmd_binary()
    work = Path(tempfile.mkdtemp(prefix="ckptprof-s3save-"))
    source = Path(tempfile.mkdtemp(prefix="s3save-", dir=args.source))
    telemetry = setup_telemetry(work / "traces")
    tracer = CheckpointTracer(telemetry.provider, framework="synthetic")
    runs: dict[str, dict[int, list[float]]] = {"s5cmd": {}, "parallel": {}}
    try:
        with SeaweedS3(auth=False) as server:
            configure_env(server.endpoint_url, work)
            server.client(DUMMY_CREDENTIALS).create_bucket(Bucket="bench")
            spec = SynthSpec("llama2-7b", args.layout, args.scale, optimizer=False)
            plan = get_layout(args.layout).plan(spec)
            tensors = build_state(plan, spec.seed)
            # the same bytes as files for s5cmd: one local parallel save into tmpfs
            run_parallel(str(source), plan, tensors, tracer, 1, args.part_size)
            total = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
            version = subprocess.run([binary, "version"], capture_output=True, text=True)
            print(f"server: SeaweedFS `weed mini` on {server.endpoint_url} (loopback)")
            print(f"client: s5cmd {version.stdout.strip()} vs ckptprof synth save (boto3)")
            print(
                f"files: {len(plan.files)} ({args.layout}, llama2-7b x{args.scale}, no optimizer), "
                f"{total / 1e9:.3f} GB; part {args.part_size >> 20} MiB; {os.cpu_count()} CPUs"
            )
            tools = {
                "s5cmd": lambda c, n: run_s5cmd(
                    binary, server.endpoint_url, source, f"s3://bench/s5-{n}", c, args.part_size
                ),
                "parallel": lambda c, n: run_parallel(
                    f"s3://bench/ours-{n}", plan, tensors, tracer, c, args.part_size
                ),
            }
            for conc in args.concurrency:
                for tool in tools.values():  # warm-up, not counted
                    tool(conc, f"warm{conc}")
                for repeat in range(args.repeat):
                    for name, tool in tools.items():
                        seconds = tool(conc, f"{conc}-{repeat}")
                        runs[name].setdefault(conc, []).append(seconds)
            print("\nGB/s (median, min-max)")
            report = {}
            for conc in args.concurrency:
                gbps = {n: [total / s / 1e9 for s in runs[n][conc]] for n in ("s5cmd", "parallel")}
                ratio = statistics.median(gbps["parallel"]) / statistics.median(gbps["s5cmd"])
                for name, values in gbps.items():
                    print(
                        f"  {conc:3d} in flight  {name:9} {statistics.median(values):5.2f} "
                        f"({min(values):.2f}-{max(values):.2f})"
                    )
                verdict = "met" if ratio >= TARGET else "NOT met"
                print(f"  {conc:3d} in flight  parallel / s5cmd: {ratio:.2f}x "
                      f"(target >= {TARGET}x: {verdict})")  # fmt: skip
                report[conc] = {"ratio": ratio, "gbps": gbps}
            if args.json:
                args.json.write_text(json.dumps({"bytes": total, "runs": report}, indent=2))
    finally:
        telemetry.shutdown()
        shutil.rmtree(source, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
