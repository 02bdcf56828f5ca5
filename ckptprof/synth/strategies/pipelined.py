"""``pipelined`` (the default): read each file's own index (zip directory and pickle,
safetensors header), then only the byte ranges the target rank needs, in the requests
the storage's policy plans (:mod:`ckptprof.io.requests`), ``concurrency`` in flight
inside a memory budget (:class:`~ckptprof.io.window.Window`); each request is verified
and copied into the state as soon as it lands while the next are on the wire. Peak
memory is the state plus the budget, whatever the checkpoint's size."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, wait
from contextlib import closing
from dataclasses import replace
from pathlib import Path

from ckptprof.errors import CkptprofError
from ckptprof.io.buffers import BufferPool, HostBuffer
from ckptprof.io.requests import RequestPolicy, RequestSummary
from ckptprof.io.sparse import INDEX_BLOCK, SparseFile
from ckptprof.io.window import POOLED, FileClocks, Window
from ckptprof.manifest import StreamingDigest
from ckptprof.phases import Attr, Phase
from ckptprof.synth.device import PinnedBuffer
from ckptprof.synth.readplan import (
    Read,
    Source,
    check_covered,
    plan_copies,
    plan_reads,
    split_held,
)
from ckptprof.synth.strategies.base import (
    ANY,
    RunContext,
    Strategy,
    copy_into,
    finish_digests,
)
from ckptprof.synth.strategies.registry import dcp_handler
from ckptprof.threads import thread_pool
from ckptprof.tracing.summary import uncovered

OBJECT_STORE_INDEX_BLOCK = 1 << 20


class Pipelined(Strategy):
    name = "pipelined"
    bounded_by_budget = True

    def handlers(self):
        return {ANY: self.restore, "dcp": dcp_handler("restore_pipelined")}

    def memory_held(self, read_bytes: int, memory_budget: int) -> int:
        return memory_budget

    def restore(self, ctx: RunContext) -> None:
        clocks = FileClocks()
        indexed = sparse_files(ctx)
        try:
            maps = FileMaps(ctx)
            try:
                _Ranges(ctx, indexed, maps, clocks).run(index_files(ctx, clocks, indexed))
            finally:
                maps.close()
        finally:
            for sparse in indexed.values():
                sparse.close()


class _Ranges:
    """The rank's byte ranges read, verified and placed, a window per batch of files as
    its files' indexes are read (the files without tensors with the first), so the reads
    of the files indexed first run while the others are still being indexed (on S3 a
    large archive's index takes seconds of requests)."""

    def __init__(self, ctx: RunContext, indexed: dict, maps: FileMaps, clocks) -> None:
        self.ctx, self.indexed, self.maps, self.clocks = ctx, indexed, maps, clocks
        self.on_host = ctx.state.on_host  # reads land in host memory only
        self.summary = RequestSummary()
        self.covered: dict[int, int] = {}
        self.digests = (
            {f.path: StreamingDigest(ctx.size(f.path), ctx.verify) for f in ctx.files}
            if ctx.verify in ("full", "sample")
            else {}
        )
        self.copier = DeviceCopier(ctx) if not self.on_host else None
        # one pool of window buffers for every batch's window (made as the first needs
        # them, then reused); a device state's pinned ones are the runner's, made before
        self.pool = BufferPool(HostBuffer) if self.on_host else ctx.buffers
        self.placed = 0  # bytes the reads put straight into the state
        self.window_bytes = self.in_flight = 0

    def run(self, batches) -> None:
        ctx = self.ctx
        try:
            small = [f.path for f in ctx.files if not f.pieces]  # read with the first batch
            with closing(batches):  # on a failure, the indexing ends before its files close
                for paths, sources in batches:
                    self.batch([*small, *paths], sources)
                    small = []
            if small:  # no file had tensors
                self.batch(small, [])
            check_covered(ctx.state.targets, self.covered)
            if self.copier is not None:
                self.copier.finish()  # reshard ends when the last copy has landed on the device
        finally:  # the plan's shape on the fetch span, of the batches planned, also on failure
            ctx.op.set_phase_attributes(Phase.FETCH, **self.summary.attributes())
            self.clocks.record(ctx.op)
            if self.on_host:
                self.pool.close()
        ctx.op.set_attributes({
            Attr.MEMORY_WINDOW_BYTES: self.window_bytes,
            # what the copies came from: pinned buffers, unless a file was mapped (pageable)
            Attr.MEMORY_WINDOW_PINNED: not self.on_host and not self.maps.maps,
        })  # fmt: skip
        ctx.op.set_phase_attributes(Phase.FETCH, **{Attr.CONCURRENCY: self.in_flight})
        if self.placed:  # the reshard these reads did: bytes landed where the state needs them
            ctx.op.set_phase_attributes(
                Phase.RESHARD, **{Attr.RESHARD_PLACED_BY_READS_BYTES: self.placed}
            )
        finish_digests(ctx, self.digests)

    def batch(self, paths: list[str], sources: list[Source]) -> None:
        """One window over ``paths``: the copies their ``sources`` give, whole files where
        a file has no tensors or a full hash needs every byte."""
        ctx = self.ctx
        copies = plan_copies(ctx.state.targets, sources, self.covered)
        pieces = {f.path for f in ctx.files if f.pieces}
        whole = {p: ctx.size(p) for p in paths if ctx.verify == "full" or p not in pieces}
        held = {p: self.indexed[p].held() for p in paths if p in self.indexed}
        direct = {p for p in paths if p not in self.maps.maps} if self.on_host else set()
        reads = plan_reads(copies, ctx.policy(), whole, have=held, direct=direct,
                           summary=self.summary)  # fmt: skip
        if ctx.verify == "sample":
            reads += sample_reads(ctx, held, reads, paths)
        if not reads:
            return
        # for a device state, page-locked buffers, made before the run (the runner's pool):
        # the copy out of them is a DMA
        window = Window(
            ctx.storage, ctx.op, ctx.concurrency, budget=ctx.memory_budget,
            digests=self.digests, progress=ctx.progress, desc="restore", clocks=self.clocks,
            buffer_type=HostBuffer if self.on_host else PinnedBuffer, pool=self.pool,
        )  # fmt: skip
        window.run(reads, into=self.into, read=self.read, land=self.land, release=self.release)
        self.window_bytes = max(self.window_bytes, window.window_bytes)
        self.in_flight = max(self.in_flight, window.in_flight)

    def mapped(self, read: Read) -> bool:
        return read.path in self.maps.maps and not read.resident

    def into(self, read: Read):
        if self.mapped(read):  # into the page cache, no copy: copied from the mapping
            return None
        if read.into:  # straight into the state: no buffer, no copy after
            state = self.ctx.state
            views = [state.memory(c.target, c.target_offset, c.length) for c in read.into]
            return views[0] if len(views) == 1 else views  # several: one scattered request
        return POOLED

    def read(self, read: Read, view: memoryview | None) -> memoryview:
        if read.resident:  # in memory from the index
            return self.indexed[read.path].view[read.offset : read.end]
        if self.mapped(read):
            self.maps.warm(read)
            return self.maps.view(read)
        if isinstance(view, list):
            self.ctx.storage.read_into_views(read.path, read.offset, view)
        else:
            self.ctx.storage.read_into(read.path, read.offset, view)
        return view

    def land(self, read: Read, view: memoryview):
        if read.into:
            self.placed += read.length
        if read.copies and read.length:
            if self.copier is not None:  # queued on a copy stream: the fence frees the buffer
                return self.copier.copy(read, view)
            _copy(self.ctx, read, view)
        return None

    def release(self, read: Read) -> None:
        if self.mapped(read):
            self.maps.drop(read)


def _copy(ctx: RunContext, read: Read, view: memoryview) -> None:
    import torch

    source = torch.frombuffer(view, dtype=torch.uint8)
    with ctx.op.phase(Phase.RESHARD):
        moved = copy_into(
            ctx.state,
            [replace(c, offset=c.offset - read.offset) for c in read.copies],
            {read.path: source},
        )
    ctx.op.add_bytes(Phase.RESHARD, moved)


class DeviceCopier:
    """Host→device copies out of the pinned window, asynchronous on a stream of their
    own, so the link works while the next reads land: each copy's event is the fence the
    window waits on before it reuses the buffer; :meth:`finish` waits for the last copy
    inside ``reshard``."""

    def __init__(self, ctx: RunContext) -> None:
        import torch

        self.ctx = ctx
        self.device = ctx.state.tensors[0].device
        self.stream = torch.cuda.Stream(self.device)

    def copy(self, read: Read, view: memoryview):
        import torch

        source = torch.frombuffer(view, dtype=torch.uint8)
        with self.ctx.op.phase(Phase.RESHARD), torch.cuda.stream(self.stream):
            moved = copy_into(
                self.ctx.state,
                [replace(c, offset=c.offset - read.offset) for c in read.copies],
                {read.path: source},
                non_blocking=True,
            )
            done = torch.cuda.Event()
            done.record(self.stream)
        self.ctx.op.add_bytes(Phase.RESHARD, moved)
        return done

    def finish(self) -> None:
        with self.ctx.op.phase(Phase.RESHARD):
            self.stream.synchronize()


class FileMaps:
    """Large files of a POSIX checkpoint, mapped (not read) for the pipeline.

    Through the page cache the cheapest way to get bytes into the state is to have the
    kernel read them into the cache with no copy (``sendfile`` to ``/dev/null``: the
    fetch) and copy them from a mapping of the file (the reshard; a plain memory copy,
    faster than the kernel's copy into user buffers on most machines). A range's pages
    leave this process's resident set once it is copied (they stay in the page cache).
    Small files and object stores go through reads into the state instead, and so does
    every file when the state is on a device: its copies must come from pinned memory to
    be DMA at the link's speed (a mapping is pageable: about half of it).
    """

    MIN_BYTES = 64 << 20

    def __init__(self, ctx: RunContext) -> None:
        import mmap

        self.fds: dict[str, int] = {}
        self.maps: dict[str, mmap.mmap] = {}
        local = ctx.storage.mappable
        if not local or not ctx.state.on_host:  # a device's copies come from pinned buffers
            return
        for file in ctx.files:
            size = ctx.size(file.path)
            if size >= self.MIN_BYTES:
                fd = os.open(Path(ctx.storage.uri) / file.path, os.O_RDONLY)
                self.fds[file.path] = fd
                # private and writable only so that tensors can view it (never written)
                prot = mmap.PROT_READ | mmap.PROT_WRITE
                self.maps[file.path] = mmap.mmap(fd, size, mmap.MAP_PRIVATE, prot)

    def warm(self, read: Read) -> None:
        from ckptprof.storage.pagecache import warm_range

        warm_range(self.fds[read.path], read.offset, read.length)

    def view(self, read: Read) -> memoryview:
        return memoryview(self.maps[read.path])[read.offset : read.offset + read.length]

    def drop(self, read: Read) -> None:
        """The range's pages out of this process's resident set (not out of the cache)."""
        import mmap

        page = mmap.PAGESIZE
        start = read.offset // page * page
        end = min(len(self.maps[read.path]), -(-(read.offset + read.length) // page) * page)
        if end > start:
            self.maps[read.path].madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> None:
        import contextlib

        for m in self.maps.values():
            with contextlib.suppress(BufferError):
                m.close()
        for fd in self.fds.values():
            os.close(fd)
        self.maps.clear()
        self.fds.clear()


def sparse_files(ctx: RunContext) -> dict[str, SparseFile]:
    """A sparse file for each data file's index (nothing fetched yet; the caller closes
    them)."""
    # on an object store a request costs a round trip: the first read of an index brings
    # a larger block (the header and what follows it, which the restore reads anyway)
    block = INDEX_BLOCK if ctx.policy().cheap_requests else OBJECT_STORE_INDEX_BLOCK
    return {
        f.path: SparseFile(ctx.storage, f.path, ctx.size(f.path), block)
        for f in ctx.files
        if f.pieces
    }


def index_files(
    ctx: RunContext, clocks: FileClocks, indexed: dict[str, SparseFile]
) -> Iterator[tuple[list[str], list[Source]]]:
    """Each data file's own index: read from storage on demand (fetch) and parsed by the
    codec's loader (deserialize), ``concurrency`` files at a time; yields the files whose
    indexes are read, with their sources, as they finish (the bytes the sparse files hold
    are not read again)."""
    op = ctx.op
    policy = ctx.policy()
    data = [f for f in ctx.files if f.pieces]
    order = {f.path: n for n, f in enumerate(data)}

    def one(file) -> list[Source]:
        sparse = indexed[file.path]
        start = time.time_ns()
        try:
            return file_sources(ctx.layout, ctx.plan, file, sparse, policy, ctx.concurrency)
        except CkptprofError:
            raise
        except Exception as exc:  # noqa: BLE001 - an unreadable index is a corrupt file
            from ckptprof.errors import unreadable

            raise unreadable(ctx.where(file.path), exc) from None
        finally:
            for interval in sparse.read_intervals:
                op.add_interval(Phase.FETCH, *interval)
            for gap in uncovered(start, time.time_ns(), sparse.read_intervals):
                op.add_interval(Phase.DESERIALIZE, *gap)
            if sparse.read_intervals:
                first = min(s for s, _ in sparse.read_intervals)
                last = max(e for _, e in sparse.read_intervals)
                clocks.note(file.path, first, last, sparse.fetched_bytes)

    op.set_phase_attributes(Phase.DESERIALIZE, **{Attr.DESERIALIZE_WHAT: "each file's index"})
    with (  # reads on demand: fetch is under way while the indexes are read
        op.running(Phase.FETCH),
        thread_pool(min(ctx.concurrency, len(data)), "index reads") as pool,
    ):
        pending = {pool.submit(one, f): f for f in data}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                found = {pending.pop(d).path: d.result() for d in done}
                paths = sorted(found, key=order.__getitem__)
                yield paths, [s for path in paths for s in found[path]]
        finally:
            for future in pending:
                future.cancel()


def file_sources(
    layout,
    plan,
    file,
    sparse: SparseFile,
    policy: RequestPolicy,
    concurrency: int = 8,
):
    """The file's tensor regions as :class:`Source` s, from its codec's loader run
    over the sparse bytes (it reads the index; the tensors it returns are views)."""
    from ckptprof.synth.codecs import get_codec

    codec = get_codec(layout.codec(file))
    hints = codec.index_hints(sparse)
    if hints:
        sparse.prefetch(hints, policy, concurrency)
    tensors = layout.pieces(plan, file, codec.read(sparse))
    base = sparse.base_address
    return layout.sources(plan, file, {p: t.data_ptr() - base for p, t in tensors.items()})


def sample_reads(ctx: RunContext, held: dict, planned: list[Read], paths: list[str]) -> list[Read]:
    """What ``--verify sample`` hashes (8 × 1 MiB per file) that the ``planned`` reads do
    not bring: extra reads (resident where the index read them already). Planned reads
    feed the hash as they land, so no byte is read twice for it."""
    from ckptprof.manifest import sample_ranges

    covered: dict[str, list[tuple[int, int]]] = {}
    for r in planned:
        covered.setdefault(r.path, []).append((r.offset, r.offset + r.length))
    out = []
    for path in paths:
        for offset, length in sample_ranges(ctx.size(path)):
            for lo, hi, already in split_held(offset, offset + length, covered.get(path, [])):
                if already:
                    continue
                for a, b, resident in split_held(lo, hi, held.get(path, [])):
                    out.append(Read(path, a, b - a, resident=resident))
    return out


__all__ = ["FileMaps", "Pipelined", "index_files"]
