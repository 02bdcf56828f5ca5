"""What ``ckptprof compare`` holds: each setting's runs per source (:class:`Entry`), each
judgement of one against the base (:class:`Finding`), and the whole comparison with its
gate (:class:`Comparison`); compare.py builds it, compare_text.py, compare_storage.py
and compare_json.py show it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ckptprof.results_schema import fraction_of_ceiling

#: a verdict needs at least this many repeats on each side: with 2, a gate over four
#: settings of the same storage and code failed 12-29% of builds (simulated, 10-20% spread)
MIN_REPEATS = 3
#: what ranks a setting
TTS, RTO, SAVE_TIME = "time to state", "RTO", "save time"
SAVE = "save"  # the kind of operation
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


__all__ = [
    "MIN_REPEATS",
    "RTO",
    "SAVE",
    "SAVE_TIME",
    "TTS",
    "Comparison",
    "Entry",
    "Finding",
    "percent",
]
