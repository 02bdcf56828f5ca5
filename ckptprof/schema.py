"""Small explicit schemas for what ckptprof reads from outside: manifests, results files,
synthetic specs and option values.

Stdlib only. A check returns the first :class:`Problem` (or None), named by its JSON
path, so every error says which field is wrong, what was there and what was expected;
:func:`require` turns it into one :class:`~ckptprof.errors.CkptprofError` line.
Unknown keys are ignored: newer writers may add fields.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ckptprof.errors import CkptprofError


@dataclass(frozen=True)
class Problem:
    """What is wrong with a value: where (a JSON path, "" for the value itself)."""

    path: str
    expected: str
    got: Any

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{where}expected {self.expected}, got {describe(self.got)}"

    def under(self, parent: str) -> Problem:
        """The same problem, one level further down (``parent`` is ``name`` or ``[i]``)."""
        sep = "" if not self.path or self.path.startswith("[") else "."
        return Problem(parent + sep + self.path, self.expected, self.got)


Check = Callable[[Any], "Problem | None"]


class _Missing:
    def __repr__(self) -> str:
        return "nothing (the key is missing)"


#: what a required key that is absent "is", in messages
MISSING = _Missing()


def describe(value: Any) -> str:
    """A value as a user would recognise it in their file (short)."""
    if value is None:
        return "null"
    if value is MISSING:
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:39] + "…"
        return f"{shown!r} (a string)"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


def _bounds(noun: str, minimum: float | None, maximum: float | None, above: float | None) -> str:
    parts = [f"above {above}"] if above is not None else []
    parts += [f"at least {minimum}"] if minimum is not None else []
    parts += [f"at most {maximum}"] if maximum is not None else []
    return f"{noun} {' and '.join(parts)}" if parts else noun


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def integer(minimum: int | None = None, maximum: int | None = None) -> Check:
    """A whole number (JSON integer, not a bool or a string of digits) in range."""
    expected = _bounds("a whole number", minimum, maximum, None)

    def check(value: Any) -> Problem | None:
        ok = (
            isinstance(value, int)
            and not isinstance(value, bool)
            and (minimum is None or value >= minimum)
            and (maximum is None or value <= maximum)
        )
        return None if ok else Problem("", expected, value)

    return check


def number(
    minimum: float | None = None, maximum: float | None = None, *, above: float | None = None
) -> Check:
    """A finite number in range (``above``: strictly greater than)."""
    expected = _bounds("a number", minimum, maximum, above)

    def check(value: Any) -> Problem | None:
        ok = (
            _is_number(value)
            and math.isfinite(value)
            and (above is None or value > above)
            and (minimum is None or value >= minimum)
            and (maximum is None or value <= maximum)
        )
        return None if ok else Problem("", expected, value)

    return check


def text(*, pattern: str | None = None, choices: Iterable[str] = (), expected: str = "") -> Check:
    """A string, optionally matching ``pattern`` in full or being one of ``choices``."""
    allowed = tuple(choices)
    regex = re.compile(pattern) if pattern else None
    wanted = expected or (f"one of {', '.join(allowed)}" if allowed else "a string")

    def check(value: Any) -> Problem | None:
        ok = (
            isinstance(value, str)
            and (not allowed or value in allowed)
            and (regex is None or regex.fullmatch(value) is not None)
        )
        return None if ok else Problem("", wanted, value)

    return check


def boolean() -> Check:
    def check(value: Any) -> Problem | None:
        return None if isinstance(value, bool) else Problem("", "true or false", value)

    return check


def anything() -> Check:
    """Any JSON value (the field is only type-checked by its reader)."""
    return lambda value: None


def optional(check: Check) -> Check:
    """``check``, or null."""

    def nullable(value: Any) -> Problem | None:
        problem = check(value) if value is not None else None
        if problem is not None and not problem.path:
            return Problem("", f"{problem.expected} or null", value)
        return problem

    return nullable


def record(fields: Mapping[str, Check], required: Iterable[str] = ()) -> Check:
    """An object: ``required`` keys present, every listed key that is present valid."""
    needed = tuple(required)

    def check(value: Any) -> Problem | None:
        if not isinstance(value, Mapping):
            return Problem("", "an object", value)
        for key in needed:
            if key not in value:
                return Problem(key, "a value", MISSING)
        for key, field_check in fields.items():
            if key in value:
                problem = field_check(value[key])
                if problem is not None:
                    return problem.under(key)
        return None

    return check


def mapping(key: Check, value: Check) -> Check:
    """An object whose every key passes ``key`` and every value passes ``value``."""

    def check(doc: Any) -> Problem | None:
        if not isinstance(doc, Mapping):
            return Problem("", "an object", doc)
        for name, item in doc.items():
            label = f"[{name!r}]"
            problem = key(name)
            if problem is not None:
                return Problem(label, problem.expected, name)
            problem = value(item)
            if problem is not None:
                return problem.under(label)
        return None

    return check


def items(check: Check) -> Check:
    """A list whose every item passes ``check``."""

    def each(doc: Any) -> Problem | None:
        if not isinstance(doc, list):
            return Problem("", "a list", doc)
        for index, item in enumerate(doc):
            problem = check(item)
            if problem is not None:
                return problem.under(f"[{index}]")
        return None

    return each


def is_relative_path(path: Any) -> bool:
    """A path that stays inside the folder it is relative to: no leading ``/``, no ``..``,
    ``.`` or empty parts, no NUL (what a manifest may name and ``--force`` may delete)."""
    if not isinstance(path, str) or not path or "\0" in path or path.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def relative_path() -> Check:
    def check(value: Any) -> Problem | None:
        if is_relative_path(value):
            return None
        return Problem("", "a relative path inside the checkpoint (no '..', no leading '/')", value)

    return check


def require(doc: Any, check: Check, where: str, fix: str) -> None:
    """Raise one :class:`CkptprofError` line naming ``where``, the field and ``fix``."""
    problem = check(doc)
    if problem is not None:
        raise CkptprofError(f"{where}: {problem}; {fix}")
