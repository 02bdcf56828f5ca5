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
from ckptprof.report.aggregate import Breakdown, Report, phase_order

_COLORS = {
    "list": "#8c564b",
    "fetch": "#1f77b4",
    "verify": "#ff7f0e",
    "deserialize": "#2ca02c",
    "reshard": "#9467bd",
    "first_step": "#d62728",
    "serialize": "#17becf",
    "write": "#e377c2",
    "upload": "#bcbd22",
    "commit": "#7f7f7f",
}


def _bars(report: Report) -> list[tuple[str, Breakdown]]:
    bars: list[tuple[str, Breakdown]] = []
    many_sweeps = len(report.sweeps) > 1
    for index, sweep in enumerate(report.sweeps):
        prefix = f"#{index + 1} " if many_sweeps else ""
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
        ax.barh(y, widths, left=left, color=_COLORS.get(name), label=name, edgecolor="white")
        for i, (_, b) in enumerate(bars):
            row = b.phase(name)
            if row is not None and row.emulated and widths[i]:
                ax.barh(i, widths[i], left=left[i], fill=False, hatch="//", edgecolor="white")
        left = [a + w for a, w in zip(left, widths, strict=True)]
    for i, (_, b) in enumerate(bars):
        word = "RTO" if b.kind == "restore" else "save"
        ax.plot([b.wall_median_s] * 2, [i - 0.45, i + 0.45], color="black", linewidth=1.5)
        ax.annotate(
            f"{word} {b.wall_median_s:.3g} s",
            (max(b.wall_median_s, left[i]), i),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(y, [label for label, _ in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("median seconds (black tick: wall time = critical path)")
    ax.set_title("Where the time goes, per configuration")
    ax.set_xlim(0, max(max(left), max(b.wall_median_s for _, b in bars)) * 1.22 or 1.0)
    ax.legend(
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        title="phase (hatched: emulated)",
        title_fontsize=8,
    )


def _draw_concurrency(ax, report: Report) -> None:
    levels: set[int] = set()
    for index, sweep in enumerate(report.sweeps):
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for row in sweep.rows:
            b = row.breakdown
            if b.concurrency is not None and row.fetch_gbps is not None:
                series[str(b.cache or "runs")].append((b.concurrency, row.fetch_gbps))
        prefix = f"#{index + 1} " if len(report.sweeps) > 1 else ""
        for cache, points in sorted(series.items()):
            points.sort()
            levels.update(p[0] for p in points)
            ax.plot(
                [p[0] for p in points], [p[1] for p in points], marker="o", label=prefix + cache
            )
        if sweep.ceiling and sweep.ceiling.read_gbps:
            ax.axhline(
                sweep.ceiling.read_gbps,
                linestyle="--",
                color="gray",
                label=f"{prefix}ceiling {sweep.ceiling.read_gbps:.2f} GB/s",
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(levels), [str(c) for c in sorted(levels)])
    ax.minorticks_off()
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("fetch GB/s (median)")
    ax.set_title("Fetch throughput vs concurrency")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _has_concurrency_sweep(report: Report) -> bool:
    return any(
        len({r.breakdown.concurrency for r in s.rows if r.fetch_gbps is not None}) > 1
        for s in report.sweeps
    )


def write_plot(report: Report, path: str | os.PathLike) -> Path:
    """Draw the report to ``path`` (format from its suffix, PNG by default), atomically.

    Raises:
        CkptprofError: matplotlib is missing, the format is unknown, the folder
            does not exist, or there is nothing to plot.
    """
    target = Path(path).expanduser()
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise CkptprofError(
            f"--plot {path}: matplotlib is not installed — pip install matplotlib"
        ) from None
    if not target.parent.is_dir():
        raise CkptprofError(
            f"--plot {path}: folder {target.parent} does not exist — create it first"
        )
    bars = _bars(report)
    if not bars:
        raise CkptprofError(f"--plot {path}: no successful operations to plot")
    fmt = target.suffix.lstrip(".").lower() or "png"
    sweep_panel = _has_concurrency_sweep(report)
    fig = Figure(
        figsize=(10, 1.2 + 0.45 * len(bars) + (4 if sweep_panel else 0)), layout="constrained"
    )
    canvas = FigureCanvasAgg(fig)
    if fmt not in canvas.get_supported_filetypes():
        raise CkptprofError(f"--plot {path}: unknown image format '.{fmt}' — use a .png file name")
    if sweep_panel:
        top, bottom = fig.subplots(2, 1, height_ratios=[max(len(bars), 2), 4])
        _draw_bars(top, bars)
        _draw_concurrency(bottom, report)
    else:
        _draw_bars(fig.subplots(), bars)
    with atomic_open(target, "wb") as handle:
        fig.savefig(handle, format=fmt, dpi=110)
    return target
