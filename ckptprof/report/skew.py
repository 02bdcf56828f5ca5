"""Rank skew: when each rank of a multi-rank save or restore began, had its state in
place and ended, relative to the first rank to begin; which rank began last (the arrival
skew: "rank 1 began loading 3.02 s after rank 0") and which one the job waited on.

The job waited on the rank that was done last with its own part: its state in place
before a restore's first step (that step is a collective, which ends every rank
together, so its end names no one), the end of a save. Ranks done within
:data:`TOGETHER_S` of the last were released together by a collective; of those, the one
that began last held the others. Every view (text, JSON, HTML) reads :class:`Skew` from
:func:`skews`; nothing else computes it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ckptprof.phases import Attr, Phase
from ckptprof.report.records import ResultsRun, TraceOperation

#: ranks done this close to the last one (or within 2% of the skew) ended together
TOGETHER_S = 0.05
#: ranks listed one per row; beyond, only the sentence
SKEW_ROWS = 16
_VERBS = {"restore": ("loading", "loaded"), "save": ("saving", "saved")}


@dataclass(frozen=True)
class RankTimes:
    """One rank's operation on the wall clock (seconds since the epoch)."""

    rank: int
    start_s: float
    ready_s: float  # its own part done: the state in place (a restore), the end (a save)
    end_s: float
    host: str | None = None


@dataclass(frozen=True)
class RankOffset:
    """One rank's times, in seconds after the first rank began."""

    rank: int
    began_s: float
    ready_s: float
    ended_s: float
    host: str | None = None


@dataclass(frozen=True)
class Skew:
    """One multi-rank operation's skew; ``line`` says it in a sentence."""

    kind: str  # restore | save
    label: str  # which operation: "step 9", "repeat 1", ...
    ranks: list[RankOffset]
    first_rank: int  # the first to begin
    last_rank: int  # the last to begin
    arrival_skew_s: float  # how long after the first the last began
    waited_on: int  # the rank the job waited on
    ready_skew_s: float  # how long after the first rank's part was done the last one's was
    line: str


def skew(kind: str, times: Sequence[RankTimes], label: str = "") -> Skew | None:
    """The skew of one operation over its ranks' times; None for fewer than two ranks."""
    ordered = sorted({t.rank: t for t in times}.values(), key=lambda t: (t.start_s, t.rank))
    if len(ordered) < 2:
        return None
    first, last = ordered[0], ordered[-1]
    zero = first.start_s
    latest = max(t.ready_s for t in ordered)
    ready_skew = latest - min(t.ready_s for t in ordered)
    together = max(TOGETHER_S, 0.02 * (latest - zero))
    done_last = [t for t in ordered if latest - t.ready_s <= together]
    waited = max(done_last, key=lambda t: (t.start_s, t.ready_s, t.rank))
    ranks = [
        RankOffset(t.rank, t.start_s - zero, t.ready_s - zero, t.end_s - zero, t.host)
        for t in sorted(ordered, key=lambda t: t.rank)
    ]
    arrival = last.start_s - zero
    began, done = _VERBS.get(kind, ("in", "done"))
    line = (
        f"rank {last.rank} began {began} {arrival:.2f} s after rank {first.rank}; the job "
        f"waited on rank {waited.rank} (the last {done}, {ready_skew:.2f} s after the first)"
    )
    return Skew(kind, label, ranks, first.rank, last.rank, arrival, waited.rank, ready_skew, line)


def _times(rank, start, wall_s, phases, kind: str, host) -> RankTimes | None:
    """A rank's times from its start and wall time; the state in place before its first
    step (that phase comes last)."""
    if start is None or not isinstance(rank, int) or isinstance(rank, bool):
        return None
    end = start + wall_s
    step = phases.get(Phase.FIRST_STEP.value)
    ready = end - step.busy_s if step is not None and kind == "restore" else end
    return RankTimes(rank, start, max(ready, start), end, str(host) if host else None)


def operation_times(op: TraceOperation) -> RankTimes | None:
    """A traced rank's times (its root span)."""
    start = op.start.timestamp() if op.start is not None else None
    host = op.resource.get("host.name")
    return _times(op.attr(Attr.RANK), start, op.wall_s, op.phases, op.kind, host)


def skews(kind: str, instances: Iterable[Sequence[TraceOperation]]) -> list[Skew]:
    """Each multi-rank operation's skew (``instances``: each operation's rank roots)."""
    out = []
    for inst in instances:
        times = [t for t in map(operation_times, inst) if t is not None]
        found = skew(kind, times, _label(inst[0].attr(Attr.STEP), inst[0].attr(Attr.REPEAT)))
        if found is not None:
            out.append(found)
    return out


def results_skews(rank_runs: Iterable[ResultsRun]) -> list[Skew]:
    """Each run's skew in a synthetic job's results (``rank_runs``: every rank's runs)."""
    runs: dict[tuple, list[ResultsRun]] = defaultdict(list)
    for run in rank_runs:
        runs[(run.strategy, run.cache, run.concurrency, run.repeat)].append(run)
    out = []
    for (strategy, cache, concurrency, repeat), items in runs.items():
        times = [_times(r.rank, r.start_s, r.wall_s, r.phases, "restore", r.host) for r in items]
        label = " ".join(
            filter(
                None, (strategy, cache, concurrency and f"c={concurrency}", _label(None, repeat))
            )
        )
        found = skew("restore", [t for t in times if t], label)
        if found is not None:
            out.append(found)
    return out


def _label(step, repeat) -> str:
    if step is not None:
        return f"step {step}"
    return f"repeat {repeat}" if repeat is not None else ""


def worst(found: Sequence[Skew]) -> Skew | None:
    """The most skewed operation: the larger of its arrival skew and the skew of its
    ranks' parts done (ranks that began together and finished apart)."""
    return max(found, key=lambda s: max(s.arrival_skew_s, s.ready_skew_s), default=None)


def skew_sentence(found: Sequence[Skew]) -> str | None:
    """The worst operation's skew in a sentence (with how many there were); none: None."""
    top = worst(found)
    if top is None:
        return None
    of = f" ({top.label})" if top.label else ""
    if len(found) > 1:
        median = statistics.median(s.arrival_skew_s for s in found)
        of = f" ({top.label or 'one'}, the most skewed of {len(found)} {top.kind}s; median "
        of += f"arrival skew {median:.2f} s)"
    return f"rank skew{of}: {top.line}"


def skew_rows(found: Sequence[Skew]) -> list[str]:
    """The worst operation's ranks, one row each (a heading first); beyond
    :data:`SKEW_ROWS` ranks, none (the sentence names the two that matter)."""
    top = worst(found)
    if top is None or len(top.ranks) > SKEW_ROWS:
        return []
    done = _VERBS.get(top.kind, ("in", "done"))[1] + " s"
    rows = [f"{'rank':>5} {'began s':>8} {done:>9} {'ended s':>8}  host"]
    rows += [
        f"{r.rank:>5} {r.began_s:>+8.2f} {r.ready_s:>+9.2f} {r.ended_s:>+8.2f}  {r.host or ''}"
        for r in top.ranks
    ]
    return [row.rstrip() for row in rows]


__all__ = [
    "RankOffset",
    "RankTimes",
    "Skew",
    "operation_times",
    "results_skews",
    "skew",
    "skew_rows",
    "skew_sentence",
    "skews",
]
