"""``ckptprof compare``: several runs side by side — storage targets, versions, strategies —
ranked per setting, with what each restore costs, a storage table, and a regression gate.

Each PATH is what ``ckptprof report`` reads (a results.json, a save.json, traces, a
folder), saves and restores in any mix. Like settings are matched across them: a
restore's (strategy, cache state, concurrency), a save's kind, a callback's trace group's
configuration less where it was stored. The first PATH is the base; PATHs given one
``--label`` are one source, and so are the runs one PATH holds (a folder of two sweeps):
their runs of a setting are pooled where they did the same work (one checkpoint, one
writer), else refused in one line. Only later sources are judged, against the base.

What ranks a setting: a synthetic restore by its **time to state** (list → reshard: what
the storage and the loader control; its first step is this machine's compute, shown
beside it), a callback's real resume by its RTO (the first step is what the job pays), a
save by its wall time. ``by="rto"`` ranks synthetic restores by RTO too.

Verdicts only where the data separates them: a setting is *faster* or *slower* only
when every repeat of it is beyond every repeat of the base (the spreads do not overlap),
with at least two repeats on each side; overlapping repeats are said to overlap, with
the repeats that would separate them at the spread observed. The gate fails a setting
that is slower beyond the spread **and** by more than the limit, and a setting the base
ran enough times to judge that a later source lacks (``Comparison.not_judged``): not
judged is no pass. In a synthetic run only
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

from ckptprof.errors import CkptprofError
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
    why_apart,
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
    """Load every PATH, pool each source's runs per setting, and judge every later source
    against the first (the base): never the base against itself.

    Raises:
        CkptprofError: one source holds runs of one setting that did different work (two
            checkpoints, two writers): pooled, they would be one sample of neither.
    """
    from ckptprof.cost import cost_per_hour as default_rate

    labels = labels or _labels(paths)  # PATHs the user named alike are one source
    by_setting: dict[str, list[Entry]] = {}
    home: dict[tuple[str, str], int] = {}  # (source, setting) -> the PATH its runs came from
    for n, (path, label) in enumerate(zip(paths, labels, strict=True)):
        for entry in entries_of(path, label):
            entry.metric = metric_of(entry, by)
            same = by_setting.setdefault(entry.setting, [])
            known = next((e for e in same if e.source == label), None)
            if known is None:
                same.append(entry)
                home[(label, entry.setting)] = n
            elif home[(label, entry.setting)] == n or not _read_before(known, entry):
                _pool(known, entry, paths[home[(label, entry.setting)]], path)
    sources = list(dict.fromkeys(labels))
    writers: dict[str, dict[str, str]] = {}
    for setting, entries in by_setting.items():
        wrote = {e.source: str(e.writer) for e in entries if e.kind == SAVE and e.writer}
        if len(set(wrote.values())) > 1:
            writers[setting] = wrote
    findings = []
    for setting, entries in by_setting.items():
        base = next((e for e in entries if e.source == sources[0]), None)
        if base is None:
            continue
        for entry in entries:
            if entry.source != base.source:
                findings += judge(base, entry, limit, comparable=setting not in writers)
    return Comparison(
        sources, by_setting, findings, default_rate(cost_per_hour), instances, limit, by, writers
    )


def _read_before(known: Entry, entry: Entry) -> bool:
    """Whether another PATH of the same label named the runs ``entry`` holds (``a`` and
    ``a/results.json``, a results.json and its own traces): the same runs, counted once."""
    if entry.run_ids and set(entry.run_ids) <= set(known.run_ids):
        return True
    files = {Path(o).resolve() for o in known.origins}
    return bool(entry.origins) and all(Path(o).resolve() in files for o in entry.origins)


def _pool(known: Entry, entry: Entry, known_path: str, path: str) -> None:
    """``entry``'s runs join ``known`` (one source, one setting), or one line says why
    they cannot: runs of different work are never pooled silently."""
    why = why_apart(known, entry)
    if why is None:
        known.pool(entry)
        return
    one, other = known.origins[0], entry.origins[0]
    files = f"{one} and {other}" if one != other else one
    if Path(known_path).resolve() == Path(path).resolve():
        fix = f"pass each as its own PATH (both are under {path})"
    else:
        fix = f"give {known_path} and {path} a --label each (both are --label {entry.source})"
    raise CkptprofError(
        f"{files}: runs of {entry.setting} for one source ({entry.source}), but {why}: "
        f"never pooled; {fix}."
    )


def _labels(paths: list[str]) -> list[str]:
    """Each PATH's label (:func:`_label`), each a source of its own: a name that two
    PATHs share becomes the PATH as given, else gets "#2" (the same PATH twice)."""
    short = [_label(p) for p in paths]
    labels = [p if short.count(s) > 1 else s for p, s in zip(paths, short, strict=True)]
    out: list[str] = []
    for label in labels:
        n = 1
        while (f"{label}#{n}" if n > 1 else label) in out:
            n += 1
        out.append(f"{label}#{n}" if n > 1 else label)
    return out


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
