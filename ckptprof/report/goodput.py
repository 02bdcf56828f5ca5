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
  median pace (trained, then trained again), those its last ``ckpt.run`` never saw too;
* productive: the rest of the step time;
* the rest: whatever else the process did (start-up, evaluation, idle), its wall time
  less the buckets above: what ckptprof did not see is said, never spread.

Between processes, downtime: the old process's end to the new one's start. A process
killed before it wrote its end (its last ``ckpt.run`` is from its last routine save)
lived at least until the notice and its last step that the next process's interruption
record names (on its restore): its life runs to there, and those steps are lost work.
The buckets of every process plus the downtimes are the job's wall time; goodput is the
productive share.

The processes of one job are those whose ``ckpt.run`` names the same job (its checkpoint
folder or run id; else the folder of the trace file): several jobs are several tables,
never one job with the gaps between them as downtime. A span whose clocks cannot be (it
ends before it starts, a process's buckets exceed its life, two processes of one job at
once) is named with its file: no bucket is negative and no share above 100%.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptprof.errors import CkptprofError
from ckptprof.phases import (
    RESTORE_PHASES,
    RESTORE_SPAN,
    RUN_SPAN,
    SAVE_SPAN,
    Attr,
    Phase,
    span_name,
)
from ckptprof.report.json_values import integer, number
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
#: where :func:`read_job_spans` notes the trace file a span came from (to name it)
SOURCE = "ckptprof.source"
#: how far a process's buckets may exceed its life (clock rounding) before it is refused
OVERRUN_S, OVERRUN_SHARE = 0.1, 0.01
#: how long two processes of one job may overlap (an exit still flushing) before refusal
OVERLAP_S = 1.0


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
    overrun_s: float = 0.0  # its buckets beyond its wall time (within the rounding allowed)
    #: what the interruption record its restore read says of the process before it
    #: (notice_ns, last_step, last_step_ns)
    record: dict[str, int] | None = None
    #: its life past its last ``ckpt.run``, and the steps in it, from the next one's record
    unseen_s: float = 0.0
    unseen_steps: int = 0

    @property
    def wall_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass
class Goodput:
    lifetimes: list[Lifetime]
    downtimes_s: list[float]  # between process i and i+1
    total: dict[str, float]  # the job's seconds per bucket
    price_per_hour: float | None = None
    job: str | None = None  # the job's identity (its checkpoint folder, run id or trace folder)

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
    attrs = span.get("attributes")
    return attrs.get(key, default) if isinstance(attrs, dict) else default


def _num(span: dict | None, key: str) -> float:
    """A number attribute; a missing or odd one (not a number) reads as 0."""
    return (number(_attr(span, key)) or 0.0) if span else 0.0


def _bounds(span: dict) -> tuple[int, int]:
    return span_ns(span.get("start_time")) or 0, span_ns(span.get("end_time")) or 0


def _resource(span: dict, key: str) -> Any:
    return ((span.get("resource") or {}).get("attributes") or {}).get(key)


def _children(spans: Sequence[dict], root: dict) -> dict[str, dict]:
    span_id = (root.get("context") or {}).get("span_id")
    return {s["name"]: s for s in spans if span_id and s.get("parent_id") == span_id}


def read_job_spans(paths: Iterable[str | os.PathLike], beside_results: bool = False) -> list[dict]:
    """Every span of the trace files the PATHs name, each noting its file (``SOURCE``),
    and each ``ckpt.run`` its job: its own ``ckpt.run.job``, else its file's folder."""
    from ckptprof.report.load import trace_files
    from ckptprof.report.traces import read_json_lines

    spans = []
    for path in trace_files(paths, beside_results):
        folder = os.path.abspath(path.parent)
        for span in read_json_lines(path).docs:
            span[SOURCE] = str(path)
            if span["name"] == RUN_SPAN:
                if not isinstance(span.get("attributes"), dict):
                    span["attributes"] = {}
                span["attributes"].setdefault(Attr.RUN_JOB, folder)
            spans.append(span)
    return spans


def jobs_of(spans: Sequence[dict]) -> list[str]:
    """The jobs whose processes left a ``ckpt.run`` here, the earliest started first."""
    first: dict[str, int] = {}
    for run in _latest_runs(spans):
        job = str(_attr(run, Attr.RUN_JOB) or "")
        first[job] = min(first.get(job, _bounds(run)[0]), _bounds(run)[0])
    return sorted(first, key=first.__getitem__)


def build_goodputs(spans: Sequence[dict], price_per_hour: float | None = None) -> list[Goodput]:
    """One :class:`Goodput` per job (see :func:`jobs_of`); empty without ``ckpt.run``.

    Raises:
        CkptprofError: a span's clocks are impossible (named with its file).
    """
    goodputs = (build_goodput(spans, price_per_hour, job=job) for job in jobs_of(spans))
    return [g for g in goodputs if g is not None]


def build_goodput(
    spans: Sequence[dict],
    price_per_hour: float | None = None,
    resuming: tuple[int, int] | None = None,
    job: str | None = None,
    record: dict[str, Any] | None = None,
) -> Goodput | None:
    """The job's goodput from every span read (rank 0's processes; with ``job``, that
    job's alone); None without any ``ckpt.run`` span. ``resuming``: (start ns, restored
    step) of a process resuming now, whose own spans are not written yet: the downtime
    and lost work before it count, with the interruption ``record`` its restore read
    (:func:`interruption_record`), as the report reads it from that restore's span.

    Raises:
        CkptprofError: a span's clocks are impossible (named with its file).
    """
    runs = sorted(_latest_runs(spans, job), key=lambda s: _bounds(s)[0])
    if not runs:
        return None
    lifetimes = [_lifetime(run, spans) for run in runs]
    for before, after in zip(lifetimes, lifetimes[1:], strict=False):
        _past_last_run(before, after.record, after.start_ns)
    nexts: list[tuple[int, int | None]] = [(lt.start_ns, lt.resumed_from) for lt in lifetimes[1:]]
    if resuming is not None:
        _past_last_run(lifetimes[-1], record, resuming[0])
        nexts.append(resuming)
    downtimes = []
    for index, (before, (start_ns, resumed)) in enumerate(zip(lifetimes, nexts, strict=False)):
        overlap_s = (before.end_ns - start_ns) / 1e9
        if overlap_s > OVERLAP_S and index + 1 < len(runs):
            earlier = runs[index].get(SOURCE) or f"pid {before.pid}"
            raise _impossible(
                runs[index + 1],
                f"it starts {overlap_s:.2f} s before the process before it in the same job "
                f"ends ({earlier}): a job's processes follow one another",
            )
        downtimes.append(max(0.0, -overlap_s))
        if resumed is not None and before.last_step is not None and before.last_step > resumed:
            _lose(before, before.last_step - resumed)
    total = {b: sum(lt.buckets.get(b, 0.0) for lt in lifetimes) for b in BUCKETS}
    total["downtime"] = sum(downtimes)
    return Goodput(lifetimes, downtimes, total, price_per_hour, job)


def _past_last_run(before: Lifetime, record: dict[str, int] | None, next_start: int) -> None:
    """``before`` was alive at the notice and at its last step that the next process's
    interruption ``record`` names (inside its life, before the next start): its end is
    there at least, and the steps after its last ``ckpt.run`` ran in that time."""
    if not record:
        return
    seen = [
        at for at in (record.get("notice_ns"), record.get("last_step_ns"))
        if at is not None and before.start_ns <= at <= next_start
    ]  # fmt: skip
    end = max(seen, default=before.end_ns)
    if end > before.end_ns:
        before.unseen_s = (end - before.end_ns) / 1e9
        before.buckets["other"] += before.unseen_s
        before.end_ns = end
    last = record.get("last_step")
    if before.unseen_s and last is not None and last > (before.last_step or 0):
        before.unseen_steps = last - (before.last_step or 0)
        before.last_step = last


def _lose(before: Lifetime, steps: int) -> None:
    """``steps`` of ``before`` redone by the next process, at its median pace: those its
    ``ckpt.run`` counted come out of its productive time, those after it out of the time
    the next one's record added."""
    before.lost_steps = steps
    pace = before.step_median_s or 0.0
    unseen = min(steps, before.unseen_steps)
    after_run = min(unseen * pace, before.unseen_s, before.buckets["other"])
    counted = min((steps - unseen) * pace, before.buckets["productive"])
    before.buckets["lost_work"] = counted + after_run
    before.buckets["productive"] -= counted
    before.buckets["other"] -= after_run


def _impossible(span: dict, what: str) -> CkptprofError:
    """The one line naming a span whose clocks cannot be, and its file."""
    where = span.get(SOURCE) or "the traces"
    pid = _attr(span, Attr.RUN_PID) or _resource(span, "process.pid")
    return CkptprofError(
        f"{where}: impossible clocks in its {span.get('name')} span"
        + (f" (pid {pid})" if pid else "")
        + f": {what}; --goodput cannot split that time: leave this file out (or fix the "
        "host's clock) and report again"
    )


def _checked_bounds(span: dict) -> tuple[int, int]:
    start, end = _bounds(span)
    if start <= 0 or end <= 0:
        raise _impossible(span, "no valid start_time or end_time")
    if end < start:
        raise _impossible(span, f"it ends {(start - end) / 1e9:.2f} s before it starts")
    wall = _attr(span, Attr.WALL_S)
    if isinstance(wall, (int, float)) and wall < 0:
        raise _impossible(span, f"its {Attr.WALL_S} is {wall}")
    return start, end


def _latest_runs(spans: Sequence[dict], job: str | None = None) -> list[dict]:
    """Rank 0's ``ckpt.run`` per process (of ``job`` when given): its final one, else the
    latest written at a save (a process killed without closing ends there as far as the
    traces know)."""
    best: dict[tuple, dict] = {}
    for span in spans:
        if span["name"] != RUN_SPAN or _attr(span, Attr.RANK, 0) != 0:
            continue
        if job is not None and str(_attr(span, Attr.RUN_JOB) or "") != job:
            continue
        start, end = _bounds(span)
        key = (_resource(span, "host.name"), _attr(span, Attr.RUN_PID), start)
        kept = best.get(key)
        if kept is None or _bounds(kept)[1] < end:
            best[key] = span
    return list(best.values())


def _lifetime(run: dict, spans: Sequence[dict]) -> Lifetime:
    start, end = _checked_bounds(run)
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
    for span in restores + saves:
        _checked_bounds(span)
    restore, first_step, phases, resumed_from, record = _restores(restores, spans)
    blocking = sum(_wall(s) for s in saves)
    steps_s = _num(run, Attr.RUN_STEP_S)
    median = number(_attr(run, Attr.RUN_STEP_MEDIAN_S))
    bg_steps = _num(run, Attr.RUN_BACKGROUND_STEPS)
    bg_s = _num(run, Attr.RUN_BACKGROUND_STEP_S)
    slowdown = max(0.0, bg_s - bg_steps * median) if median is not None else 0.0
    buckets = {
        "productive": max(0.0, steps_s - slowdown),
        "restore": restore,
        "first_step": first_step,
        "save_blocking": blocking,
        "background_slowdown": slowdown,
        "lost_work": 0.0,
    }
    for name, value in (("step", steps_s), ("background step", bg_s)):
        if value < 0:
            raise _impossible(run, f"its {name} seconds are {value}")
    wall = (end - start) / 1e9
    seen = sum(buckets.values())
    overrun = seen - wall
    if overrun > max(OVERRUN_S, OVERRUN_SHARE * wall):
        raise _impossible(
            run, f"its steps, saves and restores take {seen:.2f} s of a {wall:.2f} s life"
        )
    buckets["other"] = max(0.0, wall - seen)  # what ckptprof did not see: said
    return Lifetime(
        pid=pid, host=host, start_ns=start, end_ns=end,
        first_step=integer(_attr(run, Attr.RUN_FIRST_STEP)),
        last_step=integer(_attr(run, Attr.RUN_LAST_STEP)), resumed_from=resumed_from,
        step_median_s=median, buckets=buckets, restore_phases=phases,
        overrun_s=max(0.0, overrun), record=record,
    )  # fmt: skip


def _wall(span: dict) -> float:
    """A restore's or save's wall time: its ``ckpt.wall_s``, else its span's length."""
    wall = number(_attr(span, Attr.WALL_S))
    if wall is None:
        start, end = _bounds(span)
        wall = max(0.0, (end - start) / 1e9)
    return wall


def _restores(restores: list[dict], spans: Sequence[dict]) -> tuple:
    """A process's restores: their time less the first step, the first step, the time
    by phase, the step the last brought back, and the interruption record it read."""
    phases: dict[str, float] = {}
    restore = first_step = 0.0
    resumed_from = record = None
    for r in restores:
        kids = _children(spans, r)
        step_s = _num(kids.get(span_name(Phase.FIRST_STEP)), Attr.BUSY_S)
        first_step += step_s
        restore += max(0.0, _wall(r) - step_s)
        for phase in RESTORE_PHASES:
            kid = kids.get(phase.span_name)
            if kid and phase is not Phase.FIRST_STEP:
                phases[phase.value] = phases.get(phase.value, 0.0) + _num(kid, Attr.BUSY_S)
        if integer(_attr(r, Attr.RESTORED_STEP)) is not None:
            resumed_from = integer(_attr(r, Attr.RESTORED_STEP))
        record = interruption_record(r.get("attributes")) or record
    return restore, first_step, phases, resumed_from, record


def interruption_record(attributes: Any) -> dict[str, Any] | None:
    """What a resumed restore's attributes say of the interruption before it (the
    notice, the last step trained and when), or None where it read no record."""
    attrs = attributes if isinstance(attributes, dict) else {}
    notice_ns = span_ns(attrs.get(Attr.INTERRUPTION_NOTICE_AT))
    if notice_ns is None:
        return None
    return {
        "notice_ns": notice_ns,
        "last_step": integer(attrs.get(Attr.INTERRUPTION_LAST_STEP)),
        "last_step_ns": span_ns(attrs.get(Attr.INTERRUPTION_LAST_STEP_AT)),
    }


__all__ = [
    "BUCKETS",
    "Goodput",
    "Lifetime",
    "build_goodput",
    "build_goodputs",
    "interruption_record",
    "jobs_of",
    "read_job_spans",
]
