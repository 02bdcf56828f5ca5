"""What this process's storage I/O is doing right now: requests in flight, bytes moved.

The storage backends wrap each read and write request in :func:`request` (whoever
issues it: the I/O core, an index read, a probe); a file that a framework's own writer
fills (``torch.save``, safetensors, DCP's writer), whose bytes no request of ckptprof's
sees, is named by :func:`growing` while it is written, and its size on disk shows the
bytes reaching it. The stall watchdog (:mod:`ckptprof.tracing.watchdog`) reads
:func:`snapshot` and :func:`grown` once a second to tell a slow transfer (bytes still
moving) from a stalled one, and to name the file or object a stalled request waits on.
Cheap by design: one lock, a counter, two small dicts.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_lock = threading.Lock()
_tickets = itertools.count()
_in_flight: dict[int, tuple[str, int, int]] = {}  # ticket -> (where, bytes, started ns)
_moved = 0
_growing: dict[int, Path] = {}  # ticket -> a file, or a folder of files, being filled


@dataclass(frozen=True)
class InFlight:
    where: str  # the file or object (``s3://bucket/key``, a path)
    nbytes: int
    age_s: float


@contextmanager
def request(where: str, nbytes: int) -> Iterator[None]:
    """One read or write of ``nbytes`` at ``where``; its bytes count as moved when it ends."""
    global _moved
    ticket = next(_tickets)
    with _lock:
        _in_flight[ticket] = (where, nbytes, time.monotonic_ns())
    try:
        yield
    finally:
        with _lock:
            _in_flight.pop(ticket, None)
            _moved += nbytes


@contextmanager
def growing(path: str | os.PathLike) -> Iterator[None]:
    """A file (or a folder whose files) a writer of its own fills while this lasts: its
    growth on disk counts as progress."""
    ticket = next(_tickets)
    with _lock:
        _growing[ticket] = Path(path)
    try:
        yield
    finally:
        with _lock:
            _growing.pop(ticket, None)


def grown() -> int:
    """Bytes the files named by :func:`growing` hold now (a folder: every file under it)."""
    with _lock:
        paths = list(_growing.values())
    return sum(_size_on_disk(p) for p in paths)


def _size_on_disk(path: Path) -> int:
    try:
        if not path.is_dir():
            return path.stat().st_size
        with os.scandir(path) as entries:
            return sum(_entry_size(e) for e in entries)
    except OSError:  # not created yet, or renamed into place already
        return 0


def _entry_size(entry: os.DirEntry) -> int:
    """A file's size; a folder's files', as deep as they go (a sharded save's subfolder)."""
    try:
        if entry.is_dir(follow_symlinks=False):
            return _size_on_disk(Path(entry.path))
        return entry.stat().st_size if entry.is_file() else 0
    except OSError:  # gone since the listing
        return 0


def moved() -> int:
    """Bytes moved by finished requests since the process started."""
    return _moved


def snapshot() -> tuple[int, list[InFlight]]:
    """Bytes moved so far and the requests in flight, the oldest first."""
    now = time.monotonic_ns()
    with _lock:
        flying = [InFlight(w, n, (now - t) / 1e9) for w, n, t in _in_flight.values()]
        total = _moved
    return total, sorted(flying, key=lambda f: -f.age_s)


__all__ = ["InFlight", "growing", "grown", "moved", "request", "snapshot"]
