"""``ckptprof report --interruptions``: notice → emergency save → downtime → restore →
first step, one story per interruption, from the spans of both processes."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from ckptprof.errors import CkptprofError
from ckptprof.phases import INTERRUPTION_SPAN, NAMESPACE, PROGRESS_SPAN, RESTORE_SPAN, Attr, Phase
from ckptprof.report.goodput import build_goodput
from ckptprof.report.recovery import Recovery, recovery_of
from ckptprof.tracing.times import span_ns


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
    startup_s: float | None = None  # the new process's start → its restore began
    rto_s: float | None = None
    largest_phase: str | None = None
    restored_step: int | None = None
    steps_lost: int | None = None
    recovery_s: float | None = None
    cost_per_hour: float | None = None
    downtime_cost: float | None = None
    restore_cost: float | None = None
    ranks: int = 1
    recovery: Recovery | None = None  # the parts recovery_s is made of


def _attr(span: dict | None, key: str) -> Any:
    return None if span is None else (span.get("attributes") or {}).get(key)


def build_stories(spans: list[dict[str, Any]]) -> list[Story]:
    """One story per interruption: the interrupted run's ``ckpt.interruption`` traces
    (one per rank; rank 0's tells it) and the restores that link back (the slowest rank's
    is the job's restore)."""
    goodput = build_goodput(spans)  # the job's processes: where downtime is measured
    roots = [s for s in spans if s["name"] == INTERRUPTION_SPAN]
    restores = [
        s for s in spans if s["name"] == RESTORE_SPAN and _attr(s, Attr.INTERRUPTION_SOURCE)
    ]
    linked: dict[str, list[dict]] = {}
    for restore in restores:
        for link in restore.get("links") or []:
            linked.setdefault(link["context"]["span_id"], []).append(restore)
    by_run: dict[Any, list[dict]] = {}
    for root in roots:
        run = (root.get("attributes") or {}).get(Attr.RUN_ID) or root["context"]["span_id"]
        by_run.setdefault(run, []).append(root)
    stories, paired = [], set()
    for group in by_run.values():
        group.sort(key=lambda r: (r.get("attributes") or {}).get(Attr.RANK, 0))
        root = group[0]
        resumed = [r for g in group for r in linked.get(g["context"]["span_id"], [])]
        paired.update(id(r) for r in resumed)
        slowest = max(resumed, key=_wall, default=None)
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


def _wall(span: dict) -> float:
    return float((span.get("attributes") or {}).get(Attr.WALL_S) or 0.0)


def _story(root, spans, restore, goodput=None) -> Story:
    source_span = root or restore
    story = Story(source=_attr(source_span, Attr.INTERRUPTION_SOURCE) or "?")
    if root is not None:
        notice_ns = span_ns(root.get("start_time"))
        story.notice_at = root.get("start_time") if notice_ns is not None else None
        story.run_id = (root.get("attributes") or {}).get(Attr.RUN_ID)
        story.deadline_s = _attr(root, Attr.INTERRUPTION_DEADLINE_S)
        story.deadline_assumed = bool(_attr(root, Attr.INTERRUPTION_DEADLINE_ASSUMED))
        kids = [s for s in spans if s.get("parent_id") == root["context"]["span_id"]]
        notice = next((s for s in kids if s["name"] == Phase.NOTICE.span_name), None)
        if notice is not None:
            story.step_at_notice = _attr(notice, Attr.INTERRUPTION_STEP)
        save = next((s for s in kids if s["name"] == Phase.EMERGENCY_SAVE.span_name), None)
        if save is not None:
            start, end = span_ns(save.get("start_time")), span_ns(save.get("end_time"))
            if start is not None and notice_ns is not None:
                story.save_after_notice_s = round((start - notice_ns) / 1e9, 3)
            if start is not None and end is not None:
                story.save_s = round((end - start) / 1e9, 3)
        story.outcome = (
            _attr(root, Attr.INTERRUPTION_OUTCOME) or "not finished (killed during the save?)"
        )
        story.checkpoint_step = _attr(root, Attr.INTERRUPTION_CHECKPOINT_STEP)
        story.margin_s = _attr(root, Attr.INTERRUPTION_MARGIN_S)
    if restore is not None:
        attrs = restore.get("attributes") or {}
        story.resumed = True
        story.run_id = story.run_id or _attr(restore, Attr.INTERRUPTION_RUN_ID)
        if story.outcome is None:
            story.outcome = _attr(restore, Attr.INTERRUPTION_OUTCOME)
            story.checkpoint_step = _attr(restore, Attr.INTERRUPTION_CHECKPOINT_STEP)
            story.margin_s = _attr(restore, Attr.INTERRUPTION_MARGIN_S)
        notice_ns = span_ns(root.get("start_time")) if root is not None else None
        parts = recovery_of(attrs, span_ns(restore.get("start_time")), notice_ns, goodput)
        story.recovery = parts
        story.downtime_s, story.startup_s = parts.downtime_s, parts.startup_s
        story.rto_s, story.recovery_s = parts.rto_s, parts.recovery_s
        story.restored_step = _attr(restore, Attr.INTERRUPTION_RESTORED_STEP)
        story.steps_lost = _attr(restore, Attr.INTERRUPTION_STEPS_LOST)
        story.cost_per_hour = _attr(restore, Attr.INTERRUPTION_COST_PER_HOUR)
        story.downtime_cost = _attr(restore, Attr.INTERRUPTION_DOWNTIME_COST)
        if story.cost_per_hour is not None and story.downtime_s is not None:  # the one above
            story.downtime_cost = round(story.downtime_s / 3600 * story.cost_per_hour, 4)
        story.restore_cost = _attr(restore, Attr.INTERRUPTION_RESTORE_COST)
        phases = [
            s
            for s in spans
            if s.get("parent_id") == restore["context"]["span_id"]
            and s["name"].startswith(NAMESPACE)
            and s["name"] != PROGRESS_SPAN
        ]
        if phases:
            top = max(phases, key=lambda s: (s.get("attributes") or {}).get(Attr.BUSY_S, 0))
            busy = (top.get("attributes") or {}).get(Attr.BUSY_S, 0)
            story.largest_phase = f"{top['name'].removeprefix(NAMESPACE)} {busy:.3f} s"
    return story


def _s(value: float | None, unit: str = " s") -> str:
    return "?" if value is None else f"{value:.3f}{unit}"


def render_stories(stories: list[Story]) -> str:
    if not stories:
        raise CkptprofError(
            "no interruptions in these traces — run with interruption tracing on "
            "(CkptProfCallback(interruptions=True), CkptProf(interruptions=True), ...)"
        )
    lines = []
    for n, st in enumerate(stories, 1):
        deadline = "no deadline given"
        if st.deadline_s is not None:
            assumed = " (assumed)" if st.deadline_assumed else ""
            deadline = f"deadline {st.deadline_s:.1f} s later{assumed}"
        at = f" at {st.notice_at}" if st.notice_at else ""
        step = f", step {st.step_at_notice}" if st.step_at_notice is not None else ""
        step += f", {st.ranks} ranks" if st.ranks > 1 else ""
        lines.append(
            f"interruption {n}: {st.source} notice{at} (run {st.run_id}{step}); {deadline}"
        )
        if st.save_s is not None:
            margin = (
                ""
                if st.margin_s is None
                else f", {abs(st.margin_s):.1f} s {'before' if st.margin_s >= 0 else 'after'} "
                "the deadline"
            )
            lines.append(
                f"  emergency save: started {_s(st.save_after_notice_s)} after the notice, took "
                f"{_s(st.save_s)}: {st.outcome} at step {st.checkpoint_step}{margin}"
            )
        else:
            lines.append(f"  emergency save: {st.outcome}")
        if not st.resumed:
            lines.append("  not resumed yet (or the resumed run's traces are not among the PATHs)")
            continue
        restart = "the restore started" if st.source == "simulated" else "the new process started"
        wind_down = st.recovery.wind_down_s if st.recovery is not None else None
        if wind_down is not None:
            lines.append(
                f"  downtime: {_s(st.downtime_s)} (the interrupted process's end, "
                f"{_s(wind_down)} after the notice → {restart})"
            )
        else:
            lines.append(f"  downtime: {_s(st.downtime_s)} (notice → {restart})")
        if st.startup_s is not None and st.source != "simulated":
            lines.append(
                f"  start-up: {_s(st.startup_s)} (the new process started → its restore began: "
                "imports, the framework's set-up)"
            )
        largest = f" (largest phase {st.largest_phase})" if st.largest_phase else ""
        slowest = ", slowest rank" if st.ranks > 1 else ""
        lines.append(
            f"  restore: RTO {_s(st.rto_s)}{slowest}{largest}, from step {st.restored_step}"
        )
        lines.append(f"  steps lost: {st.steps_lost} (restored step {st.restored_step})")
        parts = st.recovery.parts() if st.recovery is not None else []
        known = [f"{name} {_s(value)}" for name, value in parts if value is not None]
        adds = f" = {' + '.join(known)}" if parts and len(known) == len(parts) else ""
        lines.append(
            f"  recovery: {_s(st.recovery_s)} from the notice to the first step done{adds}"
        )
        if st.cost_per_hour is not None:
            lines.append(
                f"  cost at ${st.cost_per_hour:.2f}/h: downtime ${st.downtime_cost:.4f}, "
                f"restore ${st.restore_cost:.4f}"
            )
    return "\n".join(lines) + "\n"


def render_stories_json(stories: list[Story]) -> str:
    return json.dumps([asdict(s) for s in stories], indent=1) + "\n"
