"""``--plot``: phase bars per configuration and fetch GB/s against concurrency.

matplotlib is a base dependency (the README's main job ends with a picture) but is
imported only here, only when a plot is asked for; the figure is drawn on an Agg canvas
without pyplot, so no global backend state is touched.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from ckptprof.atomic import atomic_open
from ckptprof.errors import CkptprofError
from ckptprof.report.breakdown import Breakdown, Report
from ckptprof.report.labels import source_labels
from ckptprof.report.medians import phase_order
from ckptprof.report.timeline import Timeline

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


def _bars(report: Report) -> list[tuple[str, Breakdown]]:
    bars: list[tuple[str, Breakdown]] = []
    for prefix, sweep in zip(_prefixes(report), report.sweeps, strict=True):
        bars += [(prefix + row.breakdown.label, row.breakdown) for row in sweep.rows]
    for group in report.groups:
        if group.breakdown is not None:
            bars.append((f"{group.kind} {group.breakdown.label}", group.breakdown))
    return bars


def _draw_bars(ax, bars: list[tuple[str, Breakdown]]) -> None:
    names = phase_order("restore", {r.phase for _, b in bars for r in b.phases})
    names += [
        n
        for n in phase_order("save", {r.phase for _, b in bars for r in b.phases})
        if n not in names
    ]
    y = list(range(len(bars)))
    left = [0.0] * len(bars)
    for name in names:
        widths = [(b.phase(name).busy_s if b.phase(name) else 0.0) for _, b in bars]
        if not any(widths):
            continue
        ax.barh(y, widths, left=left, color=phase_color(name), label=name, edgecolor="white")
        for i, (_, b) in enumerate(bars):
            row = b.phase(name)
            if row is not None and row.emulated and widths[i]:
                ax.barh(i, widths[i], left=left[i], fill=False, hatch="//", edgecolor="white")
        left = [a + w for a, w in zip(left, widths, strict=True)]
    for i, (_, b) in enumerate(bars):
        word = "RTO" if b.kind == "restore" else "save"
        ax.plot([b.wall_median_s] * 2, [i - 0.45, i + 0.45], color="black", linewidth=1.5)
        if b.repeats > 1 and b.wall_max_s > b.wall_min_s:  # the repeats' spread, min to max
            ax.plot([b.wall_min_s, b.wall_max_s], [i, i], color="black", linewidth=0.8)
        ax.annotate(
            f"{word} {b.wall_median_s:.3g} s",
            (max(b.wall_median_s, b.wall_max_s, left[i]), i),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(y, [label for label, _ in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("median seconds (black tick: wall time = critical path; line: min–max)")
    ax.set_title("Where the time goes, per configuration")
    ax.set_xlim(0, max(max(left), max(b.wall_max_s for _, b in bars)) * 1.22 or 1.0)
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
    """``ckptprof compare --plot``: per setting, one bar per source (fastest first, the
    base marked), phases stacked, the repeats' min–max drawn."""
    from ckptprof.report.breakdown import PhaseRow

    bars: list[tuple[str, Breakdown]] = []
    base = comparison.sources[0]
    for setting, entries in sorted(comparison.entries.items()):
        for entry in sorted(entries, key=lambda e: e.median):
            rows = [
                PhaseRow(name, entry.phase_median(name) or 0.0, None, None, None, None)
                for name in phase_order(entry.kind, set(entry.phases))
            ]
            label = f"{setting}: {entry.source}" + (" (base)" if entry.source == base else "")
            bars.append(
                (
                    label,
                    Breakdown(
                        label,
                        entry.kind,
                        len(entry.walls),
                        entry.rto_median,
                        min(entry.walls),
                        max(entry.walls),
                        rows,
                    ),  # fmt: skip
                )
            )
    if not bars:
        return None
    fig = _figure(1.2 + 0.45 * len(bars))
    ax = fig.subplots()
    _draw_bars(ax, bars)
    ax.set_title("Compared: median seconds per phase, fastest first within each setting")
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
