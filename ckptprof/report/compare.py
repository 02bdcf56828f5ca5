"""``ckptprof compare``: several runs side by side — storage targets, versions, strategies —
ranked by RTO per setting, with what each restore costs, and a regression gate for CI.

Each PATH is what ``ckptprof report`` reads (a results.json, traces, a folder). Like
settings are matched across them: a results sweep's (strategy, cache state,
concurrency), a trace group's configuration less where it was stored. The first PATH is
the base. The gate is noise-aware: a setting is *slower* only when its median is slower
by more than the limit **and** every repeat of it is slower than every repeat of the
base (the spreads do not overlap), with at least two repeats on each side — never a
single-sample verdict.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ckptprof.phases import RESTORE_PHASES, Attr
from ckptprof.report.aggregate import CONFIG_ATTRS, aggregate, short_label
from ckptprof.report.load import load
from ckptprof.units import fmt_bytes

SCHEMA_VERSION = 1
MIN_REPEATS = 2  # a verdict needs at least this many repeats on each side
PHASE_FLOOR = 0.05  # a phase must move by this share of the base RTO to count
#: configuration keys that name where a run was stored, not what it did
WHERE_KEYS = ("storage",)


@dataclass
class Entry:
    """One setting of one source: its runs' RTOs and each phase's per-run busy time."""

    source: str
    setting: str
    walls: list[float]
    phases: dict[str, list[float]] = field(default_factory=dict)
    #: what was restored (model, layout, bytes): runs of other checkpoints are no match
    checkpoint: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.walls)

    def phase_median(self, name: str) -> float | None:
        values = self.phases.get(name)
        return statistics.median(values) if values else None


@dataclass
class Finding:
    """A setting (or one of its phases) of a source against the base."""

    source: str
    setting: str
    what: str  # "RTO" or a phase name
    base_s: float
    new_s: float
    change: float  # new / base - 1
    beyond_spread: bool
    judged: bool  # enough repeats on both sides for a verdict
    slower: bool  # beyond the limit and the spread: a regression

    def line(self, limit: float | None) -> str:
        bound = f"; limit {percent(limit)}" if limit is not None else ""
        spread = "beyond the repeats' spread" if self.beyond_spread else "within the spread"
        return (
            f"{self.source}: {self.setting} {self.what} {self.new_s:.3f} s vs "
            f"{self.base_s:.3f} s ({self.change:+.0%}, {spread}{bound})"
        )


@dataclass
class Comparison:
    sources: list[str]
    entries: dict[str, list[Entry]]  # setting -> one entry per source that has it
    findings: list[Finding]
    cost_per_hour: float
    instances: int
    limit: float | None = None

    @property
    def regressions(self) -> list[Finding]:
        return [f for f in self.findings if f.slower]

    def unjudged_sources(self) -> list[str]:
        """Later sources the gate rendered no verdict on: no setting in common with the
        base, or too few repeats on a side. A gate that compared nothing has not passed."""
        judged = {f.source for f in self.findings if f.judged}
        return [s for s in self.sources[1:] if s not in judged]

    def settings_of(self, source: str) -> list[str]:
        return sorted(k for k, entries in self.entries.items() if any(
            e.source == source for e in entries))  # fmt: skip

    def checkpoints_of(self, source: str) -> list[str]:
        return sorted({e.checkpoint for es in self.entries.values() for e in es
                       if e.source == source and e.checkpoint})  # fmt: skip

    def gate_failure(self) -> str | None:
        """One line saying why the gate could not judge, or None when it did."""
        if self.limit is None:
            return None
        if len(self.sources) < 2:
            return (f"the gate compared nothing: only the base ({self.sources[0]}) was given "
                    "(an empty variable in the command line?); name the runs to judge after "
                    "it.")  # fmt: skip
        missing = self.unjudged_sources()
        if not missing:
            return None
        other = missing[0]
        base_settings, other_settings = self.settings_of(self.sources[0]), self.settings_of(other)
        if set(base_settings) & set(other_settings):
            why = f"each setting they share has fewer than {MIN_REPEATS} repeats on a side"
        else:
            why = (f"no setting in common (base: {', '.join(base_settings) or 'none'}; "
                   f"{other}: {', '.join(other_settings) or 'none'})")  # fmt: skip
        return (f"the gate compared nothing for {other}: {why}; run both with the same "
                f"settings and --repeat {MIN_REPEATS} or more.")  # fmt: skip

    def cost(self, seconds: float) -> float:
        return seconds / 3600 * self.cost_per_hour * self.instances


def percent(share: float) -> str:
    """A share as the user wrote it: 0.055 is "5.5%", never rounded to "6%"."""
    return f"{share * 100:.4g}%"


def _checkpoint(model: Any, layout: Any, size: Any) -> str:
    """What a run restored, in a few words ("llama2-7b safetensors x0.01")."""
    if isinstance(size, int) and not isinstance(size, bool):
        size = fmt_bytes(size) if size > 0 else None
    elif isinstance(size, float):
        size = f"x{size:g}"
    return " ".join(str(p) for p in (model, layout, size) if p)


def entries_of(path: str, label: str) -> list[Entry]:
    """The settings one PATH holds, with their runs."""
    data = load([path])
    out: list[Entry] = []
    for results in data.results:
        by_setting: dict[str, Entry] = {}
        for run in results.runs:
            conc = f"c={run.concurrency}" if run.concurrency else ""
            setting = " ".join(str(p) for p in (run.strategy, run.cache, conc) if p)
            spec = results.spec
            what = _checkpoint(spec.get("model"), spec.get("layout"), spec.get("scale"))
            entry = by_setting.setdefault(setting, Entry(label, setting, [], checkpoint=what))
            entry.walls.append(run.wall_s)
            for name, sample in run.phases.items():
                entry.phases.setdefault(name, []).append(sample.busy_s)
        out += by_setting.values()
    report = aggregate(type(data)(operations=data.operations))
    for group in report.groups:
        if group.kind != "restore" or not group.operations:
            continue
        config = {k: v for k, v in group.config.items() if k not in WHERE_KEYS}
        # the group's rows are numbers only: its checkpoint is told by its first operation
        first = next(op for op in data.operations if op.kind == group.kind and {
            label: op.attributes[key] for key, label in CONFIG_ATTRS if key in op.attributes
        } == group.config)  # fmt: skip
        what = _checkpoint(first.attr(Attr.MODEL), first.attr(Attr.LAYOUT, first.attr(Attr.FORMAT)),
                           first.attr(Attr.CHECKPOINT_BYTES))  # fmt: skip
        entry = Entry(label, short_label(config) or "restore", [], checkpoint=what)
        for op in group.operations:
            if op.failed:
                continue
            entry.walls.append(op.wall_s)
            for name, busy in op.phases.items():
                entry.phases.setdefault(name, []).append(busy)
        if entry.walls:
            out.append(entry)
    return out


def judge(base: Entry, new: Entry, limit: float | None) -> list[Finding]:
    """RTO and every phase of ``new`` against ``base`` (see the module docstring)."""
    judged = len(base.walls) >= MIN_REPEATS and len(new.walls) >= MIN_REPEATS
    findings = [_finding(base, new, "RTO", base.walls, new.walls, judged, limit)]
    floor = PHASE_FLOOR * base.median
    for name in [p.value for p in RESTORE_PHASES]:
        a, b = base.phases.get(name), new.phases.get(name)
        if not a or not b or abs(statistics.median(b) - statistics.median(a)) < floor:
            continue
        findings.append(_finding(base, new, name, a, b, judged, limit))
    return findings


def _finding(base, new, what, a: list[float], b: list[float], judged, limit) -> Finding:
    base_s, new_s = statistics.median(a), statistics.median(b)
    change = new_s / base_s - 1 if base_s > 0 else 0.0
    beyond = min(b) > max(a) or max(b) < min(a)
    slower = bool(judged and limit is not None and beyond and change > limit)
    return Finding(new.source, new.setting, what, base_s, new_s, change, beyond, judged, slower)


def compare(
    paths: list[str],
    labels: list[str] | None = None,
    limit: float | None = None,
    cost_per_hour: float | None = None,
    instances: int = 1,
) -> Comparison:
    """Load every PATH, match like settings, and judge each against the first."""
    from ckptprof.cost import cost_per_hour as default_rate

    labels = labels or [_label(p) for p in paths]
    by_setting: dict[str, list[Entry]] = {}
    for path, label in zip(paths, labels, strict=True):
        for entry in entries_of(path, label):
            by_setting.setdefault(entry.setting, []).append(entry)
    findings = []
    for entries in by_setting.values():
        base = next((e for e in entries if e.source == labels[0]), None)
        if base is None:
            continue
        for entry in entries:
            if entry is not base:
                findings += judge(base, entry, limit)
    return Comparison(labels, by_setting, findings, default_rate(cost_per_hour), instances, limit)


def _label(path: str) -> str:
    """A PATH as given, less a trailing results.json: short and unique."""
    p = Path(path)
    return str(p.parent if p.name == "results.json" else p)


def render_text(c: Comparison) -> str:
    base = c.sources[0]
    lines = [
        f"compare: base {base}; {', '.join(c.sources[1:]) or 'nothing else'}; ranked by median "
        f"RTO per setting; cost at ${c.cost_per_hour:.2f}/h × {c.instances} instance"
        + ("s" if c.instances != 1 else "")
    ]
    for setting, entries in sorted(c.entries.items()):
        lines.append("")
        lines.append(setting)
        base_entry = next((e for e in entries if e.source == base), None)
        names = [p.value for p in RESTORE_PHASES if any(e.phases.get(p.value) for e in entries)]
        width = max(len(e.source) for e in entries) + 7
        head = f"  {'#':>2}  {'source':<{width}} runs  {'RTO s (min-max)':<22} {'vs base':>7}"
        head += "".join(f" {_short(n):>8}" for n in names) + f" {'cost $':>8}"
        lines.append(head)
        for rank, e in enumerate(sorted(entries, key=lambda e: e.median), 1):
            name = e.source + (" (base)" if e.source == base else "")
            vs = "-" if base_entry is None or e is base_entry else (
                f"{e.median / base_entry.median - 1:+.0%}" if base_entry.median > 0 else "?"
            )  # fmt: skip
            spread = f"{e.median:.3f} ({min(e.walls):.3f}-{max(e.walls):.3f})"
            row = f"  {rank:>2}  {name:<{width}} {len(e.walls):>4}  {spread:<22} {vs:>7}"
            for n in names:
                value = e.phase_median(n)
                row += f" {value:>8.3f}" if value is not None else f" {'-':>8}"
            lines.append(row + f" {c.cost(e.median):>8.4f}")
        if base_entry is None:
            lines.append(f"  (no {base} run of this setting: nothing to judge against)")
    lines.append("")
    lines += _checkpoint_lines(c)
    lines += _verdict_lines(c)
    return "\n".join(lines) + "\n"


def _checkpoint_lines(c: Comparison) -> list[str]:
    """A word when the sources restored different checkpoints: their times measure
    different work, so a ranking or a gate between them says little."""
    seen = {s: c.checkpoints_of(s) for s in c.sources}
    if len({tuple(v) for v in seen.values() if v}) <= 1:
        return []
    parts = "; ".join(f"{s}: {', '.join(v) or 'unknown'}" for s, v in seen.items())
    return [f"note: the sources restored different checkpoints ({parts})"]


def _verdict_lines(c: Comparison) -> list[str]:
    if c.limit is None:
        moved = [f for f in c.findings if f.beyond_spread and f.what == "RTO"]
        return [f"moved beyond the spread: {f.line(None)}" for f in moved] or [
            "no setting moved beyond its repeats' spread"
        ]
    lines = [f"SLOWER: {f.line(c.limit)}" for f in c.regressions]
    unjudged = sorted({f"{f.source}: {f.setting}" for f in c.findings if not f.judged})
    if unjudged:
        lines.append(
            f"not judged (fewer than {MIN_REPEATS} repeats on a side): " + "; ".join(unjudged)
        )
    if c.gate_failure():
        lines.append("gate: FAILED: it could not judge (the error line says why)")
    elif not c.regressions:
        lines.append(f"gate: nothing slower than the base by more than {percent(c.limit)}")
    return lines


def _short(phase: str) -> str:
    return {"deserialize": "deser", "first_step": "1st_step"}.get(phase, phase)


def render_json(c: Comparison) -> str:
    doc = {
        "schema_version": SCHEMA_VERSION,
        "base": c.sources[0],
        "sources": c.sources,
        "limit": c.limit,
        "cost_per_hour": c.cost_per_hour,
        "instances": c.instances,
        "settings": {
            setting: [
                {
                    "source": e.source,
                    "runs": len(e.walls),
                    "rto_median_s": e.median,
                    "rto_min_s": min(e.walls),
                    "rto_max_s": max(e.walls),
                    "phases_median_s": {n: e.phase_median(n) for n in e.phases},
                    "cost": c.cost(e.median),
                }
                for e in sorted(entries, key=lambda e: e.median)
            ]
            for setting, entries in sorted(c.entries.items())
        },
        "findings": [asdict(f) for f in c.findings],
        "regressions": [asdict(f) for f in c.regressions],
        "gate_failure": c.gate_failure(),
        "checkpoints": {s: c.checkpoints_of(s) for s in c.sources},
    }
    return json.dumps(doc, indent=2) + "\n"


__all__ = ["Comparison", "Entry", "Finding", "compare", "render_json", "render_text"]
