"""``ckptprof compare``'s storage table: one row per source with write and read GB/s,
their ratio, the share of each probed ceiling and the verdict, then each phase's median
seconds; and the notes on figures measured above their ceiling. The text and the HTML
report both show it."""

from __future__ import annotations

import statistics

from ckptprof.phases import RESTORE_PHASES, SAVE_PHASES
from ckptprof.report.comparison import SAVE, Comparison, Entry, same_work


def of_ceiling_cell(e: Entry) -> str:
    """The "of ceil" cell: ``e``'s share of its probed ceiling, "!" above it."""
    share = e.of_ceiling
    if share is None:
        return "-"
    return f"{share:.0%}" + ("!" if share > 1.0 else "")


def ceiling_notes(c: Comparison) -> list[str]:
    """Every figure measured above its probed ceiling: the probe underestimated."""
    lines = []
    for setting, entries in sorted(c.entries.items()):
        for e in entries:
            if not e.above_ceiling:
                continue
            what = "its saves wrote" if e.kind == SAVE else "its fetch read"
            lines.append(
                f"above the ceiling (!): {e.source} {setting}: {what} at {e.of_ceiling:.0%} of "
                "the probed ceiling; the probe underestimated the storage (too few bytes, or a "
                "cache served the reads): set --ceiling-gbps, or probe a larger checkpoint"
            )
    return lines


#: "fetch of ceil": the fetch phase's GB/s over the read ceiling (what the probe bounds),
#: not the read GB/s beside it, which is by time to state; "verdict": on seconds, as the
#: gate judges, each naming its figure
STORAGE_COLUMNS = ("source", "write GB/s", "read GB/s", "w/r", "of write ceil",
                   "fetch of ceil", "saves", "restores", "verdict")  # fmt: skip


def storage_rows(c: Comparison) -> tuple[str, list[list[str]]]:
    """The storage table's heading and one row per source (:data:`STORAGE_COLUMNS`):
    write and read GB/s (read by time to state), MLPerf Storage's write/read ratio, the
    share of each probed ceiling, repeats and the verdict; ("", []) with nothing to show."""
    read = _table_setting(c, "restore")
    write = _table_setting(c, SAVE)
    if read is None and write is None:
        return "", []
    by = f"read GB/s by {c.entries[read][0].metric}" if read else ""
    shown = ((by, read), ("write", write))
    head = "storage: " + "; ".join(f"{what}: {setting}" for what, setting in shown if setting)
    rows = []
    for source in c.sources:
        w = _entry(c, write, source)
        r = _entry(c, read, source)
        wg, rg = (w.gbps if w else None), (r.gbps if r else None)
        rows.append([
            source, _num(wg), _num(rg), f"{wg / rg:.2f}" if wg and rg else "-",
            of_ceiling_cell(w) if w else "-", of_ceiling_cell(r) if r else "-",
            str(len(w.values) if w else 0), str(len(r.values) if r else 0),
            _table_verdict(c, source, read, write),
        ])  # fmt: skip
    return head, rows


def storage_table(c: Comparison) -> list[str]:
    """:func:`storage_rows` as text, with each source's median seconds per phase."""
    head, rows = storage_rows(c)
    if not rows:
        return []
    width = max(len(s) for s in c.sources) + 2
    sizes = (width, 10, 10, 5, 13, 13, 5, 8)
    lines = ["", head]
    for cells in [list(STORAGE_COLUMNS), *rows]:
        line = f"  {cells[0]:<{width}}" + "".join(
            f" {cell:>{size}}" for cell, size in zip(cells[1:-1], sizes[1:], strict=True)
        )
        lines.append(f"{line}  {cells[-1]}")
    read, write = _table_setting(c, "restore"), _table_setting(c, SAVE)
    lines += _phase_table(c, read, write, width)
    return lines


def _num(value: float | None) -> str:
    return f"{value:.3f}" if value else "-"


def _entry(c: Comparison, setting: str | None, source: str) -> Entry | None:
    return next((e for e in c.entries.get(setting, []) if e.source == source), None)


def _table_setting(c: Comparison, kind: str) -> str | None:
    """The setting of ``kind`` the table shows: one every source ran (else one most ran),
    cold first, then the fastest across the sources (the geometric mean of their medians,
    so that each source weighs alike): the same setting whichever PATH comes first."""
    settings = {s: es for s, es in c.entries.items() if es[0].kind == kind}
    if not settings:
        return None
    most = max(len({e.source for e in es}) for es in settings.values())
    shared = {s: es for s, es in settings.items() if len({e.source for e in es}) == most}
    cold = {s: es for s, es in shared.items() if es[0].cache == "cold"} or shared

    def across_sources(item):
        setting, entries = item
        return (statistics.geometric_mean(max(e.median, 1e-9) for e in entries), setting)

    return min(cold.items(), key=across_sources)[0]


def _table_verdict(c: Comparison, source: str, read: str | None, write: str | None) -> str:
    """The verdicts of the block below and of the gate, on what ranks the setting (seconds:
    time to state, RTO, save time), each said with the figure it is judged on: the GB/s
    beside it are bytes over those seconds, and of another checkpoint's bytes they part."""
    if source == c.sources[0]:
        return "base"
    parts = []
    for what, setting in (("read", read), ("write", write)):
        if setting is None:
            continue
        entry, base = _entry(c, setting, source), _entry(c, setting, c.sources[0])
        if entry is None:
            parts += [f"{what}: no run"] if base is not None else []
            continue
        found = next((f for f in c.findings if f.source == source and f.setting == setting
                      and f.what == entry.metric), None)  # fmt: skip
        figure = entry.metric
        if base is not None and not same_work(base, entry):
            figure += ", another checkpoint"
        if found is None:
            parts.append(f"{what}: -")
        elif found.beyond_spread and found.judged:
            parts.append(f"{what} ({figure}): {found.verdict} ({found.change:+.0%})")
        else:
            parts.append(f"{what} ({figure}): {found.verdict}")
    return "; ".join(parts)


def _phase_table(c: Comparison, read: str | None, write: str | None, width: int) -> list[str]:
    """Per source, the median seconds of each save and restore phase of the table's
    settings (the first step: this machine's compute for a synthetic restore)."""
    columns: list[tuple[str, str]] = []
    for setting, phases in ((write, SAVE_PHASES), (read, RESTORE_PHASES)):
        if setting is None:
            continue
        for p in phases:
            if any(e.phases.get(p.value) for e in c.entries[setting]):
                columns.append((setting, p.value))
    if not columns:
        return []
    lines = [f"  {'phases (median s)':<{width + 2}}" + "".join(
        f" {short_phase(n):>9}" for _, n in columns)]  # fmt: skip
    for source in c.sources:
        row = f"  {source:<{width + 2}}"
        for setting, name in columns:
            e = _entry(c, setting, source)
            value = e.phase_median(name) if e else None
            row += f" {value:>9.3f}" if value is not None else f" {'-':>9}"
        lines.append(row)
    return lines


def short_phase(phase: str) -> str:
    """A phase's name as a column heading: "deser", "1st_step", "serial"."""
    return {"deserialize": "deser", "first_step": "1st_step", "serialize": "serial"}.get(
        phase, phase
    )


__all__ = [
    "STORAGE_COLUMNS",
    "ceiling_notes",
    "of_ceiling_cell",
    "short_phase",
    "storage_rows",
    "storage_table",
]
