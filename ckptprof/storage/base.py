"""The storage interface: a handful of primitives per backend (fsspec-style).

A backend is picked from the location (``s3://…`` vs a path) by
:func:`ckptprof.storage.open_storage`. Phases and spans never care which one
runs. Backends raise builtin exceptions carrying the location
(``FileNotFoundError(uri)``, ``PermissionError(uri)``), never their own.

Order of calls a backend sees during a restore: ``list`` (or ``stat`` per
known file) once, then ``read_into`` concurrently from many threads. During
generation: ``staging_file`` per file, then ``write_bytes`` for the manifest.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

#: bytes per ranged read (a fetch request, an S3 multipart part) unless told otherwise
DEFAULT_PART_SIZE = 16 << 20


#: what O_DIRECT moves: whole blocks, at block-aligned offsets, from block-aligned memory
DIRECT_ALIGN = 4096


def whole_blocks(nbytes: int) -> int:
    """``nbytes`` rounded up to whole O_DIRECT blocks."""
    return -(-nbytes // DIRECT_ALIGN) * DIRECT_ALIGN


@dataclass(frozen=True)
class Part:
    """One write request: ``views`` land at ``offset``; ``number`` counts from 1 (S3's)."""

    number: int
    offset: int
    views: tuple[memoryview, ...]

    @property
    def size(self) -> int:
        return sum(v.nbytes for v in self.views)


class FileWriter(Protocol):
    """One file (object) being written; nothing is visible under its name before
    :meth:`commit`, and :meth:`abort` leaves nothing behind."""

    #: written from staged, block-aligned buffers (:meth:`write_staged`): O_DIRECT
    direct: bool

    def write_part(self, part: Part) -> None: ...

    def write_staged(self, buffer: memoryview, offset: int, size: int) -> None:
        """A direct writer's part, staged at the start of an aligned ``buffer``."""

    def sync(self) -> None:
        """Force what was written to the device (a no-op where completing is durable)."""

    def commit(self) -> None:
        """Make the file visible under its name."""

    def abort(self) -> None: ...


@dataclass(frozen=True)
class ObjectInfo:
    """One file or object, ``path`` relative to the storage root with ``/`` separators."""

    path: str
    size: int


@dataclass
class CacheState:
    """What was done to a cache and what was measured afterwards."""

    method: str
    resident_fraction: float | None
    detail: dict[str, float] = field(default_factory=dict)


@dataclass
class RequestStats:
    """Counters a backend keeps while serving requests (shown on spans)."""

    requests: int = 0
    retries: int = 0
    errors: int = 0
    #: the longest single request since :meth:`reset_slowest`, and what it read: a stall
    #: shorter than the read timeout shows here, not as an error
    slowest_s: float = 0.0
    slowest: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, requests: int = 0, retries: int = 0, errors: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.retries += retries
            self.errors += errors

    def observe(self, where: str, seconds: float) -> None:
        """One request's time (``where``: the object or file it read, nothing secret)."""
        if seconds > self.slowest_s:
            with self._lock:
                if seconds > self.slowest_s:
                    self.slowest_s, self.slowest = seconds, where

    def reset_slowest(self) -> None:
        with self._lock:
            self.slowest_s, self.slowest = 0.0, ""


class Storage(ABC):
    """Primitives every backend implements; everything else builds on them."""

    kind: str = "abstract"
    #: every request is a round trip (an object store): reads are planned in few, large
    #: requests (:mod:`ckptprof.io.requests`)
    object_store: bool = False
    #: whether reads can be served from a local cache, so "hot" differs from "cold"
    has_local_cache: bool = False
    #: files open by path (a local disk or a mount): the frameworks' own loaders read
    #: them there, and O_DIRECT applies
    files_by_path: bool = False
    #: speaks the S3 API, so S3's own clients (s3torchconnector) can read it
    s3_api: bool = False

    @property
    def mappable(self) -> bool:
        """Whether files can be memory-mapped (by path, through the page cache)."""
        return False

    def __init__(self, location: str) -> None:
        self.location = location
        self.stats = RequestStats()

    @property
    def uri(self) -> str:
        """The location as safe to print: no credentials, no query string."""
        return self.location

    # ---- reading
    @abstractmethod
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """All objects under the root (recursively), sorted by path."""

    @abstractmethod
    def stat(self, path: str) -> ObjectInfo:
        """Size of one object; ``FileNotFoundError`` naming it when absent."""

    @abstractmethod
    def read_into(self, path: str, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` with the object's bytes from ``offset``, or raise.

        Called concurrently from many threads; must release the GIL while waiting.
        A short read (object shorter than expected) raises ``EOFError`` naming the path.
        """

    def read_into_views(self, path: str, offset: int, views: list[memoryview]) -> None:
        """Fill ``views`` with consecutive bytes from ``offset`` (a scattered read: one
        range, many destinations). By default one read per view; object stores override
        it with one request for the whole range."""
        for view in views:
            self.read_into(path, offset, view)
            offset += len(view)

    def read_bytes(self, path: str) -> bytes:
        size = self.stat(path).size
        buf = bytearray(size)
        if size:
            self.read_into(path, 0, memoryview(buf))
        return bytes(buf)

    @abstractmethod
    def location_exists(self) -> bool:
        """Whether the root (directory, or any object under the prefix) exists."""

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except FileNotFoundError:
            return False
        return True

    # ---- writing
    @abstractmethod
    def staging_file(self, path: str) -> AbstractContextManager[Path]:
        """A local file to write ``path`` into; published atomically on clean exit."""

    def open_writer(self, path: str, size: int, part_size: int) -> FileWriter:
        """A writer that lands ``size`` bytes of ``path`` part by part, several at once
        (:mod:`ckptprof.io.writes`); the file appears under its name only on commit."""
        raise NotImplementedError(f"{self.kind} storage has no part writer")

    @abstractmethod
    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a small object atomically (temp name, then rename/put)."""

    @abstractmethod
    def delete(self, path: str) -> None:
        """Remove one object; a missing one is not an error."""

    def claim(self) -> AbstractContextManager[object]:
        """This process's hold on the location while it writes a checkpoint there: a
        second writer is refused at once, naming the holder. Object stores have no lock
        to take (two writers of one prefix are not detected there)."""
        return nullcontext()

    def writer(self) -> str | None:
        """The process that holds the location's :meth:`claim` now, as "pid N: its
        command" (None: none, or no lock to ask, as on object stores)."""
        return None

    def check_writable(self, path: str, removing: set[str] = frozenset()) -> None:
        """Refuse, before anything is deleted, a path that cannot be written as a file
        (once the paths in ``removing`` are gone). Object stores take any key."""
        return None

    def abort_uploads(self) -> int:
        """Abort the unfinished uploads under the location (an object store's multipart
        uploads a killed save left open); how many. A file system has none."""
        return 0

    @abstractmethod
    def free_bytes(self) -> int | None:
        """Space left for generation, or None when the backend has no such limit."""

    def free_inodes(self) -> int | None:
        """Files that may still be created, or None when the backend has no such limit."""
        return None

    # ---- cache control (meaningful for POSIX; object stores have no local cache)
    def memory_filesystem(self) -> str | None:
        """The filesystem type when its files live in memory (no cold read possible)."""
        return None

    def evict(self, paths: list[str]) -> CacheState:
        return CacheState(method="none (no local cache)", resident_fraction=None)

    def warm(self, paths: list[str]) -> CacheState:
        return CacheState(method="none (no local cache)", resident_fraction=None)

    def describe(self) -> dict[str, str]:
        """Environment of this storage for results (fs type, mount options, endpoint…)."""
        return {"storage.kind": self.kind, "storage.uri": self.uri}
