"""The OTLP exporter as ckptprof builds it from the ``OTEL_*`` settings: wrapped so an
unreachable collector or a refused batch is one warning (with the backend's reason),
never an exception into the job, and with no credential or query string in what it says.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ckptprof.redact import strip_url_secrets
from ckptprof.tracing.otel_settings import otlp_protocol, otlp_timeout_s

log = logging.getLogger("ckptprof")


# Endpoints already warned about, process-wide: a job that makes several exporters
# (one per fit) still gets one warning per unreachable collector.
_WARNED_ENDPOINTS: set[str] = set()
# Endpoints whose last export in this process failed (a success takes one off): a later
# shutdown does not wait the whole request timeout again for a collector known down.
_FAILING_ENDPOINTS: set[str] = set()


class WarnOnceExporter(SpanExporter):
    """Wraps a network exporter: failures become one warning, never an exception."""

    def __init__(self, inner: SpanExporter, description: str, timeout_s: float) -> None:
        self.inner = inner
        self.description = description
        #: how long one export may take (the SDK's own retries included)
        self.timeout_s = timeout_s
        self._warned = False
        self._backend_said: str | None = None
        #: failed attempts so far (the SDK's retries count each): a refusal is known at once
        self.failures = 0
        self._shut = False
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
        if record.levelno >= logging.WARNING:  # an attempt failed (the SDK may retry)
            self._failed()
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

    @property
    def failing(self) -> bool:
        """Whether the last export to this endpoint, in this process, failed."""
        return self.description in _FAILING_ENDPOINTS

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # noqa: BLE001 - the exporter must never raise into the job
            self._failed()
            self._warn(f"{type(exc).__name__}: {exc}")
            return SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._failed()
            self._warn("the collector did not accept the batch")
        else:
            _FAILING_ENDPOINTS.discard(self.description)
        return result

    def _failed(self) -> None:
        self.failures += 1
        _FAILING_ENDPOINTS.add(self.description)

    def abort(self) -> None:
        """Stop the SDK's retries now (its backoff waits on this): the spans are in the
        trace file, and a collector that refused will not take them within a fit's end."""
        self.shutdown()

    def shutdown(self) -> None:
        if self._shut:  # aborted: the SDK would warn of a second shutdown
            return
        self._shut = True
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


def otlp_exporter() -> WarnOnceExporter | None:
    protocol = otlp_protocol()
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


def _strip_url_secrets(text: str) -> str:
    """Drop query strings and user info from any URL or path inside ``text``."""
    import re

    text = strip_url_secrets(text)
    text = re.sub(r"(?<=[\w/])\?[^\s'\")]*", "?…", text)
    return re.sub(r"//[^/\s:@]+(:[^/\s@]*)?@", "//", text)


def safe_endpoint(url: str) -> str:
    """The endpoint without credentials or query string. Never raises: an endpoint
    that does not parse (``http://collector:${OTEL_PORT}``, unexpanded) is shown as
    written, less any secrets; the exporter's own failure to send is warned once."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return strip_url_secrets(str(url))
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else url.split("?")[0]
