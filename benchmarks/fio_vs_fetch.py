#!/usr/bin/env python3
"""fio vs ckptprof's cold fetch, side by side, on the same files.

For every queue depth, fio reads every file of the checkpoint once, sequentially, with
direct I/O (``--rw=read --direct=1 --ioengine=libaio --bs=<part> --iodepth=<qd>``), and
ckptprof's ``fetch()`` reads the same files into its anonymous-memory buffers with ``qd``
requests of ``<part>`` bytes in flight (exactly the fetch phase of ``ckptprof synth
restore``). Both start cold: ``storage.evict()`` (fsync + POSIX_FADV_DONTNEED) runs before
every run of every method and mincore measures the residency it left. The methods are
interleaved per repeat (their order rotates every repeat) so that drift of the disk or of
the VM hits all of them. Throughput is decimal GB/s over the bytes each tool actually read.

Extra columns (clearly not ckptprof's fetch):

- ``reuse``: ckptprof's ``storage.read_into`` (buffered ``preadv``) into one reused,
  pre-faulted buffer at the same queue depth: the read path without the cost of fresh
  memory.
- ``--diagnose`` adds: ``fio-buf`` (fio, buffered, io_uring, same qd: the kernel's buffered
  path without Python), ``prefault`` (ckptprof's HostBuffers faulted in whole before the
  reads, then ``read_into``), ``populate`` (each part's pages faulted in by one
  ``madvise(MADV_POPULATE_WRITE)`` in its thread, then ``read_into``), and ``odirect``
  (O_DIRECT ``preadv`` straight into fresh HostBuffers from the same thread pool: no
  page-cache copy). None of these change ckptprof; they show where its time goes.

After each qd group a small probe times one thread writing a fresh 256 MiB anonymous mapping: the
price of the fresh memory that every fetched byte lands in.

Run ``python benchmarks/fio_vs_fetch.py --help``; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from machine import (  # noqa: E402
    FRESH_PROBE,
    Probe,
    background_load,
    balloon_page_reporting,
    block_device,
    describe_load,
    fresh_memory_gbps,
    queue_settings,
    read_first_line,
)

from ckptprof.cli.options import parse_size, size_text  # noqa: E402
from ckptprof.io.buffers import HostBuffer  # noqa: E402
from ckptprof.io.requests import whole_files  # noqa: E402
from ckptprof.io.transfer import fetch  # noqa: E402
from ckptprof.manifest import MANIFEST_NAME, hash_full  # noqa: E402
from ckptprof.storage.base import ObjectInfo  # noqa: E402
from ckptprof.storage.posix import PosixStorage  # noqa: E402
from ckptprof.units import fmt_bytes  # noqa: E402

TARGET = 0.9
COLD_LIMIT = 0.05  # the same limit ckptprof uses to call a run cold
BUSY_OTHER = 0.25  # cores busy outside the benchmark above which a run is flagged
DIO_ALIGN = 4096
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14
MAX_FILENAME_ARG = 100_000  # below Linux's 128 KiB limit for one argv string


# ---------------------------------------------------------------- small helpers


def _size(text: str) -> int:
    """``16M``, ``4096``, ``1G``: ckptprof's own size syntax."""
    try:
        return parse_size(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 16M, 4096, 1G)") from None


def parse_qds(text: str) -> list[int]:
    try:
        qds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not qds or min(qds) < 1:
        raise argparse.ArgumentTypeError("queue depths must be integers >= 1")
    return qds


# ---------------------------------------------------------------- environment


def environment(root: Path, files: list[ObjectInfo], part: int) -> dict:
    """The harness's environment (versions, CPU, memory, kernel, filesystem, fio), and
    what a read benchmark needs beside it: the block device's queue, transparent huge
    pages, the memory balloon, the files."""
    env = harness.environment(root)
    dev = block_device(env)
    return {
        **env,
        "dir": str(root.resolve()),
        "block_device": dev,
        "queue": queue_settings(dev),
        "thp": read_first_line("/sys/kernel/mm/transparent_hugepage/enabled"),
        "memory_balloon": balloon_page_reporting(),
        "files": len(files),
        "bytes": sum(f.size for f in files),
        "largest_file": max((f.size for f in files), default=0),
        "part_size": part,
    }


# ---------------------------------------------------------------- the checkpoint


def remove_generated(root: Path, files: list[ObjectInfo], created_dir: bool) -> None:
    if created_dir:
        shutil.rmtree(root, ignore_errors=True)
        return
    (root / MANIFEST_NAME).unlink(missing_ok=True)
    for f in files:
        (root / f.path).unlink(missing_ok=True)


# ---------------------------------------------------------------- one run


@dataclass
class Run:
    method: str
    qd: int
    repeat: int  # -1: warm-up, discarded
    position: int  # order within the repeat
    bytes: int
    seconds: float
    resident_before: float
    resident_after: float | None
    cold: bool
    wall_s: float = 0.0
    cpu_busy: float | None = None
    cpu_iowait: float | None = None
    dev_bytes: int | None = None
    dev_reads: int | None = None
    dev_read_ms: int | None = None
    proc_cpu_s: float | None = None
    proc_sys_s: float | None = None
    proc_minflt: int | None = None
    other_cores: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def dev_inflight(self) -> float | None:
        """Average reads in flight at the device over the timed interval (Little's Law)."""
        if self.dev_read_ms is None or self.seconds <= 0:
            return None
        return self.dev_read_ms / 1000 / self.seconds

    def to_dict(self) -> dict:
        out = asdict(self)
        out["gbps"] = self.gbps
        out["dev_inflight"] = self.dev_inflight
        return out


class Bench:
    def __init__(self, root: Path, files: list[ObjectInfo], part: int, dev: str | None):
        self.root = root
        self.storage = PosixStorage(str(root))
        self.files = files
        self.paths = [f.path for f in files]
        self.total = sum(f.size for f in files)
        self.part = part
        self.dev = dev
        self.reqs = [r for r in whole_files({f.path: f.size for f in files}, part) if r.length]
        self._scratch: dict[int, HostBuffer] = {}
        self._links: tempfile.TemporaryDirectory | None = None
        self.fio_files = self._fio_filenames()
        self.verified: dict[str, bool] = {}

    # -- cold cache, measured
    def cold(self) -> float:
        state = self.storage.evict(self.paths)
        resident = state.resident_fraction or 0.0
        if resident > COLD_LIMIT:  # one more try, then report what is left
            resident = self.storage.evict(self.paths).resident_fraction or 0.0
        return resident

    def resident(self) -> float:
        return self.storage.resident_fraction(self.paths)

    # -- fio
    def _fio_filenames(self) -> tuple[str, str]:
        """(cwd, filename=) for fio; a folder of short symlinks when the list is too long."""
        names = ":".join(p.replace(":", "\\:") for p in self.paths)
        if len(names) <= MAX_FILENAME_ARG:
            return str(self.root), names
        self._links = tempfile.TemporaryDirectory(prefix="fio-vs-fetch-")
        for i, path in enumerate(self.paths):
            os.symlink((self.root / path).resolve(), Path(self._links.name, str(i)))
        return self._links.name, ":".join(str(i) for i in range(len(self.paths)))

    def fio(self, qd: int, direct: bool = True, engine: str = "libaio") -> tuple:
        cwd, names = self.fio_files
        cmd = [
            "fio",
            "--name=fio_vs_fetch",
            "--rw=read",
            f"--direct={int(direct)}",
            f"--ioengine={engine}",
            f"--bs={self.part}",
            f"--iodepth={qd}",
            "--numjobs=1",
            "--file_service_type=sequential",
            f"--openfiles={min(len(self.paths), 256)}",
            f"--filename={names}",
            "--output-format=json",
        ]
        with Probe(self.dev) as probe:
            proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"fio failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        text = proc.stdout[proc.stdout.index("{") :]
        job = json.loads(text)["jobs"][0]
        if job.get("error"):
            raise SystemExit(f"fio job error {job['error']}: {proc.stderr.strip()[-2000:]}")
        read = job["read"]
        seconds = read["runtime"] / 1000  # ms, the I/O phase only
        # this process only waited meanwhile: take fio's own CPU over its I/O phase
        probe.proc_cpu_s = (job.get("usr_cpu", 0) + job.get("sys_cpu", 0)) / 100 * seconds
        probe.proc_sys_s = job.get("sys_cpu", 0) / 100 * seconds
        probe.proc_minflt = job.get("minf")
        extra = {
            "fio_runtime_ms": read["runtime"],
            "fio_total_ios": read["total_ios"],
            "fio_usr_cpu_pct": job.get("usr_cpu"),
            "fio_sys_cpu_pct": job.get("sys_cpu"),
            "fio_clat_mean_ms": read.get("clat_ns", {}).get("mean", 0) / 1e6,
            "command": " ".join(cmd[:-2] + ["--filename=<the files>", cmd[-1]]),
        }
        return read["io_bytes"], seconds, probe, extra

    # -- ckptprof's fetch, as `ckptprof synth restore` runs it
    def fetch(self, qd: int) -> tuple:
        with Probe(self.dev) as probe:
            t0 = time.perf_counter()
            bufs = fetch(
                self.storage,
                self.files,
                concurrency=qd,
                op=None,
                part_size=self.part,
                progress=False,
            )
            seconds = time.perf_counter() - t0
        self._verify_once("fetch", bufs)
        t0 = time.perf_counter()
        for b in bufs.values():
            b.close()
        return self.total, seconds, probe, {"close_s": time.perf_counter() - t0}

    def _verify_once(self, method: str, bufs: dict[str, HostBuffer]) -> None:
        """Check the fetched bytes against the manifest's xxh3 (once per method, untimed)."""
        if method in self.verified:
            return
        entries = json.loads((self.root / MANIFEST_NAME).read_text())["files"]
        ok = all(hash_full(bufs[p].view) == entries[p]["xxh3"] for p in self.paths)
        self.verified[method] = ok
        if not ok:
            raise SystemExit(f"{method}: fetched bytes do not match the manifest's xxh3")

    # -- the read path alone: read_into one reused, pre-faulted buffer
    def reuse(self, qd: int) -> tuple:
        scratch = self._scratch.get(qd)
        if scratch is None:
            scratch = self._scratch[qd] = HostBuffer(self.part * qd, "fio-vs-fetch-scratch")
            zeros = bytes(self.part)
            for slot in range(qd):  # fault it in before anything is timed
                scratch.view[slot * self.part : (slot + 1) * self.part] = zeros
        view = scratch.view

        def read(item) -> None:
            i, req = item
            slot = (i % qd) * self.part
            self.storage.read_into(req.path, req.offset, view[slot : slot + req.length])

        with Probe(self.dev) as probe:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=qd) as pool:
                list(pool.map(read, enumerate(self.reqs)))
            seconds = time.perf_counter() - t0
        return self.total, seconds, probe, {}

    # -- diagnostics: what ckptprof's fetch would do with a different memory / I/O path
    def prefault(self, qd: int) -> tuple:
        with Probe(self.dev) as probe:
            t0 = time.perf_counter()
            bufs = {f.path: HostBuffer(f.size, f.path) for f in self.files}
            for buf in bufs.values():  # every page faulted in before the reads (benchmark only)
                if buf.size:
                    buf._map.madvise(MADV_POPULATE_WRITE)
            t_alloc = time.perf_counter() - t0

            def read(req) -> None:
                view = bufs[req.path].view[req.offset : req.offset + req.length]
                self.storage.read_into(req.path, req.offset, view)

            with ThreadPoolExecutor(max_workers=qd) as pool:
                list(pool.map(read, self.reqs))
            seconds = time.perf_counter() - t0
        self._verify_once("prefault", bufs)
        for b in bufs.values():
            b.close()
        return self.total, seconds, probe, {"prefault_s": t_alloc}

    def populate(self, qd: int) -> tuple:
        with Probe(self.dev) as probe:
            t0 = time.perf_counter()
            bufs = {f.path: HostBuffer(f.size, f.path) for f in self.files}

            def read(req) -> None:
                buf = bufs[req.path]
                # fault the part's pages in with one call, then read into them; HostBuffer
                # has no public handle on its mapping, hence _map (benchmark only)
                buf._map.madvise(MADV_POPULATE_WRITE, req.offset, req.length)
                self.storage.read_into(
                    req.path, req.offset, buf.view[req.offset : req.offset + req.length]
                )

            with ThreadPoolExecutor(max_workers=qd) as pool:
                list(pool.map(read, self.reqs))
            seconds = time.perf_counter() - t0
        self._verify_once("populate", bufs)
        for b in bufs.values():
            b.close()
        return self.total, seconds, probe, {}

    def odirect(self, qd: int) -> tuple:
        with Probe(self.dev) as probe:
            t0 = time.perf_counter()
            bufs = {f.path: HostBuffer(f.size, f.path) for f in self.files}
            fds = {p: os.open(self.root / p, os.O_RDONLY | os.O_DIRECT) for p in self.paths}
            try:

                def read(req) -> None:
                    view = bufs[req.path].view[req.offset : req.offset + req.length]
                    fd, aligned = fds[req.path], req.length // DIO_ALIGN * DIO_ALIGN
                    done = 0
                    while done < aligned:  # DMA straight into the (page-aligned) buffer
                        n = os.preadv(fd, [view[done:aligned]], req.offset + done)
                        if n <= 0:
                            raise EOFError(f"{req.path}: short O_DIRECT read")
                        done += n
                    rest = req.length - aligned
                    if rest:  # the file's unaligned tail: an aligned bounce buffer
                        bounce = mmap.mmap(-1, -(-rest // DIO_ALIGN) * DIO_ALIGN)
                        try:
                            if os.preadv(fd, [bounce], req.offset + aligned) != rest:
                                raise EOFError(f"{req.path}: short O_DIRECT tail read")
                            view[aligned:] = bounce[:rest]
                        finally:
                            bounce.close()

                with ThreadPoolExecutor(max_workers=qd) as pool:
                    list(pool.map(read, self.reqs))
                seconds = time.perf_counter() - t0
            finally:
                for fd in fds.values():
                    os.close(fd)
        self._verify_once("odirect", bufs)
        for b in bufs.values():
            b.close()
        return self.total, seconds, probe, {}

    def close(self) -> None:
        for b in self._scratch.values():
            b.close()
        if self._links is not None:
            self._links.cleanup()

    def run(self, method: str, qd: int, repeat: int, position: int) -> Run:
        resident_before = self.cold()
        if method == "fio":
            nbytes, seconds, probe, extra = self.fio(qd)
        elif method == "fio-buf":
            nbytes, seconds, probe, extra = self.fio(qd, direct=False, engine="io_uring")
        else:
            nbytes, seconds, probe, extra = getattr(self, method)(qd)
        after = self.resident()
        return Run(
            method,
            qd,
            repeat,
            position,
            nbytes,
            seconds,
            resident_before,
            after,
            cold=resident_before <= COLD_LIMIT,
            wall_s=probe.wall,
            cpu_busy=probe.cpu_busy,
            cpu_iowait=probe.cpu_iowait,
            dev_bytes=probe.dev_bytes,
            dev_reads=probe.dev_reads,
            dev_read_ms=probe.dev_read_ms,
            proc_cpu_s=probe.proc_cpu_s,
            proc_sys_s=probe.proc_sys_s,
            proc_minflt=probe.proc_minflt,
            other_cores=probe.other_cores,
            extra=extra,
        )


# ---------------------------------------------------------------- report

LABELS = {
    "fio": "fio, O_DIRECT, libaio, one reused buffer (the reference)",
    "fetch": "ckptprof fetch(): buffered preadv into fresh HostBuffers (the product)",
    "reuse": "ckptprof storage.read_into into one reused, pre-faulted buffer (read path only)",
    "fio-buf": "fio, buffered, io_uring, one reused buffer (kernel buffered path, no Python)",
    "prefault": "fetch's buffers faulted in whole first, then read_into (diagnostic)",
    "populate": "fetch's buffers, each part madvise(MADV_POPULATE_WRITE)d by its thread "
    "right before read_into (diagnostic)",
    "odirect": "O_DIRECT preadv into fresh HostBuffers, same pool (diagnostic)",
}


def per_gb(value: float | None, run: Run) -> float | None:
    return value / (run.bytes / 1e9) if value is not None and run.bytes else None


def stats(values: list[float]) -> tuple[float, float, float]:
    return harness.median(values), min(values), max(values)


def med(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return harness.median(values) if values else None


def print_env(env: dict) -> None:
    q = env.get("queue", {})
    print("environment")
    print(f"  fio          {env['fio']}")
    print(
        f"  kernel       {env['os.kernel']}   python {env['version.python']}   ckptprof "
        f"{env['version.ckptprof']}"
    )
    print(
        f"  cpu          {env['cpu.count']} × {env['cpu.model']};  memory "
        f"{fmt_bytes(env['memory.total_bytes'])} ({fmt_bytes(env['memory.available_bytes'])} "
        f"available);  THP {env['thp']};  {env['memory_balloon']}"
    )
    if "background_before" in env:
        print(f"  load before  {describe_load(env['background_before'])}")
    print(
        f"  dir          {env['dir']}  on {env.get('storage.device', '?')} "
        f"({env.get('storage.mount_point', '?')}): {env.get('storage.fs_type', '?')} "
        f"{env.get('storage.mount_options', '?')}"
    )
    if q:
        print(
            f"  block queue  {env['block_device']}: read_ahead_kb={q['read_ahead_kb']} "
            f"max_sectors_kb={q['max_sectors_kb']} nr_requests={q['nr_requests']} "
            f"scheduler={q['scheduler']} rotational={q['rotational']}"
        )
    print(
        f"  files        {env['files']} files, {env['bytes']:,} bytes "
        f"({env['bytes'] / 1e9:.3f} GB; largest {fmt_bytes(env['largest_file'])}); "
        f"part/bs {size_text(env['part_size'])}"
    )


def summarize(runs: list[Run], qds: list[int], methods: list[str]) -> dict:
    out = {}
    for qd in qds:
        row = {}
        for m in methods:
            rs = [r for r in runs if r.qd == qd and r.method == m and r.repeat >= 0 and r.cold]
            if not rs:
                continue
            median, lo, hi = stats([r.gbps for r in rs])
            row[m] = {
                "gbps_median": median,
                "gbps_min": lo,
                "gbps_max": hi,
                "runs": len(rs),
                "bytes": rs[0].bytes,
                "cpu_busy": med([r.cpu_busy for r in rs]),
                "cpu_iowait": med([r.cpu_iowait for r in rs]),
                "other_cores": med([r.other_cores for r in rs]),
                "cpu_s_per_gb": med([per_gb(r.proc_cpu_s, r) for r in rs]),
                "sys_share": med(
                    [r.proc_sys_s / r.proc_cpu_s if r.proc_cpu_s else None for r in rs]
                ),
                "faults_per_mib": med(
                    [
                        r.proc_minflt * 2**20 / r.bytes if r.proc_minflt is not None else None
                        for r in rs
                    ]
                ),
                "resident_after_median": med([r.resident_after for r in rs]),
                "dev_inflight": med([r.dev_inflight for r in rs]),
                "dev_bytes": med([r.dev_bytes for r in rs]),
                "dev_req_kib": med(
                    [r.dev_bytes / r.dev_reads / 1024 if r.dev_reads else None for r in rs]
                ),
                "resident_before_max": max(r.resident_before for r in rs),
                "resident_after_max": max(
                    (r.resident_after for r in rs if r.resident_after is not None), default=None
                ),
            }
        fio = row.get("fio")
        for m, c in row.items():
            if fio and m != "fio":
                c["ratio"] = c["gbps_median"] / fio["gbps_median"]
                paired = [
                    a.gbps / b.gbps
                    for a in runs
                    for b in runs
                    if a.method == m
                    and b.method == "fio"
                    and a.qd == b.qd == qd
                    and a.repeat == b.repeat >= 0
                    and a.cold
                    and b.cold
                ]
                if paired:
                    lo_hi = stats(paired)
                    c["paired_ratio_median"], c["paired_ratio_min"], c["paired_ratio_max"] = lo_hi
        out[qd] = row
    return out


def cell(row: dict, m: str) -> str:
    c = row.get(m)
    if not c:
        return f"{'-':>18}"
    return f"{c['gbps_median']:5.2f} ({c['gbps_min']:.2f}-{c['gbps_max']:.2f})"


def print_tables(summary: dict, methods: list[str], total: int) -> None:
    others = [m for m in methods if m not in ("fio", "fetch")]
    head = f"{'qd':>3}  {'fio GB/s (min-max)':>18}  {'fetch GB/s (min-max)':>20}  ratio"
    for m in others:
        head += f"  {m + ' GB/s (min-max)':>20}  ratio"
    print(head)
    for qd, row in summary.items():
        ratio = row.get("fetch", {}).get("ratio")
        line = f"{qd:>3}  {cell(row, 'fio'):>18}  {cell(row, 'fetch'):>20}  "
        line += f"{ratio:5.2f}" if ratio is not None else "    -"
        for m in others:
            r = row.get(m, {}).get("ratio")
            line += f"  {cell(row, m):>20}  " + (f"{r:5.2f}" if r is not None else "    -")
        print(line)
    print(
        "  ratio = median GB/s of the method / median GB/s of fio at the same qd "
        f"(target for fetch: ≥ {TARGET:.2f})"
    )

    print(
        "\nwhere the time goes (medians per run). cpu: busy share of all cores; other: cores"
        " busy outside this script and its fio (other processes, kernel threads); CPU s/GB:"
        " the method's own CPU (fio: its I/O phase); faults: page faults per MiB read;"
        " cached after: page-cache residency of the files after the run; dev: the block"
        " device (reads in flight by Little's Law, mean request size)"
    )
    print(
        f"{'qd':>3}  {'method':<8} {'bytes read':>14} {'covers':>7} {'cpu':>5} {'other':>5} "
        f"{'CPU s/GB':>8} {'faults/MiB':>10} {'cached after':>12} {'dev in-flight':>13} "
        f"{'dev req':>9}  {'paired ratio (min-max)':>22}"
    )

    def num(value, spec: str, suffix: str = "") -> str:
        return "-" if value is None else format(value, spec) + suffix

    for qd, row in summary.items():
        for m in methods:
            c = row.get(m)
            if not c:
                continue
            pr = "-"
            if "paired_ratio_median" in c:
                pr = (
                    f"{c['paired_ratio_median']:.2f} ({c['paired_ratio_min']:.2f}-"
                    f"{c['paired_ratio_max']:.2f})"
                )
            print(
                f"{qd:>3}  {m:<8} {c['bytes']:>14,} {c['bytes'] / total:7.2%} "
                f"{num(c['cpu_busy'], '.0%'):>5} {num(c['other_cores'], '.2f'):>5} "
                f"{num(c['cpu_s_per_gb'], '.2f'):>8} {num(c['faults_per_mib'], '.0f'):>10} "
                f"{num(c['resident_after_median'], '.0%'):>12} "
                f"{num(c['dev_inflight'], '.1f'):>13} {num(c['dev_req_kib'], '.0f', ' KiB'):>9}"
                f"  {pr:>22}"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="fio sequential direct read vs ckptprof cold fetch on the same files.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument(
        "--dir",
        type=Path,
        default=Path("/tmp/bench-ckpt"),
        help="checkpoint directory; generated when it has no manifest",
    )
    ap.add_argument("--scale", type=float, default=0.1, help="synthetic checkpoint scale")
    ap.add_argument("--layout", default="torch", help="synthetic checkpoint layout")
    ap.add_argument("--model", default="llama2-7b", help="synthetic checkpoint model")
    ap.add_argument(
        "--qd",
        type=parse_qds,
        default=[1, 8, 16, 32],
        help="queue depths (fio iodepth = fetch concurrency)",
    )
    ap.add_argument(
        "--part-size",
        type=_size,
        default=16 << 20,
        help="request size: fio --bs and fetch part_size",
    )
    ap.add_argument("--repeat", type=int, default=3, help="timed repeats per method and qd")
    ap.add_argument(
        "--warmup", type=int, default=1, help="untimed rounds first (shown, not counted)"
    )
    ap.add_argument("--no-reuse", action="store_true", help="skip the reused-buffer column")
    ap.add_argument(
        "--diagnose",
        action="store_true",
        help="add diagnostic columns: fio buffered, prefault, populate, O_DIRECT",
    )
    ap.add_argument("--keep", action="store_true", help="keep a checkpoint this script made")
    ap.add_argument(
        "--force",
        action="store_true",
        help="allow generating into a non-empty dir without a manifest",
    )
    ap.add_argument("--json", type=Path, help="write every run and the summary here")
    args = ap.parse_args(argv)
    if args.repeat < 3:
        print("note: fewer than 3 repeats; medians mean little", file=sys.stderr)
    if args.part_size % DIO_ALIGN:
        ap.error(f"--part-size must be a multiple of {DIO_ALIGN} for direct I/O")

    root = args.dir.expanduser()
    harness.require_fio()  # fail early without fio
    generated, created_dir = not (root / MANIFEST_NAME).exists(), not root.exists()
    spec = {"optimizer": False}
    manifest = harness.checkpoint(root, args.model, args.layout, args.scale, force=args.force,
                                  **spec)  # fmt: skip
    files = sorted((ObjectInfo(p, e.size) for p, e in manifest.files.items()), key=lambda f: f.path)
    bench = None
    try:
        env = environment(root, files, args.part_size)
        total = env["bytes"]
        need = total * (2 if args.diagnose else 1) + args.part_size * max(args.qd) + (1 << 30)
        if env["memory.available_bytes"] and need > env["memory.available_bytes"]:
            raise SystemExit(
                f"fetch holds {fmt_bytes(total)} in memory; only "
                f"{fmt_bytes(env['memory.available_bytes'])} is available. Use a smaller --scale."
            )
        env["background_before"] = background_load()
        print_env(env)
        methods = ["fio", "fetch"] + ([] if args.no_reuse else ["reuse"])
        if args.diagnose:
            methods += ["fio-buf", "prefault", "populate", "odirect"]
        print("\nmethods (evicted and checked cold before every run; order rotates per repeat)")
        for m in methods:
            print(f"  {m:<8} {LABELS[m]}")
        print(
            f"\n{args.warmup} warm-up round(s) + {args.repeat} repeats × qd {args.qd} × "
            f"{len(methods)} methods = {(args.warmup + args.repeat) * len(args.qd) * len(methods)}"
            " runs\n",
            flush=True,
        )

        bench = Bench(root, files, args.part_size, env["block_device"])
        runs: list[Run] = []
        mem_probes: list[dict] = []
        t_start = time.perf_counter()
        for rep in range(-args.warmup, args.repeat):
            shift = rep % len(methods)
            order = methods[shift:] + methods[:shift]
            for qd in args.qd:
                parts = []
                for pos, m in enumerate(order):
                    r = bench.run(m, qd, rep, pos)
                    runs.append(r)
                    flag = "" if r.cold else f" NOT COLD ({r.resident_before:.1%} resident)"
                    if r.other_cores is not None and r.other_cores > BUSY_OTHER:
                        flag += f" (other {r.other_cores:.1f} cores)"
                    parts.append(f"{m} {r.gbps:.2f}{flag}")
                mem = fresh_memory_gbps()
                mem_probes.append({"repeat": rep, "qd": qd, "gbps": mem})
                tag = "warm-up" if rep < 0 else f"repeat {rep + 1}"
                print(
                    f"  {tag:<9} qd {qd:>3}: "
                    + ", ".join(parts)
                    + f" GB/s  [fresh memory {mem:.2f}]",
                    flush=True,
                )
        elapsed = time.perf_counter() - t_start
        not_cold = [r for r in runs if not r.cold and r.repeat >= 0]
        print(
            f"\n{len(runs)} runs in {elapsed:.0f} s; cold before every run: "
            + ("yes" if not not_cold else f"NO for {len(not_cold)} runs (left out)")
            + f"; max residency after evict {max(r.resident_before for r in runs):.2%}"
            + "; bytes verified against the manifest's xxh3: "
            + ", ".join(f"{k} {'ok' if v else 'MISMATCH'}" for k, v in bench.verified.items())
        )
        timed = [r for r in runs if r.repeat >= 0]
        mem_rates = [p["gbps"] for p in mem_probes if p["repeat"] >= 0] or [0.0]
        mem_med, mem_lo, mem_hi = stats(mem_rates)
        print(
            f"fresh memory (one thread writing {FRESH_PROBE >> 20} MiB of new memory, after each qd"
            f" group): {mem_med:.2f} GB/s median ({mem_lo:.2f}-{mem_hi:.2f})"
        )
        busy = [r for r in timed if r.other_cores is not None and r.other_cores > BUSY_OTHER]
        env["background_after"] = background_load()
        print(
            f"other load: {len(busy)} of {len(timed)} timed runs had > {BUSY_OTHER} cores busy"
            f" outside the benchmark; after the runs: {describe_load(env['background_after'])}"
            + (
                "\n  (fetch needs CPU, fio hardly any: other load hurts fetch, not fio)"
                if busy
                else ""
            )
            + "\n"
        )

        summary = summarize(runs, args.qd, methods)
        print_tables(summary, methods, total)
        fio_after = max(
            (r.resident_after for r in runs if r.method == "fio" and r.resident_after is not None),
            default=0.0,
        )
        fio_cov = min((r.bytes for r in runs if r.method == "fio"), default=0) / total
        print(
            f"\nfio read {fio_cov:.2%} of the bytes (only whole --bs blocks: it skips each file's"
            f" tail shorter than the part size); its page-cache residency after a run stayed "
            f"≤ {fio_after:.2%} (direct I/O)."
        )

        met = [qd for qd in args.qd if summary[qd].get("fetch", {}).get("ratio", 0) >= TARGET]
        missed = [qd for qd in args.qd if qd not in met]
        best = max(args.qd, key=lambda qd: summary[qd].get("fetch", {}).get("ratio", 0))
        best_ratio = summary[best].get("fetch", {}).get("ratio", 0)
        verdict = "target met" if not missed else "below target"
        print(
            f"summary: fetch/fio ≥ {TARGET} at qd {met or 'none'}; below at qd {missed or 'none'}"
            f"; best {best_ratio:.2f}× at qd {best} "
            f"({summary[best]['fetch']['gbps_median']:.2f} vs "
            f"{summary[best]['fio']['gbps_median']:.2f} GB/s) — {verdict}"
        )
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "target": TARGET,
                        "args": {
                            k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                        },
                        "environment": env,
                        "methods": {m: LABELS[m] for m in methods},
                        "summary": {str(k): v for k, v in summary.items()},
                        "runs": [r.to_dict() for r in runs],
                        "fresh_memory_probes": mem_probes,
                    },
                    indent=2,
                )
            )
            print(f"raw numbers: {args.json}")
    finally:
        if bench is not None:
            bench.close()
        if generated and not args.keep:
            remove_generated(root, files, created_dir)
            print(f"removed the generated checkpoint in {root} (--keep keeps it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
