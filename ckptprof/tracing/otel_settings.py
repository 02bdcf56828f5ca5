"""What the standard ``OTEL_*`` variables ask of ckptprof's export (which exporters,
which OTLP protocol, its request timeout, OpenTelemetry off), and what in them ckptprof
cannot honour: a typo there would otherwise send the spans nowhere without a word.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("ckptprof")

DEFAULT_OTLP_TIMEOUT_S = 10.0  # the SDK's own (OTEL_EXPORTER_OTLP_TIMEOUT's default)
_OTLP_TIMEOUT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")

#: the ``OTEL_TRACES_EXPORTER`` names ckptprof acts on, and the protocols it speaks
KNOWN_EXPORTERS = ("otlp", "console", "none")
KNOWN_PROTOCOLS = ("http/protobuf", "grpc")
_settings_warned: set[str] = set()


def exporter_names() -> list[str]:
    """``OTEL_TRACES_EXPORTER``: otlp, console, none (comma-separated; empty: not set)."""
    return [n.strip().lower() for n in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")
            if n.strip()]  # fmt: skip


def otlp_protocol() -> str:
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
    unknown = [n for n in exporter_names() if n not in KNOWN_EXPORTERS]
    if unknown:
        problems.append(
            f"OTEL_TRACES_EXPORTER={os.environ.get('OTEL_TRACES_EXPORTER')!r}: "
            f"{', '.join(unknown)} is not one of {', '.join(KNOWN_EXPORTERS)}; the spans go to "
            "the trace file only"
        )
    protocol = otlp_protocol()
    if protocol and protocol not in KNOWN_PROTOCOLS:
        problems.append(
            f"OTLP protocol {protocol!r} is not one of {', '.join(KNOWN_PROTOCOLS)}; "
            "using http/protobuf"
        )
    return problems


def warn_settings_once() -> None:
    for problem in settings_problems():
        if problem not in _settings_warned:
            _settings_warned.add(problem)
            log.warning("ckptprof: warning: %s", problem)


def sdk_disabled() -> bool:
    """``OTEL_SDK_DISABLED=true``: the user turned OpenTelemetry off; ckptprof exports
    nothing, not even its trace file."""
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def otlp_requested() -> bool:
    names = exporter_names()
    if names:
        return "otlp" in names
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


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
