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
    MIN_REPEATS,
    NO_RUN,
    OTHER_WRITER,
    RTO,
    SAVE,
    SAVE_TIME,
    TTS,
    Comparison,
    Entry,
    Finding,
    percent,
    same_checkpoint,
    setting_order,
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
    for setting in setting_order(c):
        lines.append("")
        lines.append(setting)
        lines += _setting_block(c, setting, c.entries[setting])
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


def _unjudged_why(c: Comparison, entry: Entry) -> str | None:
    """Why ``entry`` got no verdict against the base though both ran its setting ("1 run vs
    3"), or None: it was judged, it is the base, or there is no base run (said apart).
    Such a row is never ranked: the JSON calls its finding ``judged: false``."""
    found = _finding_of(c, entry)
    if found is None or found.judged or not found.comparable:
        return None
    base = next(e for e in c.entries[entry.setting] if e.source == c.sources[0])
    runs = len(entry.values)
    return f"{runs} run{'s' * (runs != 1)} vs {len(base.values)}"


def _finding_of(c: Comparison, entry: Entry) -> Finding | None:
    return next((f for f in c.findings if f.source == entry.source
                 and f.setting == entry.setting and f.what == entry.metric), None)  # fmt: skip


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
    ranked = sorted(entries, key=lambda e: e.median)
    for e, shown_rank in zip(ranked, _ranks(c, ranked), strict=True):
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
        found, why = _finding_of(c, e), _unjudged_why(c, e)
        if why is not None:
            lines.append(
                f"  {e.source}: not judged: {why} (fewer than {MIN_REPEATS} repeats a side)"
            )
        elif found is not None and found.comparable and not found.beyond_spread:
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


def _ranks(c: Comparison, ranked: list[Entry]) -> list[str]:
    """Each row's rank, fastest first: "=" where its repeats overlap the row ranked above;
    "-" where nothing was judged (saves by different writers, too few repeats a side), so
    no row is placed on figures that cannot separate it."""
    shown, previous, rank = [], None, 0
    for e in ranked:
        if e.setting in c.writers or _unjudged_why(c, e) is not None:
            shown.append("-")
            continue
        tie = previous is not None and _overlap(previous.values, e.values)
        rank = rank if tie else rank + 1
        shown.append(f"={rank}" if tie else str(rank))
        previous = e
    return shown


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
    """The gate's SLOWER lines, every other judged move beyond the spread, what was not
    judged and why, and the gate's word: each finding the JSON lists as judged and beyond
    the spread is said here, so the text never reads calmer than the JSON."""
    lines = [f"SLOWER: {f.line(c.limit)}" for f in c.regressions]
    lines += _moved_lines(c)
    unjudged = [u for u in c.not_judged() if u.why != OTHER_WRITER]  # "not ranked" above
    if not lines and c.limit is None:
        lines.append("no judged setting moved beyond its repeats' spread")
    for why in dict.fromkeys(u.why for u in unjudged):
        named = "; ".join(f"{u.source}: {u.setting}" for u in unjudged if u.why == why)
        words = "no run of the base's setting" if why == NO_RUN else why
        lines.append(f"not judged ({words}): {named}")
    if c.limit is None:
        return lines
    if c.gate_failure():
        lines.append("gate: FAILED: it could not judge what the base measured (the error "
                     "line says why)")  # fmt: skip
    elif not c.regressions:
        lines.append(f"gate: nothing slower than the base by more than {percent(c.limit)}")
    return lines


def _moved_lines(c: Comparison) -> list[str]:
    """Judged moves beyond the spread the gate did not fail on, setting by setting: what
    ranks the setting as "moved", each phase as "phase moved" (beneath its setting's line
    where that moved too)."""
    order = {s: n for n, s in enumerate(setting_order(c))}
    moved = sorted((f for f in c.findings if f.beyond_spread and f.judged and not f.slower),
                   key=lambda f: order[f.setting])  # fmt: skip
    headlines = {(f.source, f.setting) for f in moved if f.what in (TTS, RTO, SAVE_TIME)}
    lines = []
    for f in moved:
        if (f.source, f.setting) not in headlines:
            lines.append(f"phase moved: {f.line(c.limit)}")
        elif f.what in (TTS, RTO, SAVE_TIME):
            lines.append(f"moved beyond the spread: {f.line(c.limit)}")
        else:
            lines.append(f"  phase moved: {f.line(c.limit)}")
    return lines


__all__ = ["ranked_by", "render_text"]
