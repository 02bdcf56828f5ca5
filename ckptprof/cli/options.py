"""Typed option values: argparse checks types and ranges before any work is done.

Each type function parses the text and checks it against the same ranges the library
uses (:mod:`ckptprof.synth.ranges`); :class:`Parser` prints argparse's complaint as the
one line every ckptprof error is (``ckptprof: error: --ranks: expected …``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from ckptprof import schema


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and each option's default shown where its help does not
    already say it (a flag's False and an unset None say nothing)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        quiet = default is None or default is False or default == argparse.SUPPRESS
        if quiet or "default" in text or action.option_strings == []:
            return text
        if default is True:
            shown = "on"
        elif isinstance(default, (list, tuple)):
            shown = ",".join(map(str, default))
        else:
            shown = default
        return f"{text} (default {str(shown).replace('%', '%%')})"  # text's own %(…)s stay


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors that name the option and point at its help."""

    def error(self, message: str) -> NoReturn:
        text = message.removeprefix("argument ")
        self.exit(2, f"ckptprof: error: {text} (see `{self.prog} --help`)\n")


def _checked(parse: Callable[[str], Any], check: schema.Check) -> Callable[[str], Any]:
    """An argparse ``type``: ``parse(text)``, then ``check``; the message quotes the text."""

    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except (ValueError, OverflowError):
            value = text
        problem = check(value)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"expected {problem.expected}, got {text!r}")
        return value

    return convert


def whole(check: schema.Check) -> Callable[[str], int]:
    """A whole number in ``check``'s range (``--ranks 8``)."""
    return _checked(int, check)


def real(check: schema.Check) -> Callable[[str], float]:
    """A finite number in ``check``'s range (``--bandwidth-gbps 2.5``)."""
    return _checked(float, check)


_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """``16M``, ``16MiB``, ``512k`` or plain bytes; ``ValueError``/``OverflowError`` if not."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    if t and t[-1] in _UNITS:
        return int(float(t[:-1]) * _UNITS[t[-1]])
    return int(t)


_SECONDS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``6h``, ``30m``, ``90s``, ``2d`` or plain seconds; ``ValueError`` if not."""
    t = text.strip().lower()
    for unit in sorted(_SECONDS, key=len, reverse=True):
        if t.endswith(unit):
            return float(t[: -len(unit)]) * _SECONDS[unit]
    return float(t)


def _with_unit(parse: Callable[[str], Any], example: str, unit: str):
    """An option type: ``parse``, then ``check``; a refusal shows the example and the unit."""

    def make(check: schema.Check) -> Callable[[str], Any]:
        def in_unit(value: Any) -> schema.Problem | None:
            problem = check(value)
            if problem is None:
                return None
            return schema.Problem("", f"{example}: {problem.expected} {unit}", value)

        return _checked(parse, in_unit)

    return make


#: a length of time like ``6h`` (s, m, h, d), in seconds, in the check's range
duration = _with_unit(parse_duration, "a duration like 6h or 30m", "seconds")
#: a byte count like ``16M`` in the check's range
size = _with_unit(parse_size, "a size like 16M", "bytes")


def int_list(check: schema.Check) -> Callable[[str], tuple[int, ...]]:
    """Comma-separated whole numbers, each in ``check``'s range (``1,8,16``)."""

    def convert(text: str) -> tuple[int, ...]:
        items = [v.strip() for v in text.split(",") if v.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected at least one value, e.g. 1,8,16")
        return tuple(whole(check)(item) for item in items)

    return convert


def choice_list(choices: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """Comma-separated names, each one of ``choices`` (``cold,hot``)."""
    one = _checked(str, schema.text(choices=choices))

    def convert(text: str) -> tuple[str, ...]:
        items = [v.strip() for v in text.split(",") if v.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected one or more of {', '.join(choices)}")
        return tuple(one(item) for item in items)

    return convert


# not empty or blank (an empty path would mean the current folder), no NUL
_PLACE = r"[^\0]*\S[^\0]*"
_location = _checked(str, schema.text(pattern=_PLACE, expected="a folder or s3://bucket/prefix"))
_directory = _checked(str, schema.text(pattern=_PLACE, expected="a folder"))


def location(text: str) -> str:
    """A checkpoint location (a path or ``s3://bucket/prefix``)."""
    return _location(text)


def directory(text: str) -> Path:
    """A local folder to write into."""
    return Path(_directory(text))


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """``--device``: where the restored state lives (shared by ``synth restore`` and ``demo``)."""

    def device(text: str) -> str:
        from ckptprof.synth.device import check_device

        problem = check_device(text)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return text

    parser.add_argument(
        "--device",
        type=device,
        default="auto",
        help="where the restored state lives: auto (a CUDA device if there is one, else "
        "host memory), cpu, cuda or cuda:N; on a GPU, reshard includes the host→device "
        "copies and the first step runs there",
    )
