"""One trace group as text: its counts, the phase table (what each phase cost and what
to know beside the number: fused, lazy, emulated), the time outside any phase, ranks,
reads, memory and the steps after the resume."""

from __future__ import annotations

from ckptprof.phases import FUSED_SEPARATOR, Phase, fused_detail
from ckptprof.report.breakdown import Breakdown, OperationGroup, PhaseRow
from ckptprof.report.medians import phase_order
from ckptprof.report.outside import outside_phrase
from ckptprof.report.text_format import (
    INDENT,
    hint_lines,
    phase_names,
    plural,
    runs_table,
    skew_lines,
    table,
    verify_lines,
    wrap,
)
from ckptprof.units import fmt_bytes, fmt_gbps, fmt_pct, fmt_s


def _overlap_lines(b: Breakdown, wall_word: str) -> list[str]:
    text = (
        f"sum of phases {fmt_s(b.phase_sum_s)} s vs wall (critical path) {fmt_s(b.wall_median_s)} s"
    )
    if b.overlapped:
        text += f": phases overlapped (by {fmt_s(b.phase_sum_s - b.wall_median_s)} s)"
    elif b.outside_phases_s:
        text += f": {outside_text(b, wall_word)}"
    return wrap(text, INDENT, INDENT * 2)


def outside_text(b: Breakdown, wall_word: str) -> str:
    """ "0.596 s (54% of RTO) outside any phase: 0.310 s in foo (file:line), …", the
    functions where the training thread was sampled; "" when no time is outside."""
    if not b.outside_phases_s:
        return ""
    share = b.outside_phases_s / b.wall_median_s
    text = f"{fmt_s(b.outside_phases_s)} s ({share:.0%} of {wall_word}) outside any phase"
    named = outside_phrase(b.outside_named, b.outside_phases_s)
    return f"{text}: {named}" if named else text


def fused_label(r: PhaseRow) -> str:
    """The phases ``r`` ran fused with and the detail: "deserialize+reshard, dcp.load"."""
    joined = FUSED_SEPARATOR.join(r.fused_phases) or str(r.fused)
    detail = fused_detail(r.fused) if r.fused else None
    return f"{joined}, {detail}" if detail else joined


def phase_note(b: Breakdown, r: PhaseRow) -> str:
    """What to know about a phase's time beside the number: emulated, fused with others
    (one interval for several phases), lazy (a fetch whose reads continue later)."""
    notes = ["emulated"] if r.emulated else []
    into = [o.phase for o in b.phases if o is not r and r.phase in o.fused_phases]
    if r.fused:
        notes.append(f"(fused: {fused_label(r)})")
    elif into:
        notes.append(f"(fused into {', '.join(into)})")
    if r.lazy:
        notes.append("(lazy: pages read on demand, some inside deserialize)")
    return " ".join(notes)


def _phase_table(b: Breakdown, wall_word: str) -> list[str]:
    rows = []
    for r in b.phases:
        rows.append(
            [
                r.phase,
                fmt_s(r.busy_s),
                fmt_pct(r.share),
                fmt_bytes(r.nbytes),
                fmt_gbps(r.gbps),
                "-" if r.files is None else str(r.files),
                phase_note(b, r),
            ]
        )
    headers = ["phase", "busy s", f"of {wall_word}", "bytes", "GB/s", "files", ""]
    return table(headers, rows, "lrrrrrl")


def render_group(group: OperationGroup, by: str = "phase") -> list[str]:
    """One trace group: header, counts, the phase table, overlap, ranks, hints."""
    noun = "restore" if group.kind == "restore" else "save"
    wall_word = "RTO" if group.kind == "restore" else "save time"
    config = " ".join(f"{k}={v}" for k, v in group.config.items())
    lines = wrap(f"{noun}: {config}" if config else noun, "", INDENT * 2)
    b = group.breakdown
    facts = []
    if b is not None:
        state = ""
        if b.state_s is not None and b.phase(Phase.FIRST_STEP) is not None:
            median, low, high = b.state_s  # a synthetic restore: the storage's part first
            state = (f"time to state (list -> reshard) median {fmt_s(median)} s (min "
                     f"{fmt_s(low)}, max {fmt_s(high)}), the first step beside it: ")  # fmt: skip
        facts.append(
            f"{plural(b.repeats, noun)}, {state}{wall_word} median {fmt_s(b.wall_median_s)} s "
            f"(min {fmt_s(b.wall_min_s)}, max {fmt_s(b.wall_max_s)})"
        )
    if group.failed:
        verb = "not counted" if b is not None else "nothing to summarise"
        why = f": {group.failure}" if group.failure else ""
        facts.append(f"{group.failed} failed, {verb}{why}")
    if group.retries or group.errors:
        facts.append(f"retries {group.retries}, errors {group.errors}")
    if group.of_write_ceiling is not None:
        share = group.of_write_ceiling
        above = ", above it: the short probe ran slower than the saves" if share > 1 else ""
        facts.append(
            f"{fmt_pct(min(share, 1.0))} of the write ceiling "
            f"({fmt_gbps(group.write_ceiling_gbps)} GB/s{above})"
        )
    lines += wrap("; ".join(facts), INDENT)
    if b is None:
        return lines
    if by == "run":
        lines += runs_table(
            group.operations, phase_order(group.kind, phase_names(group.operations))
        )
    elif b.phases:
        lines += _phase_table(b, wall_word)
        lines += _overlap_lines(b, wall_word)
    lines += verify_lines(group.verify_coverage)
    if group.ranks is not None:
        rs = group.ranks
        host = f" on {rs.slowest_host}" if rs.slowest_host else ""
        text = (
            f"slowest rank {rs.slowest_rank}{host}: {wall_word} {fmt_s(rs.slowest_wall_s)} s; "
            f"fastest rank {rs.fastest_rank}: {fmt_s(rs.fastest_wall_s)} s ({rs.ranks} ranks"
        )
        text += "; the table shows the slowest)" if by != "run" else ")"
        lines += wrap(text, INDENT)
    lines += skew_lines(group.skews)
    if group.reads is not None and (group.reads.ranks > 1 or group.reads.amplification > 1.05):
        r = group.reads
        lines += wrap(
            f"read by {plural(r.ranks, 'rank')}: {fmt_bytes(r.read_bytes)} for a "
            f"{fmt_bytes(r.checkpoint_bytes)} checkpoint (read amplification "
            f"{r.amplification:.2f}x)",
            INDENT,
        )
    if group.memory is not None:
        lines += wrap(
            f"memory: the resume peaked at {fmt_bytes(group.memory.peak_rss_bytes)} resident; "
            f"{fmt_bytes(group.memory.training_rss_bytes)} while training (at the save)",
            INDENT,
        )
    if group.after_resume is not None:
        ar = group.after_resume
        text = f"after the resume: median step {fmt_s(ar.step_median_s)} s over {ar.steps} steps"
        if ar.before_save_step_median_s:
            text += (
                f" vs {fmt_s(ar.before_save_step_median_s)} s before the save ({ar.slowdown:.2f}x)"
            )
        lines += wrap(text, INDENT)
    lines += hint_lines(group.hints)
    return lines
