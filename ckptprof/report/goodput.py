"""Of the hours a job ran, how many trained the model: its wall time across restarts, in
buckets that add up.

Each process of the job leaves a ``ckpt.run`` span (integrations/lifetime.py: its start
as the OS recorded it, its end at the adapter's close, its steps timed less the saves and
restores inside them) beside its ``ckpt.restore`` and ``ckpt.save`` spans. Per process:

* restore: its restores' wall time less their first step (by phase, list → reshard);
* first step: the restore's ``first_step`` phase (warm-up, data fast-forward);
* save blocking: its saves' wall time (an async save's blocking part only);
* background-save slowdown: the steps that ran while a background save wrote, less the
  same number of steps at the process's median pace;
* lost work: the steps after the checkpoint the next process resumed from, at the
  median pace (trained, then trained again);
* productive: the rest of the step time;
* the rest: whatever else the process did (start-up, evaluation, idle), its wall time
  less the buckets above: what ckptprof did not see is said, never spread.

Between processes, downtime: the old process's end to the new one's start. The buckets
of every process plus the downtimes are the job's wall time; goodput is the productive
share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptprof.phases import (
    RESTORE_PHASES,
    RESTORE_SPAN,
    RUN_SPAN,
    SAVE_SPAN,
    Attr,
    Phase,
    span_name,
)
from ckptprof.tracing.times import span_ns

BUCKETS = (
    "productive",
    "restore",
    "first_step",
    "save_blocking",
    "background_slowdown",
    "lost_work",
    "downtime",
    "other",
)
LABELS = {
    "productive": "productive steps",
    "restore": "restore",
    "first_step": "first step / warm-up",
    "save_blocking": "save blocking",
    "background_slowdown": "background-save slowdown",
    "lost_work": "lost work (redone)",
    "downtime": "downtime",
    "other": "other (start-up, eval, idle)",
}


@dataclass
class Lifetime:
    """One process of the job, and where its time went (seconds per bucket)."""

    pid: int | None
    host: str
    start_ns: int
    end_ns: int
    first_step: int | None
    last_step: int | None
    resumed_from: int | None  # the step its restore brought back (None: a fresh start)
    step_median_s: float | None
    buckets: dict[str, float] = field(default_factory=dict)
    restore_phases: dict[str, float] = field(default_factory=dict)
    lost_steps: int = 0

    @property
    def wall_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass
class Goodput:
    lifetimes: list[Lifetime]
    downtimes_s: list[float]  # between process i and i+1
    total: dict[str, float]  # the job's seconds per bucket
    price_per_hour: float | None = None

    @property
    def wall_s(self) -> float:
        return sum(self.total.values())

    @property
    def goodput(self) -> float:
        return self.total["productive"] / self.wall_s if self.wall_s else 0.0

    def cost(self, bucket: str) -> float | None:
        if self.price_per_hour is None:
            return None
        return self.total[bucket] / 3600 * self.price_per_hour


def _attr(span: dict, key: str, default: Any = None) -> Any:
    return (span.get("attributes") or {}).get(key, default)


def _bounds(span: dict) -> tuple[int, int]:
    return span_ns(span.get("start_time")) or 0, span_ns(span.get("end_time")) or 0


def _resource(span: dict, key: str) -> Any:
    return ((span.get("resource") or {}).get("attributes") or {}).get(key)


def _children(spans: Sequence[dict], root: dict) -> dict[str, dict]:
    span_id = root["context"]["span_id"]
    return {s["name"]: s for s in spans if s.get("parent_id") == span_id}


def build_goodput(
    spans: Sequence[dict],
    price_per_hour: float | None = None,
    resuming: tuple[int, int] | None = None,
) -> Goodput | None:
    """The job's goodput from every span read (rank 0's processes); None without any
    ``ckpt.run`` span. ``resuming``: (start ns, restored step) of a process resuming now,
    whose own spans are not written yet: the downtime and lost work before it count."""
    runs = sorted(_latest_runs(spans), key=lambda s: _bounds(s)[0])
    if not runs:
        return None
    lifetimes = [_lifetime(run, spans) for run in runs]
    nexts: list[tuple[int, int | None]] = [(lt.start_ns, lt.resumed_from) for lt in lifetimes[1:]]
    if resuming is not None:
        nexts.append(resuming)
    downtimes = []
    for before, (start_ns, resumed) in zip(lifetimes, nexts, strict=False):
        downtimes.append(max(0.0, (start_ns - before.end_ns) / 1e9))
        if resumed is not None and before.last_step is not None and before.last_step > resumed:
            before.lost_steps = before.last_step - resumed
            pace = before.step_median_s or 0.0
            lost = min(before.lost_steps * pace, before.buckets["productive"])
            before.buckets["lost_work"] = lost
            before.buckets["productive"] -= lost
    total = {b: sum(lt.buckets.get(b, 0.0) for lt in lifetimes) for b in BUCKETS}
    total["downtime"] = sum(downtimes)
    return Goodput(lifetimes, downtimes, total, price_per_hour)


def _latest_runs(spans: Sequence[dict]) -> list[dict]:
    """Rank 0's ``ckpt.run`` per process: its final one, else the latest written at a save
    (a process killed without closing ends there as far as the traces know)."""
    best: dict[tuple, dict] = {}
    for span in spans:
        if span["name"] != RUN_SPAN or _attr(span, Attr.RANK, 0) != 0:
            continue
        start, end = _bounds(span)
        key = (_resource(span, "host.name"), _attr(span, Attr.RUN_PID), start)
        kept = best.get(key)
        if kept is None or _bounds(kept)[1] < end:
            best[key] = span
    return list(best.values())


def _lifetime(run: dict, spans: Sequence[dict]) -> Lifetime:
    start, end = _bounds(run)
    pid = _attr(run, Attr.RUN_PID) or _resource(run, "process.pid")
    host = _resource(run, "host.name") or ""

    def inside(span: dict) -> bool:  # this process's own (its pid, rank 0, its lifetime)
        s, e = _bounds(span)
        theirs = _resource(span, "process.pid")
        same = pid is None or theirs is None or theirs == pid
        return same and _attr(span, Attr.RANK, 0) == 0 and start <= s and e <= end + 1_000_000

    restores = [s for s in spans if s["name"] == RESTORE_SPAN and inside(s)]
    saves = [
        s for s in spans
        if s["name"] == SAVE_SPAN and inside(s) and not _attr(s, Attr.SAVE_BACKGROUND)
    ]  # fmt: skip
    phases: dict[str, float] = {}
    first_step = 0.0
    restore = 0.0
    resumed_from = None
    for r in restores:
        wall = float(_attr(r, Attr.WALL_S) or 0.0)
        kids = _children(spans, r)
        step = kids.get(span_name(Phase.FIRST_STEP))
        step_s = float(_attr(step, Attr.BUSY_S, 0.0)) if step else 0.0
        first_step += step_s
        restore += max(0.0, wall - step_s)
        for phase in RESTORE_PHASES:
            if phase is Phase.FIRST_STEP:
                continue
            kid = kids.get(phase.span_name)
            if kid:
                phases[phase.value] = phases.get(phase.value, 0.0) + float(
                    _attr(kid, Attr.BUSY_S, 0)
                )
        if _attr(r, Attr.RESTORED_STEP) is not None:
            resumed_from = int(_attr(r, Attr.RESTORED_STEP))
    blocking = sum(float(_attr(s, Attr.WALL_S) or 0.0) for s in saves)
    steps_s = float(_attr(run, Attr.RUN_STEP_S, 0.0))
    median = _attr(run, Attr.RUN_STEP_MEDIAN_S)
    bg_steps = int(_attr(run, Attr.RUN_BACKGROUND_STEPS, 0))
    bg_s = float(_attr(run, Attr.RUN_BACKGROUND_STEP_S, 0.0))
    slowdown = max(0.0, bg_s - bg_steps * float(median)) if median is not None else 0.0
    buckets = {
        "productive": max(0.0, steps_s - slowdown),
        "restore": restore,
        "first_step": first_step,
        "save_blocking": blocking,
        "background_slowdown": slowdown,
        "lost_work": 0.0,
    }
    wall = (end - start) / 1e9
    buckets["other"] = wall - sum(buckets.values())  # what ckptprof did not see: said
    return Lifetime(
        pid=pid, host=host, start_ns=start, end_ns=end,
        first_step=_attr(run, Attr.RUN_FIRST_STEP), last_step=_attr(run, Attr.RUN_LAST_STEP),
        resumed_from=resumed_from, step_median_s=median, buckets=buckets,
        restore_phases=phases,
    )  # fmt: skip


def render_goodput(g: Goodput) -> str:
    """The table a person reads: per process and for the job, and the goodput share."""
    from ckptprof.units import fmt_pct

    names = [f"process {i + 1}" for i in range(len(g.lifetimes))]
    headers = ["bucket", *names, "job", "share"] + (["cost"] if g.price_per_hour else [])
    rows = []
    for bucket in BUCKETS:
        cells = []
        for i, lt in enumerate(g.lifetimes):
            value = g.downtimes_s[i] if bucket == "downtime" and i < len(g.downtimes_s) else None
            value = lt.buckets.get(bucket, 0.0) if bucket != "downtime" else (value or 0.0)
            cells.append(f"{value:.2f}")
        share = g.total[bucket] / g.wall_s if g.wall_s else 0.0
        row = [LABELS[bucket], *cells, f"{g.total[bucket]:.2f}", fmt_pct(share)]
        if g.price_per_hour:
            row.append(f"{g.cost(bucket):.4f}")
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells) -> str:
        first = str(cells[0]).ljust(widths[0])
        return "  " + "  ".join(
            [first] + [str(c).rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        )

    out = [
        f"goodput of a job of {len(g.lifetimes)} process(es), {g.wall_s:.2f} s of wall time "
        f"(seconds; downtime in the column of the process it follows):",
        line(headers),
        *[line(r) for r in rows],
        f"  goodput: {fmt_pct(g.goodput)} of the job's wall time trained the model",
    ]
    for i, lt in enumerate(g.lifetimes):
        facts = [f"pid {lt.pid}" if lt.pid else "", f"{lt.wall_s:.2f} s"]
        if lt.first_step is not None:
            facts.append(f"steps {lt.first_step}->{lt.last_step}")
        if lt.resumed_from is not None:
            facts.append(f"resumed from step {lt.resumed_from}")
        if lt.lost_steps:
            facts.append(f"{lt.lost_steps} steps after its last usable save lost")
        if lt.restore_phases:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in lt.restore_phases.items())
            facts.append(f"restore by phase: {parts}")
        out.append(f"  process {i + 1}: " + "; ".join(f for f in facts if f))
    if any(lt.buckets["other"] < -0.01 for lt in g.lifetimes):
        out.append("  note: a process's buckets exceed its wall time (clocks of its spans overlap)")
    if g.price_per_hour:
        lost = g.wall_s - g.total["productive"]
        out.append(
            f"  at {g.price_per_hour:g}/hour: {g.wall_s / 3600 * g.price_per_hour:.4f} in all, "
            f"{lost / 3600 * g.price_per_hour:.4f} not training"
        )
    return "\n".join(out) + "\n"


def goodput_json(g: Goodput) -> dict:
    import dataclasses

    return {
        "wall_s": g.wall_s,
        "goodput": g.goodput,
        "total": g.total,
        "downtimes_s": g.downtimes_s,
        "price_per_hour": g.price_per_hour,
        "cost": {b: g.cost(b) for b in BUCKETS} if g.price_per_hour else None,
        "lifetimes": [{**dataclasses.asdict(lt), "wall_s": lt.wall_s} for lt in g.lifetimes],
    }


__all__ = ["BUCKETS", "Goodput", "Lifetime", "build_goodput", "goodput_json", "render_goodput"]
