"""The text report's building blocks: fixed-width tables, lines wrapped to the terminal
(60-160 columns), and the lines a results sweep and a trace group both show (hints,
verify coverage, rank skew, one row per run)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence

from ckptprof.manifest import SAMPLE_BLOCK, SAMPLE_BLOCKS
from ckptprof.report.breakdown import OperationRow, VerifyCoverage
from ckptprof.report.hints import Hint
from ckptprof.report.skew import skew_rows, skew_sentence
from ckptprof.units import fmt_bytes, fmt_s, terminal_width

INDENT = "  "


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], align: str) -> list[str]:
    """Fixed-width columns separated by two spaces; ``align`` has one l/r per column."""
    rows = [list(r) for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(c).ljust(w) if a == "l" else str(c).rjust(w)
            for c, w, a in zip(cells, widths, align, strict=False)
        ]
        return (INDENT + "  ".join(parts)).rstrip()

    return [line(headers)] + [line(r) for r in rows]


def wrap(text: str, first: str, rest: str | None = None) -> list[str]:
    """``text`` wrapped to the terminal's width, never inside a word or at a hyphen."""
    return textwrap.wrap(
        text,
        terminal_width(),
        initial_indent=first,
        subsequent_indent=rest if rest is not None else " " * len(first),
        break_on_hyphens=False,
        break_long_words=False,
    )


def hint_lines(hints: Sequence[Hint]) -> list[str]:
    """Each hint as wrapped "hint: " lines."""
    lines: list[str] = []
    for hint in hints:
        lines += wrap(hint.message, f"{INDENT}hint: ")
    return lines


def verify_lines(c: VerifyCoverage | None) -> list[str]:
    """What verify covered: ``sample`` passing is not ``full`` passing."""
    if c is None:
        return []
    of_total = f" of {fmt_bytes(c.total_bytes)}" if c.total_bytes else ""
    if c.mode == "full":
        text = f"every byte hashed (xxh3){of_total}"
    elif c.mode == "sample":
        share = f" ({c.checked_bytes / c.total_bytes:.1%})" if c.total_bytes else ""
        text = (
            f"{fmt_bytes(c.checked_bytes)}{of_total} hashed{share}: a file over "
            f"{fmt_bytes(SAMPLE_BLOCKS * SAMPLE_BLOCK)} only in {SAMPLE_BLOCKS} ranges of "
            f"{fmt_bytes(SAMPLE_BLOCK)}, so a corrupt byte outside them passes (--verify full "
            "checks every byte)"
        )
    elif c.mode == "size":
        text = "sizes only, no byte hashed: corruption that keeps the size passes"
    else:
        text = "nothing checked"
    return wrap(f"verify {c.mode}: {text}", INDENT, INDENT * 2)


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, plural unless ``n`` is 1: "1 rank", "2 ranks"."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def skew_lines(skews) -> list[str]:
    """When each rank began and was done (report/skew.py), the worst operation's."""
    sentence = skew_sentence(skews)
    if sentence is None:
        return []
    return wrap(sentence, INDENT, INDENT * 3) + [INDENT * 2 + row for row in skew_rows(skews)]


def phase_names(operations: Iterable[OperationRow]) -> set[str]:
    """Every phase any of ``operations`` timed."""
    return {name for op in operations for name in op.phases}


def runs_table(operations: Sequence[OperationRow], names: Sequence[str]) -> list[str]:
    """``--by run``: each operation as measured, no medians."""
    show_rank = any(op.rank is not None for op in operations)
    show_cell = any(op.concurrency is not None for op in operations)
    headers = ["start"] if any(op.start for op in operations) else []
    if show_cell:
        headers += ["cache", "conc"]
    headers += ["rep"] + (["rank"] if show_rank else []) + ["wall s"] + list(names) + [""]
    rows = []
    for op in operations:
        row = [op.start[11:23] if op.start else "-"] if headers[0] == "start" else []
        if show_cell:
            row += [str(op.cache or "-"), "-" if op.concurrency is None else str(op.concurrency)]
        row += ["-" if op.repeat is None else str(op.repeat)]
        row += (["-" if op.rank is None else str(op.rank)] if show_rank else []) + [
            fmt_s(op.wall_s)
        ]
        row += [fmt_s(op.phases.get(n)) for n in names] + ["FAILED" if op.failed else ""]
        rows.append(row)
    align = "".join("l" if h in ("start", "cache") else "r" for h in headers[:-1]) + "l"
    return table(headers, rows, align)
