"""Where spans go, for the run's lifetime: :func:`setup_telemetry` builds the tracer
provider ckptprof owns, always with the local trace file and with OTLP when the standard
``OTEL_*`` variables ask for it; :class:`Telemetry` flushes and shuts it down, bounded.

Export is a guest in the training job: it runs on background threads, an
unreachable collector or an unwritable (or full) trace directory costs one warning,
and shutdown never waits longer than a bounded time: for the collector, its request
timeout and a little more, so a collector that never answers is still reported.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from ckptprof.tracing.otel_settings import (
    exporter_names,
    otlp_requested,
    sdk_disabled,
    warn_settings_once,
)
from ckptprof.tracing.otlp_exporter import WarnOnceExporter, otlp_exporter
from ckptprof.tracing.resource import build_resource
from ckptprof.tracing.trace_file import JsonLinesSpanExporter, resolve_trace_dir

log = logging.getLogger("ckptprof")

FILE_FLUSH_TIMEOUT_S = 5.0
PROVIDER_SHUTDOWN_TIMEOUT_S = 2.0
# shutdown waits for the collector this much longer than a request may take, so the
# last batch's failure (and its warning) is seen before the process ends
NETWORK_FLUSH_MARGIN_S = 2.0
#: the wait at shutdown for a collector whose last export failed: one more try, not the
#: whole request timeout at every fit's end (the trace file holds the spans; warned once)
FAILING_FLUSH_S = 1.0
#: the longest an exit path (the process ends next) waits for spans to leave
EXIT_FLUSH_MAX_S = 5.0
#: the share of a notice's remaining grace that flush may take (the rest is the job's)
EXIT_FLUSH_GRACE_SHARE = 0.25
#: the least it is given, even past the deadline (a deadline is seldom to the second)
EXIT_FLUSH_MIN_S = 0.5


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


@dataclass
class Telemetry:
    """A tracer provider owned by ckptprof (never installed as the global one)."""

    provider: TracerProvider
    trace_file: Path | None
    run_id: str
    file_processor: BatchSpanProcessor | None = None
    network_processor: BatchSpanProcessor | None = None
    file_exporter: JsonLinesSpanExporter | None = None
    network_exporter: WarnOnceExporter | None = None

    @property
    def trace_written(self) -> bool:
        """Whether the trace file holds every span so far (flush first)."""
        return (
            self.file_exporter is not None
            and not self.file_exporter.failed
            and self.trace_file is not None
            and self.trace_file.exists()
        )

    def describe_trace(self) -> str:
        """Where the spans went, for a run's last line: never a path to an empty file."""
        if self.trace_file is None:
            return "traces: none (OTEL_SDK_DISABLED=true)"
        if self.trace_written:
            return f"traces: {self.trace_file}"
        return f"traces: not written to {self.trace_file} (see the warning above)"

    def flush(self, wait: bool = True) -> None:
        """Make the trace file complete now (bounded); network export stays in background.

        ``wait=False`` starts the flush and returns at once (off the job's critical path).
        """
        if self.file_processor is not None:
            _bounded(
                lambda: self.file_processor.force_flush(),
                FILE_FLUSH_TIMEOUT_S if wait else 0,
                "the trace file",
            )

    def flush_before_exit(self, budget_s: float) -> bool:
        """The process ends next (a signal handed on after an emergency save, the
        interpreter's exit): send every span recorded so far to the trace file, then to
        the collector, waiting ``budget_s`` at most in all. One warning when they did not
        all leave in time; returns whether they did."""
        targets = [("the trace file", self.file_processor)]
        if self.network_exporter is not None:
            targets.append((self.network_exporter.description, self.network_processor))
        targets = [(name, p) for name, p in targets if p is not None]
        deadline = time.monotonic() + budget_s
        pending = [name for name, _ in targets]

        def flush_all() -> None:
            for name, processor in targets:
                left_ms = max(int((deadline - time.monotonic()) * 1000), 1)
                if processor.force_flush(left_ms):
                    pending.remove(name)

        _bounded(flush_all, budget_s)
        if pending:
            log.warning(
                "ckptprof: spans not all sent to %s within %.1f s before the exit; the "
                "trace file %s holds what was written (replay it: ckptprof export --otlp).",
                " and ".join(pending),
                budget_s,
                self.trace_file,
            )
        return not pending

    def _flush_at_exit(self) -> None:
        self.flush_before_exit(exit_flush_budget_s())

    def watch_exit(self) -> None:
        """Flush at the interpreter's exit (``sys.exit``, the end of the script), bounded;
        :meth:`shutdown` takes it back."""
        atexit.register(self._flush_at_exit)

    def shutdown(self) -> None:
        """Flush the trace file, give the collector its request timeout, never hang."""
        atexit.unregister(self._flush_at_exit)
        if self.file_processor is not None:
            _bounded(self.file_processor.shutdown, FILE_FLUSH_TIMEOUT_S, "the trace file")
        if self.network_processor is not None and self.network_exporter is not None:
            self._shut_network(self.network_processor, self.network_exporter)
        # processors are down: this only marks the provider shut
        _bounded(self.provider.shutdown, PROVIDER_SHUTDOWN_TIMEOUT_S)

    @staticmethod
    def _shut_network(processor: BatchSpanProcessor, exporter: WarnOnceExporter) -> None:
        """The last batch goes to the collector: its request timeout and a margin, or
        :data:`FAILING_FLUSH_S` for a collector known down; an attempt failing meanwhile
        (a refused connection is known at once) ends the wait, and the SDK's retries are
        stopped, so that no export thread outlives the fit (warned once already)."""
        before = exporter.failures
        patience = FAILING_FLUSH_S if exporter.failing else (
            exporter.timeout_s + NETWORK_FLUSH_MARGIN_S
        )  # fmt: skip
        worker = _start(processor.shutdown)
        deadline = time.monotonic() + patience
        while worker.is_alive() and exporter.failures == before:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            worker.join(min(left, 0.05))
        if not worker.is_alive():
            return
        failed = exporter.failures > before or exporter.failing
        exporter.abort()
        worker.join(FAILING_FLUSH_S)
        if worker.is_alive() and not failed:
            log.warning(
                "ckptprof: span export to %s did not finish within %.0f s; not waiting "
                "(spans still in flight are lost).", exporter.description, patience,
            )  # fmt: skip


def exit_flush_budget_s(seconds_left: float | None = None) -> float:
    """How long the flush before an exit may take: a share of the notice's remaining
    grace (``seconds_left``; None: no notice), within :data:`EXIT_FLUSH_MIN_S` and
    :data:`EXIT_FLUSH_MAX_S`."""
    if seconds_left is None:
        return EXIT_FLUSH_MAX_S
    share = max(seconds_left, 0.0) * EXIT_FLUSH_GRACE_SHARE
    return min(EXIT_FLUSH_MAX_S, max(EXIT_FLUSH_MIN_S, share))


def _bounded(fn, timeout_s: float, target: str | None = None) -> None:
    """Run ``fn`` on a daemon thread and stop waiting after ``timeout_s``; a wait that
    runs out is a warning naming ``target`` (None: quiet)."""
    worker = _start(fn)
    if timeout_s <= 0:
        return
    worker.join(timeout_s)
    if worker.is_alive() and target is not None:
        log.warning(
            "ckptprof: span export to %s did not finish within %.0f s; not waiting "
            "(spans still in flight are lost).",
            target,
            timeout_s,
        )


def _start(fn) -> threading.Thread:
    worker = threading.Thread(target=fn, name="ckptprof-export", daemon=True)
    worker.start()
    return worker


def _batch(exporter: SpanExporter, **kwargs) -> BatchSpanProcessor:
    """A BatchSpanProcessor; a bad ``OTEL_BSP_*`` value costs a warning, not the job."""
    try:
        return BatchSpanProcessor(exporter, **kwargs)
    except ValueError as exc:
        log.warning("ckptprof: ignoring invalid OTEL_BSP_* settings (%s)", exc)
        defaults = {
            "max_queue_size": 2048,
            "max_export_batch_size": 512,
            "export_timeout_millis": 30000,
            "schedule_delay_millis": 5000,
        }
        return BatchSpanProcessor(exporter, **{**defaults, **kwargs})


class OsRandomIdGenerator(IdGenerator):
    """Trace and span ids from ``os.urandom``, never from Python's ``random`` module.

    The SDK's default generator calls ``random.getrandbits``: in a training job that
    seeds ``random`` (every Trainer does) and restores its state on resume, ids repeat
    across runs, and each span would also advance the job's own random stream.

    :meth:`in_trace` puts the roots a thread starts into a given trace: a span written
    again as it grows (a process's ``ckpt.run``) stays one trace in a backend.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    @contextlib.contextmanager
    def in_trace(self, trace_id: int | None):
        """Roots this thread starts inside the block join ``trace_id`` (None: a new one)."""
        self._local.trace_id = trace_id
        try:
            yield
        finally:
            self._local.trace_id = None

    def generate_span_id(self) -> int:
        while True:
            value = int.from_bytes(os.urandom(8), "big")
            if value:
                return value

    def generate_trace_id(self) -> int:
        forced = getattr(self._local, "trace_id", None)
        if forced:
            return forced
        while True:
            value = int.from_bytes(os.urandom(16), "big")
            if value:
                return value


def setup_telemetry(
    trace_dir: str | os.PathLike | None = None,
    *,
    service_name: str | None = None,
    run_id: str | None = None,
    otlp: bool | None = None,
) -> Telemetry:
    """Build a provider with the trace-file exporter (and OTLP if requested).

    Args:
        trace_dir: directory for ``<run_id>-<pid>.jsonl``; defaults to
            ``$CKPTPROF_TRACE_DIR`` or ``./ckptprof-traces``.
        service_name: ``service.name`` unless ``OTEL_SERVICE_NAME`` is set.
        run_id: names the trace file and tags spans; generated when omitted.
        otlp: force OTLP on/off; by default the ``OTEL_*`` variables decide.
    """
    run_id = run_id or new_run_id()
    # ckptprof owns this provider: no sampling (OTEL_TRACES_SAMPLER is for the job's own
    # spans), so the trace file always has every operation the report needs
    # no SDK exit handler: its shutdown waits unbounded and says nothing (watch_exit's)
    provider = TracerProvider(
        resource=build_resource(service_name),
        sampler=ALWAYS_ON,
        id_generator=OsRandomIdGenerator(),
        shutdown_on_exit=False,
    )
    if sdk_disabled():  # spans are made (the code paths stay the same) and go nowhere
        return Telemetry(provider, None, run_id)
    warn_settings_once()
    if "console" in exporter_names():
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # the stdout of now (the SDK's default is the one of its import)
        provider.add_span_processor(_batch(ConsoleSpanExporter(out=sys.stdout)))
    trace_file = resolve_trace_dir(trace_dir) / f"{run_id}-{os.getpid()}.jsonl"
    file_exporter = JsonLinesSpanExporter(trace_file)
    file_processor = _batch(file_exporter, schedule_delay_millis=500)
    provider.add_span_processor(file_processor)
    network_processor = network_exporter = None
    if otlp if otlp is not None else otlp_requested():
        network_exporter = otlp_exporter()
        if network_exporter is not None:
            network_processor = _batch(network_exporter)
            provider.add_span_processor(network_processor)
    telemetry = Telemetry(
        provider,
        trace_file,
        run_id,
        file_processor,
        network_processor,
        file_exporter,
        network_exporter,
    )
    telemetry.watch_exit()
    return telemetry
