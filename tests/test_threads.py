"""Every thread pool of ckptprof's ends before its caller cleans up, through a second
Ctrl-C: the work not started is cancelled, the work under way is waited for (a
descriptor closed under a write may already name another file), and the wait is said
once. The rule is enumerated from the code: no pool is made outside ``ckptprof.threads``."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckptprof.io.window import Window

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("ckptprof", "integrations") for p in (ROOT / d).rglob("*.py"))


def test_no_thread_pool_is_made_outside_ckptprof_threads():
    """No module but ``ckptprof.threads`` names an executor (to import, make or subclass one)."""
    named = {}
    for source in SOURCES:
        for node in ast.walk(ast.parse(source.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            names += [getattr(node, "id", None) or getattr(node, "attr", None)]
            if {"ThreadPoolExecutor", "ProcessPoolExecutor"} & set(names):
                named.setdefault(str(source.relative_to(ROOT)), node.lineno)
    outside = {path: line for path, line in named.items() if path != "ckptprof/threads.py"}
    assert named and not outside, f"make pools with ckptprof.threads.thread_pool: {outside}"


@dataclass(frozen=True)
class _Request:
    path: str
    offset: int
    length: int


def twice_interrupted(first: int):
    """A request handler that, on request ``first``, sends the main thread SIGINT, then
    a second SIGINT while it is still under way; every request takes 0.4 s. Returns the
    handler and the offsets started and ended."""
    main, started, ended = threading.main_thread().ident, [], []

    def handle(request, view):
        started.append(request.offset)
        if request.offset == first:
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.2)
            signal.pthread_kill(main, signal.SIGINT)  # the second Ctrl-C, this one under way
        time.sleep(0.4)
        ended.append(request.offset)
        return view

    return handle, started, ended


@pytest.mark.parametrize("first", [1, 5], ids=["as-its-threads-start", "once-running"])
def test_a_window_left_by_a_second_ctrl_c_waits_for_its_requests_under_way(first, capfd):
    """Request ``first`` is cut by a Ctrl-C, and by a second one while it is still under
    way: ``run`` raises only once every request started has ended, and starts no more."""
    handle, started, ended = twice_interrupted(first)
    requests = [_Request("f", n, 1) for n in range(20)]
    with pytest.raises(KeyboardInterrupt):
        Window(None, None, 2, progress=False).run(requests, into=lambda r: None, read=handle)
    assert sorted(ended) == sorted(started)  # none under way once the caller has it back
    assert first in started and len(started) <= first + 3  # the two in flight, one more
    err = capfd.readouterr().err
    assert err.count("ckptprof: stopping once the fetch requests under way end") == 1


_HUNG_WINDOW = """
import signal, sys, threading, time
from dataclasses import dataclass
from ckptprof import threads
from ckptprof.cli import _raise_on_signals
from ckptprof.io.window import Window

_raise_on_signals()  # as the command does: SIGTERM raises Terminated
ending = threading.Event()  # the pool has begun to end: the first Ctrl-C was taken
close_and_wait = threads._CountedPool._close_and_wait

def observed(pool):
    ending.set()
    close_and_wait(pool)

threads._CountedPool._close_and_wait = observed

@dataclass(frozen=True)
class Request:
    path: str
    offset: int
    length: int

main = threading.main_thread().ident

def hang(request, view):  # a read from a hung mount: never ends
    if request.offset == 0:
        signal.pthread_kill(main, signal.SIG{name})
        ending.wait(30)
        time.sleep(0.2)
        signal.pthread_kill(main, signal.SIG{name})  # waited through, and said
        time.sleep(0.5)
        signal.pthread_kill(main, signal.SIG{name})  # once more: stop now
    time.sleep(3600)

print("a run measured before the stop")  # a pipe's buffer: flushed before the exit
with threads.last_words(lambda: print("last words: the runs measured, written")):
    Window(None, None, 2, progress=False).run([Request("f", n, 1) for n in range(4)],
                                              into=lambda r: None, read=hang)
"""


def _script(code: str) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)  # fmt: skip
    assert time.monotonic() - started < 30, done.stderr
    return done


@pytest.mark.parametrize("name,code", [("INT", 130), ("TERM", 143)])
def test_a_third_interruption_ends_a_wait_that_would_never_end(name, code):
    """A read hung on a dead NFS mount never ends, and a waited-through Ctrl-C would
    wait for ever: the one after it ends the process at once, with its signal's status,
    once its last words are said (the runs measured so far written) and what it had
    printed is flushed."""
    done = _script(_HUNG_WINDOW.replace("{name}", name))
    assert done.returncode == code, done.stderr
    assert done.stderr.strip().splitlines() == [
        "ckptprof: stopping once the fetch requests under way end (once more: stop now, "
        "leaving them unfinished)",
        "ckptprof: stopped now, with the fetch requests under way unfinished (the temporary "
        "files or incomplete uploads they were writing may remain)",
    ], done.stderr
    assert done.stdout.splitlines() == [
        "a run measured before the stop",
        "last words: the runs measured, written",
    ]


_TWO_WAITS = """
import signal, threading, time
from ckptprof.cli import _raise_on_signals
from ckptprof.threads import through_interrupts

_raise_on_signals()
main, first_done = threading.main_thread().ident, threading.Event()

def interrupt(after, then=None):
    time.sleep(after)
    signal.pthread_kill(main, signal.SIGINT)
    if then is not None:
        time.sleep(0.3)
        then.set()

threading.Thread(target=interrupt, args=(0.3, first_done), daemon=True).start()
try:
    through_interrupts(lambda: first_done.wait(30), "uploads")  # the notice, said here
finally:  # the same stop, a later wait that never ends: one more Ctrl-C stops it now
    threading.Thread(target=interrupt, args=(0.3,), daemon=True).start()
    through_interrupts(lambda: threading.Event().wait(3600), "writes")
"""


def test_the_notice_holds_for_every_later_wait_of_the_same_stop():
    """Said once in one wait, the notice's "once more: stop now" holds in the next wait
    of the same stop: the interruption after it ends the process, not a second notice."""
    done = _script(_TWO_WAITS)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines() == [
        "ckptprof: stopping once the uploads under way end (once more: stop now, leaving "
        "them unfinished)",
        "ckptprof: stopped now, with the writes under way unfinished (the temporary files or "
        "incomplete uploads they were writing may remain)",
    ], done.stderr


def test_work_not_started_when_a_pool_is_left_reads_as_cancelled():
    """What was queued when the block was left never runs, and its future says so
    (``cancelled()``), as ``ThreadPoolExecutor``'s own ``cancel_futures`` does."""
    from ckptprof.threads import thread_pool

    started, release, ran = threading.Event(), threading.Event(), []

    def work(n):
        if n == 0:
            started.set()
            release.wait(30)
        ran.append(n)

    def release_once_the_rest_are_cancelled(futures):
        deadline = time.monotonic() + 30
        while not all(f.cancelled() for f in futures[1:]) and time.monotonic() < deadline:
            time.sleep(0.01)
        release.set()

    with pytest.raises(RuntimeError), thread_pool(1, "tests") as pool:
        futures = [pool.submit(work, n) for n in range(4)]
        assert started.wait(30)  # request 0 is under way
        threading.Thread(target=release_once_the_rest_are_cancelled, args=(futures,)).start()
        raise RuntimeError("the caller fails while request 0 is under way")
    assert ran == [0] and futures[0].done() and not futures[0].cancelled()
    assert all(f.cancelled() for f in futures[1:])
