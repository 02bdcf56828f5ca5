"""Recording one save or restore: the :class:`Operation` every producer of checkpoint
spans records through.

The synthetic runner and the Lightning / Hugging Face / DeepSpeed adapters all get
their operations from :class:`~ckptprof.tracing.tracer.CheckpointTracer`; none of them
creates phase spans on its own. A phase may be entered many times and from several
threads (fetch of file 2 while file 1 is deserialized): its span covers the real
interval from first entry to last exit, and ``ckpt.busy_s`` holds the union of the time
it was actually active, so overlapping phases are never shown as sequential.

The recorder is a guest: an internal error is logged once and swallowed, and an
exception from the host code is recorded on the root span and re-raised as is.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from ckptprof.phases import PROGRESS_SPAN, RESTORE_SPAN, SAVE_SPAN, Attr, Phase
from ckptprof.redact import scrub, scrub_attributes, strip_url_secrets
from ckptprof.tracing.guest import guest
from ckptprof.tracing.phase_spans import emit_phase_span
from ckptprof.tracing.sampling import StackSampler, attribute
from ckptprof.tracing.summary import (
    AttrValue,
    FileRecord,
    OperationSummary,
    PhaseStats,
    uncovered,
)


class Operation:
    """One save or restore: a root span plus aggregated phase spans.

    Use it as a context manager (``with tracer.restore(...) as op``) or call
    :meth:`finish` yourself when the end is in another callback (e.g. the first
    training step after a framework resume).
    """

    def __init__(
        self,
        tracer: trace.Tracer,
        kind: str,
        attributes: Mapping[str, AttrValue],
        per_file_spans: bool,
        links: list[Link] | None = None,
        parent: Context | None = None,
        stall_after_s: float | None = None,
    ) -> None:
        self.kind = kind
        self._tracer = tracer
        self._per_file_spans = per_file_spans
        self._lock = threading.Lock()
        self._phases: dict[str, PhaseStats] = {}
        self._open: dict[str, int] = {}  # phases inside a ``phase()`` block now
        self._opened_ns: dict[str, int] = {}  # when each of them was entered (the first)
        # every way in strips URL secrets (a presigned path): no span ever holds one
        self._attributes: dict[str, AttrValue] = scrub_attributes(attributes)
        self._start_ns = time.time_ns()
        self._end_ns: int | None = None
        self._summary: OperationSummary | None = None
        self._span = self._start_root(links, parent)
        self._watched = False
        #: the stack of the thread that began it, sampled by the watchdog (none for the
        #: background half of a save: that thread goes on training)
        self.sampler: StackSampler | None = None
        if stall_after_s:
            self._watch(stall_after_s)

    @guest
    def _watch(self, stall_after_s: float) -> None:
        from ckptprof.tracing.watchdog import watchdog

        if not self._attributes.get(Attr.SAVE_BACKGROUND):
            self.sampler = StackSampler(threading.get_ident(), self._start_ns)
        watchdog().watch(self, stall_after_s)
        self._watched = True

    @guest
    def _start_root(self, links, parent):
        name = RESTORE_SPAN if self.kind == "restore" else SAVE_SPAN
        return self._tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes=self._attributes,
            start_time=self._start_ns,
            links=links or None,
        )

    # ----------------------------------------------------------- recording
    @property
    def finished(self) -> bool:
        return self._end_ns is not None

    @property
    def start_ns(self) -> int:
        return self._start_ns

    @property
    def attributes(self) -> dict[str, AttrValue]:
        """A copy of the root span's attributes so far."""
        with self._lock:
            return dict(self._attributes)

    @property
    def latest_end_ns(self) -> int:
        """End of the latest recorded phase interval (the start when none yet)."""
        return self.latest_end_before()

    def latest_end_before(self, limit_ns: int | None = None) -> int:
        """End of the latest phase interval ending by ``limit_ns`` (the start when none)."""
        with self._lock:
            ends = [e for s in self._phases.values() for _, e in s.intervals]
        return max((e for e in ends if limit_ns is None or e <= limit_ns), default=self._start_ns)

    def phase_busy_s(self, phase: Phase | str) -> float:
        """Seconds ``phase`` has been busy so far (its intervals' union)."""
        stats = self._stats(phase)
        with self._lock:
            return stats.busy_s

    def add_interval_around(self, phase: Phase | str, start_ns: int, end_ns: int) -> None:
        """``[start, end)`` as ``phase``, less what other phases recorded inside it (a
        load the framework runs during its first step stays the load's)."""
        name = phase.value if isinstance(phase, Phase) else str(phase)
        with self._lock:
            taken = [i for n, s in self._phases.items() if n != name for i in s.intervals]
        for gap in uncovered(start_ns, end_ns, [(max(s, start_ns), e) for s, e in taken]):
            self.add_interval(phase, *gap)

    @property
    def span_context(self):
        return self._span.get_span_context() if self._span is not None else None

    @guest
    def link_to(self, trace_id: str, span_id: str, **attributes: AttrValue) -> None:
        """Link this operation to another span by its hex ids (e.g. the save that wrote
        the checkpoint being restored), while it is still open."""
        from opentelemetry.trace import SpanContext, TraceFlags

        if self._span is None or not trace_id or not span_id:
            return
        context = SpanContext(
            int(trace_id, 16), int(span_id, 16), is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )  # fmt: skip
        self._span.add_link(context, scrub_attributes(attributes) or None)

    def _stats(self, phase: Phase | str) -> PhaseStats:
        name = phase.value if isinstance(phase, Phase) else str(phase)
        with self._lock:
            stats = self._phases.get(name)
            if stats is None:
                stats = self._phases[name] = PhaseStats(name)
            return stats

    @contextmanager
    def phase(self, phase: Phase | str, **attributes: AttrValue) -> Iterator[PhaseStats]:
        """Time one stretch of ``phase``; may be entered many times, from many threads."""
        stats = self._stats(phase)
        start = time.time_ns()
        try:
            with self.running(phase):
                yield stats
        finally:
            end = time.time_ns()
            with self._lock:
                stats.intervals.append((start, end))
                stats.attributes.update(scrub_attributes(attributes))

    @contextmanager
    def running(self, phase: Phase | str) -> Iterator[None]:
        """``phase`` is under way, its time recorded elsewhere (``add_interval`` from the
        workers): what the stall watchdog names as the phase a stall is in."""
        name = phase.value if isinstance(phase, Phase) else str(phase)
        with self._lock:
            self._open[name] = self._open.get(name, 0) + 1
            self._opened_ns.setdefault(name, time.time_ns())
        try:
            yield
        finally:
            with self._lock:
                self._open[name] -= 1
                if not self._open[name]:
                    del self._open[name]
                    del self._opened_ns[name]

    # ----------------------------------------------------------- progress (the watchdog's)
    def open_phases(self) -> list[str]:
        """The phases inside a ``phase()`` block now, in the order they began."""
        with self._lock:
            return list(self._open)

    def progress_signature(self) -> tuple:
        """Changes whenever the operation makes visible progress (a phase begins or
        ends, bytes or files are recorded)."""
        with self._lock:
            return (
                tuple(self._open.items()),
                sum(len(s.intervals) for s in self._phases.values()),
                sum(s.nbytes for s in self._phases.values()),
                sum(len(s.files) for s in self._phases.values()),
            )

    def phase_state(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The phases open now and those begun so far: changes when a phase begins or ends
        (what an in-progress record is written for)."""
        with self._lock:
            begun = tuple(n for n, s in self._phases.items() if s.intervals or n in self._open)
            return tuple(self._open), begun

    @guest
    def record_progress(
        self,
        reason: str,
        moved: int = 0,
        in_flight: list | None = None,
        extra: Mapping[str, AttrValue] | None = None,
    ) -> None:
        """Append an in-progress record: a ``ckpt.progress`` span under the root (which is
        written only when the operation finishes) with the root's attributes, the phases
        begun and their busy seconds so far (an open phase's current stretch included),
        the open phase, the bytes moved (``moved``: the I/O core's count, when larger
        than the phases'), the requests ``in_flight`` (``activity.InFlight``) and ``extra``
        (a stall's stacks). A process killed later leaves this much (docs/design.md §2)."""
        if self._span is None or self.finished:
            return
        now = time.time_ns()
        with self._lock:
            busy: dict[str, float] = {}
            starts: dict[str, int] = {}
            for name, stats in self._phases.items():
                if stats.intervals:
                    busy[name], starts[name] = stats.busy_s, stats.start_ns
            for name, opened in self._opened_ns.items():
                busy[name] = busy.get(name, 0.0) + (now - opened) / 1e9
                starts[name] = min(starts.get(name, opened), opened)
            open_now = list(self._open)
            nbytes = sum(s.nbytes for s in self._phases.values())
            attrs = dict(self._attributes)
        order = sorted(busy, key=starts.__getitem__)
        attrs.update(
            {
                Attr.PROGRESS_OF: self.kind,
                Attr.PROGRESS_REASON: reason,
                Attr.PROGRESS_ELAPSED_S: round((now - self._start_ns) / 1e9, 3),
                Attr.PROGRESS_PHASES: order,
                Attr.PROGRESS_PHASE_BUSY_S: [round(busy[n], 6) for n in order],
                Attr.PROGRESS_BYTES: max(int(moved), nbytes),
                Attr.PROGRESS_IN_FLIGHT: len(in_flight or ()),
            }
        )
        if open_now:
            attrs[Attr.PROGRESS_OPEN_PHASE] = open_now[-1]
        if in_flight:
            attrs[Attr.PROGRESS_WAITING_ON] = str(in_flight[0].where)
        attrs.update(extra or {})
        context = trace.set_span_in_context(self._span)
        span = self._tracer.start_span(
            PROGRESS_SPAN, context=context, start_time=now, attributes=scrub_attributes(attrs)
        )
        span.end(end_time=now)

    def bytes_so_far(self) -> int:
        with self._lock:
            return sum(s.nbytes for s in self._phases.values())

    @guest
    def add_stall_event(self, name: str, attributes: dict) -> None:
        """An event on the span of the phase open now (the latest begun), else the root's."""
        attributes = scrub_attributes(attributes)
        now = time.time_ns()
        with self._lock:
            open_now = list(self._open)
            stats = self._phases.get(open_now[-1]) if open_now else None
            if stats is not None:
                stats.events.append((name, now, attributes))
                return
        if self._span is not None:
            self._span.add_event(name, attributes, timestamp=now)

    def add_interval(self, phase: Phase | str, start_ns: int, end_ns: int) -> None:
        """Record a stretch of ``phase`` measured elsewhere (e.g. in a worker)."""
        stats = self._stats(phase)
        with self._lock:
            stats.intervals.append((start_ns, end_ns))

    @guest
    def add_file(
        self,
        phase: Phase | str,
        path: str,
        nbytes: int,
        seconds: float,
        start_ns: int | None = None,
    ) -> None:
        """Aggregate one file's work onto the phase span (thread-safe)."""
        stats = self._stats(phase)
        with self._lock:
            stats.files.append(
                FileRecord(strip_url_secrets(str(path)), int(nbytes), float(seconds), start_ns)
            )
            stats.nbytes += int(nbytes)

    def add_bytes(self, phase: Phase | str, nbytes: int) -> None:
        stats = self._stats(phase)
        with self._lock:
            stats.nbytes += int(nbytes)

    def phase_stats(self) -> dict[str, PhaseStats]:
        """The phases recorded so far (name -> stats; the stats are live, do not modify)."""
        with self._lock:
            return {n: s for n, s in self._phases.items() if s.intervals}

    def set_phase_attributes(self, phase: Phase | str, **attributes: AttrValue) -> None:
        stats = self._stats(phase)
        with self._lock:
            stats.attributes.update(scrub_attributes(attributes))

    def set_attributes(self, attributes: Mapping[str, AttrValue]) -> None:
        with self._lock:
            self._attributes.update(scrub_attributes(attributes))

    # ----------------------------------------------------------- finishing
    def __enter__(self) -> Operation:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish(error=exc)

    def discard(self) -> None:
        """Leave it unrecorded: it did no work (a load that found no checkpoint). Off the
        watchdog, and its root span never ends, so nothing is exported; a later
        :meth:`finish` is a no-op."""
        if self._summary is not None:
            return
        if self._watched:
            self._unwatch()
        if self.sampler is not None:
            self.sampler.close()
        self._end_ns = time.time_ns()
        self._summary = OperationSummary(self.kind, 0.0, {}, dict(self._attributes))

    def finish(self, error: BaseException | None = None) -> OperationSummary:
        """End the root span and emit the phase spans. Idempotent.

        The end is now, or the end of the latest phase interval when one was recorded
        into the future (an emulated phase appended after the real work).
        """
        if self._summary is not None:
            return self._summary
        if self._watched:
            self._unwatch()
        now = time.time_ns()
        with self._lock:
            latest = max((e for s in self._phases.values() for _, e in s.intervals), default=now)
            phases = {n: s for n, s in self._phases.items() if s.intervals}
        self._end_ns = max(now, latest)
        if self.sampler is not None:
            self._name_outside(list(phases.values()))
        wall_s = (self._end_ns - self._start_ns) / 1e9
        self._summary = OperationSummary(self.kind, wall_s, phases, dict(self._attributes))
        self._emit(self._summary, error)
        return self._summary

    @guest
    def _name_outside(self, phases: list[PhaseStats]) -> None:
        """The time outside every phase, given to the functions sampled there."""
        samples = self.sampler.close()
        intervals = [i for stats in phases for i in stats.intervals]
        every = self.sampler.sample_every_s
        self._attributes.update(attribute(samples, intervals, self._start_ns, self._end_ns, every))

    @guest
    def _unwatch(self) -> None:
        from ckptprof.tracing.watchdog import watchdog

        self._watched = False
        watchdog().unwatch(self)

    @property
    def summary(self) -> OperationSummary | None:
        return self._summary

    @guest
    def _emit(self, summary: OperationSummary, error: BaseException | None) -> None:
        root = self._span
        if root is None:
            return
        ctx = trace.set_span_in_context(root)
        for stats in summary.phases.values():
            emit_phase_span(self._tracer, ctx, stats, self._per_file_spans)
        root.set_attributes(self._attributes)
        root.set_attribute(Attr.WALL_S, round(summary.wall_s, 6))
        root.set_attribute(Attr.PHASE_SUM_S, round(summary.phase_sum_s, 6))
        if error is not None:
            root.record_exception(error, _exception_attributes(error))
            message = scrub(f"{type(error).__name__}: {error}")
            root.set_status(Status(StatusCode.ERROR, message))
        root.end(end_time=self._end_ns)


def _exception_attributes(error: BaseException) -> dict[str, str]:
    """The SDK's ``exception.*`` attributes, URL secrets stripped (a failed fetch's
    message names the URL it fetched)."""
    import traceback

    stack = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return {"exception.message": scrub(str(error)), "exception.stacktrace": scrub(stack)}


def phase_or_nothing(op: Operation | None, phase: Phase | str):
    """``op.phase(phase)``, or a no-op block without an operation."""
    return op.phase(phase) if op is not None else contextlib.nullcontext()
