"""What this process's storage I/O is doing right now: requests in flight, bytes moved.

The storage backends wrap each read and write request in :func:`request` (whoever
issues it: the I/O core, an index read, a probe); the stall watchdog
(:mod:`ckptprof.tracing.watchdog`) reads :func:`snapshot` once a second to tell a slow
transfer (bytes still moving) from a stalled one, and to name the file or object a
stalled request waits on. Cheap by design: one lock, a counter, a small dict.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

_lock = threading.Lock()
_tickets = itertools.count()
_in_flight: dict[int, tuple[str, int, int]] = {}  # ticket -> (where, bytes, started ns)
_moved = 0


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


__all__ = ["InFlight", "moved", "request", "snapshot"]
