"""Host memory that storage reads land in.

:class:`HostBuffer` is page-aligned anonymous memory that holds no file descriptor, so a
checkpoint of 100,000 files needs no more open files than requests in flight. Loaders
read the bytes in place (tensors alias the buffer), without another copy.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import threading
from collections.abc import Callable
from typing import Any

from ckptprof.io.reader import RangeReader


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
        return view_reader(self.view[offset:end])

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


class BufferPool:
    """Window buffers made before any timing and lent to each run's window
    (``Window(pool=…)``, which restocks it when the run's copies have landed). Pinning
    host memory costs milliseconds per MB, once for a job, which keeps its pinned buffers
    from one load to the next: a restore that pinned them inside its fetch timed an
    allocation a job does not make."""

    def __init__(self, make: Callable[[int, str], Any]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._all: list = []
        self._free: list = []
        #: buffers a run needed beyond what was reserved (made inside its timing)
        self.made_in_runs = 0

    def reserve(self, count: int, size: int, name: str = "ckptprof-window") -> None:
        """Make ``count`` buffers of ``size`` bytes now (outside any timing)."""
        for _ in range(count):
            self._all.append(self._make(size, name))
        self._free = list(self._all)

    @property
    def reserved_bytes(self) -> int:
        return sum(b.size for b in self._all)

    def take(self, size: int, name: str = "ckptprof-window") -> Any:
        """A free buffer of at least ``size`` bytes; made now if none is. The window's
        reading threads take at once: one at a time here."""
        with self._lock:
            for index, buffer in enumerate(self._free):
                if buffer.size >= size:
                    return self._free.pop(index)
            self.made_in_runs += 1
            buffer = self._make(size, name)
            self._all.append(buffer)
            return buffer

    def free_buffers(self) -> list:
        return list(self._free)

    def restock(self) -> None:
        """A run ended (its copies out of the buffers have landed): all are free again."""
        self._free = list(self._all)

    def close(self) -> None:
        for buffer in self._all:
            buffer.close()
        self._all, self._free = [], []


def view_reader(view: memoryview) -> io.BufferedReader:
    """A seekable file object over ``view``, without copying it (what loaders read)."""
    return io.BufferedReader(_ViewReader(view))


class _ViewReader(RangeReader):
    def __init__(self, view: memoryview) -> None:
        super().__init__(len(view))
        self._view = view

    def read_at(self, offset: int, into: memoryview) -> int:
        chunk = self._view[offset : offset + len(into)]
        into[: len(chunk)] = chunk
        return len(chunk)


__all__ = ["BufferPool", "HostBuffer", "view_reader"]
