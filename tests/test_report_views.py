"""What people open: ``ckptprof report --html`` rendered in a real headless Chromium (no
network allowed) and read back from its DOM; ``ckptprof export`` as a Perfetto trace
parsed back with the protobuf classes the ``perfetto`` package ships, and as OTLP JSON
replayed into a real OTLP/HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import json
import re
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
    assert "to state" in phases  # a restore whose first step ran: headed by its time to state
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


# ------------------------------------------ what ranks a bar is what it draws and says
def stepped(doc: dict, first_step_s: float, later_s: float = 0.0) -> dict:
    """``doc`` with every run's first step taking ``first_step_s`` and its fetch (so its
    time to state) ``later_s`` longer: its RTO moves by both (the runner's summary, of
    the runs before, left out: the report reads the runs)."""
    out = json.loads(json.dumps(doc))
    out.pop("summary")
    for run in out["runs"]:
        step = run["phases"]["first_step"]
        run["wall_s"] += first_step_s - step["busy_s"] + later_s
        step["busy_s"] = first_step_s
        run["phases"]["fetch"]["busy_s"] += later_s
    return out


@pytest.fixture
def crossed(tmp_path) -> tuple[Path, Path]:
    """Two sweeps whose order flips with the figure: "step" reads fast (time to state
    4.1 / 1.5 / 0.5 s at cold c=1 / cold c=16 / hot c=16) but steps for 3 s (RTO 7.1 /
    4.5 / 3.5 s); "read" reads 1.5 s slower (5.6 / 3.0 / 2.0 s) and steps for 0.1 s
    (RTO 5.7 / 3.1 / 2.1 s)."""
    from tests.test_report import results_doc, write_results

    return (write_results(tmp_path / "step", stepped(results_doc(), 3.0)),
            write_results(tmp_path / "read", stepped(results_doc(), 0.1, 1.5)))  # fmt: skip


STEP_TTS = [(4.1, 3.9, 4.3), (1.5, 1.4, 1.6), (0.5, 0.5, 0.5)]  # median, min, max
READ_TTS = [(5.6, 5.4, 5.8), (3.0, 2.9, 3.1), (2.0, 2.0, 2.0)]
STEP_RTO, READ_RTO = [7.1, 4.5, 3.5], [5.7, 3.1, 2.1]
BY_TTS_RTO = [7.1, 5.7, 4.5, 3.1, 3.5, 2.1]  # the RTOs, step then read in each setting
BY_RTO = [5.7, 7.1, 3.1, 4.5, 2.1, 3.5]  # read then step
SETTINGS = ["cold c=1", "cold c=16", "hot c=16"]


def label(spread: tuple[float, float, float], word: str = "to state") -> str:
    median, low, high = spread
    return f"{word} {median:.3f} s" + (f" ({low:.3f}–{high:.3f})" if high > low else "")


def test_compare_plot_draws_and_labels_what_ranks_it(crossed):
    """compare ranks a synthetic restore by its time to state: the bars come in that
    order, each tick, min–max line and first label is that figure, the RTO a diamond and
    a second line beside it; --by rto ranks, draws and labels the RTO alone."""
    from ckptprof.report.compare import compare
    from ckptprof.report.compare_text import render_text
    from ckptprof.report.plot import compare_figure
    from tests.test_report import assert_stacked, bar_chart

    step, read = map(str, crossed)
    comparison = compare([step, read], ["step", "read"])
    bars = bar_chart(compare_figure(comparison).axes[0])
    assert bars["title"].endswith("fastest first within each setting by time to state")
    # by time to state "step" (the base) is first everywhere, though its RTO is longer
    assert bars["labels"] == [f"{s}: {who}" for s in SETTINGS for who in ("step (base)", "read")]
    tts = [x for pair in zip(STEP_TTS, READ_TTS, strict=True) for x in pair]
    assert bars["ranked"] == pytest.approx([m for m, _, _ in tts])
    assert bars["spread"] == [pytest.approx((lo, hi)) for _, lo, hi in tts if hi > lo]
    assert bars["rto"] == pytest.approx(BY_TTS_RTO)
    notes = [n.splitlines() for n in bars["notes"]]
    assert [n[0] for n in notes] == [label(x) for x in tts]
    assert [n[1] for n in notes] == [f"RTO {x:.3f} s" for x in BY_TTS_RTO]
    assert_stacked(bars)
    for i in range(0, 6, 2):  # within a setting: what is drawn first is the smaller
        assert bars["ranked"][i] < bars["ranked"][i + 1]
    text = render_text(comparison)  # the text's ranked rows: the same order and figures
    for setting, mine, theirs in zip(SETTINGS, STEP_TTS, READ_TTS, strict=True):
        block = text.split(f"\n{setting}\n")[1].split("\n\n")[0].splitlines()
        assert "step (base)" in block[1] and f"{mine[0]:.3f}" in block[1], block
        assert "read" in block[2] and f"{theirs[0]:.3f}" in block[2], block
    by_rto = bar_chart(compare_figure(compare([step, read], ["step", "read"], by="rto")).axes[0])
    assert by_rto["title"].endswith("by RTO")
    assert by_rto["labels"] == [f"{s}: {who}" for s in SETTINGS for who in ("read", "step (base)")]
    assert by_rto["ranked"] == pytest.approx(BY_RTO)
    assert by_rto["rto"] == [None] * 6  # the RTO is what is drawn: nothing beside it
    assert [n.split(" s")[0] for n in by_rto["notes"]] == [f"RTO {x:.3f}" for x in BY_RTO]


def test_report_plot_heads_each_bar_with_its_time_to_state(crossed, tmp_path):
    """report --plot: each synthetic restore's bar is drawn and labelled with the time to
    state and its min–max (the text report's first column), the RTO beside it."""
    from ckptprof.report.aggregate import aggregate
    from ckptprof.report.load import load
    from ckptprof.report.plot import summary_figure
    from tests.test_report import bar_chart

    report = aggregate(load([str(p) for p in crossed]))
    bars = bar_chart(summary_figure(report).axes[0])
    assert bars["labels"] == [f"{who}: {s}" for who in ("step", "read") for s in SETTINGS]
    assert bars["ranked"] == pytest.approx([m for m, _, _ in STEP_TTS + READ_TTS])
    assert bars["rto"] == pytest.approx(STEP_RTO + READ_RTO)
    assert [n.splitlines()[0] for n in bars["notes"]] == [label(x) for x in STEP_TTS + READ_TTS]
    assert [n.splitlines()[1] for n in bars["notes"]] == [
        f"RTO {x:.3f} s" for x in STEP_RTO + READ_RTO
    ]
    states = [r.breakdown.state_s for sweep in report.sweeps for r in sweep.rows]
    assert states == [pytest.approx(x) for x in STEP_TTS + READ_TTS]  # what the text heads


def test_the_html_chart_draws_and_labels_the_time_to_state(crossed, browser, tmp_path):
    """The page's phase chart, read back in Chromium: each bar's first label is the
    figure its table row heads with (to state, min–max), its black tick lies at that
    figure, left of the RTO's diamond; hot c=16's ticks stand in time-to-state order
    ("step" left of "read") while their diamonds stand in RTO order (the other way)."""
    target = tmp_path / "crossed.html"
    done = run_cli("report", *(str(p) for p in crossed), "--html", str(target))
    assert done.returncode == 0, done.stderr
    page, problems = open_page(browser, target)
    assert problems == []
    svg = page.locator('figure[data-chart="phases"] svg')
    texts = [t.strip() for t in svg.locator("text").all_text_contents()]
    firsts = [t for t in texts if t.startswith("to state ")]
    assert firsts == [label(x) for x in STEP_TTS + READ_TTS]
    assert [t for t in texts if t.startswith("RTO ")] == [
        f"RTO {x:.3f} s" for x in STEP_RTO + READ_RTO
    ]
    tables = page.locator("h3:has-text('Cold vs hot') + table")
    cells = []
    for t in range(tables.count()):
        heads = tables.nth(t).locator("thead th").all_text_contents()
        column = heads.index("to state s (min–max)")
        rows = tables.nth(t).locator("tbody tr")
        cells += [rows.nth(i).locator("td").nth(column).text_content() for i in range(rows.count())]
    shown = [tuple(float(v) for v in re.findall(r"\d+\.\d+", c)) for c in cells]
    assert shown == [pytest.approx(x) for x in STEP_TTS + READ_TTS]  # the labels' figures

    def x(selector: str) -> float:
        box = svg.locator(selector).bounding_box()
        assert box is not None, selector
        return box["x"] + box["width"] / 2

    for i in range(6):
        assert x(f"#ranked-{i} path") < x(f"#rto-{i} use"), i
    assert x("#ranked-2 path") < x("#ranked-5 path")  # hot c=16: 0.5 s before 2.0 s
    assert x("#rto-2 use") > x("#rto-5 use")  # while its RTO is 3.5 s against 2.1 s
    caption = page.locator('figure[data-chart="phases"] figcaption').text_content()
    assert "the time to state" in caption and "the RTO, first step included" in caption
    page.close()


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
