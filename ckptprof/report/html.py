"""``ckptprof report --html``: one self-contained page that opens offline.

Charts are matplotlib figures inlined as SVG (no script, no network, nothing to host);
tables and prose come from the same :class:`~ckptprof.report.aggregate.Report` the
terminal report prints, so the two never disagree.
"""

from __future__ import annotations

import html
import os
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ckptprof import __version__
from ckptprof.atomic import atomic_open
from ckptprof.errors import CkptprofError
from ckptprof.phases import Phase
from ckptprof.report import plot
from ckptprof.report.breakdown import Report, Sweep
from ckptprof.report.hints import Hint
from ckptprof.report.interruptions import Story, render_stories
from ckptprof.report.labels import source_labels
from ckptprof.report.medians import phase_order
from ckptprof.report.skew import skew_rows, skew_sentence
from ckptprof.report.text import render_text
from ckptprof.report.text_group import outside_text, phase_note
from ckptprof.report.text_sweep import ceiling_cell, env_highlights, sweep_notes
from ckptprof.report.timeline import Timeline
from ckptprof.units import fmt_bytes, fmt_gbps, fmt_s

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
.meta { color: #666; }
table { border-collapse: collapse; margin: 0.6em 0; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 9px; border-bottom: 1px solid #eee; text-align: right; }
th { background: #f6f6f6; }
td.l, th.l { text-align: left; }
figure { margin: 1em 0; }
figure svg { max-width: 100%; height: auto; }
.hint { background: #fff8e1; border-left: 4px solid #f0b400; padding: 0.4em 0.8em;
        margin: 0.4em 0; }
.hint code { color: #7a5c00; }
.hint .source { font-weight: 600; margin-right: 0.4em; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 12px; }
.emulated { color: #a33; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], left: int = 1) -> str:
    """An HTML table; the first ``left`` columns are text (left-aligned)."""
    head = "".join(
        f'<th class="{"l" if i < left else ""}">{_e(h)}</th>' for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{"l" if i < left else ""}">{_e(c)}</td>' for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(fig, caption: str, name: str, salt: str = "") -> str:
    if fig is None:
        return ""
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": name + salt}):
        image = plot.svg(fig)
    return f'<figure data-chart="{_e(name)}">{image}<figcaption>{_e(caption)}</figcaption></figure>'


def _hints(hints: Sequence[Hint], source: str) -> str:
    """Hints of one source, each labelled with it (a page may hold several sources)."""
    return "".join(
        f'<div class="hint" data-source="{_e(source)}"><span class="source">{_e(source)}</span> '
        f"<code>{_e(h.code)}</code> {_e(h.message)}</div>"
        for h in hints
    )


def _hints_by_source(report: Report, labels: Sequence[str]) -> str:
    """Every hint once, grouped under the source it is about."""
    groups = [(label, s.hints) for label, s in zip(labels, report.sweeps, strict=True)]
    groups += [(_group_label(g), g.hints) for g in report.groups]
    found = [(label, hints) for label, hints in groups if hints]
    if not found:
        return ""
    return "<h2>What to look at</h2>" + "".join(
        f"<h3>{_e(label)}</h3>{_hints(hints, label)}" for label, hints in found
    )


def _group_label(group) -> str:
    label = group.breakdown.label if group.breakdown is not None else ""
    return f"traced {group.kind}" + (f": {label}" if label else "")


def _storage_section(paths: Sequence[str]) -> str:
    """Several PATHs: the storages side by side (compare's storage table), first."""
    from ckptprof.report.compare import compare
    from ckptprof.report.compare_storage import STORAGE_COLUMNS, ceiling_notes, storage_rows
    from ckptprof.report.compare_text import ranked_by

    if len(paths) < 2:
        return ""
    try:
        c = compare(list(paths), source_labels(paths))
    except CkptprofError as exc:  # runs that cannot be one source; a PATH of run spans only
        return f'<h2>Storages side by side</h2><p class="note">not shown: {_e(str(exc))}</p>'
    head, rows = storage_rows(c)
    if not rows:
        return ""
    return (
        "<h2>Storages side by side</h2>"
        f'<p class="meta">{_e(head)}; the first is the base; ranked: {_e(ranked_by(c))}</p>'
        + _table(STORAGE_COLUMNS, rows, left=1).replace("<table>", '<table data-view="storage">')
        + "".join(f'<p class="note">{_e(note)}</p>' for note in ceiling_notes(c))
    )


def _sweep_section(label: str, sweep: Sweep) -> str:
    names = phase_order("restore", {r.phase for row in sweep.rows for r in row.breakdown.phases})
    rows = []
    for row in sweep.rows:
        b = row.breakdown
        phases = []
        for name in names:
            phase = b.phase(name)
            if phase is None:
                phases.append("-")
                continue
            mark = " (fused)" if phase.fused else " (lazy)" if phase.lazy else ""
            phases.append(fmt_s(phase.busy_s) + ("*" * phase.emulated) + mark)
        state = "-"
        if b.state_s is not None:
            state = f"{fmt_s(b.state_s[0])} ({fmt_s(b.state_s[1])}–{fmt_s(b.state_s[2])})"
        rows.append(
            [
                label,
                b.strategy or "-",
                b.cache or "-",
                "-" if b.concurrency is None else b.concurrency,
                b.repeats,
                state,
                f"{fmt_s(b.wall_median_s)} ({fmt_s(b.wall_min_s)}–{fmt_s(b.wall_max_s)})",
                *phases,
                fmt_gbps(row.fetch_gbps),
                ceiling_cell(row),
                "-" if b.resident_fraction is None else f"{b.resident_fraction:.0%}",
                fmt_bytes(b.peak_rss_bytes),
            ]
        )
    # the storage's figure first, as the text report heads its rows; the RTO beside it
    headers = ["source", "strategy", "cache", "concurrency", "runs", "to state s (min–max)"]
    headers += ["RTO s (min–max)", *names, "fetch GB/s", "of ceiling", "resident before"]
    headers += ["peak RSS"]
    parts = [f'<h2>Results: {_e(label)}</h2><p class="meta">{_e(sweep.path)}</p>']
    spec = ", ".join(f"{k}={v}" for k, v in sweep.spec.items() if isinstance(v, (str, int, float)))
    if spec:
        parts.append(f'<p class="meta">{_e(spec)}</p>')
    if sweep.ceiling and sweep.ceiling.read_gbps:
        source = f" ({sweep.ceiling.source})" if sweep.ceiling.source else ""
        parts.append(f"<p>Ceiling: {fmt_gbps(sweep.ceiling.read_gbps)} GB/s{_e(source)}.</p>")
    parts.append("<h3>Cold vs hot, per concurrency</h3>")
    parts.append(_table(headers, rows, left=3))
    if any("*" in str(c) for r in rows for c in r):
        parts.append('<p class="emulated">* emulated: an estimate, not a measurement</p>')
    parts += [f'<p class="note">{_e(note)}.</p>' for note in sweep_notes(sweep)]
    per_rank = [r for r in (sweep.job.get("per_rank") or []) if isinstance(r, dict)]
    if per_rank:
        parts.append("<h3>Per-rank spread</h3>")
        parts.append(_figure(plot.ranks_figure(per_rank), "each rank's RTO", "ranks", label))
        parts.append(
            _table(
                ["rank", "node", "host", "read", "RTO s", "fetch s"],
                (
                    [
                        r.get("rank"),
                        r.get("node"),
                        r.get("host") or "",
                        fmt_bytes(r.get("read_bytes")),
                        fmt_s(r.get("wall_s")),
                        fmt_s(r.get("fetch_s")),
                    ]
                    for r in sorted(per_rank, key=lambda r: r.get("rank") or 0)
                ),
                left=3,
            )
        )
    parts.append(_skew_part("Rank skew", sweep.skews))
    env = sweep.environment
    if env:
        parts.append("<h3>Environment</h3>")
        parts.append(f"<p>{_e('; '.join(env_highlights(env)))}</p>")
        parts.append(
            "<details><summary>everything recorded</summary>"
            + _table(["key", "value"], sorted((k, v) for k, v in env.items()), left=2)
            + "</details>"
        )
    return "".join(parts)


def _groups_section(report: Report) -> str:
    if not report.groups:
        return ""
    rows = []
    for group in report.groups:
        b = group.breakdown
        if b is None:
            continue
        rows.append(
            [
                group.kind,
                b.label,
                b.repeats,
                _state_cell(b),
                f"{fmt_s(b.wall_median_s)} ({fmt_s(b.wall_min_s)}–{fmt_s(b.wall_max_s)})",
                ", ".join(
                    " ".join(filter(None, (p.phase, fmt_s(p.busy_s), phase_note(b, p))))
                    for p in b.phases
                ),
                outside_text(b, "RTO" if group.kind == "restore" else "save time") or "-",
                _ranks_cell(group),
            ]
        )
    parts = ["<h2>Traced operations</h2>"]
    headers = ["kind", "configuration", "n", "to state s (min–max)", "wall s (min–max)"]
    headers += ["phases", "outside", "ranks"]
    parts.append(_table(headers, rows, 2))
    for group in report.groups:
        parts.append(_skew_part(f"Rank skew, {_group_label(group)}", group.skews))
    return "".join(parts)


def _state_cell(b) -> str:
    """A restore's time to state with its min–max where a first step ran (what the bar of
    the chart and the text report head it with), else "-"."""
    if b.state_s is None or b.phase(Phase.FIRST_STEP) is None:
        return "-"
    median, low, high = b.state_s
    return f"{fmt_s(median)} ({fmt_s(low)}–{fmt_s(high)})"


def _skew_part(heading: str, skews) -> str:
    """The worst operation's rank skew: its sentence and its ranks, as the text says them."""
    sentence = skew_sentence(skews)
    if sentence is None:
        return ""
    rows = "\n".join(skew_rows(skews))
    return f"<h3>{_e(heading)}</h3><p>{_e(sentence)}</p>" + (
        f"<pre>{_e(rows)}</pre>" if rows else ""
    )


def _ranks_cell(group) -> str:
    """The slowest rank and, where ranks began apart, the skew's sentence."""
    spread = group.ranks
    slowest = spread and f"slowest rank {spread.slowest_rank} {fmt_s(spread.slowest_wall_s)} s"
    return "; ".join(filter(None, (slowest, skew_sentence(group.skews)))) or "-"


def _save_restore_section(report: Report) -> str:
    """Saves beside the restores of the same checkpoint, and the checkpoint intervals."""
    parts = []
    if report.save_restore:
        rows = [
            [
                p.location,
                p.strategy or "",
                f"{p.save_s:.3f}" + (" (blocking)" if p.blocking_only else ""),
                f"{p.save_gbps:.2f}",
                p.restore_label,
                f"{p.restore_s:.3f}",
                f"{p.restore_gbps:.2f}",
                f"{p.ratio:.2f}" if p.ratio is not None else "-",
            ]
            for p in report.save_restore
        ]
        parts.append("<h2>Save vs restore of the same checkpoint</h2>")
        headers = [
            "checkpoint",
            "save",
            "save s",
            "write GB/s",
            "restore",
            "to state s",
            "read GB/s",
        ]
        parts.append(_table([*headers, "write/read"], rows, 2))
    if report.intervals:
        rows = [
            [
                i.location,
                f"{i.save_s:.3f}",
                f"{i.interval_s / 60:.1f}",
                f"{i.save_share:.1%}",
                f"{i.lost_share:.1%}",
                f"{i.overhead_share:.1%}",
            ]
            for i in report.intervals
        ]
        mtbi = report.intervals[0].mtbi_s / 3600
        parts.append(f"<h2>Checkpoint interval at a {mtbi:.1f} h MTBI (Young/Daly)</h2>")
        headers = ["checkpoint", "save s", "every min", "saving", "lost work", "overhead"]
        parts.append(_table(headers, rows, 1))
    return "".join(parts)


def render_html(
    report: Report,
    timeline: Timeline | None = None,
    stories: Sequence[Story] = (),
    sources: Sequence[str] = (),
    goodput=None,
    paths: Sequence[str] = (),
) -> str:
    """The whole page as a string (see :func:`write_html`); ``paths``: the PATHs given,
    set side by side at the top when there are several."""
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<title>ckptprof report</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>Where checkpoint restore time goes</h1>",
        f'<p class="meta">ckptprof {_e(__version__)}, {made}; from {_e(", ".join(sources))}</p>',
    ]
    labels = source_labels([s.path for s in report.sweeps])
    parts.append(_storage_section(paths))
    parts.append(_hints_by_source(report, labels))  # every hint once, first, by source
    parts.append("<h2>Phase breakdown</h2>")
    parts.append(
        _figure(
            plot.bars_figure(report),
            "median seconds per phase; hatched phases are emulated; the black tick, its line "
            "(the repeats' min–max) and the first figure beside each bar: the time to state "
            "(list -> reshard) where a first step ran, else the wall time; the diamond and "
            "the second figure: the RTO, first step included",
            "phases",
        )
    )
    concurrency = plot.concurrency_figure(report)
    if concurrency is not None:
        parts.append("<h2>Fetch throughput vs concurrency</h2>")
        parts.append(_figure(concurrency, "median fetch GB/s, cold and hot", "concurrency"))
    if timeline is not None:
        parts.append(f"<h2>Timeline of one {_e(timeline.kind)}</h2>")
        caption = "its phases, each drawn where it was busy" + (
            ", then each file read"
            if timeline.files
            else " (each file read too with synth restore --per-file-spans)"
        )
        parts.append(_figure(plot.timeline_figure(timeline), caption, "timeline"))
    parts += [_sweep_section(label, s) for label, s in zip(labels, report.sweeps, strict=True)]
    parts.append(_groups_section(report))
    parts.append(_save_restore_section(report))
    if stories:
        parts.append("<h2>Interruptions</h2>")
        parts.append(f"<pre>{_e(render_stories(list(stories)))}</pre>")
    if goodput is not None:
        from ckptprof.report.goodput_text import render_goodput

        parts.append("<h2>Goodput across restarts</h2>")
        parts.append(
            _figure(plot.goodput_figure(goodput), "where the job's wall time went", "goodput")
        )
        parts.append(f"<pre>{_e(render_goodput(goodput))}</pre>")
    parts.append(
        "<details><summary>the terminal report, as printed</summary>"
        f"<pre>{_e(render_text(report))}</pre></details>"
    )
    parts.append("</body></html>\n")
    return "\n".join(p for p in parts if p)


def write_html(
    report: Report,
    path: str | os.PathLike,
    timeline: Timeline | None = None,
    stories: Sequence[Story] = (),
    sources: Sequence[str] = (),
    goodput=None,
    paths: Sequence[str] = (),
) -> Path:
    """Write the page atomically to ``path``.

    Raises:
        CkptprofError: the folder does not exist, nothing succeeded, or matplotlib is
            missing.
    """
    target = Path(path).expanduser()
    if not target.parent.is_dir():
        raise CkptprofError(
            f"--html {path}: folder {target.parent} does not exist — create it first"
        )
    plot.require_matplotlib(path, "--html")
    if not report.sweeps and not any(g.breakdown for g in report.groups):
        raise CkptprofError(f"--html {path}: no successful operations to show")
    page = render_html(report, timeline, stories, sources, goodput, paths)
    with atomic_open(target, "w", encoding="utf-8") as handle:
        handle.write(page)
    return target


__all__ = ["render_html", "write_html"]
