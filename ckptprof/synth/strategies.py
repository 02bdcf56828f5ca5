"""Restore strategies: how a checkpoint's bytes become the restored state.

* ``staged`` — every file this restore reads into memory (or ``--stage DIR`` first),
  then verify everything, deserialize everything, copy into the state: what
  ``s5cmd cp`` + ``torch.load`` does, the seed guide's method.
* ``pipelined`` — read each file's own index (zip directory and pickle, safetensors
  header), then only the byte ranges the target rank needs, ``concurrency`` reads in
  flight inside a memory budget; each range is verified and copied into the state as
  soon as it arrives while the next reads are on the wire. Peak memory is the state
  plus the budget, whatever the checkpoint's size.
* ``framework`` — the layout's own loader reading straight from the storage path
  (``torch.load(path, mmap=True)``, ``safe_open``, ``dcp.load`` with its
  ``FileSystemReader``); fetch (into the page cache) and deserialize are told apart as
  the framework callbacks do. POSIX paths only.

Every strategy fills the same :class:`~ckptprof.synth.targets.TargetState`, so their
results can be compared byte for byte, and records the same six phases. Layouts whose
framework brings its own loader (DCP) provide ``<strategy>_restore`` methods instead of
the generic paths here.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ckptprof.errors import CkptprofError
from ckptprof.fetch import HostBuffer, fetch
from ckptprof.manifest import StreamingDigest, check_digest, verify_buffers
from ckptprof.phases import Attr, Phase
from ckptprof.progress import bar as progress_bar
from ckptprof.storage.base import ObjectInfo
from ckptprof.synth.device import PinnedBuffer, synchronize
from ckptprof.synth.index import SparseFile, file_sources
from ckptprof.synth.ranges import OPTIONAL_STRATEGIES, STRATEGIES
from ckptprof.synth.readplan import Read, Source, plan_copies, plan_reads, read_bytes, split_held
from ckptprof.tracing.recorder import uncovered

if TYPE_CHECKING:
    import torch

    from ckptprof.manifest import Manifest
    from ckptprof.storage.base import Storage
    from ckptprof.synth.layouts.base import Layout
    from ckptprof.synth.plan import CheckpointPlan, FilePlan, Piece
    from ckptprof.synth.targets import TargetState
    from ckptprof.tracing.recorder import Operation


@dataclass
class RunContext:
    """What one restore run works with."""

    storage: Storage
    layout: Layout
    plan: CheckpointPlan
    manifest: Manifest
    state: TargetState
    files: list[FilePlan]  # what this restore reads: the rank's data files and small files
    op: Operation
    concurrency: int
    part_size: int
    memory_budget: int
    verify: str
    progress: bool | None = None
    threads: int = 1
    stage_dir: Path | None = None

    def where(self, path: str) -> str:
        return f"{self.storage.uri}/{path}"

    def infos(self) -> list[ObjectInfo]:
        return [ObjectInfo(f.path, self.manifest.files[f.path].size) for f in self.files]


def needed_files(plan: CheckpointPlan, targets) -> list[FilePlan]:
    """The files a restore of ``targets`` reads: data files holding rows any target
    needs (from the plan: what each file holds is known before reading it), and every
    small file (config, RNG and trainer state: a resume reads them all)."""
    wanted: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for t in targets:
        wanted.setdefault(t.key, []).append((t.row_start, t.row_end))
    out = []
    for file in plan.files:
        if not file.pieces or any(_holds(p, wanted) for p in file.pieces):
            out.append(file)
    return out


def _holds(piece: Piece, wanted) -> bool:
    if piece.name.startswith("__flat"):  # a ZeRO flat partition: any tensor may be in it
        return any(group == piece.group for group, _ in wanted)
    spans = wanted.get((piece.group, piece.name), ())
    return any(lo < piece.row_end and piece.row_start < hi for lo, hi in spans)


def get_strategy(name: str) -> Strategy:
    if name == "runai":  # optional loaders: imported only when asked for
        from ckptprof.synth.runai import RunAI

        return RunAI()
    if name == "s3torchconnector":
        from ckptprof.synth.s3torchconnector import S3TorchConnector

        return S3TorchConnector()
    if name not in _BY_NAME:
        raise CkptprofError(
            f"--strategy {name!r} is not known; choose from "
            f"{', '.join(STRATEGIES + OPTIONAL_STRATEGIES)}."
        )
    return _BY_NAME[name]


class Strategy:
    """One way of restoring; a layout may bring its own (``<name>_restore(ctx)``)."""

    name: str

    def run(self, ctx: RunContext) -> None:
        own = getattr(ctx.layout, f"{self.name}_restore", None)
        (own or self.generic)(ctx)
        if not ctx.state.on_host:  # the device copies end when they have landed
            with ctx.op.phase(Phase.RESHARD):
                synchronize(ctx.state.tensors[0].device)
        ctx.op.set_attributes({Attr.STRATEGY: self.name})

    def generic(self, ctx: RunContext) -> None:
        raise NotImplementedError

    def check(self, storage: Storage) -> None:
        """Refuse up front where this strategy cannot run (one line, with the fix)."""

    def check_layout(self, layout: Layout) -> None:
        """Refuse a checkpoint layout this strategy cannot read (one line, with the fix)."""


# ---------------------------------------------------------------------- copies
def piece_sources(layout: Layout, plan, file: FilePlan, tensors: dict) -> tuple[list, dict]:
    """Sources that point into each loaded piece tensor (its bytes, not the file's)."""
    import torch

    sources: list[Source] = []
    memory: dict[str, torch.Tensor] = {}
    for n, (piece, tensor) in enumerate(tensors.items()):
        tag = f"{file.path}#{n}"
        memory[tag] = tensor.detach().reshape(-1).view(torch.uint8)
        sources += [replace(s, path=tag) for s in layout.sources(plan, file, {piece: 0})]
    return sources, memory


def copy_into(state: TargetState, copies, memory: dict, advance=None) -> int:
    """Execute copies from source bytes (``memory[path]``: flat uint8 tensors);
    ``advance(n)`` after each (a progress bar)."""
    moved = 0
    for c in copies:
        source = memory[c.path]
        state.byte_view(c.target)[c.target_offset : c.target_offset + c.length].copy_(
            source[c.offset : c.offset + c.length]
        )
        moved += c.length
        if advance is not None:
            advance(c.length)
    return moved


def load_pieces(ctx: RunContext, loaded: Iterable[tuple[FilePlan, dict]]) -> None:
    """``reshard``: copy every loaded piece's rows into the target state."""
    sources, memory = [], {}
    for file, tensors in loaded:
        more, mem = piece_sources(ctx.layout, ctx.plan, file, tensors)
        sources += more
        memory.update(mem)
    with ctx.op.phase(Phase.RESHARD):
        copies = plan_copies(ctx.state.targets, sources)
        with progress_bar(sum(c.length for c in copies), "reshard", ctx.progress) as bar:
            moved = copy_into(ctx.state, copies, memory, bar.update)
    ctx.op.add_bytes(Phase.RESHARD, moved)


def deserialize_files(
    ctx: RunContext, load, files: list[FilePlan] | None = None
) -> list[tuple[FilePlan, dict]]:
    """The deserialize phase: ``load(file)`` for every data file read (of ``files``, by
    default all), ``threads`` at a time; a loader's failure names the file."""
    from ckptprof.synth.layouts.base import unreadable

    def one(file: FilePlan):
        with ctx.op.phase(Phase.DESERIALIZE):
            t0 = time.perf_counter()
            try:
                tensors = load(file)
            except CkptprofError:
                raise
            except Exception as exc:  # noqa: BLE001 - a loader's error on bad bytes
                raise unreadable(ctx.where(file.path), exc, ctx.verify) from None
        size = ctx.manifest.files[file.path].size
        ctx.op.add_file(Phase.DESERIALIZE, file.path, size, time.perf_counter() - t0)
        bar.update(size)
        return file, tensors

    data = [f for f in (ctx.files if files is None else files) if f.pieces]
    total = sum(ctx.manifest.files[f.path].size for f in data)
    with (
        progress_bar(total, "deserialize", ctx.progress) as bar,
        ThreadPoolExecutor(max(1, ctx.threads)) as pool,
    ):
        return list(pool.map(one, data))


# ---------------------------------------------------------------------- staged
class Staged(Strategy):
    name = "staged"

    def generic(self, ctx: RunContext) -> None:
        load_from_buffers(ctx, fetch_all(ctx))


def load_from_buffers(ctx: RunContext, buffers: dict[str, HostBuffer]) -> None:
    """verify, deserialize and reshard files already in memory; the buffers are released."""
    try:
        verify_all(ctx, buffers)
        loaded = deserialize_files(
            ctx, lambda f: ctx.layout.deserialize(ctx.plan, f, buffers[f.path])
        )
        load_pieces(ctx, loaded)
        del loaded
    finally:
        for buffer in buffers.values():
            buffer.close()


def fetch_all(ctx: RunContext) -> dict[str, HostBuffer]:
    """Every file this restore reads, into memory (or ``--stage DIR``, then from there)."""
    from ckptprof.fetch import download
    from ckptprof.storage import PosixStorage

    infos, op = ctx.infos(), ctx.op
    with op.phase(Phase.FETCH, **{Attr.CONCURRENCY: ctx.concurrency}):
        if ctx.stage_dir is None:
            return fetch(ctx.storage, infos, ctx.concurrency, op, ctx.part_size, ctx.progress)
        import shutil

        stage = Path(ctx.stage_dir) / f"ckptprof-stage-{os.getpid()}"
        shutil.rmtree(stage, ignore_errors=True)
        try:
            t0 = time.perf_counter()
            download(ctx.storage, infos, stage, ctx.concurrency, op, ctx.part_size, ctx.progress)
            t1 = time.perf_counter()
            local = PosixStorage(str(stage))
            buffers = fetch(local, infos, ctx.concurrency, None, ctx.part_size, ctx.progress)
            t2 = time.perf_counter()
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        op.set_phase_attributes(
            Phase.FETCH,
            **{
                "ckpt.fetch.stage_dir": str(stage),
                "ckpt.fetch.stage_download_s": round(t1 - t0, 6),
                "ckpt.fetch.stage_read_s": round(t2 - t1, 6),
            },
        )
        return buffers


def verify_attributes(ctx: RunContext) -> dict:
    """The verify phase's mode and the bytes of the files it checks (what a share of
    ``sample`` is a share of)."""
    of = sum(ctx.manifest.files[f.path].size for f in ctx.files)
    return {Attr.VERIFY_MODE: ctx.verify, Attr.VERIFY_OF_BYTES: of}


def verify_all(ctx: RunContext, buffers: dict[str, HostBuffer]) -> None:
    with ctx.op.phase(Phase.VERIFY, **verify_attributes(ctx)):
        verify_buffers(
            buffers, ctx.manifest, ctx.verify, ctx.storage.uri, ctx.op, threads=ctx.threads
        )


# ---------------------------------------------------------------------- pipelined
class Pipelined(Strategy):
    name = "pipelined"

    def generic(self, ctx: RunContext) -> None:
        clocks = FetchClocks()
        sources, indexed = index_files(ctx, clocks)
        try:
            copies = plan_copies(ctx.state.targets, sources)
            whole = {f.path: ctx.manifest.files[f.path].size for f in ctx.files if not f.pieces}
            if ctx.verify == "full":  # a full-file hash needs every byte of every file
                whole = {f.path: ctx.manifest.files[f.path].size for f in ctx.files}
            held = {path: sparse.held() for path, sparse in indexed.items()}
            maps = FileMaps(ctx)
            on_host = ctx.state.on_host  # reads land in host memory only
            direct = {f.path for f in ctx.files if f.path not in maps.paths} if on_host else set()
            reads = plan_reads(copies, ctx.part_size, whole, have=held, direct=direct)
            if ctx.verify == "sample":
                reads += sample_reads(ctx, held, reads)
            try:
                Pipeline(ctx, reads, indexed, maps, clocks).run()
            finally:
                maps.close()
                clocks.record(ctx.op)
        finally:
            for sparse in indexed.values():
                sparse.close()


class FileMaps:
    """Large files of a POSIX checkpoint, mapped (not read) for the pipeline.

    Through the page cache the cheapest way to get bytes into the state is to have the
    kernel read them into the cache with no copy (``sendfile`` to ``/dev/null``: the
    fetch) and copy them from a mapping of the file (the reshard; a plain memory copy,
    faster than the kernel's copy into user buffers on most machines). A range's pages
    leave this process's resident set once it is copied (they stay in the page cache).
    Small files and object stores go through reads into the state instead.
    """

    MIN_BYTES = 64 << 20

    def __init__(self, ctx: RunContext) -> None:
        import mmap

        self.fds: dict[str, int] = {}
        self.maps: dict[str, mmap.mmap] = {}
        local = ctx.storage.kind == "posix" and not getattr(ctx.storage, "direct_io", False)
        if not local:
            return
        for file in ctx.files:
            size = ctx.manifest.files[file.path].size
            if size >= self.MIN_BYTES:
                fd = os.open(Path(ctx.storage.uri) / file.path, os.O_RDONLY)
                self.fds[file.path] = fd
                # private and writable only so that tensors can view it (never written)
                prot = mmap.PROT_READ | mmap.PROT_WRITE
                self.maps[file.path] = mmap.mmap(fd, size, mmap.MAP_PRIVATE, prot)

    @property
    def paths(self) -> set[str]:
        return set(self.maps)

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


def index_files(ctx: RunContext, clocks: FetchClocks) -> tuple[list[Source], dict[str, SparseFile]]:
    """Each data file's own index: read from storage on demand (fetch) and parsed by the
    layout's loader (deserialize), ``concurrency`` files at a time. The sparse files stay
    open: the bytes they hold are not read again (the caller closes them)."""
    op = ctx.op

    data = [f for f in ctx.files if f.pieces]
    indexed = {
        f.path: SparseFile(ctx.storage, f.path, ctx.manifest.files[f.path].size) for f in data
    }

    def one(file: FilePlan) -> list[Source]:
        sparse = indexed[file.path]
        start = time.time_ns()
        try:
            return file_sources(ctx.layout, ctx.plan, file, sparse, ctx.concurrency)
        except CkptprofError:
            raise
        except Exception as exc:  # noqa: BLE001 - an unreadable index is a corrupt file
            from ckptprof.synth.layouts.base import unreadable

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

    op.set_phase_attributes(Phase.DESERIALIZE, **{"ckpt.deserialize.what": "each file's index"})
    try:
        with ThreadPoolExecutor(max(1, min(ctx.concurrency, len(data) or 1))) as pool:
            sources = [s for found in pool.map(one, data) for s in found]
    except BaseException:
        for sparse in indexed.values():
            sparse.close()
        raise
    return sources, indexed


def sample_reads(ctx: RunContext, held: dict, planned: list[Read]) -> list[Read]:
    """What ``--verify sample`` hashes (8 × 1 MiB per file) that the ``planned`` reads do
    not bring: extra reads (resident where the index read them already). Planned reads
    feed the hash as they land, so no byte is read twice for it."""
    from ckptprof.manifest import sample_ranges

    covered: dict[str, list[tuple[int, int]]] = {}
    for r in planned:
        covered.setdefault(r.path, []).append((r.offset, r.offset + r.length))
    out = []
    for file in ctx.files:
        for offset, length in sample_ranges(ctx.manifest.files[file.path].size):
            runs = split_held(offset, offset + length, covered.get(file.path, []))
            for lo, hi, already in runs:
                if already:
                    continue
                for a, b, resident in split_held(lo, hi, held.get(file.path, [])):
                    out.append(Read(file.path, a, b - a, resident=resident))
    return out


class Pipeline:
    """Reads in flight (``concurrency``), verified and copied as they land, inside a
    pool of buffers the memory budget pays for (each read waits for a free one)."""

    def __init__(
        self,
        ctx: RunContext,
        reads: list[Read],
        resident: dict | None = None,
        maps: FileMaps | None = None,
        clocks: FetchClocks | None = None,
    ) -> None:
        self.ctx = ctx
        self.maps = maps
        self.clocks = clocks or FetchClocks()
        self.reads = [r for r in reads if not r.resident]
        self.resident = [r for r in reads if r.resident]
        self.memory = resident or {}  # path -> SparseFile holding the resident reads' bytes
        self.part = max((r.length for r in self.reads), default=0) or ctx.part_size
        # the window: as many buffers as the budget pays for (at least one more than reads in
        # flight), but no more than reads in flight and landed reads waiting can use
        enough = max(2, min(2 * ctx.concurrency + 2, len(self.reads) + 1))
        self.slots = max(2, min(ctx.memory_budget // self.part, enough))
        self.in_flight = max(1, min(ctx.concurrency, self.slots - 1))
        self.free: queue.Queue[HostBuffer] = queue.Queue()
        # a slot per buffer; mapped reads hold no buffer, but a slot all the same (as many
        # may wait for the copy as buffers could). Slots go to reads in plan order, so the
        # read a file's hash waits for always has one: the pipeline cannot stall on itself.
        self.slots_in_order = OrderedSlots(self.slots)
        self.done: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.placed = 0  # bytes the reads put straight into the state
        sizes = ctx.manifest.files
        self.digests = (
            {f.path: StreamingDigest(sizes[f.path].size, ctx.verify) for f in ctx.files}
            if ctx.verify in ("full", "sample")
            else {}
        )

    def run(self) -> None:
        ctx, op = self.ctx, self.ctx.op
        # for a device state, page-locked buffers: the copy out of them is a DMA
        buffer_type = HostBuffer if ctx.state.on_host else PinnedBuffer
        for _ in range(self.slots):
            self.free.put(buffer_type(self.part, "ckptprof-window"))
        op.set_attributes(
            {
                "ckpt.memory.window_bytes": self.slots * self.part,
                "ckpt.memory.window_pinned": buffer_type is PinnedBuffer,
            }
        )
        op.set_phase_attributes(Phase.FETCH, **{Attr.CONCURRENCY: self.in_flight})
        bar = progress_bar(read_bytes(self.reads), f"restore x{ctx.concurrency}", ctx.progress)
        consumer = threading.Thread(target=self._consume, args=(bar,), name="ckptprof-copy")
        failure: list[BaseException] = []
        consumer.start()
        for read in self.resident:  # in memory from the index: straight to the copies
            self.done.put((read, None))
        try:
            with ThreadPoolExecutor(self.in_flight) as pool:
                futures = [pool.submit(self._read, r, n) for n, r in enumerate(self.reads)]
                for future in futures:
                    try:
                        future.result()
                    except BaseException as exc:  # noqa: BLE001 - re-raised below
                        failure.append(exc)
                        for f in futures:
                            f.cancel()
                        break
        finally:
            self.done.put(None)
            consumer.join()
            bar.close()
            while not self.free.empty():
                self.free.get().close()
        if failure:
            raise failure[0]
        if self.error is not None:
            raise self.error
        if self.placed:  # the reshard these reads did: bytes landed where the state needs them
            op.set_phase_attributes(
                Phase.RESHARD, **{"ckpt.reshard.placed_by_reads_bytes": self.placed}
            )
        self._finish_verify()

    def _read(self, read: Read, ticket: int) -> None:
        mapped = self._mapped(read)
        needs_slot = mapped or read.into is None
        if needs_slot:
            self.slots_in_order.acquire(ticket)
        else:
            self.slots_in_order.skip(ticket)
        if self.error is not None:
            if needs_slot:
                self.slots_in_order.release()
            return
        if mapped:  # into the page cache, no copy: the consumer copies from the mapping
            buffer, view = MAPPED, None
        elif read.into is not None:  # straight into the state: no buffer, no copy after
            c = read.into
            buffer = None
            view = self.ctx.state.memory(c.target, c.target_offset, c.length)
        else:
            buffer = self.free.get()  # there is one: the slot stands for it
            view = buffer.view[: read.length]
        start = time.time_ns()
        try:
            if mapped:
                self.maps.warm(read)
            elif read.length:
                self.ctx.storage.read_into(read.path, read.offset, view)
        except BaseException:
            self._release(read, buffer)
            raise
        end = time.time_ns()
        self.ctx.op.add_interval(Phase.FETCH, start, end)
        self.clocks.note(read.path, start, end, read.length)
        self.done.put((read, buffer))

    def _consume(self, bar) -> None:
        """Copy each landed read into the state at once; hash it once the reads before it
        in its file are hashed (its buffer waits meanwhile: nothing is copied aside).
        One thread: copies and hashes release the GIL."""
        pending: dict[str, list] = {}  # path -> heap of (offset, seq, read, buffer)
        seq = 0
        while True:
            item = self.done.get()
            if item is None:
                break
            read, buffer = item
            if not read.resident:
                bar.update(read.length)
            if read.into is not None:
                self.placed += read.length
            digest = self.digests.get(read.path)
            try:
                if self.error is None:
                    self._copy(read, self._bytes(read, buffer))
            except BaseException as exc:  # noqa: BLE001 - the reader side re-raises it
                self.error = exc
            if digest is None or self.error is not None:
                self._release(read, buffer)
                continue
            seq += 1
            heapq.heappush(pending.setdefault(read.path, []), (read.offset, seq, read, buffer))
            self._hash_in_order(digest, pending[read.path])
        for waiting in pending.values():
            for *_, read, buffer in waiting:
                self._release(read, buffer)

    def _mapped(self, read: Read) -> bool:
        return self.maps is not None and read.path in self.maps.maps and not read.resident

    def _bytes(self, read: Read, buffer: HostBuffer | None) -> memoryview:
        if buffer is MAPPED:
            return self.maps.view(read)
        if read.into is not None:  # it landed in the state
            c = read.into
            return self.ctx.state.memory(c.target, c.target_offset, c.length)
        if buffer is None:  # a resident read: the bytes are where the index put them
            return self.memory[read.path].view[read.offset : read.offset + read.length]
        return buffer.view[: read.length]

    def _copy(self, read: Read, view: memoryview) -> None:
        import torch

        if not read.copies or not read.length:
            return
        source = torch.frombuffer(view, dtype=torch.uint8)
        with self.ctx.op.phase(Phase.RESHARD):
            moved = copy_into(
                self.ctx.state,
                [replace(c, offset=c.offset - read.offset) for c in read.copies],
                {read.path: source},
            )
        self.ctx.op.add_bytes(Phase.RESHARD, moved)

    def _hash_in_order(self, digest: StreamingDigest, waiting: list) -> None:
        while waiting and (digest.done or waiting[0][0] <= digest.next_offset):
            _, _, read, buffer = heapq.heappop(waiting)
            try:
                if self.error is None and not digest.done:
                    with self.ctx.op.phase(Phase.VERIFY):
                        digest.feed(read.offset, self._bytes(read, buffer))
            except BaseException as exc:  # noqa: BLE001 - the reader side re-raises it
                self.error = exc
            finally:
                self._release(read, buffer)

    def _release(self, read: Read, buffer) -> None:
        if buffer is MAPPED:
            self.maps.drop(read)
            self.slots_in_order.release()
        elif buffer is not None:
            self.free.put(buffer)
            self.slots_in_order.release()

    def _finish_verify(self) -> None:
        ctx = self.ctx
        hashed = 0
        with ctx.op.phase(Phase.VERIFY, **verify_attributes(ctx)):
            for path, digest in self.digests.items():
                hashed += digest.hashed
                if not digest.done:
                    raise CkptprofError(f"{ctx.where(path)}: not every byte was read to hash it")
                check_digest(
                    ctx.where(path), ctx.manifest.files[path], ctx.verify, digest.hexdigest()
                )
        ctx.op.add_bytes(Phase.VERIFY, hashed)


# ---------------------------------------------------------------------- framework
class Framework(Strategy):
    name = "framework"

    def check(self, storage: Storage) -> None:
        if storage.kind != "posix":
            raise CkptprofError(
                "--strategy framework reads files from a local or mounted path, as the "
                "frameworks' loaders do; for s3:// use staged or pipelined (or --stage DIR)."
            )

    def generic(self, ctx: RunContext) -> None:
        warm_files(ctx)
        verify_files(ctx)
        loaded = deserialize_files(
            ctx, lambda f: ctx.layout.load_path(ctx.plan, f, path_of(ctx, f))
        )
        load_pieces(ctx, loaded)


@contextlib.contextmanager
def env_for_run(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` for one run (loaders configured through the
    environment), then as it was."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def path_of(ctx: RunContext, file: FilePlan) -> str:
    return str(Path(ctx.storage.uri) / file.path)


def warm_files(ctx: RunContext, files: list[FilePlan] | None = None) -> None:
    """fetch: every file into the page cache (no copy), ``concurrency`` at a time."""
    from ckptprof.storage.pagecache import warm_file

    def one(file: FilePlan) -> None:
        start = time.time_ns()
        warm_file(Path(path_of(ctx, file)))
        end = time.time_ns()
        ctx.op.add_interval(Phase.FETCH, start, end)
        size = ctx.manifest.files[file.path].size
        ctx.op.add_file(Phase.FETCH, file.path, size, (end - start) / 1e9, start)

    with ThreadPoolExecutor(max(1, ctx.concurrency)) as pool:
        list(pool.map(one, files if files is not None else ctx.files))


def verify_files(ctx: RunContext) -> None:
    """verify from the page cache: the same check, the file read through mmap."""
    import mmap

    class Mapped:
        def __init__(self, path: str) -> None:
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                self._map = mmap.mmap(handle.fileno(), size, prot=mmap.PROT_READ) if size else None
            self.view = memoryview(self._map) if self._map is not None else memoryview(b"")

        def close(self) -> None:
            self.view.release()
            if self._map is not None:
                self._map.close()

    mapped = {f.path: Mapped(path_of(ctx, f)) for f in ctx.files}
    try:
        verify_all(ctx, mapped)
    finally:
        for m in mapped.values():
            m.close()


class FetchClocks:
    """Per file, what its reads took: first start to last end, and all their bytes
    (``ckpt.files`` and per-file latency count files, not reads)."""

    def __init__(self) -> None:
        self._clocks: dict[str, tuple[int, int, int]] = {}
        self._lock = threading.Lock()

    def note(self, path: str, start: int, end: int, nbytes: int) -> None:
        with self._lock:
            first, last, total = self._clocks.get(path, (start, end, 0))
            self._clocks[path] = (min(first, start), max(last, end), total + nbytes)

    def record(self, op) -> None:
        for path, (first, last, nbytes) in self._clocks.items():
            op.add_file(Phase.FETCH, path, nbytes, (last - first) / 1e9, first)


class OrderedSlots:
    """``n`` slots handed out in ticket order (a semaphore wakes waiters in any order)."""

    def __init__(self, n: int) -> None:
        self.free = n
        self.next = 0
        self._cond = threading.Condition()

    def acquire(self, ticket: int) -> None:
        with self._cond:
            while ticket != self.next or self.free == 0:
                self._cond.wait()
            self.free -= 1
            self.next += 1
            self._cond.notify_all()

    def skip(self, ticket: int) -> None:
        """Ticket ``ticket`` needs no slot: let the next one through once it is its turn."""
        with self._cond:
            while ticket != self.next:
                self._cond.wait()
            self.next += 1
            self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self.free += 1
            self._cond.notify_all()


MAPPED = object()  # a landed read whose bytes are in the page cache, under a mapping
_BY_NAME: dict[str, Strategy] = {s.name: s for s in (Staged(), Pipelined(), Framework())}

__all__ = ["STRATEGIES", "RunContext", "Strategy", "get_strategy", "needed_files"]
