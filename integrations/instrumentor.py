"""The base every framework adapter builds on, in the style of OpenTelemetry's contrib
instrumentations: one instrumentor per framework, a declared table of patch targets,
idempotent ``instrument`` / ``uninstrument``, and nothing left behind.

An :class:`Instrumentor` traces one framework object (a Lightning ``Trainer``, a Hugging
Face ``Trainer``, a DeepSpeed engine). It owns:

* a :class:`~ckptprof.integrations.session.TracingSession` (telemetry and operations),
* a :class:`~ckptprof.integrations.patching.Patcher` applying its ``targets`` table,
* :class:`~ckptprof.integrations.files.CheckpointFiles` (list/fetch/verify/commit),
* while asked for, an :class:`~ckptprof.interrupt.guard.InterruptionGuard`.

``uninstrument`` undoes all of it — patches, signal handlers, threads, open files — and
runs on every exit path: the adapter calls it at the framework's end and on its
exceptions, and a finalizer calls it when the object is garbage collected or the
interpreter exits. The finalizer holds nothing that refers back to the traced object.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from ckptprof.errors import CkptprofError
from ckptprof.integrations.files import CheckpointFiles
from ckptprof.integrations.patching import Patcher, Target, resolve
from ckptprof.integrations.session import TracingSession
from ckptprof.phases import Phase
from ckptprof.state import StateStore
from ckptprof.tracing.recorder import Operation
from ckptprof.tracing.summary import OperationSummary, uncovered

log = logging.getLogger("ckptprof")

GUARD_OPTIONS = (
    "sources",
    "metadata_url",
    "signal_grace_s",
    "cost_per_hour_usd",
    "agree_across_ranks",
)


class _Live:
    """What must be released however the job ends (see the module docstring)."""

    def __init__(self, session: TracingSession, owns_session: bool) -> None:
        self.session = session
        self.owns_session = owns_session
        self.guard = None

    def stop_guard(self):
        guard, self.guard = self.guard, None
        self.session.interruptions = None
        if guard is not None:
            guard.close()
        return guard

    def release(self) -> None:
        """Stop watching for notices, close telemetry, then hand on a noted signal."""
        guard = self.stop_guard()
        if self.owns_session:
            self.session.close()
        if guard is not None:
            guard.release_signal()


def _weakly(method: Callable) -> Callable:
    """``method`` of an object, called only while that object lives (no reference kept)."""
    ref = weakref.WeakMethod(method)

    def call(*args, **kwargs):
        bound = ref()
        return None if bound is None else bound(*args, **kwargs)

    return call


def check_interruption_options(options: Any) -> None:
    """``interruptions=`` is False, True or a dict of guard options: one clear error else."""
    if isinstance(options, bool) or options is None:
        return
    unknown = sorted(set(options) - set(GUARD_OPTIONS)) if isinstance(options, dict) else None
    if unknown is None or unknown:
        raise CkptprofError(
            f"interruptions={options!r}: expected True or a dict of "
            f"{', '.join(GUARD_OPTIONS)} (unknown: {', '.join(map(str, unknown or []))})."
        )


class Instrumentor:
    """Tracing of one framework object; subclasses declare the framework and its table.

    Args:
        trace_dir: where the JSON-lines trace goes (default ``$CKPTPROF_TRACE_DIR`` or
            ``./ckptprof-traces``); OTLP follows the standard ``OTEL_*`` variables.
        tracer_provider: record into this OpenTelemetry provider instead.
        verify: ``size`` (default), ``full`` (xxh3, one extra read per save and resume)
            or ``none``.
        strict: refuse a resume whose files do not match what the save recorded (by
            default a mismatch is a warning and the framework loads as usual).
        state_dir: where ckptprof keeps its records (:mod:`ckptprof.state`).
        interruptions: ``True`` or a dict of guard options to save on a notice.
        log_metrics: also log each traced restore's RTO and phase seconds (and each save's)
            through the framework's own loggers (default True).
        rank: ``ckpt.rank`` (default from ``RANK``).
        session: trace into another adapter's session (its operations are ours).
    """

    framework: ClassVar[str]
    distribution: ClassVar[str]
    known_versions: ClassVar[str]
    loader_name: ClassVar[str]
    targets: ClassVar[tuple[Target, ...]] = ()
    #: start telemetry when instrumenting (else at the framework's own start: HF train())
    starts_telemetry: ClassVar[bool] = True

    def __init__(
        self,
        *,
        trace_dir=None,
        tracer_provider=None,
        verify: str = "size",
        strict: bool = False,
        state_dir=None,
        interruptions: bool | dict = False,
        log_metrics: bool = True,
        rank: int | None = None,
        session: TracingSession | None = None,
    ) -> None:
        check_interruption_options(interruptions)
        owns = session is None
        self.session = session or TracingSession(
            self.framework, trace_dir=trace_dir, tracer_provider=tracer_provider, rank=rank
        )
        self.patcher = Patcher(self.framework, self.distribution, self.known_versions)
        self.files = CheckpointFiles(
            self.session, self.loader_name, verify, strict, StateStore(state_dir)
        )
        self.interruption_options = interruptions
        self.root: Any = None
        self._records_dir_of: Callable[[], str | None] = lambda: None
        self._live = _Live(self.session, owns)
        self._finalizer: weakref.finalize | None = None
        if owns and log_metrics:  # weakly: the session outlives nothing it should not
            self.session.metrics_sink = _weakly(self.log_metrics)
        if owns:  # the job's identity across restarts, for the goodput report
            self.session.checkpoint_dir = _weakly(self._records_dir)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Hand ``metrics`` to the traced framework's loggers (adapters override)."""

    def _records_dir(self) -> str | None:
        """The job's checkpoint folder, once known (adapters that know it override)."""
        return None

    # ------------------------------------------------------------------ lifecycle
    @property
    def instrumented(self) -> bool:
        return self.root is not None

    def instrument(self, root: Any) -> Instrumentor:
        """Trace ``root``; a second call for the same object is a no-op."""
        if self.root is root:
            log.debug("ckptprof: %s already instrumented", type(root).__name__)
            return self
        if self.root is not None:
            self.uninstrument()
        try:
            self.root = root
            if self.starts_telemetry:
                self.session.start()
            self.apply(self.targets, root)
            self._finalizer = weakref.finalize(root, self._live.release)
        except CkptprofError:
            self.uninstrument()
            raise
        except Exception as exc:  # noqa: BLE001 - never the job's problem
            self.uninstrument()
            self.session.warn_once("instrument", exc)
        return self

    def uninstrument(self) -> None:
        """Undo everything this instrumentor did; safe to call twice, on any path."""
        self.patcher.unwrap_all()
        self.root = None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self.end_run()

    def end_run(self) -> None:
        """What a run leaves open: stop watching for notices, flush and close telemetry,
        then hand on a signal that was noted but never passed on."""
        self._live.release()

    def apply(
        self, targets: Iterable[Target], root: Any, scope: contextlib.ExitStack | None = None
    ) -> None:
        """Wrap ``targets`` on ``root``'s objects: until :meth:`uninstrument`, or only
        until ``scope`` closes."""
        for target in targets:
            if target.when is not None and not getattr(self, target.when)(root):
                continue
            obj = resolve(root, target.owner)
            options = {"label": target.label, "phase": target.phase, "params": target.params}
            make = getattr(self, target.wrapper)
            if scope is None:
                self.patcher.wrap(obj, target.name, make, **options)
            else:
                scope.enter_context(self.patcher.scoped(obj, target.name, make, **options))

    # ------------------------------------------------------------------ timing helpers
    def split(
        self,
        op: Operation | None,
        phase: Phase | str,
        fn: Callable,
        *args,
        inner: Iterable[tuple[Any, str, Phase | str | None]] = (),
        **kwargs,
    ):
        """Run the framework's ``fn`` as ``phase``, except time inside the ``inner`` methods.

        ``inner`` names ``(object, method, phase)``: while ``fn`` runs, each such method is
        timed as its own phase (e.g. ``model.load_state_dict`` as ``reshard`` inside a
        loader that is otherwise ``deserialize``), so the two never double count. A phase
        of ``None`` only leaves the method's time out (it records its own phases).
        """
        if op is None:
            return fn(*args, **kwargs)
        taken: list[tuple[int, int]] = []

        def timer(inner_phase):
            def make(original):
                def timed_method(*a, **kw):
                    start = time.time_ns()
                    try:
                        return original(*a, **kw)
                    finally:
                        end = time.time_ns()
                        taken.append((start, end))
                        if inner_phase is not None:
                            op.add_interval(inner_phase, start, end)

                return timed_method

            return make

        with contextlib.ExitStack() as stack:
            for obj, name, inner_phase in inner:
                if obj is not None:
                    label = f"{type(obj).__name__}.{name}"
                    what = f"the time of {name} inside {getattr(phase, 'value', phase)}"
                    stack.enter_context(
                        self.patcher.scoped(obj, name, timer(inner_phase), label=label, phase=what)
                    )
            start = time.time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                for gap in uncovered(start, time.time_ns(), taken):
                    op.add_interval(phase, *gap)

    # ------------------------------------------------------------------ interruptions
    def watch_interruptions(
        self,
        location: Callable[[], str | None],
        save: Callable[[], str | None],
        stop: Callable[[], None] | None = None,
        start: bool = True,
    ) -> None:
        """Prepare for notices when ``interruptions`` asked for it (once), and start
        watching for them unless ``start`` is False (then ``interruptions.start()``
        does, later; a restore before that still links to the interrupted run).

        ``location`` gives the checkpoint directory whose records hold the interruption
        record; ``save`` saves the current state through the framework (traced).
        """
        options = self.interruption_options
        if not options:
            return
        if self._live.guard is not None:
            if start:
                self._live.guard.start()
            return
        from ckptprof.interrupt.guard import InterruptionGuard

        kwargs = {} if options is True else dict(options)
        self._records_dir_of = location
        callbacks = (_weakly(self._interruption_records), _weakly(save), stop and _weakly(stop))
        try:
            guard = InterruptionGuard(self.session, *callbacks, **kwargs)
        except CkptprofError:
            raise  # a bad option: the user's to fix
        except (TypeError, ValueError) as exc:
            raise CkptprofError(
                f"interruptions={options!r}: {exc}; expected True or a dict of "
                f"{', '.join(GUARD_OPTIONS)} (and numbers in CKPTPROF_SIGNAL_GRACE_S / "
                "CKPTPROF_COST_PER_HOUR)."
            ) from None
        self._live.guard = self.session.interruptions = guard
        if start:
            try:
                guard.start()
            except Exception as exc:  # noqa: BLE001
                self.session.warn_once("interruptions", exc)

    def _interruption_records(self) -> str | None:
        """Where the interruption record about this job's checkpoint directory lives."""
        directory = self._records_dir_of()
        return self.files.state.location(directory) if directory else None

    @property
    def interruptions(self):
        """The guard while notices are watched, else None."""
        return self._live.guard


class GuestCallback:
    """What the framework callbacks share: their options, their last operations, and
    copying or pickling that carries the options only (live telemetry, locks and
    threads are made anew where the copy is used; a ``tracer_provider`` cannot cross a
    pickle, so an unpickled callback writes its own trace file)."""

    _options: dict[str, Any]
    _instrumentor: Instrumentor | None

    @property
    def last_restore(self) -> OperationSummary | None:
        """Summary of the last traced resume (RTO, phases), or None."""
        return self._instrumentor.session.last_restore if self._instrumentor else None

    @property
    def last_save(self) -> OperationSummary | None:
        """Summary of the last traced save, or None."""
        return self._instrumentor.session.last_save if self._instrumentor else None

    def __getstate__(self) -> dict[str, Any]:
        return {"_options": {k: v for k, v in self._options.items() if k != "tracer_provider"}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state["_options"])

    def __deepcopy__(self, memo: dict) -> GuestCallback:
        return type(self)(**self._options)


__all__ = ["GuestCallback", "Instrumentor", "check_interruption_options"]
