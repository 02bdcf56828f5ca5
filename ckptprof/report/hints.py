"""Plain-sentence advice, given only where the numbers say so.

Each rule is a pure function over aggregated numbers (a :class:`Breakdown`, or a
sweep's rows and ceiling) that returns a :class:`Hint` or ``None``; thresholds
are the named constants below so a reader can see (and tests can pin) exactly
when a hint fires. Every comparison is strict: a value *at* a threshold does not
fire.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ckptprof.phases import Phase
from ckptprof.report.breakdown import Hint
from ckptprof.results_schema import stalled
from ckptprof.units import fmt_bytes

if TYPE_CHECKING:
    from ckptprof.report.breakdown import Breakdown, OperationGroup, Sweep, SweepRow
    from ckptprof.report.load import RecordedCeiling

MiB = 1024 * 1024

VERIFY_SHARE_MAX = 0.25
"""verify above this share of the RTO is worth cutting (sampled or size-only checks)."""
DESERIALIZE_SHARE_MAX = 0.35
"""deserialize above this share of the RTO points at pickle copies without mmap."""
RESHARD_SHARE_MAX = 0.40
"""reshard above this share of the RTO: the copies into the state are the restore."""
FIRST_STEP_SHARE_MAX = 0.50
"""first_step above this share of the RTO: the step after the load is the restore."""
READ_ALL_SHARE = 0.8
"""ranks that together read more than this × ranks × the checkpoint each read all of it."""
RESUME_MEMORY_RATIO = 1.25
"""a resume peaking above this × the memory held while training is worth a hint."""
SLOWER_AFTER_RESUME = 1.25
"""median step after the resume above this many times the one before the save."""
FIRST_BATCH_SHARE_MIN = 0.5
"""the first batch (or the step's compute) above this share of first_step is its cause."""
NOISE_SPREAD = 0.25
"""repeats spreading more than ±this around their median: the numbers are not steady."""
LIST_SHARE_MAX = 0.10
"""list above this share of the RTO means too many objects to find."""
SMALL_FILES_MIN_COUNT = 256
"""More files than this, each smaller than SMALL_FILE_MAX_BYTES, is "many small files"."""
SMALL_FILE_MAX_BYTES = 8 * MiB
LOW_CONCURRENCY_FRACTION = 0.60
"""fetch below this fraction of the ceiling, with fewer requests in flight than Little's Law
needs, means the queue is too shallow for the latency."""
FETCH_FAR_BELOW_FRACTION = 0.50
"""fetch below this fraction of the ceiling although concurrency suffices."""
COLD_RESIDENCY_MAX = 0.05
"""a "cold" run with more than this fraction of the checkpoint in page cache was not cold."""


def _s(seconds: float) -> str:
    return f"{seconds:.3g} s"


def _wall_word(b: Breakdown) -> str:
    return "the RTO" if b.kind == "restore" else "the save time"


def _share_rule(b: Breakdown, phase: Phase, limit: float, code: str, advice: str) -> Hint | None:
    row = b.phase(phase)
    if row is None or row.share is None or not row.share > limit:
        return None
    return Hint(
        code,
        f"{phase.value} takes {row.share:.0%} of {_wall_word(b)} ({_s(row.busy_s)} of "
        f"{_s(b.wall_median_s)}): {advice}",
        row.share,
        b.label,
    )


# --------------------------------------------------------------------- per breakdown
def verify_dominates(b: Breakdown) -> Hint | None:
    """verify busy above VERIFY_SHARE_MAX of the RTO."""
    return _share_rule(
        b,
        Phase.VERIFY,
        VERIFY_SHARE_MAX,
        "verify-dominates",
        "check a sample of files (`--verify sample`) or sizes only, or use a faster hash.",
    )


def deserialize_dominates(b: Breakdown) -> Hint | None:
    """deserialize busy above DESERIALIZE_SHARE_MAX of the RTO."""
    return _share_rule(
        b,
        Phase.DESERIALIZE,
        DESERIALIZE_SHARE_MAX,
        "deserialize-dominates",
        "load with mmap (torch.load(..., mmap=True)) or store safetensors to avoid pickle copies.",
    )


def many_small_files(b: Breakdown) -> Hint | None:
    """Many files of small mean size, or a list phase above LIST_SHARE_MAX of the RTO.

    Phase spans carry bytes and file counts, not each file's size, so the size
    tested is the mean bytes per file of the phase that touched the most files.
    """
    with_files = [r for r in b.phases if r.files]
    busiest = max(with_files, key=lambda r: r.files or 0) if with_files else None
    mean = busiest.nbytes / busiest.files if busiest and busiest.nbytes and busiest.files else None
    many = (
        busiest is not None
        and mean is not None
        and busiest.files > SMALL_FILES_MIN_COUNT
        and mean < SMALL_FILE_MAX_BYTES
    )
    listing = b.phase(Phase.LIST)
    slow_list = listing is not None and listing.share is not None and listing.share > LIST_SHARE_MAX
    if not (many or slow_list):
        return None
    facts = []
    if busiest is not None and busiest.files:
        size = f" averaging {fmt_bytes(mean)}" if mean is not None else ""
        facts.append(f"{busiest.files} files{size}")
    if slow_list:
        facts.append(f"list takes {listing.share:.0%} of {_wall_word(b)}")
    return Hint(
        "many-small-files",
        f"{', '.join(facts)}: per-file overhead dominates; pack small files into a few large "
        "ones (or fewer, larger shards).",
        max((listing.share or 0.0) if listing else 0.0, 1.0 if many else 0.0),
        b.label,
    )


def emulated_phases(b: Breakdown) -> Hint | None:
    """Any phase that was emulated rather than run: its numbers are estimates."""
    rows = [r for r in b.phases if r.emulated]
    if not rows:
        return None
    names = ", ".join(r.phase for r in rows)
    if len(rows) == 1:
        reasons = rows[0].emulation_reason or ""
    else:
        reasons = "; ".join(f"{r.phase}: {r.emulation_reason}" for r in rows if r.emulation_reason)
    why = f" ({reasons})" if reasons else ""
    verb = "was" if len(rows) == 1 else "were"
    return Hint(
        "emulated",
        f"{names} {verb} emulated{why}: numbers for that phase are estimates, not measurements, "
        f"and so is {_wall_word(b)}.",
        1.0,
        b.label,
    )


def not_really_cold(b: Breakdown) -> Hint | None:
    """A cold run that found more than COLD_RESIDENCY_MAX of the data in page cache."""
    if b.cache != "cold" or b.resident_fraction is None:
        return None
    if not b.resident_fraction > COLD_RESIDENCY_MAX:
        return None
    method = f" after {b.cache_method}" if b.cache_method else ""
    return Hint(
        "not-cold",
        f"the cold run still had {b.resident_fraction:.0%} of the checkpoint in page cache"
        f"{method}: it was not really cold; evict as root (drop_caches) or use a checkpoint "
        "larger than memory.",
        b.resident_fraction,
        b.label,
    )


def stalled_request(b: Breakdown) -> Hint | None:
    """One storage request that waited seconds, a large share of the RTO: a stall (below
    the read timeout, so no error says so)."""
    fetch = b.phase(Phase.FETCH)
    longest = fetch.details.get("slowest_request_s") if fetch is not None else None
    if longest is None or not stalled(longest, b.wall_median_s):
        return None
    return Hint(
        "stall",
        f"one fetch request waited {_s(longest)} ({longest / b.wall_median_s:.0%} of "
        f"{_wall_word(b)}): the storage stalled rather than ran slowly; the trace's fetch "
        "span names the object (ckpt.fetch.slowest_request). Check the server and the "
        "network for pauses, and repeat the run before you trust this figure.",
        min(1.0, longest / b.wall_median_s),
        b.label,
    )


def reshard_dominates(b: Breakdown) -> Hint | None:
    """reshard busy above RESHARD_SHARE_MAX of the RTO."""
    return _share_rule(
        b,
        Phase.RESHARD,
        RESHARD_SHARE_MAX,
        "reshard-dominates",
        "load straight into the tensors that hold the state (dcp.load into existing "
        "tensors, --strategy pipelined), avoid a world-size change at resume, and on a GPU "
        "stage through pinned memory.",
    )


def first_step_dominates(b: Breakdown) -> Hint | None:
    """first_step busy above FIRST_STEP_SHARE_MAX of the RTO (measured, not estimated);
    where the callbacks split it (``batch_s``, ``compute_s``, ``skipped_batches``), the
    advice is for the part that dominates."""
    row = b.phase(Phase.FIRST_STEP)
    if b.synthetic and row is not None:
        return _synthetic_first_step(b, row.emulated)
    details = row.details if row is not None else {}
    batch, compute = details.get("batch_s"), details.get("compute_s")
    skipped = int(details.get("skipped_batches") or 0)
    busy = row.busy_s if row is not None else 0.0
    if batch is not None and busy > 0 and batch / busy >= FIRST_BATCH_SHARE_MIN:
        part = f"the first batch took {_s(batch)} of it"
        if skipped:
            return _share_rule(
                b,
                Phase.FIRST_STEP,
                FIRST_STEP_SHARE_MAX,
                "data-fast-forward",
                f"{part}, fast-forwarding {skipped} already-seen batches to resume the "
                "data where the checkpoint left it. TrainingArguments(ignore_data_skip=True) "
                "starts at once (the data order then differs from an uninterrupted run); a "
                "dataloader that saves its position (torchdata's StatefulDataLoader) skips "
                "without reading.",
            )
        return _share_rule(
            b,
            Phase.FIRST_STEP,
            FIRST_STEP_SHARE_MAX,
            "first-batch",
            f"{part}: the data pipeline starting up after the resume (DataLoader workers "
            "spawned, files opened, a shuffle buffer filled); persistent_workers=True, "
            "fewer or pre-forked workers, or a prefetched first batch shorten it.",
        )
    if compute is not None and busy > 0 and compute / busy >= FIRST_BATCH_SHARE_MIN:
        return _share_rule(
            b,
            Phase.FIRST_STEP,
            FIRST_STEP_SHARE_MAX,
            "first-step-compute",
            f"the step itself took {_s(compute)} of it: compilation (torch.compile, "
            "CUDA graphs) and allocator warm-up; a compile cache (TORCHINDUCTOR_CACHE_DIR on "
            "shared storage) or a warm-up before the resume moves it off the RTO.",
        )
    return _share_rule(
        b,
        Phase.FIRST_STEP,
        FIRST_STEP_SHARE_MAX,
        "first-step-dominates",
        "the step after the load is most of the recovery: look for a data fast-forward "
        "(HF Trainer skips seen batches unless ignore_data_skip=True; a resumable "
        "dataloader skips none), compilation and allocator warm-up.",
    )


def _synthetic_first_step(b: Breakdown, given: bool) -> Hint | None:
    """A synthetic run's first step: a step on this machine's CPU (or the time the user
    gave), never a data fast-forward or a job's warm-up: the storage's part is the time
    to state."""
    state = f" ({_s(b.state_s[0])})" if b.state_s else ""
    if given:
        advice = (
            f"the step time given with --first-step-s; the storage's part is the time to "
            f"state{state}, list -> reshard: compare storages by it."
        )
    else:
        advice = (
            f"a real step on this machine's CPU, its compute, not the storage's; the storage's "
            f"part is the time to state{state}, list -> reshard: compare storages by it "
            "(ckptprof compare does). --first-step-s gives the real job's step time, "
            "--no-first-step leaves it out."
        )
    return _share_rule(b, Phase.FIRST_STEP, FIRST_STEP_SHARE_MAX, "first-step-synthetic", advice)


def noisy_repeats(b: Breakdown) -> Hint | None:
    """Repeats that disagree: min and max more than NOISE_SPREAD from the median."""
    median = b.wall_median_s
    if b.repeats < 2 or median <= 0:
        return None
    spread = max(median - b.wall_min_s, b.wall_max_s - median) / median
    if spread <= NOISE_SPREAD:
        return None
    return Hint(
        "noisy",
        f"the repeats disagree ({'RTO' if b.kind == 'restore' else 'save time'} "
        f"{b.wall_min_s:.2f}-{b.wall_max_s:.2f} s around "
        f"a median of {median:.2f} s, ±{spread:.0%}): the machine or the storage was not "
        "steady; compare medians of more repeats (--repeat), and look for other load.",
        severity=min(1.0, spread / 2),
        where=b.label,
    )


BREAKDOWN_RULES: tuple[Callable[[Breakdown], Hint | None], ...] = (
    stalled_request,
    not_really_cold,
    verify_dominates,
    deserialize_dominates,
    reshard_dominates,
    first_step_dominates,
    many_small_files,
    emulated_phases,
    noisy_repeats,
)


def breakdown_hints(b: Breakdown) -> list[Hint]:
    """All per-breakdown rules that fire, in a fixed order."""
    return [h for rule in BREAKDOWN_RULES if (h := rule(b)) is not None]


# --------------------------------------------------------------------- ceiling rules
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
    cells = ", ".join(
        f"c={r.breakdown.concurrency}"
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
    return Hint(
        "fetch-below-ceiling",
        f"fetch reached only {worst.fraction_of_ceiling:.0%} of the {ceiling.read_gbps:.2f} GB/s "
        f"ceiling"
        + (f" at concurrency {conc}" if conc is not None else "")
        + " although that is enough requests in flight: the limit is elsewhere (per-request "
        "latency spikes, retries, small files, or client CPU).",
        1.0 - (worst.fraction_of_ceiling or 0.0),
        ", ".join(r.breakdown.label for r in far),
    )


# --------------------------------------------------------------------- entry points
def merge(hints: Sequence[Hint], total: int) -> list[Hint]:
    """One hint per code, worded for its most severe cell, naming the other cells.

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
        message = worst.message
        if len(same) > 1 and len(same) == total:
            message = f"{message} (every row)"
        elif len(same) > 1:
            others = ", ".join(c for c in cells if c != worst.where)
            message = f"{worst.where}: {message} (also {others})"
        elif total > 1 and worst.where:
            message = f"{worst.where}: {message}"
        merged.append(Hint(worst.code, message, worst.severity, ", ".join(cells)))
    return merged


def slower_after_resume(group: OperationGroup) -> Hint | None:
    """Training slower after the resume than before the save by SLOWER_AFTER_RESUME."""
    ar = group.after_resume
    if ar is None or ar.slowdown is None or ar.slowdown <= SLOWER_AFTER_RESUME:
        return None
    return Hint(
        "slower-after-resume",
        f"training ran {ar.slowdown:.2f}x slower after the resume (median step "
        f"{_s(ar.step_median_s)} vs {_s(ar.before_save_step_median_s or 0.0)} before the save): "
        "the RTO does not end at the first step. Look for a changed layout (a sharded or "
        "resharded state, offload turned on), a lost compile cache, data now read cold, and "
        "optimizer state loaded in another dtype or device.",
        severity=min(1.0, ar.slowdown - 1.0),
        where=group.breakdown.label if group.breakdown else "",
    )


def ranks_read_everything(group: OperationGroup) -> Hint | None:
    """Every rank read (nearly) the whole checkpoint: READ_ALL_SHARE of ranks × its size."""
    r = group.reads
    if r is None or r.ranks < 2 or r.amplification < READ_ALL_SHARE * r.ranks:
        return None
    return Hint(
        "every-rank-reads-everything",
        f"each of the {r.ranks} ranks read the whole checkpoint ({fmt_bytes(r.read_bytes)} "
        f"for {fmt_bytes(r.checkpoint_bytes)}, {r.amplification:.2f}x): storage serves it "
        f"{r.ranks} times. Save it sharded (torch.distributed.checkpoint, FSDP's sharded "
        "state dict) so each rank reads its slice, or read once and broadcast.",
        severity=min(1.0, r.amplification / 10),
        where=group.breakdown.label if group.breakdown else "",
    )


def resume_memory(group: OperationGroup) -> Hint | None:
    """The resume's peak above RESUME_MEMORY_RATIO × the memory held while training."""
    m = group.memory
    if m is None or not m.training_rss_bytes:
        return None
    ratio = m.peak_rss_bytes / m.training_rss_bytes
    if ratio <= RESUME_MEMORY_RATIO:
        return None
    return Hint(
        "resume-memory",
        f"the resume peaked at {fmt_bytes(m.peak_rss_bytes)} resident, {ratio:.2f}x the "
        f"{fmt_bytes(m.training_rss_bytes)} the job held while training: the checkpoint is "
        "materialised beside the model. torch.load(mmap=True), load_state_dict(assign=True) "
        "or a model built on the meta device avoid the second copy; so does loading shard "
        "by shard.",
        severity=min(1.0, ratio - 1.0),
        where=group.breakdown.label if group.breakdown else "",
    )


GROUP_RULES = (slower_after_resume, ranks_read_everything, resume_memory)


def group_hints(group: OperationGroup) -> list[Hint]:
    """Hints for one group of trace operations (no ceiling is known for traces)."""
    found = breakdown_hints(group.breakdown) if group.breakdown is not None else []
    return found + [h for rule in GROUP_RULES if (h := rule(group)) is not None]


STRATEGY_GAIN = 0.10  # a change of strategy worth saying: at least this much faster


def better_strategy(rows: Sequence[SweepRow]) -> Hint | None:
    """Where strategies ran side by side: what the fastest would buy over the slowest, in
    the setting where the gap is largest (cache state and concurrency alike), and only
    where every repeat of one was faster than every repeat of the other."""
    cells: dict[tuple, list] = {}
    for r in rows:
        b = r.breakdown
        if b.strategy and b.repeats:
            cells.setdefault((b.cache, b.concurrency), []).append(b)
    best_gap, best = 0.0, None
    for (cache, conc), found in cells.items():
        if len(found) < 2:
            continue
        fast = min(found, key=lambda b: b.wall_median_s)
        slow = max(found, key=lambda b: b.wall_median_s)
        if fast.wall_max_s >= slow.wall_min_s:
            continue  # the repeats overlap: noise, not a difference
        gap = 1 - fast.wall_median_s / slow.wall_median_s if slow.wall_median_s else 0.0
        if gap > best_gap:
            best_gap, best = gap, (cache, conc, fast, slow)
    if best is None or best_gap < STRATEGY_GAIN:
        return None
    cache, conc, fast, slow = best
    where = " ".join(p for p in (str(cache or ""), f"c={conc}" if conc else "") if p)
    # where the difference was measured: the phases that differ most, slowest first
    deltas = []
    for row in slow.phases:
        other = fast.phase(row.phase)
        saved = row.busy_s - (other.busy_s if other else 0.0)
        if saved > 0.05 * slow.wall_median_s:
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
    return Hint(
        "strategy",
        f"{fast.strategy} would cut this restore from {slow.wall_median_s:.2f} s "
        f"({slow.strategy}) to {fast.wall_median_s:.2f} s ({where}, {best_gap:.0%} less)"
        + (f"; {slow.strategy} spends more in {why}" if why else "")
        + memory
        + ".",
        severity=best_gap,
        where=where,
    )


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
