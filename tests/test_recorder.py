"""The one recording API: phase spans, overlap, aggregation, guest behaviour."""

from __future__ import annotations

import threading
import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckptprof import CheckpointTracer, Phase
from ckptprof.phases import Attr
from ckptprof.tracing import recorder as recorder_module
from tests.test_report import Clock  # the recorder's fake clock


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(recorder_module, "time", fake)
    return fake


@pytest.fixture
def memory():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def by_name(exporter):
    return {s.name: s for s in exporter.get_finished_spans()}


def test_restore_root_and_phase_children(memory):
    provider, exporter = memory
    tracer = CheckpointTracer(provider, framework="lightning", run_id="r1")
    with tracer.restore({Attr.FORMAT: "torch", Attr.RANK: 0}) as op:
        with op.phase(Phase.LIST):
            time.sleep(0.01)
        with op.phase(Phase.FETCH):
            op.add_file(Phase.FETCH, "a.pt", 100, 0.5)
            op.add_file(Phase.FETCH, "b.pt", 300, 0.1)
            op.add_file(Phase.FETCH, "c.pt", 50, 0.2)
    spans = by_name(exporter)
    root = spans["ckpt.restore"]
    assert root.attributes[Attr.FRAMEWORK] == "lightning"
    assert root.attributes[Attr.RUN_ID] == "r1"
    assert root.attributes[Attr.FORMAT] == "torch"
    fetch = spans["ckpt.fetch"]
    assert fetch.parent.span_id == root.context.span_id
    assert fetch.attributes[Attr.BYTES] == 450
    assert fetch.attributes[Attr.FILES] == 3
    assert fetch.attributes[Attr.FILE_LATENCY_MIN_S] == pytest.approx(0.1)
    assert fetch.attributes[Attr.FILE_LATENCY_MEDIAN_S] == pytest.approx(0.2)
    assert fetch.attributes[Attr.FILE_LATENCY_MAX_S] == pytest.approx(0.5)
    assert spans["ckpt.list"].attributes[Attr.BUSY_S] >= 0.01
    assert root.attributes[Attr.WALL_S] >= root.attributes[Attr.PHASE_SUM_S] - 1e-6
    assert "ckpt.file" not in spans  # per-file spans are opt-in


def test_overlapping_phases_keep_real_intervals(memory, clock):
    """fetch of file 2 while file 1 deserializes: sum of phases exceeds wall time."""
    provider, exporter = memory
    tracer = CheckpointTracer(provider)
    fetching, release = threading.Event(), threading.Event()
    with tracer.restore() as op:  # t = 0

        def fetch_worker():
            with op.phase(Phase.FETCH):  # 0 .. 0.2, from another thread
                fetching.set()
                release.wait(30)

        worker = threading.Thread(target=fetch_worker)
        worker.start()
        assert fetching.wait(30)  # the fetch is under way (an event, not a sleep)
        clock.advance(0.05)
        with op.phase(Phase.DESERIALIZE):  # 0.05 .. 0.25
            clock.advance(0.15)
            release.set()
            worker.join(30)
            assert not worker.is_alive()
            clock.advance(0.05)
    summary = op.summary
    assert summary.phase_sum_s > summary.wall_s  # they overlapped
    assert summary.wall_s == pytest.approx(0.25) and summary.phase_sum_s == pytest.approx(0.4)
    spans = by_name(exporter)
    fetch, deser = spans["ckpt.fetch"], spans["ckpt.deserialize"]
    assert deser.start_time < fetch.end_time  # intervals overlap in the trace too
    assert fetch.attributes[Attr.BUSY_S] == pytest.approx(0.2)
    assert deser.attributes[Attr.BUSY_S] == pytest.approx(0.2)


def test_reentered_phase_busy_is_union_not_span(memory, clock):
    provider, exporter = memory
    tracer = CheckpointTracer(provider)
    with tracer.restore() as op:
        with op.phase(Phase.FETCH):
            clock.advance(0.05)
        clock.advance(0.1)  # between the two entries: in the phase's span, not its busy time
        with op.phase(Phase.FETCH):
            clock.advance(0.05)
    fetch = by_name(exporter)["ckpt.fetch"]
    span_s = (fetch.end_time - fetch.start_time) / 1e9
    assert span_s == pytest.approx(0.2)
    assert fetch.attributes[Attr.BUSY_S] == pytest.approx(0.1)


def test_per_file_spans_when_asked(memory):
    provider, exporter = memory
    tracer = CheckpointTracer(provider, per_file_spans=True)
    with tracer.restore() as op, op.phase(Phase.FETCH):
        op.add_file(Phase.FETCH, "x", 1, 0.01, time.time_ns())
    files = [s for s in exporter.get_finished_spans() if s.name == "ckpt.file"]
    assert len(files) == 1 and files[0].attributes[Attr.PATH] == "x"


def test_host_exception_recorded_and_reraised_unchanged(memory):
    provider, exporter = memory
    tracer = CheckpointTracer(provider)
    error = ValueError("bad checkpoint")
    with pytest.raises(ValueError) as caught, tracer.restore() as op, op.phase(Phase.FETCH):
        raise error
    assert caught.value is error
    root = by_name(exporter)["ckpt.restore"]
    assert root.status.status_code.name == "ERROR"
    assert any(e.name == "exception" for e in root.events)


def test_internal_error_is_swallowed_and_logged_once(memory, caplog):
    provider, _ = memory

    class BrokenTracer:
        def start_span(self, *a, **k):
            raise RuntimeError("exporter bug")

    from ckptprof.tracing import recorder

    recorder._warned.clear()  # warn-once memory is per process
    tracer = CheckpointTracer(provider)
    tracer._tracer = BrokenTracer()
    for _ in range(3):
        with tracer.save() as op, op.phase(Phase.WRITE):
            pass  # the host code runs normally
    assert op.summary.kind == "save"  # the caller still gets its summary
    messages = [r.message for r in caplog.records if "internal error" in r.message]
    assert len(messages) == 1


def test_finish_is_idempotent_and_one_line_summary(memory):
    provider, exporter = memory
    op = CheckpointTracer(provider).restore()
    with op.phase(Phase.DESERIALIZE):
        time.sleep(0.01)
    first = op.finish()
    assert op.finish() is first
    assert len([s for s in exporter.get_finished_spans() if s.name == "ckpt.restore"]) == 1
    line = first.one_line()
    assert line.startswith("ckptprof: RTO ") and "largest phase deserialize" in line
