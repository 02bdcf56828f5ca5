"""The ceilings of the read and write paths, estimated before measuring (docs/design.md §9).

Best read bandwidth: a short cold read of the checkpoint's largest files at a high
queue depth. Per-request latency: a few cold single requests. Little's Law then
says how many requests must be in flight to reach that bandwidth:
in-flight = throughput × latency. Best write bandwidth (:func:`probe_write`): a short
sequential write of random bytes through the I/O core at the save's concurrency,
forced to the device, into a scratch file of ckptprof's that is removed after.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

from ckptprof.io.buffers import HostBuffer
from ckptprof.io.requests import whole_files
from ckptprof.storage.base import ObjectInfo, Storage
from ckptprof.threads import thread_pool
from ckptprof.units import fmt_bytes

PROBE_BYTES = 512 << 20
#: below this a probe's bandwidth is mostly start-up cost: said beside the figure
STEADY_PROBE_BYTES = 64 << 20
#: the most of a file that may stay cached for a read to count as cold (the sweep's too)
COLD_RESIDENCY_LIMIT = 0.05
LATENCY_SAMPLES = 5
PROBE_PASSES = 2


@dataclass
class Ceiling:
    read_gbps: float
    source: str
    #: the size of the requests the figures are for: the probe's own (never more than
    #: its files hold), or --part-size for a given ceiling
    part_size: int
    bytes: int
    request_latency_s: float | None = None
    probe_concurrency: int | None = None

    @property
    def littles_law_inflight(self) -> float | None:
        if self.request_latency_s is None:
            return None
        return self.read_gbps * 1e9 / self.part_size * self.request_latency_s

    @property
    def lower_bound_fetch_s(self) -> float:
        return self.bytes / (self.read_gbps * 1e9)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["littles_law_inflight"] = self.littles_law_inflight
        out["lower_bound_fetch_s"] = self.lower_bound_fetch_s
        return out

    def describe(self) -> str:
        text = (
            f"ceiling {self.read_gbps:.2f} GB/s ({self.source}); lower bound for fetching "
            f"{fmt_bytes(self.bytes)}: {self.lower_bound_fetch_s:.3f} s"
        )
        if self.littles_law_inflight is not None:
            text += (
                f"; one {fmt_bytes(self.part_size)} request takes "
                f"{self.request_latency_s * 1e3:.1f} ms, so Little's Law needs "
                f"≈{self.littles_law_inflight:.1f} requests in flight"
            )
        return text


WRITE_PROBE_NAME = ".ckptprof-write-probe"


@dataclass
class WriteCeiling:
    write_gbps: float
    source: str
    bytes: int

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return f"write ceiling {self.write_gbps:.2f} GB/s ({self.source})"


def probe_write_bytes(nbytes: int, part_size: int, object_store: bool) -> int:
    """The size of the write probe's file for a save of ``nbytes``: at most
    ``PROBE_BYTES``; on an object store a multipart upload, as the save's: two parts or more."""
    nbytes = max(1, min(nbytes, PROBE_BYTES))
    return max(nbytes, 2 * part_size) if object_store else nbytes


#: a probe moves at most this share of the bytes the run itself moves (and PROBE_BYTES)
PROBE_SHARE = 0.25


def probe_budget(run_bytes: int) -> int:
    """The bytes a probe may move in all: a fixed share of what the run itself moves,
    never more than ``PROBE_BYTES``: the probe must cost little beside the measurement."""
    return max(1, min(PROBE_BYTES, int(run_bytes * PROBE_SHARE)))


def write_plan(
    budget: int, nbytes: int, part_size: int, concurrency: int, object_store: bool
) -> tuple[list[int], int, int]:
    """(levels in flight, passes at each, bytes per write) for a write probe of at most
    ``budget`` bytes in all: one at a time and ``concurrency`` at a time, the best of
    ``PROBE_PASSES``; fewer writes where the budget cannot pay for them (the level of one
    first, then the second pass). A write is never smaller than a multipart upload's two
    parts on an object store, so the smallest probe is that one write."""
    smallest = 2 * part_size if object_store else 1
    levels = sorted({1, concurrency})
    choices = [(levels, PROBE_PASSES), ([concurrency], PROBE_PASSES), ([concurrency], 1)]
    for chosen, passes in choices:
        each = min(nbytes, budget // (len(chosen) * passes))
        if each >= smallest:
            return chosen, passes, each
    return [concurrency], 1, max(smallest, min(nbytes, budget))


def probe_write(
    storage: Storage,
    nbytes: int,
    part_size: int,
    concurrency: int,
    fsync: bool = True,
    budget: int = PROBE_BYTES,
    echo=None,
) -> WriteCeiling:
    """Write random bytes as one file in part-size requests, one at a time and
    ``concurrency`` at a time (a local file system is often fastest with one writer, a
    network store with many), then fsync (on a file system); the best at each. The writes
    together move at most ``budget`` bytes (:func:`write_plan`), each at most ``nbytes``
    (the checkpoint's). ``echo`` gets a line before it starts: a probe never leaves the
    terminal blank. The file never becomes visible (it is aborted, not committed)."""
    from ckptprof.io.writes import cut_parts, write_parts
    from ckptprof.synth.fill import RandomFiller

    levels, passes, nbytes = write_plan(
        budget, max(1, min(nbytes, PROBE_BYTES)), part_size, concurrency, storage.object_store
    )
    writes = len(levels) * passes
    if echo is not None:
        echo(
            f"probing the write ceiling: {writes} write{'s' if writes > 1 else ''} of "
            f"{fmt_bytes(nbytes)} ({fmt_bytes(nbytes * writes)} in all, at most "
            f"{PROBE_SHARE:.0%} of the run's bytes or {fmt_bytes(PROBE_BYTES)}; --ceiling-gbps "
            "skips it)"
        )
    filler = RandomFiller(0)
    chunks = [bytes(filler.next_chunk()) for _ in range(4)]  # distinct: no dedup shortcut
    size = len(chunks[0])
    segments = [chunks[i % 4] for i in range(nbytes // size)] + [chunks[0][: nbytes % size]]
    parts = cut_parts(segments, part_size)
    best: dict[int, float] = {}
    for level in levels:
        for _ in range(passes):
            writer = storage.open_writer(WRITE_PROBE_NAME, nbytes, part_size)
            try:
                t0 = time.perf_counter()
                write_parts(writer, parts, level)
                if fsync:
                    writer.sync()
                seconds = time.perf_counter() - t0
            finally:
                writer.abort()
            best[level] = min(best.get(level, float("inf")), seconds)
    level, seconds = min(best.items(), key=lambda kv: kv[1])
    synced = " with fsync" if fsync and not storage.object_store else ""
    source = (
        f"probe: best of {passes} write{'s' if passes > 1 else ''} of {fmt_bytes(nbytes)}"
        f"{synced} at {' and '.join(map(str, sorted(best)))} in flight (best at {level})"
    )
    if nbytes < STEADY_PROBE_BYTES:
        source += ", too few bytes for a steady figure"
    return WriteCeiling(nbytes / seconds / 1e9 if seconds > 0 else 0.0, source, nbytes)


def probe(
    storage: Storage,
    files: list[ObjectInfo],
    part_size: int,
    concurrency: int,
    budget: int = PROBE_BYTES,
) -> Ceiling:
    """Measure cold bandwidth at ``concurrency`` and cold single-request latency.

    Reads the largest files first, at most ``budget`` bytes a pass (many small files are
    read as many requests, not cut short at a request count), so the figure is for as
    many bytes as the checkpoint and the budget give, and says so when that is too few
    to be steady.
    """
    reqs, total = [], 0
    largest_first = {f.path: f.size for f in sorted(files, key=lambda i: -i.size)}
    for req in whole_files(largest_first, max(1, min(part_size, budget))):
        if total + req.length > budget:  # a pass never reads more than its budget
            break
        if req.length:
            reqs.append(req)
            total += req.length
    if not reqs:
        return Ceiling(0.0, "probe: the checkpoint holds no bytes to read", part_size, 0)
    paths = sorted({r.path for r in reqs})
    largest = max(r.length for r in reqs)
    scratch = HostBuffer(largest * max(1, concurrency))
    try:
        storage.evict(paths)
        latencies = []
        for req in reqs[:LATENCY_SAMPLES]:
            t0 = time.perf_counter()
            storage.read_into(req.path, req.offset, scratch.view[: req.length])
            latencies.append(time.perf_counter() - t0)

        def read(i_req):
            i, req = i_req
            slot = (i % max(1, concurrency)) * largest
            storage.read_into(req.path, req.offset, scratch.view[slot : slot + req.length])

        seconds = float("inf")
        resident = 0.0  # the most of the files still cached as a pass began
        for _ in range(PROBE_PASSES):  # best of a few passes: the ceiling is the best case
            state = storage.evict(paths)
            resident = max(resident, state.resident_fraction or 0.0)
            t0 = time.perf_counter()
            with thread_pool(concurrency, "probe reads") as pool:
                list(pool.map(read, enumerate(reqs)))
            seconds = min(seconds, time.perf_counter() - t0)
        storage.evict(paths)
    finally:
        scratch.close()
    nbytes = sum(r.length for r in reqs)
    # cold only where checked: pages another process holds cannot be evicted from here
    reads = (
        "cold reads"
        if resident <= COLD_RESIDENCY_LIMIT
        else (
            f"reads with up to {resident:.0%} still in the page cache (not cold: the pages "
            "could not be evicted; the figure is the cache's, above the storage's)"
        )
    )
    source = (
        f"probe: best of {PROBE_PASSES} {reads} of {fmt_bytes(nbytes)} at {concurrency} in flight"
    )
    if nbytes < STEADY_PROBE_BYTES:
        whole = ", the whole checkpoint" if nbytes >= sum(f.size for f in files) else ""
        source += f"{whole}: too few bytes for a steady figure"
    sampled = [r.length for r in reqs[:LATENCY_SAMPLES]]
    return Ceiling(
        read_gbps=nbytes / seconds / 1e9 if seconds > 0 else 0.0,
        source=source,
        part_size=int(statistics.median(sampled)),  # what one request really was
        bytes=sum(f.size for f in files),
        request_latency_s=statistics.median(latencies) if latencies else None,
        probe_concurrency=concurrency,
    )
