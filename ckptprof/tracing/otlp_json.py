"""ckptprof's trace files as OTLP: JSON lines in the OpenTelemetry file-exporter format
(one ``ExportTraceServiceRequest`` per line, the OTLP/JSON encoding: hex ids, ns times
as strings), and a replay of either kind of file into a backend over OTLP/HTTP.

Training nodes often have no collector; the local trace file is the SDK's debug JSON.
``ckptprof export --format otlp-json`` turns it into what any OTLP tool reads, and
``ckptprof export --otlp`` sends it on later, from wherever the backend is reachable.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any

from ckptprof._version import __version__
from ckptprof.errors import CkptprofError
from ckptprof.tracing.times import span_ns

SCOPE = {"name": "ckptprof", "version": __version__}
BATCH = 512  # spans per request (the SDK's own batch size)
_KINDS = {"INTERNAL": 1, "SERVER": 2, "CLIENT": 3, "PRODUCER": 4, "CONSUMER": 5}
_STATUS = {"UNSET": 0, "OK": 1, "ERROR": 2}
_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _value(value: Any) -> dict[str, Any]:
    """An OTLP ``AnyValue`` (64-bit integers as strings, as OTLP/JSON writes them)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _attributes(mapping: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in (mapping or {}).items()]


def _hex(text: Any) -> str:
    return str(text or "").removeprefix("0x")


def otlp_span(span: dict[str, Any]) -> dict[str, Any]:
    """One span of a ckptprof trace file (the SDK's JSON) as an OTLP/JSON ``Span``."""
    context = span.get("context") or {}
    status = span.get("status") or {}
    out: dict[str, Any] = {
        "traceId": _hex(context.get("trace_id")),
        "spanId": _hex(context.get("span_id")),
        "name": str(span.get("name", "")),
        "kind": _KINDS.get(str(span.get("kind", "")).rsplit(".", 1)[-1], 1),
        "startTimeUnixNano": str(span_ns(span.get("start_time")) or 0),
        "endTimeUnixNano": str(span_ns(span.get("end_time")) or 0),
        "attributes": _attributes(span.get("attributes")),
        "status": {"code": _STATUS.get(str(status.get("status_code", "UNSET")), 0)},
    }
    if span.get("parent_id"):
        out["parentSpanId"] = _hex(span["parent_id"])
    if status.get("description"):
        out["status"]["message"] = str(status["description"])
    events = [
        {
            "name": str(e.get("name", "")),
            "timeUnixNano": str(span_ns(e.get("timestamp")) or 0),
            "attributes": _attributes(e.get("attributes")),
        }
        for e in span.get("events") or []
    ]
    links = [
        {
            "traceId": _hex((link.get("context") or {}).get("trace_id")),
            "spanId": _hex((link.get("context") or {}).get("span_id")),
            "attributes": _attributes(link.get("attributes")),
        }
        for link in span.get("links") or []
    ]
    if events:
        out["events"] = events
    if links:
        out["links"] = links
    return out


def requests_of(spans: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """``ExportTraceServiceRequest`` documents: spans grouped by their resource, at most
    :data:`BATCH` spans each."""
    by_resource: dict[str, tuple[dict, list[dict]]] = {}
    for span in spans:
        resource = (span.get("resource") or {}).get("attributes") or {}
        key = json.dumps(resource, sort_keys=True)
        by_resource.setdefault(key, (resource, []))[1].append(otlp_span(span))
    for resource, converted in by_resource.values():
        for start in range(0, len(converted), BATCH):
            yield {
                "resourceSpans": [
                    {
                        "resource": {"attributes": _attributes(resource)},
                        "scopeSpans": [{"scope": SCOPE, "spans": converted[start : start + BATCH]}],
                    }
                ]
            }


def is_otlp_document(doc: Any) -> bool:
    """One OTLP/JSON export request (a line of an OTLP JSON-lines file)."""
    return isinstance(doc, dict) and isinstance(doc.get("resourceSpans"), list)


def protobuf_request(document: dict[str, Any]) -> bytes:
    """An OTLP/JSON request as OTLP protobuf bytes (what every OTLP/HTTP receiver takes).

    OTLP/JSON writes ids in hex where the protobuf JSON mapping expects base64; they are
    turned back before ``json_format`` parses the rest."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    def ids_to_base64(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: base64.b64encode(bytes.fromhex(v)).decode()
                if k in _ID_KEYS and isinstance(v, str)
                else ids_to_base64(v)
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [ids_to_base64(v) for v in node]
        return node

    message = json_format.ParseDict(ids_to_base64(document), ExportTraceServiceRequest())
    return message.SerializeToString()


def otlp_endpoint() -> str:
    """The OTLP/HTTP traces URL the ``OTEL_*`` variables name.

    Raises:
        CkptprofError: the variable does not hold an http(s) URL with a numeric port.
    """
    import urllib.parse

    from ckptprof.tracing.otlp_exporter import safe_endpoint

    explicit = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    variable = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" if explicit else "OTEL_EXPORTER_OTLP_ENDPOINT"
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318")
    url = explicit or base.rstrip("/") + "/v1/traces"
    try:
        parts = urllib.parse.urlsplit(url)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        usable = False
    if not usable:
        raise CkptprofError(
            f"{variable}={safe_endpoint(explicit or base)!r} is not an http:// or https:// URL "
            "with a host and a numeric port; set it like http://collector:4318"
        )
    return url


def _headers() -> dict[str, str]:
    """``OTEL_EXPORTER_OTLP_(TRACES_)HEADERS``: ``key=value,key2=value2``, URL-encoded."""
    raw = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS", os.environ.get("OTEL_EXPORTER_OTLP_HEADERS", "")
    )
    headers = {}
    for item in raw.split(","):
        if "=" in item:
            key, value = item.split("=", 1)
            headers[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    return headers


def replay(documents: Iterable[dict[str, Any]], timeout_s: float) -> tuple[int, int]:
    """POST each request to the OTLP/HTTP endpoint of the ``OTEL_*`` variables; returns
    (requests, spans) sent.

    Raises:
        CkptprofError: the endpoint refused a request (with its reason) or did not answer
            within ``timeout_s``; the endpoint is named without credentials or query.
    """
    from ckptprof.tracing.otlp_exporter import backend_reason, safe_endpoint

    url = otlp_endpoint()
    where = safe_endpoint(url)
    headers = {**_headers(), "Content-Type": "application/x-protobuf"}
    sent = spans = 0
    for document in documents:
        body = protobuf_request(document)
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                answer.read()
        except urllib.error.HTTPError as exc:
            said = backend_reason(exc.read()) or exc.reason
            raise CkptprofError(
                f"export --otlp: {where} refused the spans (HTTP {exc.code}: {said}); "
                f"{sent} of the requests were sent before it"
            ) from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CkptprofError(
                f"export --otlp: no answer from {where} within {timeout_s:g} s ({reason}); "
                "check OTEL_EXPORTER_OTLP_ENDPOINT and that the collector is running"
            ) from None
        sent += 1
        spans += sum(
            len(scope["spans"]) for rs in document["resourceSpans"] for scope in rs["scopeSpans"]
        )
    return sent, spans


__all__ = ["is_otlp_document", "otlp_span", "protobuf_request", "replay", "requests_of"]
