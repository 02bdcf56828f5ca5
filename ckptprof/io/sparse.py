"""Reading a checkpoint file's own index — and only its index — from storage.

A restore that reads only what a rank needs must first learn where each tensor lies:
the zip directory and pickle of a ``torch.save`` archive, the JSON header of a
safetensors shard. :class:`SparseFile` holds a file's bytes as untouched virtual memory
and fetches blocks of it only when a reader asks for them, so the codec's own loader
(``torch.load``'s zip reader and unpickler, the safetensors header parser) runs
unchanged and pulls exactly the bytes it parses; the tensors it returns are views whose
addresses give their byte offsets in the file. This is what
``torch.load(mmap=True)`` or ``safe_open`` do through page faults.
"""

from __future__ import annotations

import io
import mmap
import threading
import time
from typing import TYPE_CHECKING

from ckptprof.io.reader import RangeReader

if TYPE_CHECKING:
    from ckptprof.storage.base import Storage

INDEX_BLOCK = 4 << 10  # one zip local header; a page


class SparseFile:
    """``size`` bytes of ``path`` as virtual memory, fetched from ``storage`` by block
    on first read (never committed until touched: a 100 GB file costs nothing)."""

    def __init__(self, storage: Storage, path: str, size: int, block: int = INDEX_BLOCK) -> None:
        self.storage, self.path, self.size, self.block = storage, path, size, block
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_NORESERVE", 0)
        self._map = mmap.mmap(-1, max(size, 1), flags=flags)
        self.view = memoryview(self._map)[:size]
        self._have: set[int] = set()
        self._lock = threading.Lock()
        self.fetched_bytes = 0
        self.read_intervals: list[tuple[int, int]] = []  # when it was reading (fetch time)

    def ensure(self, offset: int, length: int) -> None:
        """Fetch the blocks covering ``[offset, offset + length)`` not fetched yet."""
        end = min(self.size, offset + length)
        first, last = offset // self.block, max(offset, end - 1) // self.block
        with self._lock:
            missing = [b for b in range(first, last + 1) if b not in self._have]
            self._have.update(missing)  # claimed: a concurrent caller skips them
        for lo, hi in self._spans(missing):
            started = time.time_ns()
            self.storage.read_into(self.path, lo, self.view[lo:hi])
            with self._lock:
                self.read_intervals.append((started, time.time_ns()))
                self.fetched_bytes += hi - lo

    def prefetch(self, ranges: list[tuple[int, int]], policy, concurrency: int) -> None:
        """Fetch ``(offset, length)`` ranges before a loader asks for them one by one, in
        the requests the storage's ``policy`` plans (on an object store, nearby ranges are
        one request; its latency is paid once, not per range), ``concurrency`` at a time.
        Blocks held already are not asked for again, and one request is read in the
        caller's thread: a small file's index is one request, and a window's threads for
        it cost more than the read (1.5 ms a file here)."""
        from ckptprof.io.requests import Request, cut, merge
        from ckptprof.io.window import Window

        spans = merge(self._missing(ranges), policy.gap)
        requests = [
            Request(self.path, o, n) for lo, hi in spans for o, n in cut(lo, hi, policy.part_size)
        ]

        def ensure(request: Request, _view=None) -> None:
            self.ensure(request.offset, request.length)

        if len(requests) <= 1:
            for request in requests:
                ensure(request)
            return
        # op=None: ensure() records its own read intervals, as for reads on demand
        Window(self.storage, None, concurrency).run(requests, into=lambda r: None, read=ensure)

    def _missing(self, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The ``[start, end)`` spans of the blocks under ``(offset, length)`` ranges not
        fetched yet."""
        blocks: set[int] = set()
        for offset, length in ranges:
            end = min(self.size, offset + length)
            if end > offset:
                blocks.update(range(offset // self.block, (end - 1) // self.block + 1))
        with self._lock:
            blocks -= self._have
        return self._spans(blocks)

    def held(self) -> list[tuple[int, int]]:
        """The ``[start, end)`` ranges fetched so far, merged."""
        with self._lock:
            have = set(self._have)
        return self._spans(have)

    def _spans(self, blocks) -> list[tuple[int, int]]:
        """``blocks`` as the ``[start, end)`` byte spans of their runs."""
        return [
            (a * self.block, min(self.size, (b + 1) * self.block)) for a, b in _runs(sorted(blocks))
        ]

    def reader(self, offset: int = 0, length: int | None = None) -> io.BufferedReader:
        """A file object over the bytes; it reads ahead one page, not one block. A zip
        reader's 30-byte local header is in its prefetched hint (a page from the header),
        so reading it fetches nothing; a block's read-ahead ran past the hint into tensor
        data not fetched yet, on an object store one request in series per record."""
        end = self.size if length is None else offset + length
        return io.BufferedReader(_SparseReader(self, offset, end), buffer_size=INDEX_BLOCK)

    @property
    def base_address(self) -> int:
        import torch

        return torch.frombuffer(self.view, dtype=torch.uint8).data_ptr() if self.size else 0

    def close(self) -> None:
        import contextlib

        with contextlib.suppress(BufferError):
            self.view.release()
            self._map.close()


def _runs(blocks: list[int]) -> list[tuple[int, int]]:
    runs: list[list[int]] = []
    for b in blocks:
        if runs and b == runs[-1][1] + 1:
            runs[-1][1] = b
        else:
            runs.append([b, b])
    return [(a, b) for a, b in runs]


class _SparseReader(RangeReader):
    """``[start, end)`` of a sparse file; each read fetches the blocks it covers first."""

    def __init__(self, sparse: SparseFile, start: int, end: int) -> None:
        super().__init__(end - start)
        self._sparse, self._start = sparse, start

    def read_at(self, offset: int, into: memoryview) -> int:
        start = self._start + offset
        self._sparse.ensure(start, len(into))
        into[:] = self._sparse.view[start : start + len(into)]
        return len(into)


__all__ = ["INDEX_BLOCK", "SparseFile"]
