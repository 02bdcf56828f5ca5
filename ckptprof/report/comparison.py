"""What ``ckptprof compare`` holds: each setting's runs per source (:class:`Entry`), each
judgement of one against the base (:class:`Finding`), and the whole comparison with its
gate (:class:`Comparison`); compare.py builds it, compare_text.py, compare_storage.py
and compare_json.py show it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ckptprof.report.medians import sort_value
from ckptprof.results_schema import fraction_of_ceiling
from ckptprof.units import fmt_bytes

#: a verdict needs at least this many repeats on each side: with 2, a gate over four
#: settings of the same storage and code failed 12-29% of builds (simulated, 10-20% spread)
MIN_REPEATS = 3
#: what ranks a setting
TTS, RTO, SAVE_TIME = "time to state", "RTO", "save time"
SAVE = "save"  # the kind of operation
#: two runs of one checkpoint read (or write) the same bytes; two checkpoints of different
#: specs (a scale step, the optimizer's state, a layout) differ by far more than this
SIZE_TOLERANCE = 0.01
#: why a setting of the base got no verdict for a later source (:class:`Unjudged`)
NO_RUN, OTHER_WRITER = "no run of it", "different writers"
ASYNC = "async"  # a save's strategy whose timed part blocks while the write goes on behind


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
    #: where its runs read or wrote ("/mnt/fsx/ck", "s3://bucket/ck"; None: not recorded)
    location: str | None = None
    #: each run's probed ceiling, where it recorded one: read GB/s (restore), write (save)
    ceilings: list[float] = field(default_factory=list)
    fetch_gbps: list[float] = field(default_factory=list)
    metric: str = RTO  # what ranks it (set by ``compare``)
    #: the files its runs were read from (a results.json, a save.json, a trace file)
    origins: list[str] = field(default_factory=list)
    #: its runs' trace ids, where recorded (a results.json and its own traces: the same)
    run_ids: list[str] = field(default_factory=list)

    @property
    def checkpoint_name(self) -> str:
        return " ".join(p for p in self.checkpoint if p)

    @property
    def work(self) -> str:
        """What its runs did, for a line that sets two apart: "llama2-7b torch x0.01,
        21.57 MB read"."""
        size = f"{fmt_bytes(self.nbytes)} {'written' if self.kind == SAVE else 'read'}"
        return ", ".join(p for p in (self.checkpoint_name, size if self.nbytes else "") if p)

    @property
    def ceiling_gbps(self) -> float | None:
        """The probed ceiling: the median of its runs' (runs pooled from two sweeps each
        bring their own probe)."""
        return statistics.median(self.ceilings) if self.ceilings else None

    def pool(self, other: Entry) -> None:
        """``other``'s runs join this entry's (the same source and setting, the same work:
        :func:`why_apart` says None); what one did not record, the other may have."""
        self.walls += other.walls
        self.tts += other.tts
        self.fetch_gbps += other.fetch_gbps
        self.ceilings += other.ceilings
        self.origins += [o for o in other.origins if o not in self.origins]
        self.run_ids += other.run_ids
        for name, values in other.phases.items():
            self.phases.setdefault(name, []).extend(values)
        self.checkpoint = tuple(a or b for a, b in zip(self.checkpoint, other.checkpoint,
                                                       strict=True))  # fmt: skip
        self.nbytes = self.nbytes or other.nbytes
        self.location = self.location or other.location

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
        """Bytes over the median of what ranks it: read GB/s by time to state, write GB/s
        (none for an async save: its time is the blocking copy into memory)."""
        if self.kind == SAVE and self.writer == ASYNC:
            return None
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


def same_checkpoint(a: tuple[str | None, ...], b: tuple[str | None, ...]) -> bool:
    """Whether two runs may have touched the same checkpoint: what one did not record
    (a trace's scale, say) matches anything."""
    return all(x == y or x is None or y is None for x, y in zip(a, b, strict=True))


def same_size(a: int | None, b: int | None) -> bool:
    """Bytes read (or written) alike, within :data:`SIZE_TOLERANCE`; unknown matches."""
    return not a or not b or abs(a - b) <= SIZE_TOLERANCE * max(a, b)


def same_work(a: Entry, b: Entry) -> bool:
    """The same checkpoint (as far as both recorded it), the same bytes read or written."""
    return same_checkpoint(a.checkpoint, b.checkpoint) and same_size(a.nbytes, b.nbytes)


def why_apart(a: Entry, b: Entry) -> str | None:
    """Why the runs of ``a`` and ``b`` (one source's, one setting's) are not one sample to
    pool, or None: they did different work (another checkpoint, another share of one),
    or at different places (two storages compared are never one sample), or saves by
    different writers, or from different cache states."""
    if (a.kind, a.synthetic) != (b.kind, b.synthetic):
        return "one is a synthetic run, the other a traced job's"
    if not same_work(a, b):
        what = "wrote" if a.kind == SAVE else "restored"
        return f"they {what} different checkpoints ({a.work}; {b.work})"
    if a.location and b.location and a.location != b.location:
        return f"they were stored in different places ({a.location}; {b.location})"
    if a.writer != b.writer:
        return f"different writers wrote them ({a.writer}; {b.writer})"
    if a.cache != b.cache:
        return f"they read from different cache states ({a.cache}; {b.cache})"
    return None


@dataclass(frozen=True)
class Unjudged:
    """A setting of the base that a later source got no verdict on."""

    source: str
    setting: str
    why: str  # NO_RUN, "fewer than 3 repeats on a side", OTHER_WRITER
    #: the base can judge it (MIN_REPEATS repeats, one writer): a gate fails without it
    guarded: bool


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
    #: the gate: every repeat of the new slower than every base repeat by more than the
    #: limit (the bounds, not the medians, clear it), on what ranks the setting
    slower: bool
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

    def not_judged(self) -> list[Unjudged]:
        """Each setting of the base a later source got no verdict on: it has no run of it,
        too few repeats, or saves by another writer. The gate guards what the base can
        judge: a guarded setting the new run lacks (its restores failed, the sweep changed)
        is no pass, as a gate that compared nothing is none."""
        out = []
        for setting, entries in sorted(self.entries.items()):
            base = next((e for e in entries if e.source == self.sources[0]), None)
            if base is None:
                continue
            guarded = setting not in self.writers and len(base.values) >= MIN_REPEATS
            for source in self.sources[1:]:
                entry = next((e for e in entries if e.source == source), None)
                if entry is None:
                    why = NO_RUN
                elif setting in self.writers:
                    why = OTHER_WRITER
                elif min(len(entry.values), len(base.values)) < MIN_REPEATS:
                    why = f"fewer than {MIN_REPEATS} repeats on a side"
                else:
                    continue
                out.append(Unjudged(source, setting, why, guarded))
        return out

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
        if missing:
            return self._compared_nothing(missing[0])
        gaps = [u for u in self.not_judged() if u.guarded]
        if not gaps:
            return None
        other = gaps[0].source
        named = "; ".join(f"{u.setting}: {u.why}" for u in gaps if u.source == other)
        more = len({u.source for u in gaps}) - 1
        return (f"the gate did not judge every setting of the base for {other} ({named})"
                + (f", nor for {more} more source{'s' * (more > 1)}" if more else "")
                + "; a setting the base measured that the new run lacks is no pass (its "
                "restores may have failed, or the sweep changed): run it with the base's "
                f"settings and --repeat {MIN_REPEATS} or more, or make a base of only the "
                "settings you run.")  # fmt: skip

    def _compared_nothing(self, other: str) -> str:
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


def setting_order(c: Comparison) -> list[str]:
    """The settings in the order every view of compare lists them: restores before saves,
    then word by word by the report's own key (:func:`sort_value`), so "c=8" comes before
    "c=16" as in ``report``'s table, HTML and plot."""
    return sorted(
        c.entries, key=lambda s: (c.entries[s][0].kind == SAVE, [_word_key(w) for w in s.split()])
    )


def _word_key(word: str) -> tuple:
    """One word of a setting's name ("hot", "c=16") for :func:`sort_value`: its number
    compared as a number, not as text."""
    prefix, _, value = word.rpartition("=")
    try:
        return (prefix, sort_value(float(value)))
    except ValueError:
        return (prefix, sort_value(value))


__all__ = [
    "MIN_REPEATS",
    "NO_RUN",
    "OTHER_WRITER",
    "RTO",
    "SAVE",
    "SIZE_TOLERANCE",
    "SAVE_TIME",
    "TTS",
    "Comparison",
    "Entry",
    "Finding",
    "Unjudged",
    "percent",
    "same_checkpoint",
    "setting_order",
    "same_size",
    "same_work",
    "why_apart",
]
