"""What people open: ``ckptprof report --html`` rendered in a real headless Chromium (no
network allowed) and read back from its DOM; ``ckptprof export`` as a Perfetto trace
parsed back with the protobuf classes the ``perfetto`` package ships, and as OTLP JSON
replayed into a real OTLP/HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import LOOPBACK_ENV, TINY_SCALE, run_cli, spans_in
from tests.test_bad_input import assert_one_line_error
from tests.test_export import collector, refused_port

pytestmark = pytest.mark.slow  # real jobs in fresh processes

SWEEP = ["--concurrency", "1,4", "--repeat", "2", "--ceiling-gbps", "1", "--no-report"]


@pytest.fixture(scope="module")
def runs(checkpoints, tmp_path_factory):
    """A cold/hot sweep with per-file reads, an interrupted run, and a 2-rank job."""
    ckpt = str(checkpoints("safetensors", ranks=2))
    root = tmp_path_factory.mktemp("html")
    made = {
        "sweep": ["--cache", "cold,hot", *SWEEP, "--per-file-spans", "--world-size", "1"],
        "interrupted": ["--cache", "hot", "--concurrency", "1", "--repeat", "1",
                        "--simulate-interruption", "--no-report", "--world-size", "1"],
        "job": ["--cache", "cold", "--concurrency", "2", "--repeat", "1", "--no-report",
                "--ceiling-gbps", "1", "--nproc-per-node", "2"],
    }  # fmt: skip
    for name, flags in made.items():
        done = run_cli("synth", "restore", ckpt, "--out", str(root / name), *flags,
                       env=LOOPBACK_ENV, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    return root


def open_page(browser, path):
    """Load ``path``; fail on any request that leaves the file, or any console error."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))

    def only_the_file(route):
        if route.request.url == path.as_uri():
            route.continue_()
        else:
            problems.append(f"fetched {route.request.url}")
            route.abort()

    page.route("**/*", only_the_file)
    page.goto(path.as_uri())
    return page, problems


def chart(page, name: str) -> dict:
    box = page.locator(f'figure[data-chart="{name}"] svg').bounding_box()
    assert box is not None, f"no {name} chart"
    text = page.locator(f'figure[data-chart="{name}"] svg').text_content()
    return {"width": box["width"], "height": box["height"], "text": text}


def test_one_page_opens_offline_with_every_chart(runs, browser, tmp_path):
    target = tmp_path / "report.html"
    done = run_cli("report", *(str(runs / n) for n in ("sweep", "interrupted", "job")),
                   "--html", str(target))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"HTML report written to {target}" in done.stderr
    page, problems = open_page(browser, target)
    assert problems == []
    for name in ("phases", "concurrency", "timeline", "ranks"):
        drawn = chart(page, name)
        assert drawn["width"] > 300 and drawn["height"] > 100, name
    phases = chart(page, "phases")["text"]
    for phase in ("list", "fetch", "verify", "deserialize", "reshard", "first_step"):
        assert phase in phases
    assert "min–max" in phases  # the repeats' spread is drawn
    assert "ceiling 1.00 GB/s" in chart(page, "concurrency")["text"]
    timeline = chart(page, "timeline")["text"]
    assert "restore" in timeline and "fetch 0" in timeline  # per-file reads on lanes
    assert "rank 1" in chart(page, "ranks")["text"]
    # the storages side by side first: one row per source, by its folder's name
    sources = ["sweep", "interrupted", "job"]
    storage = page.locator('table[data-view="storage"] tbody tr')
    assert [storage.nth(i).locator("td").first.text_content()
            for i in range(storage.count())] == sources  # fmt: skip
    assert page.locator("h2").first.text_content() == "Storages side by side"
    # every results row and every hint names its source
    sweep = page.locator("h3:has-text('Cold vs hot') + table").first.locator("tbody tr")
    cells = [sweep.nth(i).locator("td") for i in range(sweep.count())]
    assert {c.nth(0).text_content() for c in cells} == {"sweep"}
    assert {c.nth(2).text_content() for c in cells} == {"cold", "hot"}
    hints = page.locator(".hint")
    assert hints.count() > 0
    for i in range(hints.count()):
        assert hints.nth(i).locator(".source").text_content() in sources
    assert "its phases, each drawn where it was busy, then each file read" in page.locator(
        'figure[data-chart="timeline"] figcaption').text_content()  # fmt: skip
    body = page.locator("body").text_content()
    assert "Interruptions" in body and "simulated notice" in body and "steps lost: 0" in body
    assert "Environment" in body and "storage posix" in body
    assert "What to look at" in body  # the hints, once, at the top
    assert not page.locator("details pre").first.is_visible()  # the terminal dump: collapsed
    page.close()


def test_html_of_a_missing_folder_is_one_clear_error(runs, tmp_path):
    target = tmp_path / "nowhere" / "report.html"
    done = run_cli("report", str(runs / "sweep"), "--html", str(target))
    assert_one_line_error(done, f"--html: {target}: folder {target.parent} does not exist")


# ---------------------------------------------------------------------- export
def all_spans(runs) -> list[dict]:
    return spans_in(runs / "sweep" / "traces") + spans_in(runs / "job" / "traces")


def test_perfetto_trace_has_ranks_as_processes_and_reads_as_threads(runs, tmp_path):
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    target = tmp_path / "restore.perfetto-trace"
    done = run_cli("export", "--format", "perfetto", str(runs / "sweep" / "traces"),
                   str(runs / "job" / "traces"), "-o", str(target))  # fmt: skip
    assert done.returncode == 0, done.stderr
    trace = Trace.FromString(target.read_bytes())
    processes, threads, open_at, slices = {}, {}, {}, []
    for packet in trace.packet:
        if packet.HasField("track_descriptor"):
            d = packet.track_descriptor
            if d.HasField("process"):
                processes[d.uuid] = d.process.process_name
            else:
                assert d.parent_uuid in processes  # a thread of a process declared before
                threads[d.uuid] = d.thread.thread_name
            continue
        event = packet.track_event
        assert event.track_uuid in threads  # declared before its first event
        if event.type == TrackEvent.TYPE_SLICE_BEGIN:
            assert event.track_uuid not in open_at  # slices on one thread never overlap
            open_at[event.track_uuid] = (packet.timestamp, event)
        else:
            assert event.type == TrackEvent.TYPE_SLICE_END
            start, begin = open_at.pop(event.track_uuid)
            assert packet.timestamp >= start
            slices.append((threads[event.track_uuid], begin))
    assert not open_at
    ranks = sorted(name.split(" (")[0] for name in processes.values())
    assert ranks == ["rank 0", "rank 1"]
    names = set(threads.values())
    assert {"operation", "phase fetch", "phase reshard", "fetch reads"} <= names
    roots = [s for s in all_spans(runs) if s["name"] == "ckpt.restore"]
    operations = [begin for thread, begin in slices if thread.startswith("operation")]
    assert len(operations) == len(roots)
    reads = [begin for thread, begin in slices if thread.startswith("fetch reads")]
    sweep = spans_in(runs / "sweep" / "traces")
    fetches = {s["context"]["span_id"] for s in sweep if s["name"] == "ckpt.fetch"}
    fetched = [s for s in sweep if s["name"] == "ckpt.file" and s["parent_id"] in fetches]
    doc = json.loads((runs / "sweep" / "results.json").read_text())
    manifest = json.loads((Path(doc["location"]) / "ckptprof-manifest.json").read_text())
    # every file of every run's fetch, one slice each
    assert len(reads) == len(fetched) == len(doc["runs"]) * len(manifest["files"])

    def read(slice_):
        notes = {a.name: a for a in slice_.debug_annotations}
        return slice_.name, notes["ckpt.path"].string_value, notes["ckpt.bytes"].int_value

    assert sorted(map(read, reads)) == sorted(
        (f["attributes"]["ckpt.path"],) * 2 + (f["attributes"]["ckpt.bytes"],) for f in fetched
    )


def test_otlp_json_lines_replay_into_a_backend_span_for_span(runs, tmp_path, monkeypatch):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    traces = runs / "sweep" / "traces"
    target = tmp_path / "spans.otlp.jsonl"
    done = run_cli("export", "--format", "otlp-json", str(traces), "-o", str(target))
    assert done.returncode == 0, done.stderr
    lines = target.read_text().splitlines()
    original = {s["context"]["span_id"].removeprefix("0x"): s for s in spans_in(traces)}
    written = [span for line in lines for rs in json.loads(line)["resourceSpans"]
               for scope in rs["scopeSpans"] for span in scope["spans"]]  # fmt: skip
    assert {s["spanId"] for s in written} == set(original)
    first = next(s for s in written if s.get("parentSpanId"))
    source = original[first["spanId"]]
    assert first["parentSpanId"] == source["parent_id"].removeprefix("0x")
    assert len(first["traceId"]) == 32 and first["name"] == source["name"]
    for replayed in (target, traces):  # OTLP JSON lines, or the trace files themselves
        with collector() as (endpoint, received):
            sent = run_cli("export", "--otlp", str(replayed),
                           env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        requests = len({body for _, body in received})
        word = "request" if requests == 1 else "requests"
        assert f"sent {len(original)} spans in {requests} {word}" in sent.stderr
        got = {}
        for content_type, body in received:
            assert content_type == "application/x-protobuf"
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
                for scope in rs.scope_spans:
                    got.update({span.span_id.hex(): span for span in scope.spans})
        assert set(got) == set(original)
        span = got[first["spanId"]]
        assert span.parent_span_id.hex() == first["parentSpanId"] and span.name == first["name"]
        assert {a.key for a in span.attributes} == set(original[first["spanId"]]["attributes"])


def test_a_refused_or_unanswered_replay_is_one_line_naming_the_endpoint(runs):
    traces = str(runs / "sweep" / "traces")
    said = json.dumps({"message": "Missing header x-mlflow-experiment-id"}).encode()
    with collector(422, said) as (endpoint, _):
        refused = run_cli("export", "--otlp", traces, env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    assert_one_line_error(refused, f"{endpoint}/v1/traces refused the spans (HTTP 422: "
                          "Missing header x-mlflow-experiment-id)")  # fmt: skip
    with refused_port() as port:  # held while the export tries it: nobody else's
        closed = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": closed, "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}
        gone = run_cli("export", "--otlp", traces, env=env)
    assert_one_line_error(gone, f"no answer from {closed}/v1/traces within 2 s")
    assert time.monotonic() - started < 30


def test_export_without_a_format_or_file_is_one_clear_error(runs, tmp_path):
    traces = str(runs / "sweep" / "traces")
    assert_one_line_error(run_cli("export", traces), "give either --format")
    assert_one_line_error(
        run_cli("export", "--format", "perfetto", traces), "name the file to write with -o"
    )
    missing = tmp_path / "nowhere" / "t.pftrace"
    assert_one_line_error(
        run_cli("export", "--format", "perfetto", traces, "-o", str(missing)),
        f"folder {missing.parent} does not exist",
    )


def test_a_second_run_into_the_same_out_is_reported_alone(checkpoints, tmp_path):
    """``--out`` reused (the second save of another checkpoint, a second restore sweep):
    the folder reports what its save.json or results.json holds, as the file itself does,
    and the HTML timeline is of one of those runs; the first run's traces are left out
    in words, never deleted."""
    from ckptprof.cli import main

    save = tmp_path / "save"
    for dest, repeat in ((tmp_path / "a", "2"), (tmp_path / "b", "1")):
        assert main(["synth", "save", str(dest), "--scale", str(TINY_SCALE), "--repeat", repeat,
                     "--ceiling-gbps", "1", "--out", str(save)]) == 0  # fmt: skip
    assert len(list((save / "traces").glob("*.jsonl"))) == 2  # nothing deleted
    by_folder = json.loads(run_cli("report", str(save), "--format", "json").stdout)
    by_file = json.loads(run_cli("report", str(save / "save.json"), "--format", "json").stdout)
    for doc in (by_folder, by_file):
        [group] = doc["groups"]
        assert group["breakdown"]["repeats"] == 1
    assert by_folder["groups"][0]["breakdown"]["wall_median_s"] == pytest.approx(
        by_file["groups"][0]["breakdown"]["wall_median_s"], rel=1e-5
    )
    shown = run_cli("report", str(save))
    assert "1 trace file(s) of an earlier run" in shown.stderr
    out, ckpt = tmp_path / "restore", checkpoints("torch")
    for strategy in ("pipelined", "staged"):
        assert main(["synth", "restore", str(ckpt), "--strategy", strategy, "--cache", "hot",
                     "--concurrency", "1", "--repeat", "1", "--no-first-step", "--ceiling-gbps",
                     "1", "--no-report", "--out", str(out)]) == 0  # fmt: skip
    page = tmp_path / "page.html"
    assert run_cli("report", str(out), "--html", str(page)).returncode == 0
    timeline = page.read_text().split("Timeline of one restore:")[1][:200]
    assert "staged" in timeline and "pipelined" not in timeline, timeline
