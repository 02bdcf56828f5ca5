"""Lenient reads of the values in trace and results JSON: a wrong type reads as
absent (or false), never raises, so one odd attribute does not sink a report."""

from __future__ import annotations

from typing import Any


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def integer(value: Any) -> int | None:
    found = number(value)
    return None if found is None else int(found)


def flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes"}
    return bool(value)
