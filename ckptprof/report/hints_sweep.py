"""Advice on one results sweep: the rules that compare its rows with the ceiling and
with each other (strategies, ranks), then its rows' breakdown hints
(:mod:`ckptprof.report.hints`) merged into one per kind, on the same terms.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ckptprof.phases import Phase
from ckptprof.report.breakdown import Hint
from ckptprof.report.comparison import MIN_REPEATS
from ckptprof.report.hints import breakdown_hints

if TYPE_CHECKING:
    from ckptprof.report.breakdown import Sweep, SweepRow
    from ckptprof.report.records import RecordedCeiling

LOW_CONCURRENCY_FRACTION = 0.60
"""fetch below this fraction of the ceiling, with fewer requests in flight than Little's Law
needs, means the queue is too shallow for the latency."""
FETCH_FAR_BELOW_FRACTION = 0.50
"""fetch below this fraction of the ceiling although concurrency suffices."""


def low_concurrency(rows: Sequence[SweepRow], ceiling: RecordedCeiling | None) -> Hint | None:
    """Rows (not hot) whose concurrency is under Little's Law's in-flight need and whose
    fetch is under LOW_CONCURRENCY_FRACTION of the ceiling."""
    if ceiling is None or not ceiling.littles_law_inflight or not ceiling.read_gbps:
        return None
    need = ceiling.littles_law_inflight
    low = [
        r
        for r in rows
        if r.breakdown.cache != "hot"
        and r.breakdown.concurrency is not None
        and r.breakdown.concurrency < need
        and r.fraction_of_ceiling is not None
        and r.fraction_of_ceiling < LOW_CONCURRENCY_FRACTION
    ]
    if not low:
        return None
    several = len({r.breakdown.strategy for r in rows}) > 1  # else the strategy goes unsaid
    cells = ", ".join(
        (f"{r.breakdown.strategy} " if several else "")
        + f"c={r.breakdown.concurrency}"
        + (f" {r.breakdown.cache}" if r.breakdown.cache else "")
        + f": {r.fraction_of_ceiling:.0%}"
        for r in low
    )
    latency = (
        f" with {ceiling.request_latency_s * 1000:.1f} ms per request"
        if ceiling.request_latency_s
        else ""
    )
    return Hint(
        "low-concurrency",
        f"fetch stayed under {LOW_CONCURRENCY_FRACTION:.0%} of the {ceiling.read_gbps:.2f} GB/s "
        f"ceiling at low concurrency ({cells}); to reach it{latency}, Little's Law needs about "
        f"{need:.1f} requests in flight: use concurrency {math.ceil(need)} or more.",
        1.0 - min(r.fraction_of_ceiling or 0.0 for r in low),
        ", ".join(r.breakdown.label for r in low),
    )


def fetch_below_ceiling(rows: Sequence[SweepRow], ceiling: RecordedCeiling | None) -> Hint | None:
    """Cold rows under FETCH_FAR_BELOW_FRACTION of the ceiling that low concurrency does
    not explain (hot runs read page cache, so the storage ceiling does not bound them)."""
    if ceiling is None or not ceiling.read_gbps:
        return None
    need = ceiling.littles_law_inflight
    far = [
        r
        for r in rows
        if r.breakdown.cache != "hot"
        and r.fraction_of_ceiling is not None
        and r.fraction_of_ceiling < FETCH_FAR_BELOW_FRACTION
        and not (need and r.breakdown.concurrency is not None and r.breakdown.concurrency < need)
    ]
    if not far:
        return None
    worst = min(far, key=lambda r: r.fraction_of_ceiling or 0.0)
    conc = worst.breakdown.concurrency
    others = [r.breakdown.label for r in far if r is not worst]
    return Hint(
        "fetch-below-ceiling",
        f"{worst.breakdown.label}: fetch reached only {worst.fraction_of_ceiling:.0%} of the "
        f"{ceiling.read_gbps:.2f} GB/s ceiling"
        + (f" at concurrency {conc}" if conc is not None else "")
        + " although that is enough requests in flight: the limit is elsewhere (per-request "
        "latency spikes, retries, small files, or client CPU)."
        + (f" (also {', '.join(others)})" if others else ""),
        1.0 - (worst.fraction_of_ceiling or 0.0),
        ", ".join(r.breakdown.label for r in far),
    )


def merge(hints: Sequence[Hint], total: int) -> list[Hint]:
    """One hint per code, worded for its most severe cell and naming it (its figures are
    that row's), then the other cells or "every row".

    Args:
        hints: per-cell hints (``where`` names the cell).
        total: how many cells were checked, to say "every row" instead of listing them.
    """
    by_code: dict[str, list[Hint]] = {}
    for hint in hints:
        by_code.setdefault(hint.code, []).append(hint)
    merged = []
    for same in by_code.values():
        worst = max(same, key=lambda h: h.severity)
        cells = list(dict.fromkeys(h.where for h in same if h.where))
        message = f"{worst.where}: {worst.message}" if worst.where else worst.message
        if len(same) > 1 and len(same) == total:
            message = f"{message} (every row)"
        elif len(same) > 1:
            message += f" (also {', '.join(c for c in cells if c != worst.where)})"
        merged.append(Hint(worst.code, message, worst.severity, ", ".join(cells)))
    return merged


STRATEGY_GAIN = 0.10  # a change of strategy worth saying: at least this much faster


def _ranked(b) -> tuple[float, float, float]:
    """(median, min, max) of what a restore strategy controls: the time to state (list
    -> reshard; the first step is the model's), or the RTO where it was not recorded."""
    return b.state_s or (b.wall_median_s, b.wall_min_s, b.wall_max_s)


def better_strategy(rows: Sequence[SweepRow]) -> Hint | None:
    """Where strategies ran side by side: what the fastest would buy over the slowest, in
    the setting where the gap is largest (cache state and concurrency alike), by the
    rule ``compare`` judges by: at least ``MIN_REPEATS`` a side, and every repeat of one
    faster than every repeat of the other."""
    cells: dict[tuple, list] = {}
    for r in rows:
        b = r.breakdown
        if b.strategy and b.repeats >= MIN_REPEATS:
            cells.setdefault((b.cache, b.concurrency), []).append(b)
    best_gap, best = 0.0, None
    for (cache, conc), found in cells.items():
        if len(found) < 2:
            continue
        fast = min(found, key=lambda b: _ranked(b)[0])
        slow = max(found, key=lambda b: _ranked(b)[0])
        if _ranked(fast)[2] >= _ranked(slow)[1]:
            continue  # the repeats overlap: noise, not a difference
        gap = 1 - _ranked(fast)[0] / _ranked(slow)[0] if _ranked(slow)[0] else 0.0
        if gap > best_gap:
            best_gap, best = gap, (cache, conc, fast, slow)
    if best is None or best_gap < STRATEGY_GAIN:
        return None
    cache, conc, fast, slow = best
    where = " ".join(p for p in (str(cache or ""), f"c={conc}" if conc else "") if p)
    slow_s, fast_s = _ranked(slow)[0], _ranked(fast)[0]
    # where the difference was measured: the phases that differ most, slowest first
    deltas = []
    for row in slow.phases:
        if slow.state_s and row.phase == Phase.FIRST_STEP.value:
            continue  # not what was ranked
        other = fast.phase(row.phase)
        saved = row.busy_s - (other.busy_s if other else 0.0)
        if saved > 0.05 * slow_s:
            deltas.append((saved, row.phase, row.busy_s, other.busy_s if other else 0.0))
    why = ", ".join(
        f"{name} {a:.2f} s vs {b:.2f} s" for _, name, a, b in sorted(deltas, reverse=True)[:2]
    )
    memory = ""
    if fast.peak_rss_bytes and slow.peak_rss_bytes:
        memory = (
            f"; peak memory {fast.peak_rss_bytes / 1e9:.2f} GB vs "
            f"{slow.peak_rss_bytes / 1e9:.2f} GB"
        )
    what = "the time to state (list -> reshard)" if slow.state_s else "this restore"
    reverse = _faster_elsewhere(cells, slow.strategy, fast.strategy)
    return Hint(
        "strategy",
        f"{fast.strategy} would cut {what} from {slow_s:.2f} s "
        f"({slow.strategy}) to {fast_s:.2f} s ({where}, {best_gap:.0%} less)"
        + (f"; {slow.strategy} spends more in {why}" if why else "")
        + memory
        + (f"; but {slow.strategy} is faster at {reverse}, beyond the spread" if reverse else "")
        + ".",
        severity=best_gap,
        where=where,
    )


def _faster_elsewhere(cells: dict[tuple, list], winner: str, loser: str) -> str:
    """The settings where ``winner`` beat ``loser`` with every repeat ("hot c=8, hot
    c=16"): a strategy hint must not read as the answer for every setting."""
    found = []
    for (cache, conc), rows in cells.items():
        by = {b.strategy: b for b in rows}
        a, b = by.get(winner), by.get(loser)
        if a is not None and b is not None and _ranked(a)[2] < _ranked(b)[1]:
            found.append(" ".join(p for p in (str(cache or ""), f"c={conc}" if conc else "") if p))
    return ", ".join(found)


READ_AMPLIFICATION = 1.5  # ranks reading this many times the checkpoint: worth saying
STRAGGLER = 1.25  # the slowest rank this much slower than the median rank
STRAGGLER_MIN_S = 0.1


def read_amplification(job: dict) -> Hint | None:
    """Ranks reading whole files of which each needs a slice: a classic slow resume."""
    amp = job.get("read_amplification")
    if not isinstance(amp, (int, float)) or amp < READ_AMPLIFICATION:
        return None
    read, whole = job.get("read_bytes_all_ranks") or 0, job.get("checkpoint_bytes") or 0
    return Hint(
        "read-amplification",
        f"the {job.get('world_size')} ranks read {amp:.1f}× the checkpoint "
        f"({read / 1e9:.2f} GB for {whole / 1e9:.2f} GB): each reads more than the slice it "
        "holds; --strategy pipelined reads only a rank's ranges, and a layout saved per rank "
        "(torch, DeepSpeed) or DCP lets each rank read its own.",
        severity=min(1.0, (amp - 1) / 4),
    )


def straggler(job: dict) -> Hint | None:
    """One rank much slower than the others: the job waits for it."""
    rows = [r for r in job.get("per_rank") or [] if isinstance(r.get("wall_s"), (int, float))]
    if len(rows) < 2:
        return None
    slowest = max(rows, key=lambda r: (r["wall_s"], -r.get("rank", 0)))
    typical = statistics.median(r["wall_s"] for r in rows)
    gap = slowest["wall_s"] - typical
    if typical <= 0 or slowest["wall_s"] < STRAGGLER * typical or gap < STRAGGLER_MIN_S:
        return None
    where = f" on node {slowest.get('node')} ({slowest.get('host')})" if slowest.get("host") else ""
    return Hint(
        "straggler",
        f"rank {slowest.get('rank')}{where} is the straggler: {slowest['wall_s']:.2f} s against "
        f"a median rank's {typical:.2f} s, and the job's RTO is its slowest rank's; compare its "
        "fetch time and its node's storage path with the others'.",
        severity=min(1.0, gap / slowest["wall_s"]),
        where=f"rank {slowest.get('rank')}",
    )


def sweep_hints(sweep: Sweep) -> list[Hint]:
    """Hints for a results sweep: ceiling rules first, then per-row rules merged."""
    rows = sweep.rows
    found = [
        better_strategy(rows),
        read_amplification(sweep.job),
        straggler(sweep.job),
        low_concurrency(rows, sweep.ceiling),
        fetch_below_ceiling(rows, sweep.ceiling),
    ]
    per_row = [h for r in rows for h in breakdown_hints(r.breakdown)]
    return [h for h in found if h is not None] + merge(per_row, len(rows))
