"""``ckptprof report --interruptions``: notice → emergency save → downtime → restore →
first step, one story per interruption, from the spans of both processes."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from ckptprof.cost import COST_ENV, DEFAULT_COST_PER_HOUR
from ckptprof.errors import CkptprofError
from ckptprof.phases import INTERRUPTION_SPAN, NAMESPACE, PROGRESS_SPAN, RESTORE_SPAN, Attr, Phase
from ckptprof.report.goodput import Goodput, build_goodput
from ckptprof.report.json_values import integer, number
from ckptprof.report.recovery import END_RECORDED, Recovery, recovery_of
from ckptprof.tracing.times import span_ns
from ckptprof.units import fmt_margin

#: an emergency save that never ended (its outcome, as the spans or the record left it)
UNFINISHED = {
    None: "not finished (the process ended during it: killed?)",
    "pending": "never finished (the process ended before its emergency save did: killed?)",
}


@dataclass
class Story:
    source: str
    notice_at: str | None = None
    run_id: str | None = None
    step_at_notice: int | None = None
    deadline_s: float | None = None
    deadline_assumed: bool = False
    save_after_notice_s: float | None = None
    save_s: float | None = None
    outcome: str | None = None
    checkpoint_step: int | None = None
    margin_s: float | None = None
    resumed: bool = False
    downtime_s: float | None = None  # report/recovery.py: the one definition
    notice_to_start_s: float | None = None  # the notice → the new process started
    startup_s: float | None = None  # the new process's start → its restore began
    rto_s: float | None = None
    largest_phase: str | None = None
    restored_step: int | None = None
    last_step: int | None = None  # the last step the interrupted process trained
    steps_lost: int | None = None
    recovery_s: float | None = None
    cost_per_hour: float | None = None
    #: the rate was ckptprof's default (no price set): an assumed figure, said so
    cost_per_hour_default: bool | None = None
    downtime_cost: float | None = None
    notice_to_start_cost: float | None = None
    restore_cost: float | None = None
    ranks: int = 1
    recovery: Recovery | None = None  # the parts recovery_s is made of


def _attr(span: dict | None, key: str) -> Any:
    attrs = None if span is None else span.get("attributes")
    return attrs.get(key) if isinstance(attrs, dict) else None


def _span_id(span: dict | None) -> str | None:
    """A span's (or a link's) span id; None where its context is missing or odd."""
    context = span.get("context") if isinstance(span, dict) else None
    return context.get("span_id") if isinstance(context, dict) else None


def build_stories(spans: list[dict[str, Any]]) -> list[Story]:
    """One story per interruption: the interrupted run's ``ckpt.interruption`` traces
    (one per rank; rank 0's tells it) and the restores that link back (the slowest rank's
    is the job's restore). Odd values (a number that is text, a link without a context)
    read as absent, as in the plain report."""
    goodput = _goodput(spans)  # the job's processes: where downtime is measured
    roots = [s for s in spans if s["name"] == INTERRUPTION_SPAN and _span_id(s)]
    restores = [
        s for s in spans if s["name"] == RESTORE_SPAN and _attr(s, Attr.INTERRUPTION_SOURCE)
    ]
    linked: dict[str, list[dict]] = {}
    for restore in restores:
        for link in restore.get("links") or []:
            if _span_id(link):
                linked.setdefault(_span_id(link), []).append(restore)
    by_run: dict[Any, list[dict]] = {}
    for root in roots:
        by_run.setdefault(str(_attr(root, Attr.RUN_ID) or _span_id(root)), []).append(root)
    stories, paired = [], set()
    for group in by_run.values():
        group.sort(key=lambda r: integer(_attr(r, Attr.RANK)) or 0)
        root = group[0]
        resumed = [r for g in group for r in linked.get(_span_id(g), [])]
        paired.update(id(r) for r in resumed)
        slowest = max(resumed, key=lambda r: _wall(r) or 0.0, default=None)
        story = _story(root, spans, slowest, goodput)
        story.ranks = max(len(group), len(resumed), 1)
        # rank 0 may have taken another rank's notice ("peer"): the story is where it came
        sources = [_attr(r, Attr.INTERRUPTION_SOURCE) for r in group]
        seen = [source for source in sources if source not in (None, "peer")]
        if story.source == "peer" and seen:
            story.source = f"{seen[0]} (one rank; the others agreed)"
        stories.append(story)
    for restore in restores:  # resumed, but the interrupted process left no trace here
        if id(restore) not in paired:
            stories.append(_story(None, spans, restore, goodput))
    stories.sort(key=lambda s: s.notice_at or "")
    return stories


def _goodput(spans: list[dict[str, Any]]) -> Goodput | None:
    """The job's processes, or None where their clocks cannot be (``report --goodput``
    names the file): the stories are told from their own records then."""
    try:
        return build_goodput(spans)
    except CkptprofError:
        return None


def _wall(span: dict) -> float | None:
    """A restore's wall time: its ``ckpt.wall_s``, else its span's length (as in the
    plain report and the goodput)."""
    wall = number(_attr(span, Attr.WALL_S))
    start, end = span_ns(span.get("start_time")), span_ns(span.get("end_time"))
    if wall is None and start is not None and end is not None and end >= start:
        wall = (end - start) / 1e9
    return wall


def _story(root, spans, restore, goodput=None) -> Story:
    def told(key: str) -> Any:  # the interrupted process's spans, else its record's word
        found = _attr(root, key)
        return _attr(restore, key) if found is None else found

    story = Story(source=str(told(Attr.INTERRUPTION_SOURCE) or "?"))
    at = root.get("start_time") if root is not None else told(Attr.INTERRUPTION_NOTICE_AT)
    notice_ns = span_ns(at)
    story.notice_at = at if notice_ns is not None else None
    story.run_id = _attr(root, Attr.RUN_ID) or _attr(restore, Attr.INTERRUPTION_RUN_ID)
    story.deadline_s = number(told(Attr.INTERRUPTION_DEADLINE_S))
    story.deadline_assumed = bool(told(Attr.INTERRUPTION_DEADLINE_ASSUMED))
    outcome = told(Attr.INTERRUPTION_OUTCOME)
    story.outcome = None if outcome is None else str(outcome)
    story.checkpoint_step = integer(told(Attr.INTERRUPTION_CHECKPOINT_STEP))
    story.margin_s = number(told(Attr.INTERRUPTION_MARGIN_S))
    if root is not None:
        kids = [s for s in spans if s.get("parent_id") == _span_id(root)]
        notice = next((s for s in kids if s["name"] == Phase.NOTICE.span_name), None)
        story.step_at_notice = integer(_attr(notice, Attr.INTERRUPTION_STEP))
        save = next((s for s in kids if s["name"] == Phase.EMERGENCY_SAVE.span_name), None)
        if save is not None:
            start, end = span_ns(save.get("start_time")), span_ns(save.get("end_time"))
            if start is not None and notice_ns is not None:
                story.save_after_notice_s = round((start - notice_ns) / 1e9, 3)
            if start is not None and end is not None:
                story.save_s = round((end - start) / 1e9, 3)
    elif story.outcome in UNFINISHED:  # the record's step is still the notice's
        story.step_at_notice = integer(_attr(restore, Attr.INTERRUPTION_STEP))
    if restore is not None:
        _resumed(story, restore, spans, notice_ns, goodput)
    return story


def _resumed(story: Story, restore: dict, spans, notice_ns, goodput) -> None:
    """What the resumed run's restore tells: recovery in its parts, steps lost, cost."""
    attrs = restore.get("attributes") if isinstance(restore.get("attributes"), dict) else {}
    attrs = {**attrs, Attr.WALL_S: _wall(restore)}
    story.resumed = True
    parts = recovery_of(attrs, span_ns(restore.get("start_time")), notice_ns, goodput)
    story.recovery = parts
    story.downtime_s, story.startup_s = parts.downtime_s, parts.startup_s
    story.notice_to_start_s = parts.notice_to_start_s
    story.rto_s, story.recovery_s = parts.rto_s, parts.recovery_s
    story.restored_step = integer(_attr(restore, Attr.INTERRUPTION_RESTORED_STEP))
    story.last_step = integer(_attr(restore, Attr.INTERRUPTION_LAST_STEP))
    story.steps_lost = integer(_attr(restore, Attr.INTERRUPTION_STEPS_LOST))
    story.cost_per_hour = number(_attr(restore, Attr.INTERRUPTION_COST_PER_HOUR))
    if story.cost_per_hour is not None:
        story.cost_per_hour_default = story.cost_per_hour == DEFAULT_COST_PER_HOUR
    story.notice_to_start_cost = number(_attr(restore, Attr.INTERRUPTION_NOTICE_TO_START_COST))
    if story.cost_per_hour is not None and story.downtime_s is not None:  # the one above
        story.downtime_cost = round(story.downtime_s / 3600 * story.cost_per_hour, 4)
    story.restore_cost = number(_attr(restore, Attr.INTERRUPTION_RESTORE_COST))
    phases = [
        s
        for s in spans
        if s.get("parent_id") == _span_id(restore)
        and s["name"].startswith(NAMESPACE)
        and s["name"] != PROGRESS_SPAN
    ]
    if phases:
        top = max(phases, key=lambda s: number(_attr(s, Attr.BUSY_S)) or 0.0)
        busy = number(_attr(top, Attr.BUSY_S)) or 0.0
        story.largest_phase = f"{top['name'].removeprefix(NAMESPACE)} {busy:.3f} s"


def _s(value: float | None, unit: str = " s") -> str:
    return "?" if value is None else f"{value:.3f}{unit}"


def _usd(value: float | None) -> str:
    return "$?" if value is None else f"${value:.4f}"


def render_stories(stories: list[Story]) -> str:
    if not stories:
        raise CkptprofError(
            "no interruptions in these traces — run with interruption tracing on "
            "(CkptProfCallback(interruptions=True), CkptProf(interruptions=True), ...)"
        )
    return "".join(line + "\n" for n, st in enumerate(stories, 1) for line in _lines(n, st))


def _lines(n: int, st: Story) -> list[str]:
    """One interruption's story, line by line."""
    deadline = "no deadline given"
    if st.deadline_s is not None:
        assumed = " (assumed)" if st.deadline_assumed else ""
        deadline = f"deadline {_s(st.deadline_s)} later{assumed}"
    at = f" at {st.notice_at}" if st.notice_at else ""
    step = f", step {st.step_at_notice}" if st.step_at_notice is not None else ""
    step += f", {st.ranks} ranks" if st.ranks > 1 else ""
    lines = [f"interruption {n}: {st.source} notice{at} (run {st.run_id}{step}); {deadline}"]
    if st.save_s is not None and st.outcome not in UNFINISHED:
        margin = "" if st.margin_s is None else f", {fmt_margin(st.margin_s)}"
        lines.append(
            f"  emergency save: started {_s(st.save_after_notice_s)} after the notice, took "
            f"{_s(st.save_s)}: {st.outcome} at step {st.checkpoint_step}{margin}"
        )
    else:
        lines.append(f"  emergency save: {UNFINISHED.get(st.outcome, st.outcome)}")
    if not st.resumed:
        lines.append("  not resumed yet (or the resumed run's traces are not among the PATHs)")
        return lines
    lines += _downtime_lines(st)
    largest = f" (largest phase {st.largest_phase})" if st.largest_phase else ""
    slowest = ", slowest rank" if st.ranks > 1 else ""
    lines.append(f"  restore: RTO {_s(st.rto_s)}{slowest}{largest}, from step {st.restored_step}")
    last = f", the last trained {st.last_step}" if st.last_step is not None else ""
    lines.append(f"  steps lost: {st.steps_lost} (restored step {st.restored_step}{last})")
    parts = st.recovery.parts() if st.recovery is not None else []
    known = [f"{name} {_s(value)}" for name, value in parts if value is not None]
    adds = f" = {' + '.join(known)}" if parts and len(known) == len(parts) else ""
    lines.append(f"  recovery: {_s(st.recovery_s)} from the notice to the first step done{adds}")
    if st.cost_per_hour is not None:
        waited = (
            f"downtime {_usd(st.downtime_cost)}"
            if st.downtime_cost is not None
            else f"notice → start {_usd(st.notice_to_start_cost)}"
        )
        assumed = f" (the default, an 8×A100 list price: set {COST_ENV})" * bool(
            st.cost_per_hour_default
        )
        lines.append(
            f"  cost at ${st.cost_per_hour:.2f}/h{assumed}: {waited}, restore "
            f"{_usd(st.restore_cost)}"
        )
    return lines


def _downtime_lines(st: Story) -> list[str]:
    """The downtime (the interrupted process's end → the new start) and the start-up."""
    simulated = st.source == "simulated"
    restart = "the restore started" if simulated else "the new process started"
    wind_down = st.recovery.wind_down_s if st.recovery is not None else None
    end = st.recovery.end if st.recovery is not None else None
    if st.downtime_s is None:
        why = "" if simulated else " (its downtime: the interrupted process's traces are not here)"
        lines = [f"  notice → start: {_s(st.notice_to_start_s)} ({restart}){why}"]
    elif wind_down is None:
        lines = [
            f"  downtime: {_s(st.downtime_s)} (the interrupted process's last record, before "
            f"the notice; when it ended after is not recorded → {restart})"
        ]
    elif end == END_RECORDED:
        lines = [
            f"  downtime: {_s(st.downtime_s)} (the interrupted process's end, as its "
            f"interruption record saw it last, {_s(wind_down)} after the notice: it was killed "
            f"before it wrote its own → {restart})"
        ]
    else:
        lines = [
            f"  downtime: {_s(st.downtime_s)} (the interrupted process's last record, "
            f"{_s(wind_down)} after the notice; its exit after it is not observed and is "
            f"counted here → {restart})"
        ]
    if st.startup_s is not None and not simulated:
        lines.append(
            f"  start-up: {_s(st.startup_s)} (the new process started → its restore began: "
            "imports, the framework's set-up)"
        )
    return lines


def render_stories_json(stories: list[Story]) -> str:
    return json.dumps([asdict(s) for s in stories], indent=1) + "\n"
