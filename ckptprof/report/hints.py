"""Plain-sentence advice on one breakdown (the phases of a group of operations, or of
a sweep's row), given only where the numbers say so.

Each rule is a pure function over aggregated numbers (here a :class:`Breakdown`; a
group's in :mod:`ckptprof.report.hints_group`, a sweep's rows and ceiling in
:mod:`ckptprof.report.hints_sweep`) that returns a :class:`Hint` or ``None``; thresholds
are the named constants below so a reader can see (and tests can pin) exactly
when a hint fires. Every comparison is strict: a value *at* a threshold does not
fire.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ckptprof.phases import Phase
from ckptprof.report.breakdown import Hint
from ckptprof.results_schema import stalled
from ckptprof.units import fmt_bytes

if TYPE_CHECKING:
    from ckptprof.report.breakdown import Breakdown

MiB = 1024 * 1024

VERIFY_SHARE_MAX = 0.25
"""verify above this share of the RTO is worth cutting (sampled or size-only checks)."""
DESERIALIZE_SHARE_MAX = 0.35
"""deserialize above this share of the RTO points at pickle copies without mmap."""
RESHARD_SHARE_MAX = 0.40
"""reshard above this share of the RTO: the copies into the state are the restore."""
FIRST_STEP_SHARE_MAX = 0.50
"""first_step above this share of the RTO: the step after the load is the restore."""
FIRST_BATCH_SHARE_MIN = 0.5
"""the first batch (or the step's compute) above this share of first_step is its cause."""
NOISE_SPREAD = 0.25
"""repeats spreading more than ±this around their median: the numbers are not steady."""
LIST_SHARE_MAX = 0.10
"""list above this share of the RTO means too many objects to find."""
SMALL_FILES_MIN_COUNT = 256
"""More files than this, each smaller than SMALL_FILE_MAX_BYTES, is "many small files"."""
SMALL_FILE_MAX_BYTES = 8 * MiB
COLD_RESIDENCY_MAX = 0.05
HOT_RESIDENCY_MIN = 0.95  # a hot run with less in the page cache read partly from storage
"""a "cold" run with more than this fraction of the checkpoint in page cache was not cold."""


def seconds_text(seconds: float) -> str:
    """Seconds for a sentence: three significant digits and the unit ("1.23 s")."""
    return f"{seconds:.3g} s"


def _wall_word(b: Breakdown) -> str:
    return "the RTO" if b.kind == "restore" else "the save time"


def _share_rule(b: Breakdown, phase: Phase, limit: float, code: str, advice: str) -> Hint | None:
    row = b.phase(phase)
    if row is None or row.share is None or not row.share > limit:
        return None
    return Hint(
        code,
        f"{phase.value} takes {row.share:.0%} of {_wall_word(b)} ({seconds_text(row.busy_s)} of "
        f"{seconds_text(b.wall_median_s)}): {advice}",
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


def not_really_hot(b: Breakdown) -> Hint | None:
    """A hot run that found less than HOT_RESIDENCY_MIN of the data in the page cache
    (a checkpoint larger than the memory free for the cache): partly a storage read."""
    if b.cache != "hot" or b.resident_fraction is None:
        return None
    if not b.resident_fraction < HOT_RESIDENCY_MIN:
        return None
    return Hint(
        "not-hot",
        f"a hot run found only {b.resident_fraction:.0%} of the checkpoint in the page cache: "
        "part of it was read from the storage; free memory for the cache, or use a smaller "
        "--scale for hot runs.",
        1 - b.resident_fraction,
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
        f"one fetch request waited {seconds_text(longest)} ({longest / b.wall_median_s:.0%} of "
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
        return _synthetic_first_step(b, b.first_step_given)
    details = row.details if row is not None else {}
    batch, compute = details.get("batch_s"), details.get("compute_s")
    skipped = int(details.get("skipped_batches") or 0)
    busy = row.busy_s if row is not None else 0.0
    if batch is not None and busy > 0 and batch / busy >= FIRST_BATCH_SHARE_MIN:
        part = f"the first batch took {seconds_text(batch)} of it"
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
            f"the step itself took {seconds_text(compute)} of it: compilation (torch.compile, "
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
    state = f" ({seconds_text(b.state_s[0])})" if b.state_s else ""
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
    not_really_hot,
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
