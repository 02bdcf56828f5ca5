"""``ckptprof compare`` as text: the heading, the storage table, one ranked block per
setting with each source against the base, then the notes and the verdicts."""

from __future__ import annotations

from collections.abc import Sequence

from ckptprof.phases import RESTORE_PHASES, SAVE_PHASES
from ckptprof.report.compare_storage import (
    ceiling_notes,
    of_ceiling_cell,
    short_phase,
    storage_table,
)
from ckptprof.report.comparison import (
    NO_RUN,
    OTHER_WRITER,
    RTO,
    SAVE,
    SAVE_TIME,
    TTS,
    Comparison,
    Entry,
    percent,
    same_checkpoint,
)

_METRIC_WORDS = {
    TTS: "synthetic restores by time to state (list -> reshard; the first step, this "
    "machine's compute, beside it; --by rto ranks by RTO)",
    RTO: "restores by RTO",
    SAVE_TIME: "saves by their wall time",
}


def ranked_by(c: Comparison) -> str:
    """What ranked the settings, in words (the first line of the table says it)."""
    used = c.metrics()
    words = dict(_METRIC_WORDS)
    if c.by == "rto":
        words[RTO] = "restores by RTO (--by rto: a synthetic first step, the CPU's, included)"
    return "; ".join(words[m] for m in (TTS, RTO, SAVE_TIME) if m in used) or "nothing"


def render_text(c: Comparison) -> str:
    lines = [
        f"compare: base {c.sources[0]}; {', '.join(c.sources[1:]) or 'nothing else'}; ranked: "
        f"{ranked_by(c)}; cost at ${c.cost_per_hour:.2f}/h × {c.instances} instance"
        + ("s" if c.instances != 1 else "")
    ]
    lines += storage_table(c)
    for setting, entries in sorted(c.entries.items(), key=lambda kv: (_is_save(kv[1]), kv[0])):
        lines.append("")
        lines.append(setting)
        lines += _setting_block(c, setting, entries)
    lines.append("")
    if any(e.metric == TTS and e.phases.get("first_step") for es in c.entries.values() for e in es):
        lines.append("1st_step of a synthetic restore: the model's (a real step on this "
                     "machine's CPU, or the time given with --first-step-s): shown beside the "
                     "time to state, never in a verdict")  # fmt: skip
    lines += ceiling_notes(c)
    lines += _checkpoint_lines(c)
    lines += _pooled_lines(c)
    lines += _verdict_lines(c)
    return "\n".join(lines) + "\n"


def _is_save(entries: list[Entry]) -> bool:
    return entries[0].kind == SAVE


def _setting_block(c: Comparison, setting: str, entries: list[Entry]) -> list[str]:
    base = c.sources[0]
    base_entry = next((e for e in entries if e.source == base), None)
    metric = entries[0].metric
    kind = entries[0].kind
    order = SAVE_PHASES if kind == SAVE else RESTORE_PHASES
    names = [p.value for p in order if any(e.phases.get(p.value) for e in entries)]
    width = max(len(e.source) for e in entries) + 7
    head_metric = f"{'save' if metric == SAVE_TIME else metric} s (min-max)"
    col = max(22, len(head_metric))
    head = f"  {'#':>2}  {'source':<{width}} runs  {head_metric:<{col}} {'vs base':>7}"
    head += f" {'RTO s':>8}" if metric == TTS else ""
    head += "".join(f" {short_phase(n):>8}" for n in names)
    head += f" {'of ceil':>8} {'cost $':>8}"
    lines = [head]
    findings = {f.source: f for f in c.findings if f.setting == setting and f.what == metric}
    ranked = sorted(entries, key=lambda e: e.median)
    previous: Entry | None = None
    rank = 0
    for e in ranked:
        tie = previous is not None and _overlap(previous.values, e.values)
        rank = rank if tie else rank + 1
        shown_rank = f"={rank}" if tie else str(rank)
        if setting in c.writers:
            shown_rank = "-"
        previous = e
        name = e.source + (" (base)" if e.source == base else "")
        vs = "-" if base_entry is None or e is base_entry else (
            f"{e.median / base_entry.median - 1:+.0%}" if base_entry.median > 0 else "?"
        )  # fmt: skip
        spread = f"{e.median:.3f} ({min(e.values):.3f}-{max(e.values):.3f})"
        row = f"  {shown_rank:>2}  {name:<{width}} {len(e.values):>4}  {spread:<{col}} {vs:>7}"
        row += f" {e.rto_median:>8.3f}" if metric == TTS else ""
        for n in names:
            value = e.phase_median(n)
            row += f" {value:>8.3f}" if value is not None else f" {'-':>8}"
        row += f" {of_ceiling_cell(e):>8}"
        cost = c.cost(e.rto_median) if kind != SAVE else c.cost(e.median)
        lines.append(row + f" {cost:>8.4f}")
    for e in ranked:
        found = findings.get(e.source)
        if found is not None and found.comparable and not found.beyond_spread:
            lines.append(f"  {e.source}: {found.verdict} (the repeats overlap the base's)")
    if setting in c.writers:
        named = ", ".join(f"{s}: {w}" for s, w in c.writers[setting].items())
        lines.append(f"  not ranked: written by different writers ({named}); save both with "
                     "the same --strategy")  # fmt: skip
    if base_entry is None:
        lines.append(f"  (no {base} run of this setting: nothing to judge against)")
    lacking = [s for s in c.sources[1:] if all(e.source != s for e in entries)]
    if base_entry is not None and lacking:
        lines.append(f"  (no {', '.join(lacking)} run of this setting: not judged"
                     + (", the gate fails" if _guarded(c, setting) else "") + ")")  # fmt: skip
    return lines


def _guarded(c: Comparison, setting: str) -> bool:
    return c.limit is not None and any(u.guarded for u in c.not_judged() if u.setting == setting)


def _overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    return not (min(b) > max(a) or max(b) < min(a))


def _checkpoint_lines(c: Comparison) -> list[str]:
    """A word when the sources restored different checkpoints: their times measure
    different work, so a ranking or a gate between them says little."""
    keys = {s: {e.checkpoint for es in c.entries.values() for e in es if e.source == s
                and any(e.checkpoint)} for s in c.sources}  # fmt: skip
    if all(same_checkpoint(a, b) for x in keys.values() for y in keys.values()
           for a in x for b in y):  # fmt: skip
        return []
    seen = {s: c.checkpoints_of(s) for s in c.sources}
    parts = "; ".join(f"{s}: {', '.join(v) or 'unknown'}" for s, v in seen.items())
    return [f"note: the sources restored different checkpoints ({parts})"]


def _pooled_lines(c: Comparison) -> list[str]:
    """A word for each source whose runs of a setting came from several results.json (or
    save.json) files: pooled (the same work, the same setting), never judged against each
    other. (Trace files are many to a run: a file per process, per rank.)"""
    lines = []
    for source in c.sources:
        files: dict[str, None] = {}
        for e in (e for es in c.entries.values() for e in es if e.source == source):
            summaries = [o for o in e.origins if o.endswith(".json")]
            files.update(dict.fromkeys(summaries if len(summaries) > 1 else []))
        if files:
            lines.append(f"note: {source} pools the runs of {len(files)} files, setting by "
                         f"setting (the same checkpoint): {', '.join(files)}")  # fmt: skip
    return lines


def _verdict_lines(c: Comparison) -> list[str]:
    if c.limit is None:
        moved = [f for f in c.findings
                 if f.beyond_spread and f.judged and f.what in (TTS, RTO, SAVE_TIME)]  # fmt: skip
        return [f"moved beyond the spread: {f.line(None)}" for f in moved] or [
            "no setting moved beyond its repeats' spread"
        ]
    lines = [f"SLOWER: {f.line(c.limit)}" for f in c.regressions]
    unjudged = [u for u in c.not_judged() if u.why != OTHER_WRITER]  # "not ranked" above
    for why in dict.fromkeys(u.why for u in unjudged):
        named = "; ".join(f"{u.source}: {u.setting}" for u in unjudged if u.why == why)
        words = "no run of the base's setting" if why == NO_RUN else why
        lines.append(f"not judged ({words}): {named}")
    if c.gate_failure():
        lines.append("gate: FAILED: it could not judge what the base measured (the error "
                     "line says why)")  # fmt: skip
    elif not c.regressions:
        lines.append(f"gate: nothing slower than the base by more than {percent(c.limit)}")
    return lines


__all__ = ["ranked_by", "render_text"]
