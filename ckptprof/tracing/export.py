"""Where spans go: always a local JSON-lines trace file, plus OTLP when the
standard ``OTEL_*`` variables ask for it.

Export is a guest in the training job: it runs on background threads, an
unreachable collector or an unwritable (or full) trace directory costs one warning,
and shutdown never waits longer than a bounded time: for the collector, its request
timeout and a little more, so a collector that never answers is still reported.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from ckptprof.tracing.resource import build_resource

log = logging.getLogger("ckptprof")

TRACE_DIR_ENV = "CKPTPROF_TRACE_DIR"
DEFAULT_TRACE_DIR = "ckptprof-traces"
DEFAULT_OTLP_TIMEOUT_S = 10.0  # the SDK's own (OTEL_EXPORTER_OTLP_TIMEOUT's default)
FILE_FLUSH_TIMEOUT_S = 5.0
PROVIDER_SHUTDOWN_TIMEOUT_S = 2.0
# shutdown waits for the collector this much longer than a request may take, so the
# last batch's failure (and its warning) is seen before the process ends
NETWORK_FLUSH_MARGIN_S = 2.0
#: the longest an exit path (the process ends next) waits for spans to leave
EXIT_FLUSH_MAX_S = 5.0
#: the share of a notice's remaining grace that flush may take (the rest is the job's)
EXIT_FLUSH_GRACE_SHARE = 0.25
#: the least it is given, even past the deadline (a deadline is seldom to the second)
EXIT_FLUSH_MIN_S = 0.5
_OTLP_TIMEOUT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")


def span_to_json_line(span: ReadableSpan) -> str:
    """The SDK's own span JSON, folded onto one line."""
    return json.dumps(json.loads(span.to_json(indent=None)), separators=(",", ":"))


class JsonLinesSpanExporter(SpanExporter):
    """Appends one span per line to a file; disk trouble is a single warning, after
    which it writes nothing more (a full disk stays full)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file = None
        self._failed = False

    def _open(self):
        if self._file is None and not self._failed:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            except OSError as exc:
                self._fail(exc)
        return self._file

    @property
    def failed(self) -> bool:
        """Whether writing stopped after an error: the file is missing spans."""
        return self._failed

    def _fail(self, exc: OSError) -> None:
        self._failed = True
        self._close()
        log.warning(
            "ckptprof: cannot write the trace file %s (%s); spans are not saved locally. "
            "Set %s or --trace-dir to a writable directory.",
            self.path,
            exc.strerror or exc,
            TRACE_DIR_ENV,
        )

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            if self._failed:
                return SpanExportResult.FAILURE
            handle = self._open()
            if handle is None:
                return SpanExportResult.FAILURE
            try:
                handle.write("".join(span_to_json_line(s) + "\n" for s in spans))
                handle.flush()
            except OSError as exc:
                self._fail(exc)
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def _close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def shutdown(self) -> None:
        with self._lock:
            self._close()


# Endpoints already warned about, process-wide: a job that makes several exporters
# (one per fit) still gets one warning per unreachable collector.
_WARNED_ENDPOINTS: set[str] = set()


class WarnOnceExporter(SpanExporter):
    """Wraps a network exporter: failures become one warning, never an exception."""

    def __init__(self, inner: SpanExporter, description: str, timeout_s: float) -> None:
        self.inner = inner
        self.description = description
        #: how long one export may take (the SDK's own retries included)
        self.timeout_s = timeout_s
        self._warned = False
        self._backend_said: str | None = None
        self._gate_logs()
        self._keep_refusals()

    def _keep_refusals(self) -> None:
        """Keep what the backend answered to a refused batch (a 4xx/5xx body, e.g.
        MLflow's missing ``x-mlflow-experiment-id``), for the one warning. Best effort on
        the SDK's private HTTP transport, on this exporter instance only."""
        transport = getattr(getattr(self.inner, "_client", None), "_transport", None)
        request = getattr(transport, "request", None)
        if request is None:
            return

        def kept(*args, **kwargs):
            result = request(*args, **kwargs)
            with contextlib.suppress(Exception):
                if result.status_code is not None and result.status_code >= 400:
                    self._backend_said = backend_reason(result.content())
            return result

        transport.request = kept

    def _gate_logs(self) -> None:
        """Route the exporter's own retry warnings into our single warning.

        Best effort on a private attribute of the SDK's HTTP client, set on this
        exporter instance only (the module logger, shared with the user's own
        exporters, is left alone). Without it, the SDK's warnings show as usual.
        """
        client = getattr(self.inner, "_client", None)
        if client is not None and isinstance(getattr(client, "_logger", None), logging.Logger):
            gate = logging.Logger(f"ckptprof.otlp.{id(self)}")
            gate.addFilter(self._gate)
            client._logger = gate

    def _gate(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            reason = record.getMessage()
            if self._backend_said:
                reason += f"; the backend said: {self._backend_said}"
            self._warn(_strip_url_secrets(reason)[:500])
        return False

    def _warn(self, reason: str) -> None:
        if not self._warned and self.description not in _WARNED_ENDPOINTS:
            self._warned = True
            _WARNED_ENDPOINTS.add(self.description)
            log.warning(
                "ckptprof: could not export spans to %s (%s); the run goes on and its "
                "spans are still written to the local trace file.",
                self.description,
                reason,
            )

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # noqa: BLE001 - the exporter must never raise into the job
            self._warn(f"{type(exc).__name__}: {exc}")
            return SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._warn("the collector did not accept the batch")
        return result

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self.inner.shutdown()


def backend_reason(body: str | bytes) -> str | None:
    """A refusal's body on one short line, from the shapes real backends send: a JSON
    error's message (MLflow's ``message``; FastAPI's ``detail`` list of validation errors,
    as MLflow 3's OTLP endpoint sends, as ``header x-mlflow-experiment-id: Field required``;
    ``errors`` lists), an OTLP ``google.rpc.Status`` in protobuf or JSON, else the text."""
    raw = body if isinstance(body, bytes) else body.encode("utf-8", "replace")
    if not raw.strip():
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    reason = _json_reason(doc) if doc is not None else _status_reason(raw)
    if reason is None:
        reason = raw.decode("utf-8", "replace")
    return " ".join(reason.split())[:200] or None


def _json_reason(doc) -> str | None:
    if isinstance(doc, str):
        return doc
    if isinstance(doc, list):
        parts = [r for r in (_json_reason(item) for item in doc[:3]) if r]
        return "; ".join(parts) or None
    if not isinstance(doc, dict):
        return None
    if "msg" in doc and isinstance(doc["msg"], str):  # one pydantic validation error
        where = " ".join(str(p) for p in doc.get("loc") or [] if p != "body")
        return f"{where}: {doc['msg']}" if where else doc["msg"]
    for key in ("message", "error", "detail", "errors", "reason", "error_message"):
        if doc.get(key):
            found = _json_reason(doc[key])
            if found:
                return found
    return None


def _status_reason(raw: bytes) -> str | None:
    """The message of a protobuf ``google.rpc.Status`` (an OTLP/HTTP collector's refusal):
    its first byte is the tag of field 1 (code) or 2 (message), never printable text."""
    if raw[:1] not in (b"\x08", b"\x12"):
        return None
    with contextlib.suppress(Exception):
        from google.rpc import status_pb2

        status = status_pb2.Status.FromString(raw)
        if status.message and status.message.isprintable():
            return status.message
    return None


#: the ``OTEL_TRACES_EXPORTER`` names ckptprof acts on, and the protocols it speaks
KNOWN_EXPORTERS = ("otlp", "console", "none")
KNOWN_PROTOCOLS = ("http/protobuf", "grpc")
_settings_warned: set[str] = set()


def _exporter_names() -> list[str]:
    """``OTEL_TRACES_EXPORTER``: otlp, console, none (comma-separated; empty: not set)."""
    return [n.strip().lower() for n in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")
            if n.strip()]  # fmt: skip


def _protocol() -> str:
    return (
        os.environ.get(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
        )
        .strip()
        .lower()
    )


def settings_problems() -> list[str]:
    """What in the ``OTEL_*`` variables ckptprof cannot honour (a typo there would
    otherwise send the spans nowhere without a word)."""
    problems = []
    unknown = [n for n in _exporter_names() if n not in KNOWN_EXPORTERS]
    if unknown:
        problems.append(
            f"OTEL_TRACES_EXPORTER={os.environ.get('OTEL_TRACES_EXPORTER')!r}: "
            f"{', '.join(unknown)} is not one of {', '.join(KNOWN_EXPORTERS)}; the spans go to "
            "the trace file only"
        )
    protocol = _protocol()
    if protocol and protocol not in KNOWN_PROTOCOLS:
        problems.append(
            f"OTLP protocol {protocol!r} is not one of {', '.join(KNOWN_PROTOCOLS)}; "
            "using http/protobuf"
        )
    return problems


def _warn_settings_once() -> None:
    for problem in settings_problems():
        if problem not in _settings_warned:
            _settings_warned.add(problem)
            log.warning("ckptprof: warning: %s", problem)


def sdk_disabled() -> bool:
    """``OTEL_SDK_DISABLED=true``: the user turned OpenTelemetry off; ckptprof exports
    nothing, not even its trace file."""
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def _otlp_requested() -> bool:
    names = _exporter_names()
    if names:
        return "otlp" in names
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def _otlp_exporter() -> WarnOnceExporter | None:
    protocol = _protocol()
    endpoint = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"),
    )
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore
                OTLPSpanExporter,
            )
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        log.warning(
            "ckptprof: OTLP export over %s was requested but its exporter is not installed; "
            "pip install opentelemetry-exporter-otlp-proto-%s",
            protocol,
            protocol or "http",
        )
        return None
    # The SDK reads endpoint, headers, compression and its request timeout from the
    # OTEL_* variables; a busy backend gets the SDK's own time (a shorter one reported
    # batches as lost that arrived). Only the wait at shutdown is bounded, by it.
    timeout_s = otlp_timeout_s()
    exporter = OTLPSpanExporter(timeout=timeout_s)
    return WarnOnceExporter(exporter, f"OTLP endpoint {safe_endpoint(endpoint)}", timeout_s)


def otlp_timeout_s() -> float:
    """The request timeout the OTLP exporter works with: the user's (in seconds, as the
    Python SDK reads it), else ckptprof's short default."""
    for name in _OTLP_TIMEOUT_ENVS:
        if name in os.environ:
            try:
                value = float(os.environ[name])
            except ValueError:
                log.warning("ckptprof: ignoring %s=%r (not a number)", name, os.environ[name])
                continue
            if value > 0:
                return value
    return DEFAULT_OTLP_TIMEOUT_S


def _strip_url_secrets(text: str) -> str:
    """Drop query strings and user info from any URL or path inside ``text``."""
    import re

    text = re.sub(r"(?<=[\w/])\?[^\s'\")]*", "?…", text)
    return re.sub(r"//[^/\s:@]+(:[^/\s@]*)?@", "//", text)


def safe_endpoint(url: str) -> str:
    """The endpoint without credentials or query string."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else url.split("?")[0]


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
            _bounded(
                self.network_processor.shutdown,
                self.network_exporter.timeout_s + NETWORK_FLUSH_MARGIN_S,
                self.network_exporter.description,
            )
        # processors are down: this only marks the provider shut
        _bounded(self.provider.shutdown, PROVIDER_SHUTDOWN_TIMEOUT_S)


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
    worker = threading.Thread(target=fn, name="ckptprof-export", daemon=True)
    worker.start()
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


def resolve_trace_dir(trace_dir: str | os.PathLike | None) -> Path:
    return Path(trace_dir or os.environ.get(TRACE_DIR_ENV) or DEFAULT_TRACE_DIR)


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
    _warn_settings_once()
    if "console" in _exporter_names():
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # the stdout of now (the SDK's default is the one of its import)
        provider.add_span_processor(_batch(ConsoleSpanExporter(out=sys.stdout)))
    trace_file = resolve_trace_dir(trace_dir) / f"{run_id}-{os.getpid()}.jsonl"
    file_exporter = JsonLinesSpanExporter(trace_file)
    file_processor = _batch(file_exporter, schedule_delay_millis=500)
    provider.add_span_processor(file_processor)
    network_processor = network_exporter = None
    if otlp if otlp is not None else _otlp_requested():
        network_exporter = _otlp_exporter()
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
