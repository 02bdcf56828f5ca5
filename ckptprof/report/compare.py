"""``ckptprof compare``: several runs side by side — storage targets, versions, strategies —
ranked per setting, with what each restore costs, a storage table, and a regression gate.

Each PATH is what ``ckptprof report`` reads (a results.json, a save.json, traces, a
folder), saves and restores in any mix. Like settings are matched across them: a
restore's (strategy, cache state, concurrency), a save's kind, a callback's trace group's
configuration less where it was stored. The first PATH is the base.

What ranks a setting: a synthetic restore by its **time to state** (list → reshard: what
the storage and the loader control; its first step is this machine's compute, shown
beside it), a callback's real resume by its RTO (the first step is what the job pays), a
save by its wall time. ``by="rto"`` ranks synthetic restores by RTO too.

Verdicts only where the data separates them: a setting is *faster* or *slower* only
when every repeat of it is beyond every repeat of the base (the spreads do not overlap),
with at least two repeats on each side; overlapping repeats are said to overlap, with
the repeats that would separate them at the spread observed. The gate fails a setting
that is slower beyond the spread **and** by more than the limit. In a synthetic run only
the storage's phases are judged on their own (list, fetch; write, upload, fsync, commit):
the rest, the first step above all, measures this machine's CPU, never the storage.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ckptprof.phases import RESTORE_PHASES, SAVE_PHASES, Attr, Phase
from ckptprof.report.aggregate import CONFIG_ATTRS, rank_instances, short_label
from ckptprof.report.checkpoint_cost import time_to_state, written_bytes
from ckptprof.report.load import ReportData, TraceOperation, load
from ckptprof.results_schema import fraction_of_ceiling
from ckptprof.units import fmt_bytes

SCHEMA_VERSION = 1
MIN_REPEATS = 2  # a verdict needs at least this many repeats on each side
PHASE_FLOOR = 0.05  # a phase must move by this share of the base's figure to count
#: configuration keys that name where a run was stored, not what it did
WHERE_KEYS = ("storage",)
#: standard errors of the difference that separate two means (about 95%)
SEPARATION_Z = 2.0
#: what ranks a setting
TTS, RTO, SAVE_TIME = "time to state", "RTO", "save time"
SAVE = "save"  # the kind of operation
BY_CHOICES = ("auto", "tts", "rto")
#: the phases the storage itself does (the rest is the CPU's: serialization, copies, steps)
STORAGE_PHASES = frozenset({Phase.LIST, Phase.FETCH, Phase.WRITE, Phase.FSYNC, Phase.COMMIT})
SYNTHETIC = "synthetic"


@dataclass
class Entry:
    """One setting of one source: its runs' times and each phase's per-run busy time."""

    source: str
    setting: str
    walls: list[float]  # the RTO of each restore, the wall time of each save
    phases: dict[str, list[float]] = field(default_factory=dict)
    #: what was restored or saved (model, layout, size; None: not recorded)
    checkpoint: tuple[str | None, ...] = (None, None, None)
    kind: str = "restore"
    synthetic: bool = False
    tts: list[float] = field(default_factory=list)  # restores: each run's time to state
    nbytes: int | None = None  # the checkpoint's bytes (restore), or what a save wrote
    writer: str | None = None  # a save's strategy
    cache: str | None = None
    #: the probed ceiling: read GB/s (restore), write GB/s (save)
    ceiling_gbps: float | None = None
    fetch_gbps: list[float] = field(default_factory=list)
    metric: str = RTO  # what ranks it (set by ``compare``)

    @property
    def checkpoint_name(self) -> str:
        return " ".join(p for p in self.checkpoint if p)

    @property
    def values(self) -> list[float]:
        """The runs' figures of what ranks this entry."""
        return self.tts if self.metric == TTS else self.walls

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def rto_median(self) -> float:
        return statistics.median(self.walls)

    @property
    def tts_median(self) -> float | None:
        return statistics.median(self.tts) if self.tts else None

    def phase_median(self, name: str) -> float | None:
        values = self.phases.get(name)
        return statistics.median(values) if values else None

    @property
    def gbps(self) -> float | None:
        """Bytes over the median of what ranks it: read GB/s by time to state, write GB/s."""
        return self.nbytes / self.median / 1e9 if self.nbytes and self.median > 0 else None

    @property
    def of_ceiling(self) -> float | None:
        """A save's GB/s, or a cold restore's median fetch GB/s, over the probed ceiling."""
        if self.kind == SAVE:
            rate = self.gbps
            return rate / self.ceiling_gbps if rate and self.ceiling_gbps else None
        fetch = statistics.median(self.fetch_gbps) if self.fetch_gbps else None
        return fraction_of_ceiling(fetch, self.ceiling_gbps, self.cache)

    @property
    def above_ceiling(self) -> bool:
        """Measured faster than the probe said the storage could go: the ceiling is an
        underestimate (a probe of too few bytes, or a cache that served it)."""
        share = self.of_ceiling
        return share is not None and share > 1.0


@dataclass
class Finding:
    """A setting (or one of its phases) of a source against the base."""

    source: str
    setting: str
    what: str  # "time to state", "RTO", "save time" or a phase name
    base_s: float
    new_s: float
    change: float  # new / base - 1
    beyond_spread: bool
    judged: bool  # enough repeats on both sides (and the same writer) for a verdict
    slower: bool  # beyond the limit and the spread: a regression
    #: repeats each side would need to separate the two at the spread observed
    repeats_needed: int | None = None
    comparable: bool = True  # False: saves by different writers, never ranked

    def line(self, limit: float | None) -> str:
        bound = f"; limit {percent(limit)}" if limit is not None else ""
        spread = "beyond the repeats' spread" if self.beyond_spread else "within the spread"
        what = "time" if self.what == SAVE_TIME else self.what  # "save time", not "save save"
        subject = f"{self.setting} {what}"
        return (
            f"{self.source}: {subject} {self.new_s:.3f} s vs "
            f"{self.base_s:.3f} s ({self.change:+.0%}, {spread}{bound})"
        )

    @property
    def verdict(self) -> str:
        """A few words: faster / slower where the repeats separate, else why not."""
        if not self.comparable:
            return "not ranked (different writers)"
        if not self.judged:
            return f"not judged (fewer than {MIN_REPEATS} repeats a side)"
        if self.beyond_spread:
            return "faster" if self.change < 0 else "slower"
        if self.repeats_needed is None:
            return "overlaps (no difference measured)"
        return f"overlaps: ~{self.repeats_needed} repeats to separate"


@dataclass
class Comparison:
    sources: list[str]
    entries: dict[str, list[Entry]]  # setting -> one entry per source that has it
    findings: list[Finding]
    cost_per_hour: float
    instances: int
    limit: float | None = None
    by: str = "auto"
    #: setting -> the writers of its saves by source, where they differ (never ranked)
    writers: dict[str, dict[str, str]] = field(default_factory=dict)

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
        return sorted({e.checkpoint_name for es in self.entries.values() for e in es
                       if e.source == source and e.checkpoint_name})  # fmt: skip

    def metrics(self) -> list[str]:
        """What ranked the settings, in the order first used."""
        return list(dict.fromkeys(e.metric for es in self.entries.values() for e in es))

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
        shared = set(base_settings) & set(other_settings)
        if shared and shared <= set(self.writers):
            writers = self.writers[sorted(shared)[0]]
            named = "; ".join(f"{s}: {w}" for s, w in writers.items())
            return (f"the gate compared nothing for {other}: its saves and the base's were "
                    f"written by different writers ({named}); save both with the same "
                    "--strategy.")  # fmt: skip
        if shared:
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


def _checkpoint(model: Any, layout: Any, size: Any) -> tuple[str | None, ...]:
    """What a run restored: model, layout, size ("llama2-7b", "safetensors", "x0.01")."""
    if isinstance(size, int) and not isinstance(size, bool):
        size = fmt_bytes(size) if size > 0 else None
    elif isinstance(size, float):
        size = f"x{size:g}"
    return tuple(str(p) if p else None for p in (model, layout, size))


def _same_checkpoint(a: tuple[str | None, ...], b: tuple[str | None, ...]) -> bool:
    """Whether two runs may have touched the same checkpoint: what one did not record
    (a trace's scale, say) matches anything."""
    return all(x == y or x is None or y is None for x, y in zip(a, b, strict=True))


# --------------------------------------------------------------------- reading
def _restore_setting(strategy: Any, cache: Any, concurrency: Any) -> str:
    conc = f"c={concurrency}" if concurrency else ""
    return " ".join(str(p) for p in (strategy, cache, conc) if p) or "restore"


def _trace_setting(op: TraceOperation) -> str:
    """A synthetic restore as its results' setting is named (so traces and results.json
    match), a synthetic save as "save", a callback's operation by its configuration."""
    if op.attr(Attr.FRAMEWORK) == SYNTHETIC:
        if op.kind == SAVE:
            return "save" if op.attr(Attr.SAVE_FSYNC) is not False else "save no-fsync"
        return _restore_setting(
            op.attr(Attr.STRATEGY), op.attr(Attr.CACHE), op.attr(Attr.CONCURRENCY)
        )
    config = {label: op.attributes[key] for key, label in CONFIG_ATTRS
              if key in op.attributes and label not in WHERE_KEYS}  # fmt: skip
    label = short_label(config)
    return f"save {label}".strip() if op.kind == SAVE else label or "restore"


def _results_entries(data: ReportData, label: str) -> list[Entry]:
    out: list[Entry] = []
    for results in data.results:
        spec = results.spec
        what = _checkpoint(spec.get("model"), spec.get("layout"), spec.get("scale"))
        ceiling = results.ceiling.read_gbps if results.ceiling else None
        by_setting: dict[str, Entry] = {}
        for run in results.runs:
            setting = _restore_setting(run.strategy, run.cache, run.concurrency)
            entry = by_setting.setdefault(
                setting,
                Entry(label, setting, [], checkpoint=what, synthetic=True, nbytes=run.nbytes,
                      cache=run.cache, ceiling_gbps=ceiling),
            )  # fmt: skip
            entry.walls.append(run.wall_s)
            entry.tts.append(time_to_state(run))
            fetch = run.phases.get(Phase.FETCH.value)
            if fetch is not None and fetch.nbytes and fetch.busy_s > 0:
                entry.fetch_gbps.append(fetch.nbytes / fetch.busy_s / 1e9)
            for name, sample in run.phases.items():
                entry.phases.setdefault(name, []).append(sample.busy_s)
        out += by_setting.values()
    return out


def _trace_entries(operations: Sequence[TraceOperation], label: str) -> list[Entry]:
    """Restores and saves of traces (and of save.json), one entry per setting; a job's
    operation is its slowest rank's; an async save's background half is left out."""
    buckets: dict[tuple[str, str], list[TraceOperation]] = defaultdict(list)
    for op in operations:
        if not op.failed and not op.attr(Attr.SAVE_BACKGROUND):
            buckets[(op.kind, _trace_setting(op))].append(op)
    out = []
    for (kind, setting), ops in buckets.items():
        instances = rank_instances(ops)
        first = max(instances[0], key=lambda o: o.wall_s)
        entry = Entry(
            label,
            setting,
            [],
            checkpoint=_checkpoint(
                first.attr(Attr.MODEL),
                first.attr(Attr.LAYOUT, first.attr(Attr.FORMAT)),
                first.attr(Attr.CHECKPOINT_BYTES),
            ),  # fmt: skip
            kind=kind,
            synthetic=first.attr(Attr.FRAMEWORK) == SYNTHETIC,
            writer=first.attr(Attr.STRATEGY) if kind == SAVE else None,
            cache=first.attr(Attr.CACHE),
            ceiling_gbps=_number(first.attr(Attr.SAVE_CEILING_GBPS)) if kind == SAVE else None,
        )
        sizes = []
        for instance in instances:
            op = max(instance, key=lambda o: o.wall_s)  # the job waits for its slowest rank
            entry.walls.append(op.wall_s)
            for name, sample in op.phases.items():
                entry.phases.setdefault(name, []).append(sample.busy_s)
            if kind == SAVE:
                sizes.append(sum(written_bytes(o) for o in instance))
                continue
            entry.tts.append(time_to_state(op))
            size = op.attr(Attr.CHECKPOINT_BYTES)
            fetch = op.phases.get(Phase.FETCH.value)
            if not isinstance(size, int) and fetch is not None:
                size = fetch.nbytes
            if fetch is not None and fetch.nbytes and fetch.busy_s > 0:
                entry.fetch_gbps.append(fetch.nbytes / fetch.busy_s / 1e9)
            if isinstance(size, int) and size > 0:
                sizes.append(size)
        sizes = [s for s in sizes if s]
        entry.nbytes = int(statistics.median(sizes)) if sizes else None
        out.append(entry)
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def entries_of(path: str, label: str) -> list[Entry]:
    """The settings one PATH holds (saves and restores), with their runs."""
    data = load([path])
    return _results_entries(data, label) + _trace_entries(data.operations, label)


# --------------------------------------------------------------------- judging
def metric_of(entry: Entry, by: str) -> str:
    """What ranks ``entry``: a save's wall time; a synthetic restore's time to state unless
    ``by`` asks for the RTO; a callback's real resume's RTO unless ``by`` asks otherwise."""
    if entry.kind == SAVE:
        return SAVE_TIME
    if by == "rto" or (by == "auto" and not entry.synthetic) or not entry.tts:
        return RTO
    return TTS


def repeats_to_separate(a: Sequence[float], b: Sequence[float]) -> int | None:
    """Repeats each side would need for the difference of the means to stand
    SEPARATION_Z standard errors clear of zero at the variance measured; None when no
    difference was measured. Never fewer than one more than either side has."""
    if len(a) < 2 or len(b) < 2:
        return None
    diff = abs(statistics.fmean(b) - statistics.fmean(a))
    if diff <= 0:
        return None
    variance = statistics.variance(a) + statistics.variance(b)
    needed = math.ceil(SEPARATION_Z**2 * variance / diff**2)
    return max(needed, max(len(a), len(b)) + 1)


def judged_phases(entry: Entry) -> list[str]:
    """The phases whose own move can decide a verdict. In a synthetic run (a storage
    benchmark) only the storage's: the others (serialize, stage, verify, deserialize,
    reshard, the first step) are this machine's CPU, noisy from one repeat to the next;
    they count through the time to state, never on their own. A callback's real job: every
    phase (what the job pays)."""
    phases = SAVE_PHASES if entry.kind == SAVE else RESTORE_PHASES
    return [p.value for p in phases if not entry.synthetic or p in STORAGE_PHASES]


def judge(base: Entry, new: Entry, limit: float | None, comparable: bool = True) -> list[Finding]:
    """What ranks ``new`` and every storage phase of it against ``base`` (the module
    docstring); ``comparable`` False (saves by different writers): nothing is judged."""
    judged = comparable and len(base.values) >= MIN_REPEATS and len(new.values) >= MIN_REPEATS
    findings = [_finding(new, new.metric, base.values, new.values, judged, limit)]
    floor = PHASE_FLOOR * base.median
    for name in judged_phases(new):
        a, b = base.phases.get(name), new.phases.get(name)
        if not a or not b or abs(statistics.median(b) - statistics.median(a)) < floor:
            continue
        findings.append(_finding(new, name, a, b, judged, limit))
    for found in findings:
        found.comparable = comparable
    return findings


def _finding(new: Entry, what, a: list[float], b: list[float], judged, limit) -> Finding:
    base_s, new_s = statistics.median(a), statistics.median(b)
    change = new_s / base_s - 1 if base_s > 0 else 0.0
    beyond = min(b) > max(a) or max(b) < min(a)
    slower = bool(judged and limit is not None and beyond and change > limit)
    needed = None if beyond else repeats_to_separate(a, b)
    return Finding(new.source, new.setting, what, base_s, new_s, change, beyond, judged, slower,
                   needed)  # fmt: skip


def compare(
    paths: list[str],
    labels: list[str] | None = None,
    limit: float | None = None,
    cost_per_hour: float | None = None,
    instances: int = 1,
    by: str = "auto",
) -> Comparison:
    """Load every PATH, match like settings, and judge each against the first."""
    from ckptprof.cost import cost_per_hour as default_rate

    named = labels is not None  # PATHs the user named alike are one source
    labels = labels or [_label(p) for p in paths]
    by_setting: dict[str, list[Entry]] = {}
    for path, label in zip(paths, labels, strict=True):
        for entry in entries_of(path, label):
            entry.metric = metric_of(entry, by)
            same = by_setting.setdefault(entry.setting, [])
            known = next((e for e in same if e.source == label), None) if named else None
            if known is None:
                same.append(entry)
            else:
                _merge(known, entry)
    labels = list(dict.fromkeys(labels)) if named else labels
    writers: dict[str, dict[str, str]] = {}
    for setting, entries in by_setting.items():
        named = {e.source: str(e.writer) for e in entries if e.kind == SAVE and e.writer}
        if len(set(named.values())) > 1:
            writers[setting] = named
    findings = []
    for setting, entries in by_setting.items():
        base = next((e for e in entries if e.source == labels[0]), None)
        if base is None:
            continue
        for entry in entries:
            if entry is not base:
                findings += judge(base, entry, limit, comparable=setting not in writers)
    return Comparison(
        labels, by_setting, findings, default_rate(cost_per_hour), instances, limit, by, writers
    )


def _merge(into: Entry, other: Entry) -> None:
    """``other``'s runs join ``into`` (the same source and setting, from another PATH)."""
    into.walls += other.walls
    into.tts += other.tts
    into.fetch_gbps += other.fetch_gbps
    for name, values in other.phases.items():
        into.phases.setdefault(name, []).extend(values)


def _label(path: str) -> str:
    """A PATH as given, less a trailing results.json or save.json: short and unique."""
    p = Path(path)
    return str(p.parent if p.suffix == ".json" else p)


# --------------------------------------------------------------------- views
_METRIC_WORDS = {
    TTS: "synthetic restores by time to state (list -> reshard; the first step, this "
    "machine's compute, beside it; --by rto ranks by RTO)",
    RTO: "restores by RTO",
    SAVE_TIME: "saves by their wall time",
}


def ranked_by(c: Comparison) -> str:
    """What ranked the settings, in words (the first line of the table says it)."""
    used = c.metrics()
    words = dict(_METRIC_WORDS)
    if c.by == "rto":
        words[RTO] = "restores by RTO (--by rto: a synthetic first step, the CPU's, included)"
    return "; ".join(words[m] for m in (TTS, RTO, SAVE_TIME) if m in used) or "nothing"


def render_text(c: Comparison) -> str:
    lines = [
        f"compare: base {c.sources[0]}; {', '.join(c.sources[1:]) or 'nothing else'}; ranked: "
        f"{ranked_by(c)}; cost at ${c.cost_per_hour:.2f}/h × {c.instances} instance"
        + ("s" if c.instances != 1 else "")
    ]
    lines += storage_table(c)
    for setting, entries in sorted(c.entries.items(), key=lambda kv: (_is_save(kv[1]), kv[0])):
        lines.append("")
        lines.append(setting)
        lines += _setting_block(c, setting, entries)
    lines.append("")
    if any(e.metric == TTS and e.phases.get("first_step") for es in c.entries.values() for e in es):
        lines.append("1st_step of a synthetic restore: a real step on this machine's CPU, its "
                     "compute: shown beside the time to state, never in a verdict")  # fmt: skip
    lines += ceiling_notes(c)
    lines += _checkpoint_lines(c)
    lines += _verdict_lines(c)
    return "\n".join(lines) + "\n"


def _is_save(entries: list[Entry]) -> bool:
    return entries[0].kind == SAVE


def _setting_block(c: Comparison, setting: str, entries: list[Entry]) -> list[str]:
    base = c.sources[0]
    base_entry = next((e for e in entries if e.source == base), None)
    metric = entries[0].metric
    kind = entries[0].kind
    order = SAVE_PHASES if kind == SAVE else RESTORE_PHASES
    names = [p.value for p in order if any(e.phases.get(p.value) for e in entries)]
    width = max(len(e.source) for e in entries) + 7
    head_metric = f"{'save' if metric == SAVE_TIME else metric} s (min-max)"
    col = max(22, len(head_metric))
    head = f"  {'#':>2}  {'source':<{width}} runs  {head_metric:<{col}} {'vs base':>7}"
    head += f" {'RTO s':>8}" if metric == TTS else ""
    head += "".join(f" {_short(n):>8}" for n in names)
    head += f" {'of ceil':>8} {'cost $':>8}"
    lines = [head]
    findings = {f.source: f for f in c.findings if f.setting == setting and f.what == metric}
    ranked = sorted(entries, key=lambda e: e.median)
    previous: Entry | None = None
    rank = 0
    for e in ranked:
        tie = previous is not None and _overlap(previous.values, e.values)
        rank = rank if tie else rank + 1
        shown_rank = f"={rank}" if tie else str(rank)
        if setting in c.writers:
            shown_rank = "-"
        previous = e
        name = e.source + (" (base)" if e.source == base else "")
        vs = "-" if base_entry is None or e is base_entry else (
            f"{e.median / base_entry.median - 1:+.0%}" if base_entry.median > 0 else "?"
        )  # fmt: skip
        spread = f"{e.median:.3f} ({min(e.values):.3f}-{max(e.values):.3f})"
        row = f"  {shown_rank:>2}  {name:<{width}} {len(e.values):>4}  {spread:<{col}} {vs:>7}"
        row += f" {e.rto_median:>8.3f}" if metric == TTS else ""
        for n in names:
            value = e.phase_median(n)
            row += f" {value:>8.3f}" if value is not None else f" {'-':>8}"
        row += f" {_share(e):>8}"
        cost = c.cost(e.rto_median) if kind != SAVE else c.cost(e.median)
        lines.append(row + f" {cost:>8.4f}")
    for e in ranked:
        found = findings.get(e.source)
        if found is not None and found.comparable and not found.beyond_spread:
            lines.append(f"  {e.source}: {found.verdict} (the repeats overlap the base's)")
    if setting in c.writers:
        named = ", ".join(f"{s}: {w}" for s, w in c.writers[setting].items())
        lines.append(f"  not ranked: written by different writers ({named}); save both with "
                     "the same --strategy")  # fmt: skip
    if base_entry is None:
        lines.append(f"  (no {base} run of this setting: nothing to judge against)")
    return lines


def _overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    return not (min(b) > max(a) or max(b) < min(a))


def _share(e: Entry) -> str:
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


STORAGE_COLUMNS = ("source", "write GB/s", "read GB/s", "w/r", "of write ceil", "of read ceil",
                   "saves", "restores", "verdict")  # fmt: skip


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
            _share(w) if w else "-", _share(r) if r else "-",
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
    sizes = (width, 10, 10, 5, 13, 12, 5, 8)
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
    """The setting of ``kind`` the table shows: one every source ran (cold first, then
    the base's fastest), else the one most sources ran."""
    settings = {s: es for s, es in c.entries.items() if es[0].kind == kind}
    if not settings:
        return None
    most = max(len({e.source for e in es}) for es in settings.values())
    shared = {s: es for s, es in settings.items() if len({e.source for e in es}) == most}
    cold = {s: es for s, es in shared.items() if es[0].cache == "cold"} or shared

    def base_median(item):
        setting, entries = item
        base = next((e for e in entries if e.source == c.sources[0]), entries[0])
        return (base.median, setting)

    return min(cold.items(), key=base_median)[0]


def _table_verdict(c: Comparison, source: str, read: str | None, write: str | None) -> str:
    if source == c.sources[0]:
        return "base"
    parts = []
    for what, setting in (("read", read), ("write", write)):
        if setting is None:
            continue
        entry = _entry(c, setting, source)
        found = next((f for f in c.findings if f.source == source and f.setting == setting
                      and entry is not None and f.what == entry.metric), None)  # fmt: skip
        if entry is None:
            continue
        if found is None:
            parts.append(f"{what}: -")
        elif found.beyond_spread and found.judged:
            parts.append(f"{what}: {found.verdict} ({found.change:+.0%})")
        else:
            parts.append(f"{what}: {found.verdict}")
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
        f" {_short(n):>9}" for _, n in columns)]  # fmt: skip
    for source in c.sources:
        row = f"  {source:<{width + 2}}"
        for setting, name in columns:
            e = _entry(c, setting, source)
            value = e.phase_median(name) if e else None
            row += f" {value:>9.3f}" if value is not None else f" {'-':>9}"
        lines.append(row)
    return lines


def _checkpoint_lines(c: Comparison) -> list[str]:
    """A word when the sources restored different checkpoints: their times measure
    different work, so a ranking or a gate between them says little."""
    keys = {s: {e.checkpoint for es in c.entries.values() for e in es if e.source == s
                and any(e.checkpoint)} for s in c.sources}  # fmt: skip
    if all(_same_checkpoint(a, b) for x in keys.values() for y in keys.values()
           for a in x for b in y):  # fmt: skip
        return []
    seen = {s: c.checkpoints_of(s) for s in c.sources}
    parts = "; ".join(f"{s}: {', '.join(v) or 'unknown'}" for s, v in seen.items())
    return [f"note: the sources restored different checkpoints ({parts})"]


def _verdict_lines(c: Comparison) -> list[str]:
    if c.limit is None:
        moved = [f for f in c.findings
                 if f.beyond_spread and f.judged and f.what in (TTS, RTO, SAVE_TIME)]  # fmt: skip
        return [f"moved beyond the spread: {f.line(None)}" for f in moved] or [
            "no setting moved beyond its repeats' spread"
        ]
    lines = [f"SLOWER: {f.line(c.limit)}" for f in c.regressions]
    unjudged = sorted({f"{f.source}: {f.setting}" for f in c.findings
                       if not f.judged and f.setting not in c.writers})  # fmt: skip
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
    return {"deserialize": "deser", "first_step": "1st_step", "serialize": "serial"}.get(
        phase, phase
    )


def render_json(c: Comparison) -> str:
    doc = {
        "schema_version": SCHEMA_VERSION,
        "base": c.sources[0],
        "sources": c.sources,
        "by": c.by,
        "ranked_by": c.metrics(),
        "limit": c.limit,
        "cost_per_hour": c.cost_per_hour,
        "instances": c.instances,
        "settings": {
            setting: [
                {
                    "source": e.source,
                    "kind": e.kind,
                    "ranked_by": e.metric,
                    "runs": len(e.values),
                    "median_s": e.median,
                    "min_s": min(e.values),
                    "max_s": max(e.values),
                    "rto_median_s": e.rto_median if e.kind != SAVE else None,
                    "rto_min_s": min(e.walls) if e.kind != SAVE else None,
                    "rto_max_s": max(e.walls) if e.kind != SAVE else None,
                    "time_to_state_median_s": e.tts_median,
                    "gbps": e.gbps,
                    "of_ceiling": e.of_ceiling,
                    "above_ceiling": e.above_ceiling,
                    "writer": e.writer,
                    "phases_median_s": {n: e.phase_median(n) for n in e.phases},
                    "cost": c.cost(e.rto_median),
                }
                for e in sorted(entries, key=lambda e: e.median)
            ]
            for setting, entries in sorted(c.entries.items())
        },
        "different_writers": c.writers,
        "findings": [asdict(f) for f in c.findings],
        "regressions": [asdict(f) for f in c.regressions],
        "gate_failure": c.gate_failure(),
        "checkpoints": {s: c.checkpoints_of(s) for s in c.sources},
    }
    return json.dumps(doc, indent=2) + "\n"


__all__ = [
    "BY_CHOICES",
    "Comparison",
    "ceiling_notes",
    "Entry",
    "Finding",
    "compare",
    "entries_of",
    "judge",
    "judged_phases",
    "metric_of",
    "render_json",
    "render_text",
    "repeats_to_separate",
    "storage_rows",
    "storage_table",
]
