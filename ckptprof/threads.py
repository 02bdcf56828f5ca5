"""Thread pools that end before their caller cleans up, even through a second Ctrl-C.

A thread still under way writes through a descriptor, uploads a part or reads into a
buffer that the caller's clean-up closes, aborts or frees as soon as the pool is left:
a descriptor closed under a write may already name another file, and a part that lands
after its upload's abort is stored for nothing. So leaving a pool stops the work not
started and waits for the work under way, and a further Ctrl-C or SIGTERM meanwhile is
said once and waited through. S3 requests end within their client's timeouts, but a
read from a hung NFS mount may never end: one more Ctrl-C or SIGTERM ends the process
at once (``os._exit``, the work under way unfinished, nothing cleaned up), as a user
pressing it a third time asks. Every pool of ckptprof's is one of these; they run only
in ckptprof's own commands, never in a training job's process.

The pool counts its work itself rather than joining its threads: on Python 3.11 a
``Thread.join`` cut by Ctrl-C marks a running thread as ended, and a Ctrl-C inside
``submit`` can start a thread the executor never records.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, ThreadPoolExecutor
from contextlib import contextmanager

from ckptprof.errors import Terminated


def through_interrupts(wait: Callable[[], object], what: str) -> None:
    """``wait()`` to its end through one Ctrl-C or SIGTERM (said on stderr: ``what`` is
    what is waited for, and raised once the wait is over); a second one during the
    wait ends the process now, with the exit status of its signal."""
    interruptions: list[BaseException] = []
    told = False
    while True:
        try:  # said inside the try: a Ctrl-C while printing is waited through too
            if len(interruptions) > 1:
                _exit_now(interruptions[-1], what)
            if interruptions and not told:
                told = True
                print(
                    f"ckptprof: stopping once the {what} under way end (once more: stop now, "
                    "leaving them unfinished)",
                    file=sys.stderr,
                )
            wait()
            break
        except (KeyboardInterrupt, Terminated) as exc:
            interruptions.append(exc)
    if interruptions:  # the interruption is not lost: raised once the wait is over
        raise interruptions[0]


def _exit_now(interruption: BaseException, what: str) -> None:
    """End the process without waiting or cleaning up: a wait the user has refused
    twice (a hung mount's read never ends)."""
    signum = signal.SIGTERM if isinstance(interruption, Terminated) else signal.SIGINT
    print(f"ckptprof: stopped now, with the {what} under way unfinished", file=sys.stderr)
    sys.stderr.flush()
    os._exit(128 + signum)


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
            if self._ended:  # taken off the queue just before it was cancelled: not started
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
        self.shutdown(wait=False, cancel_futures=True)  # the queue's work: cancelled()
        with self._gate:
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
