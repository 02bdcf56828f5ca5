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
from ckptprof.tracing.pieces import MAX_PIECES
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

    from ckptprof.tracing import guest

    guest._warned.clear()  # warn-once memory is per process
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


def test_a_phase_that_ran_in_pieces_is_recorded_as_its_busy_pieces(memory, clock):
    """fetch and deserialize taking turns, file after file: each phase's span runs from its
    first start to its last end, and its ``ckpt.piece`` children are where it was busy."""
    provider, exporter = memory
    tracer = CheckpointTracer(provider)
    with tracer.restore() as op:
        for _ in range(3):
            with op.phase(Phase.FETCH):
                clock.advance(0.01)
            with op.phase(Phase.DESERIALIZE):
                clock.advance(0.02)
        for index in range(100):  # 100 stretches of verify, each gap longer than the last
            with op.phase(Phase.VERIFY):
                clock.advance(0.001)
            clock.advance(0.002 + index * 1e-5)
    spans = exporter.get_finished_spans()
    phases = {s.name: s for s in spans if s.parent and s.name != "ckpt.piece"}
    pieces = {
        name: [
            s for s in spans if s.name == "ckpt.piece" and s.parent.span_id == span.context.span_id
        ]
        for name, span in phases.items()
    }
    fetch = phases["ckpt.fetch"]
    assert (fetch.end_time - fetch.start_time) / 1e9 == pytest.approx(0.07)  # the extent
    assert fetch.attributes[Attr.PIECES] == 3 and Attr.PIECES_CAPPED not in fetch.attributes
    assert [(p.end_time - p.start_time) / 1e9 for p in pieces["ckpt.fetch"]] == pytest.approx(
        [0.01] * 3
    )
    assert {p.attributes[Attr.PIECE_OF] for p in pieces["ckpt.deserialize"]} == {"deserialize"}
    for name in ("ckpt.fetch", "ckpt.deserialize"):
        drawn = sum(p.end_time - p.start_time for p in pieces[name]) / 1e9
        assert drawn == pytest.approx(phases[name].attributes[Attr.BUSY_S])
    # past the cap, the closest stretches are joined (and the span says so); the pieces'
    # own busy time still adds up to the phase's
    verify = phases["ckpt.verify"]
    assert len(pieces["ckpt.verify"]) == verify.attributes[Attr.PIECES] == MAX_PIECES
    assert verify.attributes[Attr.PIECES_CAPPED] is True
    assert verify.attributes[Attr.PIECES_INTERVALS] == 100
    busy = sum(p.attributes[Attr.BUSY_S] for p in pieces["ckpt.verify"])
    assert busy == pytest.approx(verify.attributes[Attr.BUSY_S]) == pytest.approx(0.1)
    widest = max(pieces["ckpt.verify"], key=lambda p: p.end_time - p.start_time)
    assert widest.start_time == verify.start_time  # the first gaps, the shortest, were joined
    assert "ckpt.list" not in phases and len(pieces) == 3  # a phase in one piece has none


def test_time_outside_phases_goes_to_the_function_sampled_there():
    """The samples' rule (tracing/sampling.py): the time between two samples is split,
    the earlier one's function getting half a period at most; a phase's time is never
    named; a gap the sampler could not look into goes to what it found after it."""
    from ckptprof.tracing.sampling import attribute

    ms = 1_000_000
    setup, load = (("setup", "/job/train.py"), 10), (("load", "/fw/io.py"), 20)
    collect = (("free_memory", "/fw/memory.py"), 34)
    samples = [(0, 50 * ms, setup), (50 * ms, 100 * ms, setup), (100 * ms, 150 * ms, load)]
    samples += [(150 * ms, 200 * ms, load), (200 * ms, 500 * ms, collect)]  # blind 300 ms
    attrs = attribute(samples, [(120 * ms, 200 * ms)], 0, 520 * ms)  # a phase 120-200 ms
    named = dict(zip(attrs[Attr.OUTSIDE_FUNCTIONS], attrs[Attr.OUTSIDE_FUNCTION_S], strict=True))
    assert named == pytest.approx(
        {
            # 0-100 ms, then half a period (100-125 ms) less the phase from 120 ms
            "setup (/job/train.py:10)": 0.12,
            # the 300 ms the sampler could not look into, then the 20 ms after the last
            # sample (half a period at most, as between two)
            "free_memory (/fw/memory.py:34)": 0.32,
        }
    )  # load was seen only inside the phase: never named
    assert attrs[Attr.OUTSIDE_S] == pytest.approx(0.44) == attrs[Attr.OUTSIDE_NAMED_S]


def test_the_function_named_is_the_callers_code_not_ckptprofs_nor_plumbing():
    """ckptprof's own frames on top are named as ckptprof, with the code that called
    them, and the standard library's plumbing between (contextlib here) is skipped."""
    import contextlib
    from pathlib import Path

    import ckptprof
    from ckptprof.tracing.sampling import top_function

    ours = {"top_function": top_function, "sys": __import__("sys")}
    source = "def inside():\n    seen.append(top_function(sys._getframe()))\n"
    exec(compile(source, str(Path(ckptprof.__file__).parent / "x.py"), "exec"), ours)
    ours["seen"] = seen = []

    def user_code():
        with contextlib.ExitStack() as stack:
            stack.callback(ours["inside"])  # runs in contextlib's __exit__

    user_code()
    (((name, file), _),) = seen
    assert name == f"ckptprof, called from {user_code.__qualname__}" and file == __file__


def test_no_span_carries_a_urls_secrets_whatever_attribute_or_way_in():
    """Every attribute key the code defines (``Attr``), given a presigned URL with user
    info through every way into a span (the tracer's plain spans, an operation's root,
    phases, files, links, events, progress, the error): the secrets are in no span, and
    the path keeps its scheme, host and object."""
    from opentelemetry.sdk.trace import SpanLimits

    from ckptprof.redact import strip_url_secrets

    exporter = InMemorySpanExporter()
    room = 4096  # every key kept: none dropped for the 128 the SDK keeps by default
    limits = SpanLimits(
        max_attributes=room,
        max_span_attributes=room,
        max_event_attributes=room,
        max_link_attributes=room,
    )
    provider = TracerProvider(span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    keys = [v for k, v in vars(Attr).items() if k.isupper() and isinstance(v, str)]
    assert Attr.PATH in keys and Attr.DEEPSPEED_PATH in keys
    url = "https://me:PASSSECRET@bucket.s3.example/ckpt/step-5.pt?X-Amz-Signature=SIGSECRET"
    attrs = {key: url for key in keys}
    tracer = CheckpointTracer(provider, framework="t", per_file_spans=True)
    with pytest.raises(RuntimeError), tracer.restore(attrs) as op:
        op.set_attributes(attrs)
        with op.phase(Phase.FETCH, **attrs):
            op.add_file(Phase.FETCH, url, 1, 0.1)
        with op.phase(Phase.LIST):
            op.set_phase_attributes(Phase.LIST, **attrs)
            op.add_stall_event("ckpt.stall", attrs)
        op.add_stall_event("ckpt.stall", attrs)
        op.record_progress("test", extra=attrs)
        op.link_to("0" * 31 + "1", "0" * 15 + "1", **attrs)
        raise RuntimeError(f"GET {url} returned 403")
    tracer.start_span("ckpt.run", attrs).end()
    provider.shutdown()
    spans = exporter.get_finished_spans()
    assert {"ckpt.restore", "ckpt.fetch", "ckpt.list", "ckpt.progress", "ckpt.run"} <= {
        s.name for s in spans
    }
    written = "".join(s.to_json() for s in spans)
    assert "PASSSECRET" not in written and "SIGSECRET" not in written
    assert by_name(exporter)["ckpt.restore"].attributes[Attr.PATH] == strip_url_secrets(url)
    assert strip_url_secrets(url) == "https://bucket.s3.example/ckpt/step-5.pt"


def test_local_paths_are_kept_as_they_are():
    from ckptprof.redact import strip_url_secrets

    kept = ("/data/run?1/ckpt@5", "ckpt/step-100", "s3://bucket/key@v2", "s3://b/a#b/c")
    for path in kept:
        assert strip_url_secrets(path) == path
    assert strip_url_secrets("memory://u:p@b/c") == "memory://b/c"


def test_no_log_line_carries_a_urls_secrets(caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        logging.getLogger("ckptprof").warning("could not read %s", "http://h/o?X-Amz-Signature=S1")
    assert caplog.records and "S1" not in caplog.records[0].getMessage()
    assert "http://h/o" in caplog.records[0].getMessage()
