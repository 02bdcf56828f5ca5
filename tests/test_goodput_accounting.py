"""The goodput's accounting checked on cases worked out by hand: a process's steps timed
on a fake clock (a save inside a step is not step time; a background save that ended no
longer slows the steps after it), and the report's buckets from hand-made spans of two
processes (restore less its first step, the blocking saves only, the slowdown and the
lost work at the median pace, the downtime between them)."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from ckptprof.integrations import lifetime as lifetime_module
from ckptprof.phases import Attr
from ckptprof.report.goodput import build_goodput
from ckptprof.tracing import CheckpointTracer, setup_telemetry
from tests.conftest import read_spans

S = 1_000_000_000  # ns in a second


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def time_ns(self) -> int:
        return self.now


def test_steps_are_timed_less_the_saves_inside_them_and_background_saves_end(monkeypatch):
    clock = FakeClock()
    life = lifetime_module.Lifetime()
    monkeypatch.setattr(lifetime_module, "time", SimpleNamespace(time_ns=clock.time_ns))
    save = SimpleNamespace(finished=False)  # a background save, writing

    def step(at_s: int, number: int) -> None:
        clock.now = at_s * S
        life.step_ended(number)

    step(10, 1)  # the timing starts at the first step's end
    life.blocked(12 * S, 15 * S)  # a save the loop waited 3 s for
    step(20, 2)  # 10 s, 3 of them saving: 7 s of step
    life.background(save)
    step(30, 3)  # 10 s while the background save writes
    save.finished = True
    step(40, 4)  # 10 s: that save has ended, a clean step again
    life.blocked(38 * S, 45 * S)  # a save across two steps' ends (recorded when it ended)
    step(44, 5)  # 4 s, all inside the save
    step(50, 6)  # 6 s, 1 of them (44 to 45) inside the save
    attrs = life.attributes(rank=0)
    assert attrs[Attr.RUN_FIRST_STEP] == 1 and attrs[Attr.RUN_LAST_STEP] == 6
    assert attrs[Attr.RUN_STEPS] == 5
    assert attrs[Attr.RUN_STEP_S] == 7 + 10 + 10 + 0 + 5
    assert attrs[Attr.RUN_BACKGROUND_STEPS] == 1 and attrs[Attr.RUN_BACKGROUND_STEP_S] == 10
    assert attrs[Attr.RUN_STEP_MEDIAN_S] == 6.0  # of 7, 10, 0, 5: the clean steps


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(1_800_000_000 + seconds, timezone.utc).isoformat()


def span(name: str, start: float, end: float, pid: int, span_id: str, parent: str | None = None,
         **attributes) -> dict:  # fmt: skip
    return {
        "name": name, "start_time": iso(start), "end_time": iso(end), "parent_id": parent,
        "context": {"span_id": span_id, "trace_id": span_id * 2},
        "attributes": {Attr.WALL_S: end - start, **attributes},
        "resource": {"attributes": {"host.name": "node-0", "process.pid": pid}},
    }  # fmt: skip


def run_span(start: float, end: float, pid: int, final: bool = True, **attributes) -> dict:
    run = span("ckpt.run", start, end, pid, f"run{pid}{final}", **attributes)
    run["attributes"].update({Attr.RUN_PID: pid, Attr.RUN_FINAL: final})
    return run


def test_the_buckets_of_two_processes_worked_out_by_hand():
    """Process 1 (0-100 s): 60 s of steps, 10 of them while a background save wrote (5
    steps at a 1.5 s median: 2.5 s slower), a 4 s blocking save and the background save
    beside it, steps 1->40, a record written at its save and another at its close.
    Process 2 (110-200 s) resumes from step 30: a 12 s restore with a 2 s first step, a
    3 s blocking save, 50 s of steps. Step 30->40 of process 1 are lost: 10 at 1.5 s."""
    first = [
        run_span(0, 50, 101, final=False, **{Attr.RUN_STEP_S: 20.0}),  # at its save
        run_span(
            0,
            100,
            101,
            **{
                Attr.RUN_STEP_S: 60.0,
                Attr.RUN_STEP_MEDIAN_S: 1.5,
                Attr.RUN_STEPS: 39,
                Attr.RUN_BACKGROUND_STEPS: 5,
                Attr.RUN_BACKGROUND_STEP_S: 10.0,
                Attr.RUN_FIRST_STEP: 1,
                Attr.RUN_LAST_STEP: 40,
            },
        ),  # fmt: skip
        span("ckpt.save", 46, 50, 101, "save1"),
        span("ckpt.save", 50, 70, 101, "bg1", **{Attr.SAVE_BACKGROUND: True}),
    ]
    second = [
        run_span(
            110,
            200,
            202,
            **{
                Attr.RUN_STEP_S: 50.0,
                Attr.RUN_STEP_MEDIAN_S: 1.0,
                Attr.RUN_BACKGROUND_STEPS: 0,
                Attr.RUN_FIRST_STEP: 31,
                Attr.RUN_LAST_STEP: 80,
            },
        ),  # fmt: skip
        span("ckpt.restore", 112, 124, 202, "restore2", **{Attr.RESTORED_STEP: 30}),
        span(
            "ckpt.first_step", 122, 124, 202, "step2", parent="restore2", **{Attr.BUSY_S: 2.0}
        ),  # fmt: skip
        span("ckpt.fetch", 113, 120, 202, "fetch2", parent="restore2", **{Attr.BUSY_S: 7.0}),
        span("ckpt.save", 150, 153, 202, "save2"),
        span("ckpt.save", 40, 45, 999, "elsewhere"),  # another process's: not this one's
    ]
    goodput = build_goodput(first + second)
    one, two = goodput.lifetimes
    assert (one.pid, two.pid) == (101, 202)
    assert one.buckets == pytest.approx({
        "productive": 60 - 2.5 - 15, "restore": 0, "first_step": 0, "save_blocking": 4,
        "background_slowdown": 10 - 5 * 1.5, "lost_work": 10 * 1.5,
        "other": 100 - 60 - 4,
    })  # fmt: skip
    assert one.lost_steps == 10 and two.resumed_from == 30
    assert two.buckets == pytest.approx({
        "productive": 50, "restore": 10, "first_step": 2, "save_blocking": 3,
        "background_slowdown": 0, "lost_work": 0, "other": 90 - 50 - 12 - 3,
    })  # fmt: skip
    assert two.restore_phases == {"fetch": 7.0}
    assert goodput.downtimes_s == pytest.approx([10.0])
    assert goodput.wall_s == pytest.approx(200)
    assert goodput.goodput == pytest.approx((42.5 + 50) / 200)


def test_a_process_run_written_at_each_save_stays_one_trace(tmp_path, monkeypatch):
    """Each ``ckpt.run`` snapshot (at every save, then at the close) joins the process's
    one trace, so a backend lists one trace per process; the next process (a new
    Lifetime) is a trace of its own, and so is a span started after a snapshot."""
    monkeypatch.setattr(lifetime_module, "_previous_end_ns", 0)  # the final one sets it
    telemetry = setup_telemetry(tmp_path, run_id="job", otlp=False)
    tracer = CheckpointTracer(telemetry.provider)
    life = lifetime_module.Lifetime()
    for final in (False, False, True):
        life.emit(tracer, 0, final=final)
    tracer.start_span("ckpt.after").end()
    lifetime_module.Lifetime().emit(tracer, 0)
    telemetry.shutdown()
    spans = read_spans(telemetry.trace_file)
    traces = [s["context"]["trace_id"] for s in spans]
    assert [s["name"] for s in spans] == ["ckpt.run"] * 3 + ["ckpt.after", "ckpt.run"]
    assert len(set(traces[:3])) == 1 and len({s["context"]["span_id"] for s in spans}) == 5
    assert len(set(traces[2:])) == 3


def _killed_then_resumed(record: bool = True) -> list[dict]:
    """Process 1 (0-50 s as its spans know it: its last ``ckpt.run`` is from its save of
    step 20 at 50 s) got a notice at 55 s, trained to step 24 (ended at 54.5 s) and was
    killed before its emergency save. Process 2 (60-100 s) resumes from step 20; its
    restore carries the interruption record (with ``record``) and links to the notice
    span, which was never written."""
    facts = {
        Attr.INTERRUPTION_SOURCE: "sigterm", Attr.INTERRUPTION_OUTCOME: "pending",
        Attr.INTERRUPTION_STEP: 24, Attr.INTERRUPTION_DEADLINE_S: 30.0,
        Attr.INTERRUPTION_DEADLINE_ASSUMED: True, Attr.INTERRUPTION_NOTICE_TO_START_S: 5.0,
        Attr.INTERRUPTION_STARTUP_S: 2.0, Attr.INTERRUPTION_RECOVERY_S: 10.0,
        Attr.INTERRUPTION_RESTORED_STEP: 20, Attr.INTERRUPTION_STEPS_LOST: 4,
        Attr.INTERRUPTION_LAST_STEP: 24,
    }  # fmt: skip
    if record:
        facts[Attr.INTERRUPTION_NOTICE_AT] = iso(55)
        facts[Attr.INTERRUPTION_LAST_STEP_AT] = iso(54.5)
    restore = span("ckpt.restore", 62, 65, 202, "restore2", **{Attr.RESTORED_STEP: 20}, **facts)
    restore["links"] = [{"context": {"span_id": "notice1", "trace_id": "t"}}]
    step = {Attr.RUN_STEP_MEDIAN_S: 1.0, Attr.RUN_FIRST_STEP: 1, Attr.RUN_BACKGROUND_STEPS: 0}
    return [
        run_span(0, 50, 101, final=False, **{Attr.RUN_STEP_S: 20.0, Attr.RUN_LAST_STEP: 20},
                 **step),
        span("ckpt.save", 49, 50, 101, "save1"),
        run_span(60, 100, 202, **{Attr.RUN_STEP_S: 30.0, Attr.RUN_LAST_STEP: 50}, **step),
        restore,
    ]  # fmt: skip


def test_a_process_killed_before_its_emergency_save_ends_where_its_record_saw_it():
    """Its life runs to the notice its record saw (not its last save: the 5 s in which
    steps 21-24 trained are no downtime), those steps are lost work, and the story tells
    the goodput's downtime, the record's deadline, and no negative wind-down."""
    from ckptprof.report.interruptions import build_stories, render_stories

    spans = _killed_then_resumed()
    goodput = build_goodput(spans)
    one, two = goodput.lifetimes
    assert one.end_ns - one.start_ns == 55 * S and one.unseen_s == pytest.approx(5.0)
    assert one.last_step == 24 and one.lost_steps == 4 and two.resumed_from == 20
    assert one.buckets["lost_work"] == pytest.approx(4 * 1.0)  # at the median pace
    assert one.buckets["productive"] == pytest.approx(20.0)  # what its ckpt.run counted
    assert one.buckets["other"] == pytest.approx(55 - 20 - 1 - 4)
    assert goodput.downtimes_s == pytest.approx([5.0])
    assert goodput.wall_s == pytest.approx(100)
    (story,) = build_stories(spans)
    assert story.downtime_s == pytest.approx(5.0) and story.recovery.wind_down_s == 0.0
    assert (story.deadline_s, story.deadline_assumed) == (30.0, True)
    assert story.notice_at == iso(55) and story.step_at_notice == 24
    text = render_stories([story])
    assert "deadline 30.000 s later (assumed)" in text and "pending" not in text
    assert "the last trained 24" in text and "wind-down 0.000 s + downtime 5.000 s" in text
    assert " -" not in text
    # a record outside the process's life (another process's, a clock off) moves nothing
    late = _killed_then_resumed()
    late[-1]["attributes"][Attr.INTERRUPTION_NOTICE_AT] = iso(61)
    late[-1]["attributes"][Attr.INTERRUPTION_LAST_STEP_AT] = iso(61)
    assert build_goodput(late).downtimes_s == pytest.approx([10.0])


def test_without_the_record_no_part_of_recovery_is_negative():
    """Traces whose restore carries no record of when the process was last seen: its
    end (its last save) is before the notice, so the wind-down is not known and recovery
    is told from the notice, not as a negative wind-down."""
    from ckptprof.report.interruptions import build_stories, render_stories

    spans = _killed_then_resumed(record=False)
    notice = span("ckpt.interruption", 55, 55, 101, "notice1", **{
        Attr.INTERRUPTION_SOURCE: "sigterm", Attr.RUN_ID: "job",
    })  # fmt: skip
    (story,) = build_stories([*spans, notice])
    assert story.downtime_s == pytest.approx(10.0)  # the goodput's: its last record → start
    assert story.recovery.wind_down_s is None
    text = render_stories([story])
    assert " -" not in text
    assert "= notice → start 5.000 s + start-up 2.000 s + RTO 3.000 s" in text


def test_the_resuming_process_logs_the_goodput_the_report_gives_later():
    """The metrics a resuming process logs (``GoodputSoFar``: the earlier processes'
    spans, its own restore not written yet) apply the interruption record its restore
    read, as the report does once that restore is in the traces."""
    from ckptprof.report.goodput import interruption_record

    spans = _killed_then_resumed()
    *earlier, _, restore = spans  # the later process's run and restore: not written yet
    started_ns = (1_800_000_000 + 60) * S  # its start (iso(60))
    record = interruption_record(restore["attributes"])
    live = build_goodput(earlier, resuming=(started_ns, 20), record=record)
    later = build_goodput(spans)
    assert live.total["lost_work"] == pytest.approx(later.total["lost_work"]) == 4.0
    assert live.downtimes_s == pytest.approx(later.downtimes_s) == [5.0]
    unread = build_goodput(earlier, resuming=(started_ns, 20))  # before: its last save's end
    assert unread.downtimes_s == pytest.approx([10.0])
