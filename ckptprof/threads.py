"""Thread pools that end before their caller cleans up, even through a second Ctrl-C.

A thread still under way writes through a descriptor, uploads a part or reads into a
buffer that the caller's clean-up closes, aborts or frees as soon as the pool is left:
a descriptor closed under a write may already name another file, and a part that lands
after its upload's abort is stored for nothing. So leaving a pool stops the work not
started and waits for the work under way, and a further Ctrl-C or SIGTERM meanwhile is
said once and waited through. S3 requests end within their client's timeouts, but a
read from a hung NFS mount may never end: one more Ctrl-C or SIGTERM after that notice,
in this wait or a later one of the same stop, ends the process at once (``os._exit``
with its signal's status; the runs measured so far are written first, within
:data:`LAST_WORDS_S`, by :func:`last_words`; the work under way is left unfinished, and
the temporary files or incomplete uploads it was writing may remain). Every pool of
ckptprof's is one of these; they run only in ckptprof's own commands, never in a
training job's process.

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
from contextlib import contextmanager, suppress

from ckptprof.errors import Terminated

#: the longest the last words may take before a hard exit (a hung mount may hold them)
LAST_WORDS_S = 10.0
_last_words: list[Callable[[], object]] = []
#: set on an interruption once its notice is said: one more during this stop ends it
_TOLD = "_ckptprof_told"
_STOPS = (KeyboardInterrupt, Terminated)


def through_interrupts(wait: Callable[[], object], what: str) -> None:
    """``wait()`` to its end through one Ctrl-C or SIGTERM (said on stderr: ``what`` is
    what is waited for, and raised once the wait is over); one more after that notice,
    here or in a later wait of the same stop, ends the process now."""
    stopping = sys.exc_info()[1]  # an interruption on its way out, whose notice was said?
    told = isinstance(stopping, _STOPS) and getattr(stopping, _TOLD, False)
    first: BaseException | None = None
    while True:
        try:  # said inside the try: a Ctrl-C while printing is waited through too
            if first is not None and not told:
                told = True
                setattr(first, _TOLD, True)
                print(
                    f"ckptprof: stopping once the {what} under way end (once more: stop now, "
                    "leaving them unfinished)",
                    file=sys.stderr,
                )
            wait()
            break
        except _STOPS as exc:
            if told:
                _exit_now(exc, what)
            first = first or exc
    if first is not None:  # the interruption is not lost: raised once the wait is over
        raise first


@contextmanager
def last_words(say: Callable[[], object]) -> Iterator[None]:
    """Within the block, ``say()`` runs before a hard exit (e.g. the runs measured so far
    written), on a thread of its own, for at most :data:`LAST_WORDS_S`."""
    _last_words.append(say)
    try:
        yield
    finally:
        _last_words.remove(say)


def _exit_now(interruption: BaseException, what: str) -> None:
    """End the process without waiting for the work under way or cleaning up after it:
    the user has refused a wait (a hung mount's read never ends) twice."""
    signum = signal.SIGTERM if isinstance(interruption, Terminated) else signal.SIGINT
    try:
        print(
            f"ckptprof: stopped now, with the {what} under way unfinished (the temporary "
            "files or incomplete uploads they were writing may remain)",
            file=sys.stderr,
        )
        words = threading.Thread(target=_say_last_words, name="ckptprof-last-words", daemon=True)
        words.start()
        words.join(LAST_WORDS_S)
    except BaseException:  # noqa: BLE001 - yet another Ctrl-C: no more waiting
        pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            with suppress(BaseException):  # a closed or broken stream: exit anyway
                stream.flush()
        os._exit(128 + signum)


def _say_last_words() -> None:
    for say in list(_last_words):
        with suppress(Exception):  # best effort: the process is ending
            say()


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
