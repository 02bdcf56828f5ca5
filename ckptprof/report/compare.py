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

This module matches and judges; the model is comparison.py, the reading
compare_entries.py, the views compare_text.py (the storage table: compare_storage.py)
and compare_json.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from ckptprof.phases import RESTORE_PHASES, SAVE_PHASES, Phase
from ckptprof.report.compare_entries import entries_of
from ckptprof.report.comparison import (
    MIN_REPEATS,
    RTO,
    SAVE,
    SAVE_TIME,
    TTS,
    Comparison,
    Entry,
    Finding,
)

PHASE_FLOOR = 0.05  # a phase must move by this share of the base's figure to count
#: standard errors of the difference that separate two means (about 95%)
SEPARATION_Z = 2.0
#: the phases the storage itself does (the rest is the CPU's: serialization, copies, steps)
STORAGE_PHASES = frozenset({Phase.LIST, Phase.FETCH, Phase.WRITE, Phase.FSYNC, Phase.COMMIT})


def metric_of(entry: Entry, by: str) -> str:
    """What ranks ``entry``: a save's wall time; a synthetic restore's time to state unless
    ``by`` asks for the RTO; a callback's real resume's RTO unless ``by`` asks otherwise."""
    if entry.kind == SAVE:
        return SAVE_TIME
    if by == "rto" or (by == "auto" and not entry.synthetic) or not entry.tts:
        return RTO
    return TTS


SAME = 1e-6  # means this close (relatively) differ by the rounding of their files alone


def repeats_to_separate(a: Sequence[float], b: Sequence[float]) -> int | None:
    """Repeats each side would need for the difference of the means to stand
    SEPARATION_Z standard errors clear of zero at the variance measured; None when no
    difference was measured. Never fewer than one more than either side has."""
    if len(a) < 2 or len(b) < 2:
        return None
    diff = abs(statistics.fmean(b) - statistics.fmean(a))
    if diff <= SAME * max(abs(statistics.fmean(a)), abs(statistics.fmean(b))):
        return None  # the same runs, read twice (rounding apart): no difference to separate
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
    # every new repeat slower than every base repeat by more than the limit: noise of a
    # 10-20% spread fails 0-7% of builds over four settings at 3 repeats (simulated)
    slower = bool(judged and limit is not None and min(b) > max(a) * (1 + limit))
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


__all__ = [
    "PHASE_FLOOR",
    "compare",
    "judge",
    "judged_phases",
    "metric_of",
    "repeats_to_separate",
]
