"""The fetch phase: move bytes from storage into host memory, N requests in flight.

Reads are planned as data (:func:`plan_reads`: files cut into parts of
``part_size``), then executed by a thread pool whose size is the concurrency
(queue depth). Backends release the GIL while they wait (``preadv``, sockets).

Bytes land in :class:`HostBuffer` s: page-aligned anonymous memory that holds no
file descriptor, so a checkpoint of 100,000 files needs no more open files than
requests in flight. Loaders read the fetched bytes in place (tensors alias the
buffer; see :mod:`ckptprof.synth.layouts.torchfile`), without another copy.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ckptprof.atomic import named
from ckptprof.phases import Phase
from ckptprof.progress import bar as progress_bar
from ckptprof.storage.base import ObjectInfo, Storage
from ckptprof.tracing.recorder import Operation

DEFAULT_PART_SIZE = 16 << 20


class HostBuffer:
    """A file's bytes in host memory, as a writable, page-aligned memoryview.

    Private anonymous memory: no descriptor is held (a memfd would cost one, and
    Python's mmap a second), and adjacent buffers can share one kernel mapping.
    """

    def __init__(self, size: int, name: str = "ckptprof") -> None:
        self.size = size
        self.name = name
        try:
            self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE) if size else None
        except OSError as exc:
            raise MemoryError(f"{name}: cannot allocate {size} bytes ({exc})") from None
        self.view = memoryview(self._map) if self._map is not None else memoryview(b"")
        self._closed = False

    def reader(self, offset: int = 0, length: int | None = None) -> io.BufferedReader:
        """A seekable file object over a slice of the bytes, without copying them."""
        end = self.size if length is None else offset + length
        return io.BufferedReader(_ViewReader(self.view[offset:end]))

    def close(self) -> None:
        """Release the memory, or leave it to the tensors that still alias it: the last
        of them frees it (a loader's tensors export the buffer)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(BufferError):
            self.view.release()
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class _ViewReader(io.RawIOBase):
    def __init__(self, view: memoryview) -> None:
        self._view, self._pos = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = {0: 0, 1: self._pos, 2: len(self._view)}[whence] + pos
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buf) -> int:
        chunk = self._view[self._pos : self._pos + len(buf)]
        buf[: len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)


@dataclass(frozen=True)
class ReadRequest:
    path: str
    offset: int
    length: int


def plan_reads(files: list[ObjectInfo], part_size: int = DEFAULT_PART_SIZE) -> list[ReadRequest]:
    """Cut each file into ranged reads of at most ``part_size`` bytes, in file order."""
    if part_size <= 0:
        raise ValueError("part_size must be positive")
    reqs = []
    for info in files:
        if info.size == 0:
            reqs.append(ReadRequest(info.path, 0, 0))
        for offset in range(0, info.size, part_size):
            reqs.append(ReadRequest(info.path, offset, min(part_size, info.size - offset)))
    return reqs


class _FileClock:
    """First start and last end of a file's parts: its fetch latency."""

    def __init__(self) -> None:
        self.start_ns: int | None = None
        self.end_ns = 0
        self.pending = 0


def _execute(
    files: list[ObjectInfo],
    reqs: list[ReadRequest],
    concurrency: int,
    do_part,
    op: Operation | None,
    desc: str,
    progress: bool | None,
) -> None:
    """Run ``do_part(req)`` for every request, ``concurrency`` at a time, timing each file."""
    clocks = {f.path: _FileClock() for f in files}
    sizes = {f.path: f.size for f in files}
    for r in reqs:
        clocks[r.path].pending += 1
    lock = threading.Lock()
    bar = progress_bar(sum(sizes.values()), desc, progress)

    def run(req: ReadRequest) -> None:
        start = time.time_ns()
        if req.length:
            do_part(req)
        end = time.time_ns()
        with lock:
            clock = clocks[req.path]
            clock.start_ns = start if clock.start_ns is None else min(clock.start_ns, start)
            clock.end_ns = max(clock.end_ns, end)
            clock.pending -= 1
            done = clock.pending == 0
            bar.update(req.length)
        if done and op is not None:
            seconds = (clock.end_ns - clock.start_ns) / 1e9
            op.add_file(Phase.FETCH, req.path, sizes[req.path], seconds, clock.start_ns)

    try:
        pool = ThreadPoolExecutor(max_workers=max(1, concurrency))
        try:
            for future in [pool.submit(run, r) for r in reqs]:
                future.result()
        finally:
            # on the first failure, drop the queued parts instead of reading them all
            pool.shutdown(wait=True, cancel_futures=True)
    finally:
        bar.close()


def fetch(
    storage: Storage,
    files: list[ObjectInfo],
    concurrency: int,
    op: Operation | None = None,
    part_size: int = DEFAULT_PART_SIZE,
    progress: bool | None = None,
) -> dict[str, HostBuffer]:
    """Read ``files`` fully into memory with ``concurrency`` requests in flight."""
    buffers = {f.path: HostBuffer(f.size, f.path) for f in files}

    def part(req: ReadRequest) -> None:
        view = buffers[req.path].view[req.offset : req.offset + req.length]
        storage.read_into(req.path, req.offset, view)

    try:
        reqs = plan_reads(files, part_size)
        _execute(files, reqs, concurrency, part, op, f"fetch x{concurrency}", progress)
    except BaseException:
        for buf in buffers.values():
            buf.close()
        raise
    return buffers


def download(
    storage: Storage,
    files: list[ObjectInfo],
    dest: Path,
    concurrency: int,
    op: Operation | None = None,
    part_size: int = DEFAULT_PART_SIZE,
    progress: bool | None = None,
) -> None:
    """Copy ``files`` into the local directory ``dest``, ``concurrency`` ranged reads in
    flight (what ``s5cmd cp`` or ``aws s3 cp`` do before a job loads from local disk).

    Each part opens its file for its own write, so open files stay at one per request
    in flight however many files there are. Write errors name the file."""
    local = threading.local()
    for f in files:
        _create(dest / f.path, f.size)

    def part(req: ReadRequest) -> None:
        if getattr(local, "buf", None) is None:
            local.buf = memoryview(bytearray(part_size))
        view = local.buf[: req.length]
        storage.read_into(req.path, req.offset, view)
        target = dest / req.path
        try:
            fd = os.open(target, os.O_WRONLY)
            try:
                written = 0
                while written < req.length:
                    written += os.pwrite(fd, view[written:], req.offset + written)
            finally:
                os.close(fd)
        except OSError as exc:
            raise named(exc, target) from None

    reqs = plan_reads(files, part_size)
    _execute(files, reqs, concurrency, part, op, f"download x{concurrency}", progress)


def _create(target: Path, size: int) -> None:
    """An empty file of ``size`` bytes (sparse until written), its folders made."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
    except OSError as exc:
        raise named(exc, target) from None
