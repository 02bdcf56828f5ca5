"""Advice on one group of trace operations: its breakdown's hints
(:mod:`ckptprof.report.hints`), then the rules that judge the group as a whole (the
steps after the resume, what every rank read, the resume's memory), on the same terms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckptprof.report.breakdown import Hint
from ckptprof.report.hints import breakdown_hints, seconds_text
from ckptprof.units import fmt_bytes

if TYPE_CHECKING:
    from ckptprof.report.breakdown import OperationGroup

READ_ALL_SHARE = 0.8
"""ranks that together read more than this × ranks × the checkpoint each read all of it."""
RESUME_MEMORY_RATIO = 1.25
"""a resume peaking above this × the memory held while training is worth a hint."""
SLOWER_AFTER_RESUME = 1.25
"""median step after the resume above this many times the one before the save."""


def slower_after_resume(group: OperationGroup) -> Hint | None:
    """Training slower after the resume than before the save by SLOWER_AFTER_RESUME."""
    ar = group.after_resume
    if ar is None or ar.slowdown is None or ar.slowdown <= SLOWER_AFTER_RESUME:
        return None
    return Hint(
        "slower-after-resume",
        f"training ran {ar.slowdown:.2f}x slower after the resume (median step "
        f"{seconds_text(ar.step_median_s)} vs "
        f"{seconds_text(ar.before_save_step_median_s or 0.0)} before the save): "
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
