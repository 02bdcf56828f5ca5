"""Thread pools that end before their caller cleans up, even through a second Ctrl-C.

A thread still under way writes through a descriptor, uploads a part or reads into a
buffer that the caller's clean-up closes, aborts or frees as soon as the pool is left:
a descriptor closed under a write may already name another file, and a part that lands
after its upload's abort is stored for nothing. So leaving a pool stops the work not
started and waits for the work under way, and a further Ctrl-C or SIGTERM meanwhile is
said once and waited through (each request is bounded by its storage's own timeouts,
so the wait is too). Every pool of ckptprof's is one of these.

The pool counts its work itself rather than joining its threads: on Python 3.11 a
``Thread.join`` cut by Ctrl-C marks a running thread as ended, and a Ctrl-C inside
``submit`` can start a thread the executor never records.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, ThreadPoolExecutor
from contextlib import contextmanager

from ckptprof.errors import Terminated


def through_interrupts(wait: Callable[[], object], what: str) -> None:
    """``wait()`` to its end, whatever Ctrl-C or SIGTERM arrives meanwhile (the first
    is said on stderr: ``what`` is what is waited for)."""
    first: BaseException | None = None
    told = False
    while True:
        try:  # said inside the try: a Ctrl-C while printing is waited through too
            if first is not None and not told:
                told = True
                print(f"ckptprof: stopping once the {what} under way end", file=sys.stderr)
            wait()
            break
        except (KeyboardInterrupt, Terminated) as exc:
            first = first or exc
    if first is not None:  # the interruption is not lost: raised once the wait is over
        raise first


class _CountedPool(ThreadPoolExecutor):
    """An executor whose work, once :meth:`end` has begun, never starts, and whose work
    under way :meth:`end` waits for."""

    def __init__(self, workers: int, name: str) -> None:
        super().__init__(max(1, workers), name)
        self._gate = threading.Condition()
        self._ended = False
        self._running = 0

    def submit(self, fn, /, *args, **kwargs):
        return super().submit(self._counted, fn, args, kwargs)

    def _counted(self, fn, args, kwargs):
        with self._gate:
            if self._ended:  # taken off the queue as the pool ended: never started
                raise CancelledError
            self._running += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with self._gate:
                self._running -= 1
                self._gate.notify_all()

    def _close_and_wait(self) -> None:
        with self._gate:
            self._ended = True
            while self._running:
                self._gate.wait()

    def end(self, what: str) -> None:
        through_interrupts(self._close_and_wait, what)
        # nothing runs now: the queue's work is cancelled and the idle threads leave
        through_interrupts(lambda: self.shutdown(wait=True, cancel_futures=True), what)


@contextmanager
def thread_pool(workers: int, what: str, name: str = "ckptprof") -> Iterator[ThreadPoolExecutor]:
    """A pool of ``workers`` threads (at least one) that, when left, stops the work not
    started and waits for the work under way (``what``: how to name it, if a Ctrl-C
    comes while it waits). Unlike ``ThreadPoolExecutor``'s own exit, a normal exit also
    drops what has not started: take every result inside the block."""
    pool = _CountedPool(workers, name)
    try:
        yield pool
    finally:
        pool.end(what)


__all__ = ["thread_pool", "through_interrupts"]
