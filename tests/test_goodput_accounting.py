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
