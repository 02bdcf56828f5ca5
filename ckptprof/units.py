"""One unit system for everything a person reads: decimal bytes (1 GB = 10⁹ bytes, as
storage vendors and GB/s write them), seconds with three decimals (columns align on
the point), and text wrapped to the terminal."""

from __future__ import annotations

import shutil
import textwrap

UNITS_NOTE = "units: 1 GB = 10^9 bytes (GB/s likewise), times in seconds"
_MIN_WIDTH, _MAX_WIDTH = 60, 160


def fmt_bytes(nbytes: int | float | None) -> str:
    """``385.00 MB``, ``16.78 MB``; ``-`` for nothing."""
    if not nbytes:
        return "-"
    value = float(nbytes)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1000
    return f"{value:.2f} TB"  # pragma: no cover - unreachable


def fmt_s(seconds: float | None) -> str:
    """Seconds, always three decimals; ``-`` for nothing."""
    return "-" if seconds is None else f"{seconds:.3f}"


def fmt_margin(margin_s: float, deadline: str = "the deadline") -> str:
    """A margin to a deadline in words, never a negative number: ``0.052 s after the
    deadline`` (missed), ``29.286 s before the deadline``."""
    side = "before" if margin_s >= 0 else "after"
    return f"{abs(margin_s):.3f} s {side} {deadline}"


def fmt_gbps(gbps: float | None) -> str:
    if gbps is None:
        return "-"
    return f"{gbps:.2f}" if gbps >= 0.01 else f"{gbps:.2g}"


def fmt_pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.1f}%"


def terminal_width() -> int:
    """The terminal's columns (``$COLUMNS`` wins), kept within 60-160; 100 off a tty."""
    return max(_MIN_WIDTH, min(_MAX_WIDTH, shutil.get_terminal_size((100, 24)).columns))


def wrap(text: str, indent: str = "", rest: str | None = None) -> str:
    """``text`` wrapped to the terminal, continuation lines indented by ``rest``."""
    return "\n".join(
        textwrap.wrap(
            text,
            terminal_width(),
            initial_indent=indent,
            subsequent_indent=indent + "  " if rest is None else rest,
            break_on_hyphens=False,
        )
    )
