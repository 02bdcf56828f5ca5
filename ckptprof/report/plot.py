"""``--plot``: phase bars per configuration and fetch GB/s against concurrency.

matplotlib is a base dependency (the README's main job ends with a picture) but is
imported only here, only when a plot is asked for; the figure is drawn on an Agg canvas
without pyplot, so no global backend state is touched.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ckptprof.atomic import atomic_open
from ckptprof.errors import CkptprofError
from ckptprof.phases import Phase
from ckptprof.report.breakdown import Breakdown, Report
from ckptprof.report.labels import source_labels
from ckptprof.report.medians import phase_order
from ckptprof.report.timeline import Timeline
from ckptprof.units import fmt_s

#: one colour per phase across save and restore (and the interruption's), none twice
PHASE_COLORS = {
    "list": "#8c564b",
    "fetch": "#1f77b4",
    "verify": "#ff7f0e",
    "deserialize": "#2ca02c",
    "reshard": "#9467bd",
    "first_step": "#d62728",
    "stage": "#aec7e8",
    "serialize": "#17becf",
    "write": "#e377c2",
    "fsync": "#393b79",
    "commit": "#7f7f7f",
    "notice": "#ffbb78",
    "emergency_save": "#843c39",
}
#: for an adapter's own phases (``rotate``), in order of first use: none a phase's colour
_SPARE_COLORS = ("#637939", "#e7969c", "#5254a3", "#8ca252", "#bd9e39", "#ad494a", "#a55194")
#: what heads a restore whose first step ran, as the text report's column says it
TO_STATE = "to state"
#: each phase's median comes from its own runs: their stack may pass the median wall time
_STACK = "bars: each phase's median, over the runs (their sum may pass the tick)"
_AXIS = f"median seconds (black tick: wall time = critical path; line: min–max)\n{_STACK}"
_AXIS_BESIDE = (
    "median seconds (black tick and line: the time to state, list → reshard, where a first step\n"
    f"ran, else the wall time: median and min–max; diamond: the RTO, first step included)\n{_STACK}"
)


def phase_color(name: str) -> str:
    """The colour ``name`` is drawn in everywhere (a phase's own, or a spare one picked
    by the name, stable from one report to the next)."""
    if name in PHASE_COLORS:
        return PHASE_COLORS[name]
    return _SPARE_COLORS[sum(name.encode()) % len(_SPARE_COLORS)]


def _prefixes(report: Report) -> list[str]:
    """Each sweep's source label, as a prefix of its rows (none where there is one)."""
    if len(report.sweeps) < 2:
        return [""] * len(report.sweeps)
    return [f"{label}: " for label in source_labels([s.path for s in report.sweeps])]


@dataclass(frozen=True)
class Bar:
    """One bar of a phase chart: its phases stacked, and the figure it is ranked by, drawn
    (black tick, min–max line) and labelled with: ``word`` ("to state", "RTO", "save"),
    ``spread`` (median, min, max over the repeats); ``rto_s``, the median RTO (first
    step included), shown beside a time to state as a diamond and a second line."""

    label: str
    breakdown: Breakdown
    word: str
    spread: tuple[float, float, float]
    rto_s: float | None = None


def headline_bar(label: str, b: Breakdown) -> Bar:
    """A report's bar, headed as the text report heads it: a restore whose first step ran
    by its time to state (list -> reshard), the RTO beside it; any other by its wall time."""
    if b.kind == "restore" and b.state_s is not None and b.phase(Phase.FIRST_STEP):
        return Bar(label, b, TO_STATE, b.state_s, b.wall_median_s)
    word = "RTO" if b.kind == "restore" else "save"
    return Bar(label, b, word, (b.wall_median_s, b.wall_min_s, b.wall_max_s))


def _bars(report: Report) -> list[Bar]:
    bars: list[Bar] = []
    for prefix, sweep in zip(_prefixes(report), report.sweeps, strict=True):
        bars += [headline_bar(prefix + row.breakdown.label, row.breakdown) for row in sweep.rows]
    for group in report.groups:
        if group.breakdown is not None:
            bars.append(headline_bar(f"{group.kind} {group.breakdown.label}", group.breakdown))
    return bars


def _note(bar: Bar) -> str:
    """A bar's label: its figure with the repeats' min–max, then the RTO beside it."""
    median, low, high = bar.spread
    note = f"{bar.word} {fmt_s(median)} s"
    if bar.breakdown.repeats > 1 and high > low:
        note += f" ({fmt_s(low)}–{fmt_s(high)})"
    return note + (f"\nRTO {fmt_s(bar.rto_s)} s" if bar.rto_s is not None else "")


def _draw_bars(ax, bars: list[Bar]) -> None:
    breakdowns = [bar.breakdown for bar in bars]
    names = phase_order("restore", {r.phase for b in breakdowns for r in b.phases})
    names += [
        n
        for n in phase_order("save", {r.phase for b in breakdowns for r in b.phases})
        if n not in names
    ]
    y = list(range(len(bars)))
    left = [0.0] * len(bars)
    for name in names:
        widths = [(b.phase(name).busy_s if b.phase(name) else 0.0) for b in breakdowns]
        if not any(widths):
            continue
        ax.barh(y, widths, left=left, color=phase_color(name), label=name, edgecolor="white")
        for i, b in enumerate(breakdowns):
            row = b.phase(name)
            if row is not None and row.emulated and widths[i]:
                ax.barh(i, widths[i], left=left[i], fill=False, hatch="//", edgecolor="white")
        left = [a + w for a, w in zip(left, widths, strict=True)]
    for i, bar in enumerate(bars):
        median, low, high = bar.spread
        ax.plot([median] * 2, [i - 0.45, i + 0.45], color="black", linewidth=1.5, gid=f"ranked-{i}")
        if bar.breakdown.repeats > 1 and high > low:  # the repeats' spread, min to max
            ax.plot([low, high], [i, i], color="black", linewidth=0.8, gid=f"spread-{i}")
        if bar.rto_s is not None:
            ax.plot([bar.rto_s], [i], marker="D", markersize=5, markerfacecolor="white",
                    markeredgecolor="black", linestyle="none", gid=f"rto-{i}")  # fmt: skip
        ax.annotate(_note(bar), (max(high, left[i], bar.rto_s or 0.0), i), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=8)  # fmt: skip
    ax.set_yticks(y, [bar.label for bar in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_title("Where the time goes, per configuration")
    beside = any(bar.rto_s is not None for bar in bars)
    ax.set_xlabel(_AXIS_BESIDE if beside else _AXIS)
    ends = [max(left[i], bar.spread[2], bar.rto_s or 0.0) for i, bar in enumerate(bars)]
    ax.set_xlim(0, max(ends) * 1.5 or 1.0)  # room for the labels
    ax.legend(
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        title="phase (hatched: emulated)",
        title_fontsize=8,
    )


def _draw_concurrency(ax, report: Report) -> None:
    levels: set[int] = set()
    dashes = ("--", ":", "-.", (0, (5, 1, 1, 1)))
    for index, (prefix, sweep) in enumerate(zip(_prefixes(report), report.sweeps, strict=True)):
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        strategies = len({row.breakdown.strategy for row in sweep.rows}) > 1
        for row in sweep.rows:
            b = row.breakdown
            if b.concurrency is not None and row.fetch_gbps is not None:
                name = str(b.cache or "runs")
                if strategies:
                    name = f"{b.strategy} {name}"
                series[name].append((b.concurrency, row.fetch_gbps))
        for cache, points in sorted(series.items()):
            points.sort()
            levels.update(p[0] for p in points)
            ax.plot(
                [p[0] for p in points], [p[1] for p in points], marker="o", label=prefix + cache
            )
        if sweep.ceiling and sweep.ceiling.read_gbps:  # each sweep's ceiling its own line
            ax.axhline(
                sweep.ceiling.read_gbps,
                linestyle=dashes[index % len(dashes)],
                color=ax.lines[-1].get_color() if series else "gray",
                label=f"{prefix}ceiling {sweep.ceiling.read_gbps:.2f} GB/s",
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(levels), [str(c) for c in sorted(levels)])
    ax.minorticks_off()
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("fetch GB/s (median)")
    ax.set_title("Fetch throughput vs concurrency")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _has_concurrency_sweep(report: Report) -> bool:
    return any(
        len({r.breakdown.concurrency for r in s.rows if r.fetch_gbps is not None}) > 1
        for s in report.sweeps
    )


def _figure(height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(10, height), layout="constrained")


def require_matplotlib(path: str | os.PathLike, option: str = "--plot") -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CkptprofError(
            f"{option} {path}: matplotlib is not installed — pip install matplotlib"
        ) from None


def summary_figure(report: Report):
    """Phase bars per configuration, and fetch GB/s vs concurrency where a sweep varied
    it (what ``--plot`` draws); None when nothing succeeded."""
    bars = _bars(report)
    if not bars:
        return None
    sweep_panel = _has_concurrency_sweep(report)
    fig = _figure(1.2 + 0.45 * len(bars) + (4 if sweep_panel else 0))
    if sweep_panel:
        top, bottom = fig.subplots(2, 1, height_ratios=[max(len(bars), 2), 4])
        _draw_bars(top, bars)
        _draw_concurrency(bottom, report)
    else:
        _draw_bars(fig.subplots(), bars)
    return fig


def bars_figure(report: Report):
    bars = _bars(report)
    if not bars:
        return None
    fig = _figure(1.2 + 0.45 * len(bars))
    _draw_bars(fig.subplots(), bars)
    return fig


def concurrency_figure(report: Report):
    if not _has_concurrency_sweep(report):
        return None
    fig = _figure(4)
    _draw_concurrency(fig.subplots(), report)
    return fig


def ranks_figure(per_rank: list[dict]):
    """Each rank's RTO with its fetch part: the slowest rank sets the job's RTO."""
    rows = sorted(
        (r for r in per_rank if isinstance(r.get("wall_s"), (int, float))),
        key=lambda r: r.get("rank") or 0,
    )
    if len(rows) < 2:
        return None
    fig = _figure(1.2 + 0.3 * len(rows))
    ax = fig.subplots()
    y = list(range(len(rows)))
    walls = [float(r["wall_s"]) for r in rows]
    fetch = [float(r.get("fetch_s") or 0.0) for r in rows]
    ax.barh(y, walls, color="#c7c7c7", label="RTO")
    ax.barh(y, fetch, color=phase_color("fetch"), label="fetch")
    slowest = walls.index(max(walls))
    ax.barh(slowest, walls[slowest], fill=False, edgecolor="black", linewidth=1.2)
    ax.set_yticks(y, [f"rank {r.get('rank')} (node {r.get('node', '?')})" for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, max(walls) * 1.1)
    ax.set_xlabel("seconds (outlined: the slowest rank, the job's RTO)")
    ax.set_title("Per-rank spread")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def timeline_figure(line: Timeline):
    """One operation in time: a row of phases, each drawn where it was busy (a phase that
    ran in pieces as its pieces, not its first-to-last extent), then one row per
    concurrent file read. Each phase's bars are the SVG group ``phase-<name>``."""
    lanes = line.lanes()
    fig = _figure(1.6 + 0.22 * (len(lanes) + 1))
    ax = fig.subplots()
    t0 = line.start_ns
    for phase in line.phases:
        ax.broken_barh(
            [((s - t0) / 1e9, (e - s) / 1e9) for s, e in phase.busy()],
            (-0.4, 0.8),
            color=phase_color(phase.name),
            label=phase.name,
            gid=f"phase-{phase.name}",
        )
    row_of = {lane: i + 1 for i, lane in enumerate(lanes)}
    for item in line.files:
        ax.broken_barh(
            [((item.start_ns - t0) / 1e9, item.seconds)],
            (row_of[(item.phase, item.lane)] - 0.35, 0.7),
            color=phase_color(item.phase),
            edgecolor="white",
            linewidth=0.3,
        )
    ax.set_yticks(range(len(lanes) + 1), ["phases"] + [f"{phase} {lane}" for phase, lane in lanes])
    ax.tick_params(axis="y", labelsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, line.wall_s * 1.02 or 1.0)
    reads = " (rows below: each file read)" if line.files else ""
    ax.set_xlabel(f"seconds since the operation began{reads}")
    ax.set_title(f"Timeline of one {line.kind}: {line.label()}, {line.wall_s:.3f} s")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def write_plot(report: Report, path: str | os.PathLike) -> Path:
    """Draw the report to ``path`` (format from its suffix, PNG by default), atomically.

    Raises:
        CkptprofError: matplotlib is missing, the format is unknown, the folder
            does not exist, or there is nothing to plot.
    """
    return save_figure(lambda: summary_figure(report), path, "--plot")


def check_image_path(path: str | os.PathLike, option: str = "--plot") -> str:
    """The image format ``path`` names (``png`` where it names none), once matplotlib,
    the folder and the format are known to do: what a command checks before its work.

    Raises:
        CkptprofError: matplotlib is missing, the folder does not exist, or the format
            is not one matplotlib writes.
    """
    target = Path(path).expanduser()
    require_matplotlib(path, option)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not target.parent.is_dir():
        raise CkptprofError(
            f"{option} {path}: folder {target.parent} does not exist — create it first"
        )
    fmt = target.suffix.lstrip(".").lower() or "png"
    if fmt not in FigureCanvasAgg(_figure(1)).get_supported_filetypes():
        raise CkptprofError(
            f"{option} {path}: unknown image format '.{fmt}' — use a .png file name"
        )
    return fmt


def save_figure(make, path: str | os.PathLike, option: str) -> Path:
    """``make()``'s figure written to ``path`` atomically, after checking what can be
    checked before drawing (matplotlib, the folder, the format)."""
    target = Path(path).expanduser()
    fmt = check_image_path(path, option)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = make()
    if fig is None:
        raise CkptprofError(f"{option} {path}: no successful operations to plot")
    FigureCanvasAgg(fig)
    with atomic_open(target, "wb") as handle:
        fig.savefig(handle, format=fmt, dpi=110)
    return target


def goodput_figure(goodput) -> object:
    """Where the job's wall time went: one stacked bar per process (its downtime after
    it), and the job's."""
    from ckptprof.report.goodput import BUCKETS, LABELS

    colors = {
        "productive": "#2e7d32", "restore": "#1565c0", "first_step": "#64b5f6",
        "save_blocking": "#ef6c00", "background_slowdown": "#ffb74d", "lost_work": "#c62828",
        "downtime": "#757575", "other": "#d7ccc8",
    }  # fmt: skip
    rows = []
    for i, lt in enumerate(goodput.lifetimes):
        values = dict(lt.buckets)
        values["downtime"] = goodput.downtimes_s[i] if i < len(goodput.downtimes_s) else 0.0
        rows.append((f"process {i + 1}", values))
    rows.append(("job", goodput.total))
    fig = _figure(1.4 + 0.5 * len(rows))
    ax = fig.subplots()
    for y, (_, values) in enumerate(rows):
        left = 0.0
        for bucket in BUCKETS:
            width = max(0.0, values.get(bucket, 0.0))
            ax.barh(
                y, width, left=left, color=colors[bucket], label=LABELS[bucket] if y == 0 else None
            )
            left += width
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds of wall time")
    ax.set_title(f"goodput {goodput.goodput:.1%}: where the job's time went")
    ax.legend(loc="lower right", fontsize="small", ncols=2)
    return fig


def compare_figure(comparison) -> object | None:
    """``ckptprof compare --plot``: per setting, one bar per source, fastest first by what
    ranks it (compare's metric: a synthetic restore's time to state, a real resume's RTO, a
    save's time), that figure drawn and labelled with its min–max, the RTO beside a time to
    state, the base marked; phases stacked; settings in the text's order (the report's)."""
    from ckptprof.report.breakdown import PhaseRow
    from ckptprof.report.comparison import RTO, TTS, setting_order

    bars: list[Bar] = []
    base = comparison.sources[0]
    for setting in setting_order(comparison):
        for entry in sorted(comparison.entries[setting], key=lambda e: e.median):
            rows = [
                PhaseRow(name, entry.phase_median(name) or 0.0, None, None, None, None)
                for name in phase_order(entry.kind, set(entry.phases))
            ]
            label = f"{setting}: {entry.source}" + (" (base)" if entry.source == base else "")
            walls = (entry.rto_median, min(entry.walls), max(entry.walls))
            b = Breakdown(label, entry.kind, len(entry.values), *walls, rows)
            ranked = (entry.median, min(entry.values), max(entry.values))
            word = {TTS: TO_STATE, RTO: "RTO"}.get(entry.metric, "save")
            bars.append(Bar(label, b, word, ranked, entry.rto_median if word == TO_STATE else None))
    if not bars:
        return None
    fig = _figure(1.2 + 0.45 * len(bars))
    ax = fig.subplots()
    _draw_bars(ax, bars)
    by = ", ".join(comparison.metrics())
    ax.set_title(f"Compared: median seconds per phase, fastest first within each setting by {by}")
    return fig


def svg(fig) -> str:
    """The figure as an inline ``<svg>`` element (for the HTML report)."""
    import io

    from matplotlib.backends.backend_svg import FigureCanvasSVG

    FigureCanvasSVG(fig)
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg") :]
