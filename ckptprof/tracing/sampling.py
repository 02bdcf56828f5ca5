"""Naming the time of a save or restore that no phase accounts for.

A resume's phases are what ckptprof times (the loaders, the first step); the rest of its
RTO is the framework's and the user's own code between them (a callback's
``on_train_begin``, an optimizer built, a data loader's workers started). While an
operation is open, the stall watchdog's thread (:mod:`ckptprof.tracing.watchdog`; no
thread of its own) looks at the stack of the thread that began the operation every
:data:`SAMPLE_EVERY_S`. When the operation ends, the time outside every phase is given to
the function on top of the stack at each sample taken there (the innermost frame of user
or framework code: the standard library's plumbing is skipped, and ckptprof's own frames,
its wrappers around the code that did the work; ckptprof's own work on top is named as
"ckptprof, called from" that code), and the root span carries the :data:`TOP_FUNCTIONS`
largest (``ckpt.outside.*``).

Memory is bounded: past :data:`MAX_SAMPLES`, neighbouring samples are joined in pairs
and the sampler looks half as often (a long stall keeps its whole span, coarser).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import sysconfig
import threading
import time
import weakref
from bisect import bisect_right
from collections import Counter, defaultdict
from pathlib import Path

from ckptprof.phases import Attr

#: how often the training thread's stack is looked at while an operation is open
SAMPLE_EVERY_S = 0.05
#: the functions named on the span (the largest first)
TOP_FUNCTIONS = 5
#: samples kept per operation before they are joined in pairs (~20 minutes at 50 ms)
MAX_SAMPLES = 24_000

Function = tuple[str, str]  # (qualified name, file)


def _own_folders() -> tuple[str, ...]:
    """ckptprof's package folders (``ckptprof.integrations`` lives apart from it)."""
    folders = [str(Path(__file__).resolve().parents[1])]
    spec = importlib.util.find_spec("ckptprof.integrations")  # None: run from a source tree
    if spec is not None:
        folders += [str(Path(p).resolve()) for p in (spec.submodule_search_locations or ())]
    return tuple(folder + os.sep for folder in folders)


_OWN = _own_folders()
#: the standard library's plumbing that runs on top of the code that called it: threading's
#: waits, context managers' entry and exit, weakref's callbacks (run inside a garbage
#: collection the code below triggered)
_PLUMBING = {str(Path(m.__file__).resolve()) for m in (threading, contextlib, weakref)}
_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve()) + os.sep
_kinds: dict[str, str] = {}


def _kind(filename: str) -> str:
    """``own`` (ckptprof), ``plumbing`` (never what the time was spent in) or ``code``."""
    found = _kinds.get(filename)
    if found is None:
        path = os.path.realpath(filename)
        found = "own" if path.startswith(_OWN) else "plumbing" if path in _PLUMBING else "code"
        _kinds[filename] = found
    return found


def top_function(frame) -> tuple[Function, int] | None:
    """The innermost frame of user or framework code: ((qualified name, file), line).
    ckptprof's own work on top is named as such, with the code that called it."""
    ours = False
    while frame is not None:
        code = frame.f_code
        kind = _kind(code.co_filename)
        if kind == "code":
            name = getattr(code, "co_qualname", code.co_name)  # co_qualname: Python 3.11+
            name = f"ckptprof, called from {name}" if ours else name
            return (name, code.co_filename), frame.f_lineno
        ours = ours or kind == "own"
        frame = frame.f_back
    return None


class StackSampler:
    """The stack of one thread while one operation is open: each sample is the time since
    the previous one and the function then on top. Fed by the watchdog's thread, read by
    the operation's when it ends."""

    def __init__(self, thread_id: int, start_ns: int) -> None:
        self.thread_id = thread_id
        self._lock = threading.Lock()
        self._last_ns = start_ns
        self._samples: list[tuple[int, int, tuple[Function, int] | None]] = []
        self._stride, self._ticks = 1, 0
        self.closed = False

    def sample(self, frames: dict) -> None:
        """One look at the thread's stack (``frames``: ``sys._current_frames()``)."""
        self._ticks += 1
        if self.closed or self._ticks % self._stride:
            return
        frame = frames.get(self.thread_id)
        if frame is None:
            return
        seen = top_function(frame)
        now = time.time_ns()
        with self._lock:
            self._samples.append((self._last_ns, now, seen))
            self._last_ns = now
            if len(self._samples) >= MAX_SAMPLES:
                pairs = zip(self._samples[::2], self._samples[1::2], strict=False)
                self._samples = [(a[0], b[1], b[2]) for a, b in pairs]
                self._stride *= 2

    def close(self) -> list[tuple[int, int, tuple[Function, int] | None]]:
        """No more samples; the ones taken, oldest first."""
        with self._lock:
            self.closed = True
            return list(self._samples)

    @property
    def sample_every_s(self) -> float:
        return SAMPLE_EVERY_S * self._stride


def sample_all(samplers: list[StackSampler]) -> None:
    """One look at every sampled thread (the frames are let go at once: a frame held
    keeps its locals, tensors included, alive)."""
    frames = sys._current_frames()
    try:
        for sampler in samplers:
            sampler.sample(frames)
    finally:
        del frames


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _covered(at: int, busy: list[tuple[int, int]], starts: list[int]) -> bool:
    index = bisect_right(starts, at) - 1
    return index >= 0 and busy[index][1] >= at


def _outside_ns(start: int, end: int, busy: list[tuple[int, int]], starts: list[int]) -> int:
    """The part of ``(start, end]`` no interval of ``busy`` (merged, sorted) covers."""
    total, cursor = 0, start
    for s, e in busy[max(bisect_right(starts, start) - 1, 0) :]:
        if s >= end:
            break
        if s > cursor:
            total += s - cursor
        cursor = max(cursor, e)
    return total + max(end - cursor, 0)


def short_path(filename: str) -> str:
    """A file as a reader finds it: from its package (``transformers/trainer.py``), the
    standard library's or the working folder, else as it is."""
    for marker in ("site-packages", "dist-packages"):
        _, found, rest = filename.partition(f"{os.sep}{marker}{os.sep}")
        if found:
            return rest
    if filename.startswith(_STDLIB):
        return filename.removeprefix(_STDLIB)
    relative = os.path.relpath(filename) if os.path.isabs(filename) else filename
    return filename if relative.startswith("..") else relative


def attribute(
    samples: list[tuple[int, int, tuple[Function, int] | None]],
    phases: list[tuple[int, int]],
    start_ns: int,
    end_ns: int,
    sample_every_s: float = SAMPLE_EVERY_S,
) -> dict[str, object]:
    """The root's ``ckpt.outside.*`` attributes: the time of ``[start_ns, end_ns]`` outside
    every phase interval, named by the samples taken outside them. The time between two
    samples is split: the earlier one's function gets half a sample period at most (what
    began or ended between them gets half the gap, not all or none), the later one's the
    rest. A gap much longer than the period means the sampler could not run: the thread
    held the interpreter (a garbage collection, a C call that keeps the GIL), and the
    function it is found in after that is the one that held it."""
    busy = _merged([(max(s, start_ns), min(e, end_ns)) for s, e in phases if e > s])
    starts = [s for s, _ in busy]
    seconds: dict[Function, float] = defaultdict(float)
    lines: dict[Function, Counter] = defaultdict(Counter)
    before: tuple[Function, int] | None = None  # what the previous sample saw outside phases
    half = round(sample_every_s * 1e9 / 2)
    for begin, at, seen in samples:
        at, begin = min(at, end_ns), max(begin, start_ns)
        middle = begin + min((at - begin) // 2, half) if before is not None else begin
        if before is not None:
            seconds[before[0]] += _outside_ns(begin, middle, busy, starts) / 1e9
        before = None if seen is None or _covered(at, busy, starts) else seen
        if before is not None:
            seconds[before[0]] += _outside_ns(middle, at, busy, starts) / 1e9
            lines[before[0]][before[1]] += 1
    if before is not None and samples:  # after the last sample: as between two
        last = min(samples[-1][1], end_ns)
        seconds[before[0]] += _outside_ns(last, min(last + half, end_ns), busy, starts) / 1e9
    top = sorted(seconds.items(), key=lambda kv: -kv[1])[:TOP_FUNCTIONS]
    attrs: dict[str, object] = {
        Attr.OUTSIDE_S: round(_outside_ns(start_ns, end_ns, busy, starts) / 1e9, 6),
        Attr.OUTSIDE_NAMED_S: round(sum(seconds.values()), 6),
        Attr.OUTSIDE_SAMPLE_EVERY_S: sample_every_s,
    }
    if top:
        attrs[Attr.OUTSIDE_FUNCTIONS] = [
            f"{name} ({short_path(file)}:{lines[(name, file)].most_common(1)[0][0]})"
            for (name, file), _ in top
        ]
        attrs[Attr.OUTSIDE_FUNCTION_S] = [round(s, 6) for _, s in top]
    return attrs


__all__ = [
    "MAX_SAMPLES", "SAMPLE_EVERY_S", "TOP_FUNCTIONS", "StackSampler", "attribute",
    "sample_all", "short_path", "top_function",
]  # fmt: skip
