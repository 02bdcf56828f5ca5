"""A stalled save or restore named while it is stalled, without ever stopping it.

Every open :class:`~ckptprof.tracing.recorder.Operation` is watched by one daemon thread
per process, which checks at most once a second (and only while an operation is open: it
leaves with the last one, so a job's threads are as they were); between checks it
samples the stack of the thread that began each operation every
:data:`~ckptprof.tracing.sampling.SAMPLE_EVERY_S` (what :mod:`ckptprof.tracing.sampling`
names the time outside every phase with). Progress is a phase
beginning or ending, a phase recording bytes or files, the I/O core moving bytes, or a
file a framework's writer fills growing on disk (:mod:`ckptprof.activity`). When none of
it happens for ``stall_after`` seconds, one warning names the rank, host, phase, the file
or object in flight, the bytes so far and how long; the stacks of the process's threads
go into the log and, as a ``ckpt.stall`` event, onto the open phase's span, and into an
in-progress record. The warning repeats at doubling intervals while the stall lasts; the
operation is never interrupted.

The same thread appends an operation's in-progress records (``ckpt.progress``, see
:meth:`~ckptprof.tracing.recorder.Operation.record_progress`) once it has been open
:data:`PROGRESS_AFTER_S`: at each phase change it sees, every :data:`PROGRESS_EVERY_S`
while bytes move, and at each stall warning. A process killed mid-operation never writes
the operation's spans; its records say how far it got.

``stall_after``: ``$CKPTPROF_STALL_AFTER`` (seconds; ``0`` or ``off`` turns it off), else
:data:`DEFAULT_STALL_AFTER_S`, unless the caller gives one.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

from ckptprof import activity
from ckptprof.phases import STALL_EVENT, Attr
from ckptprof.tracing.sampling import SAMPLE_EVERY_S, sample_all
from ckptprof.units import fmt_bytes

log = logging.getLogger("ckptprof")

STALL_ENV = "CKPTPROF_STALL_AFTER"
#: long enough that a healthy load seldom trips it (ckptprof sees bytes read only through
#: its own I/O; a framework's torch.load of a large file shows no progress until it ends)
DEFAULT_STALL_AFTER_S = 120.0
MAX_STACK_CHARS = 32_000
#: an operation open this long gets in-progress records (a shorter one has little to lose)
PROGRESS_AFTER_S = 1.0
#: while bytes move and no phase changes, an in-progress record this often
PROGRESS_EVERY_S = 10.0


def stall_after_from_env(default: float = DEFAULT_STALL_AFTER_S) -> float | None:
    """Seconds without progress before a warning; None when turned off (a bad value is
    the default, said once in the log)."""
    raw = os.environ.get(STALL_ENV, "").strip().lower()
    if not raw:
        return default
    if raw in ("0", "off", "no", "false"):
        return None
    try:
        value = float(raw)
    except ValueError:
        log.warning(
            "ckptprof: warning: %s=%r is not a number of seconds; using %g.",
            STALL_ENV,
            raw,
            default,
        )
        return default
    return value if value > 0 else None


@dataclass
class _Watch:
    stall_after_s: float
    signature: tuple = ()
    changed: float = field(default_factory=time.monotonic)
    next_after_s: float = 0.0
    moved_at_start: int = 0
    warnings: int = 0
    started: float = field(default_factory=time.monotonic)
    recorded_state: tuple = ()  # the phase state of the latest in-progress record
    recorded_signature: tuple = ()
    recorded_at: float = 0.0


class Watchdog:
    """The process's one watcher of open operations (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[object, _Watch] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: the trace id (hex) of the operation watched last: the run a rank is in, or
        #: was in last (the straggler board compares ranks by it)
        self.latest_trace = ""

    def watch(self, op, stall_after_s: float) -> None:
        watch = _Watch(stall_after_s, next_after_s=stall_after_s, moved_at_start=activity.moved())
        watch.signature = self._signature(op)
        context = op.span_context
        with self._lock:
            self._watched[op] = watch
            if context is not None:
                self.latest_trace = format(context.trace_id, "032x")
            if self._thread is None or not self._thread.is_alive():
                self._stop = threading.Event()
                self._thread = threading.Thread(
                    target=self._run, args=(self._stop,), name="ckptprof-watchdog", daemon=True
                )
                self._thread.start()

    def unwatch(self, op) -> None:
        with self._lock:
            self._watched.pop(op, None)
            if self._watched or self._thread is None:
                return
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not threading.current_thread():
            thread.join(timeout=2.0)  # it wakes on the event at once

    def watched(self) -> list:
        """The operations open and watched now."""
        with self._lock:
            return list(self._watched)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self, stop: threading.Event) -> None:
        checked = time.monotonic()
        while True:
            with self._lock:
                watched = list(self._watched.items())
            tick = max(min([1.0] + [w.stall_after_s / 4 for _, w in watched]), 0.05)
            samplers = [op.sampler for op, _ in watched if getattr(op, "sampler", None)]
            if stop.wait(min(tick, SAMPLE_EVERY_S) if samplers else tick):
                return
            try:
                if samplers:
                    sample_all(samplers)
            except Exception as exc:  # noqa: BLE001 - a guest never breaks the job
                log.debug("ckptprof: stack sample failed: %s", exc)
            if time.monotonic() - checked < tick * 0.9:
                continue
            checked = time.monotonic()
            for op, watch in watched:
                try:
                    self._check(op, watch)
                except Exception as exc:  # noqa: BLE001 - a guest never breaks the job
                    log.debug("ckptprof: stall check failed: %s", exc)

    @staticmethod
    def _signature(op) -> tuple:
        return (op.progress_signature(), activity.moved(), activity.grown())

    def _check(self, op, watch: _Watch) -> None:
        now = time.monotonic()
        signature = self._signature(op)
        self._record_progress(op, watch, signature, now)
        if signature != watch.signature:
            watch.signature, watch.changed = signature, now
            watch.next_after_s = watch.stall_after_s
            return
        idle = now - watch.changed
        if idle < watch.next_after_s:
            return
        watch.warnings += 1
        watch.next_after_s *= 2
        line = describe(op, idle, activity.moved() - watch.moved_at_start, watch.next_after_s)
        stacks = thread_stacks()
        log.warning("%s\n%s", line, stacks)
        stall = {
            Attr.STALL_IDLE_S: round(idle, 3),
            Attr.STALL_MESSAGE: line.removeprefix("ckptprof: warning: "),
            Attr.STALL_STACKS: stacks[:MAX_STACK_CHARS],
            Attr.STALL_WARNING: watch.warnings,
        }
        moved, flying = activity.snapshot()
        op.record_progress("stall", moved - watch.moved_at_start, flying, stall)
        op.add_stall_event(STALL_EVENT, stall)

    @staticmethod
    def _record_progress(op, watch: _Watch, signature: tuple, now: float) -> None:
        """An in-progress record once the operation has been open a while: when a phase
        began or ended since the last one, or every :data:`PROGRESS_EVERY_S` while bytes
        move."""
        if now - watch.started < PROGRESS_AFTER_S:
            return
        state = op.phase_state()
        if state != watch.recorded_state:
            reason = "phase"
        elif signature != watch.recorded_signature and now - watch.recorded_at >= PROGRESS_EVERY_S:
            reason = "bytes"
        else:
            return
        moved, flying = activity.snapshot()
        op.record_progress(reason, moved - watch.moved_at_start, flying)
        watch.recorded_state, watch.recorded_signature, watch.recorded_at = state, signature, now


def describe(op, idle_s: float, moved: int, next_after_s: float) -> str:
    """The one-line warning: who, where, what is in flight, how much so far, how long."""
    attrs = op.attributes
    who = [op.kind]
    if attrs.get(Attr.RANK) is not None:
        who.append(f"rank {attrs[Attr.RANK]}")
    host = attrs.get(Attr.HOST)
    if host:
        who.append(f"on {host}")
    phases = op.open_phases()
    phase = f"in {', '.join(phases)}" if phases else "between phases"
    _, flying = activity.snapshot()
    if flying:
        oldest = flying[0]
        more = f" and {len(flying) - 1} more" if len(flying) > 1 else ""
        waiting = (
            f"; waiting on {oldest.where} ({fmt_bytes(oldest.nbytes)}, {oldest.age_s:.1f} s){more}"
        )
    else:
        waiting = ""
    so_far = moved or op.bytes_so_far()
    amount = f"{fmt_bytes(so_far)} moved so far" if so_far else "nothing moved yet"
    return (
        f"ckptprof: warning: {' '.join(who)} stalled {phase}: no progress for {idle_s:.1f} s "
        f"(no bytes moved, no phase change){waiting}; {amount}. The threads' "
        f"stacks follow and are in the trace; the job goes on (next warning after "
        f"{next_after_s:.0f} s without progress)."
    )


def thread_stacks() -> str:
    """Every thread's Python stack, named (what py-spy dump would show, from inside)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    blocks = []
    for ident, frame in sys._current_frames().items():
        if names.get(ident) == "ckptprof-watchdog":
            continue
        stack = "".join(traceback.format_stack(frame, limit=25))
        blocks.append(f'Thread "{names.get(ident, ident)}":\n{stack}')
    return "\n".join(blocks)


_watchdog = Watchdog()


def watchdog() -> Watchdog:
    return _watchdog


__all__ = ["DEFAULT_STALL_AFTER_S", "STALL_ENV", "STALL_EVENT", "Watchdog", "describe",
           "stall_after_from_env", "thread_stacks", "watchdog"]  # fmt: skip
