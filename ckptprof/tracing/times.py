"""The times in ckptprof's trace files: the SDK's JSON writes a span's start and end as
ISO strings (microseconds, ``Z`` or an offset); OTLP and the timelines want ns."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def span_ns(text: Any) -> int | None:
    """An ISO time of a span as ns since the epoch; None where missing or not a time."""
    if not isinstance(text, str) or not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp() * 1e6) * 1000  # the trace files keep microseconds
