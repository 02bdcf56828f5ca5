"""Export: the trace file always, OTLP when the OTEL_* variables ask, never hurting the caller."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from ckptprof import CheckpointTracer, Phase
from ckptprof.tracing.export import setup_telemetry
from tests.conftest import read_spans, run_cli


def record_one_restore(telemetry):
    tracer = CheckpointTracer(telemetry.provider, framework="synthetic", run_id=telemetry.run_id)
    with tracer.restore({"ckpt.format": "torch"}) as op:
        with op.phase(Phase.LIST):
            pass
        with op.phase(Phase.FETCH):
            op.add_file(Phase.FETCH, "a", 10, 0.001)
    return op


@contextlib.contextmanager
def refused_port():
    """A port on 127.0.0.1 where connections are refused: bound, never listening, and held
    for the block, so no other process can take it meanwhile (a port picked, closed and
    named later could be anyone's by then)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def wait_for(predicate, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def shutdown_bound_s(otlp_timeout_s: float) -> float:
    """The longest ``Telemetry.shutdown`` may wait: the sum of its bounded waits (the
    collector's is its request timeout and a margin)."""
    from ckptprof.tracing.export import (
        FILE_FLUSH_TIMEOUT_S,
        NETWORK_FLUSH_MARGIN_S,
        PROVIDER_SHUTDOWN_TIMEOUT_S,
    )

    return (
        FILE_FLUSH_TIMEOUT_S + otlp_timeout_s + NETWORK_FLUSH_MARGIN_S + PROVIDER_SHUTDOWN_TIMEOUT_S
    )


@pytest.fixture
def clean_otel_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_trace_file_is_one_sdk_span_json_per_line(tmp_path, clean_otel_env):
    telemetry = setup_telemetry(tmp_path)
    record_one_restore(telemetry)
    telemetry.shutdown()
    lines = telemetry.trace_file.read_text().splitlines()
    assert len(lines) == 3 and all(line.startswith("{") for line in lines)
    spans = read_spans(telemetry.trace_file)
    names = {s["name"] for s in spans}
    assert names == {"ckpt.restore", "ckpt.list", "ckpt.fetch"}
    root = next(s for s in spans if s["name"] == "ckpt.restore")
    assert root["parent_id"] is None
    assert root["attributes"]["ckpt.run_id"] == telemetry.run_id
    assert root["resource"]["attributes"]["service.name"] == "ckptprof"
    assert "host.name" in root["resource"]["attributes"]
    children = [s for s in spans if s["parent_id"]]
    assert {c["parent_id"] for c in children} == {root["context"]["span_id"]}


def test_trace_dir_from_env_and_service_name(tmp_path, clean_otel_env):
    clean_otel_env.setenv("CKPTPROF_TRACE_DIR", str(tmp_path / "from-env"))
    clean_otel_env.setenv("OTEL_SERVICE_NAME", "llm-pretrain")
    telemetry = setup_telemetry()
    record_one_restore(telemetry)
    telemetry.shutdown()
    assert telemetry.trace_file.parent == tmp_path / "from-env"
    spans = read_spans(telemetry.trace_file)
    assert spans[0]["resource"]["attributes"]["service.name"] == "llm-pretrain"


def test_unwritable_trace_dir_is_one_warning(tmp_path, clean_otel_env, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    telemetry = setup_telemetry(blocker / "traces")
    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        for _ in range(3):
            op = record_one_restore(telemetry)
            assert op.summary is not None  # the caller got its result
        telemetry.shutdown()
    warnings = [r for r in caplog.records if "cannot write the trace file" in r.message]
    assert len(warnings) == 1
    assert "CKPTPROF_TRACE_DIR" in warnings[0].message


def test_unreachable_collector_is_one_warning_and_no_hang(tmp_path, clean_otel_env, caplog):
    clean_otel_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")  # the test's request timeout
    with refused_port() as port:
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        telemetry = setup_telemetry(tmp_path)
        assert telemetry.network_processor is not None
        assert telemetry.network_exporter.timeout_s == 2.0
        with caplog.at_level(logging.WARNING):
            for _ in range(5):
                record_one_restore(telemetry)  # (never waits: see the next test)
            started = time.monotonic()
            telemetry.shutdown()
            shutdown_s = time.monotonic() - started
    # shutdown gives up after a bounded wait: its waits' sum, and scheduling slack
    assert shutdown_s < shutdown_bound_s(2.0) + 5.0
    ours = [r for r in caplog.records if r.name == "ckptprof" and "could not export" in r.message]
    sdk = [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
    assert len(ours) == 1 and not sdk
    assert len(read_spans(telemetry.trace_file)) == 15  # the local file still has everything


@contextlib.contextmanager
def collector(status: int = 200, answer: bytes = b"", hold: threading.Event | None = None):
    """A real OTLP/HTTP receiver on 127.0.0.1: yields its endpoint and the bodies it got,
    answering every request with ``status`` and ``answer`` (with ``hold``: only once
    ``hold`` is set; a request's body is in ``received`` as soon as it arrived)."""
    received: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.headers.get("Content-Type", ""), body))
            if hold is not None:
                hold.wait(120)
            self.send_response(status)
            self.send_header(
                "Content-Type", "application/json" if answer else "application/x-protobuf"
            )
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", received
    finally:
        if hold is not None:
            hold.set()  # a held request ends, so the server can stop
        server.shutdown()


def received_spans(bodies) -> list:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    spans = []
    for _, body in bodies:
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                spans.extend(ss.spans)
    return spans


def span_names(bodies) -> set[str]:
    return {span.name for span in received_spans(bodies)}


def test_otlp_export_reaches_a_collector(tmp_path, clean_otel_env):
    with collector() as (endpoint, received):
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        telemetry = setup_telemetry(tmp_path)
        record_one_restore(telemetry)
        telemetry.shutdown()
    assert span_names(received) == {"ckpt.restore", "ckpt.list", "ckpt.fetch"}


def test_recording_never_waits_on_the_collector(tmp_path, clean_otel_env):
    """Export runs on the SDK's background thread: while the collector holds a batch
    unanswered, restores are still recorded and returned to the caller; once it answers,
    every span reaches it."""
    clean_otel_env.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")  # the first batch goes at once
    clean_otel_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "120")  # the hold never times out
    hold = threading.Event()
    with collector(hold=hold) as (endpoint, received):
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        telemetry = setup_telemetry(tmp_path)
        exporter = telemetry.network_exporter
        finished: list[int] = []
        export = exporter.export

        def counted(spans):
            try:
                return export(spans)
            finally:
                finished.append(len(spans))

        exporter.export = counted  # the processor's thread calls it on this instance
        returned: list = []

        def record(n: int) -> threading.Thread:
            # on a thread of its own, so that a recording that waited on the collector
            # fails the test at the join's deadline instead of hanging it
            def run() -> None:
                returned.extend(record_one_restore(telemetry).summary for _ in range(n))

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            return thread

        first = record(1)
        assert wait_for(lambda: received)  # the first batch is at the collector, held
        first.join(60)
        rest = record(5)
        rest.join(60)
        assert not first.is_alive() and not rest.is_alive()  # recording returned...
        assert len(returned) == 6 and all(summary is not None for summary in returned)
        assert finished == []  # ...and no export has ended: recording did not wait on it
        hold.set()
        telemetry.shutdown()
    assert len(received_spans(received)) == 18 and sum(finished) == 18  # nothing lost
    assert len(read_spans(telemetry.trace_file)) == 18


def _status(message: str) -> bytes:
    from google.rpc import status_pb2

    return status_pb2.Status(code=3, message=message).SerializeToString()


#: refusals as real backends send them (the tests used a made-up body)
REFUSALS = {
    # MLflow 3's OTLP endpoint (FastAPI): a list of validation errors under "detail"
    "mlflow3": (
        422,
        json.dumps(
            {
                "detail": [
                    {
                        "type": "missing",
                        "loc": ["header", "x-mlflow-experiment-id"],
                        "msg": "Field required",
                        "input": None,
                    }
                ]
            }
        ).encode(),
        "header x-mlflow-experiment-id: Field required",
    ),  # fmt: skip
    # MLflow's REST errors
    "mlflow-rest": (
        400,
        json.dumps(
            {
                "error_code": "INVALID_PARAMETER_VALUE",
                "message": "Missing value for required parameter",
            }
        ).encode(),
        "Missing value for required parameter",
    ),  # fmt: skip
    # an OpenTelemetry Collector's OTLP/HTTP receiver: a google.rpc.Status in protobuf
    "otel-collector": (400, _status("proto: illegal wireType 7"), "proto: illegal wireType 7"),
    # Honeycomb-style JSON error, and a plain-text proxy page
    "honeycomb": (
        401,
        b'{"error":"unknown API key - check your credentials"}',
        "unknown API key - check your credentials",
    ),  # fmt: skip
    "plain": (404, b"404 page not found\n", "404 page not found"),
}


@pytest.mark.parametrize("backend", sorted(REFUSALS))
def test_a_refused_batch_shows_the_backends_reason(tmp_path, clean_otel_env, caplog, backend):
    status, body, reason = REFUSALS[backend]
    with collector(status, body) as (endpoint, received):
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        telemetry = setup_telemetry(tmp_path)
        with caplog.at_level(logging.WARNING):
            record_one_restore(telemetry)
            telemetry.shutdown()
    assert received  # the batch reached the backend, which refused it
    (warning,) = [r.message for r in caplog.records if "could not export" in r.message]
    assert f"code: {status}" in warning
    assert f"the backend said: {reason})" in warning  # the short reason, not the whole body
    assert "training continues" not in warning and "the run goes on" in warning


@pytest.mark.parametrize("backend", ["mlflow3", "otel-collector"])
def test_a_refused_replay_names_the_short_reason(tmp_path, backend):
    status, body, reason = REFUSALS[backend]
    telemetry = setup_telemetry(tmp_path, otlp=False)
    record_one_restore(telemetry)
    telemetry.shutdown()
    with collector(status, body) as (endpoint, _):
        refused = run_cli("export", "--otlp", str(telemetry.trace_file),
                          env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})  # fmt: skip
    assert refused.returncode != 0
    assert f"refused the spans (HTTP {status}: {reason})" in refused.stderr


def test_otel_traces_exporter_none_disables_otlp(tmp_path, clean_otel_env):
    with refused_port() as port:
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        clean_otel_env.setenv("OTEL_TRACES_EXPORTER", "none")
        telemetry = setup_telemetry(tmp_path)
        assert telemetry.network_processor is None
        telemetry.shutdown()


def test_cloud_detection_reads_local_files_only(tmp_path):
    from ckptprof.tracing.resource import detect_cloud_provider

    (tmp_path / "sys_vendor").write_text("Amazon EC2\n")
    assert detect_cloud_provider(tmp_path) == "aws"
    (tmp_path / "sys_vendor").write_text("QEMU\n")
    assert detect_cloud_provider(tmp_path) is None
    assert detect_cloud_provider(tmp_path / "missing") is None


def test_trace_file_ignores_the_jobs_sampler(tmp_path, clean_otel_env):
    clean_otel_env.setenv("OTEL_TRACES_SAMPLER", "always_off")
    clean_otel_env.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "0")  # invalid: one warning only
    telemetry = setup_telemetry(tmp_path)
    record_one_restore(telemetry)
    telemetry.shutdown()
    assert len(read_spans(telemetry.trace_file)) == 3


def test_export_warning_never_shows_url_secrets():
    from ckptprof.tracing.otlp_exporter import _strip_url_secrets

    text = "HTTPConnectionPool(host='h', port=1): url: /v1/traces?token=abc123 http://u:pw@h:1/x"
    cleaned = _strip_url_secrets(text)
    assert "abc123" not in cleaned and "pw@" not in cleaned and "/v1/traces" in cleaned


def test_an_endpoint_that_does_not_parse_is_shown_and_never_raises():
    """``http://collector:${OTEL_PORT}`` (unexpanded): named in the warning, less its
    credentials; no ValueError out of the place that builds the exporter."""
    from ckptprof.storage.s3_client import safe_endpoint as s3_endpoint
    from ckptprof.tracing.otlp_exporter import safe_endpoint

    for endpoint in (safe_endpoint, s3_endpoint):
        shown = endpoint("http://me:pw@collector:${OTEL_PORT}/v1?token=abc")
        assert "collector:${OTEL_PORT}" in shown
        assert "pw" not in shown and "abc" not in shown
        assert "pw" not in endpoint("http://me:pw@[::1")  # no closing bracket


def test_span_ids_ignore_and_keep_the_jobs_random_state(tmp_path, clean_otel_env):
    """Training jobs seed ``random`` and restore its state on resume: ids must still be
    unique across runs, and tracing must not advance the job's random stream."""
    import random

    ids = []
    for _ in range(2):
        random.seed(0)
        telemetry = setup_telemetry(tmp_path)
        record_one_restore(telemetry)
        assert random.random() == random.Random(0).random()  # stream untouched
        telemetry.shutdown()
        root = next(s for s in read_spans(telemetry.trace_file) if s["name"] == "ckpt.restore")
        ids.append((root["context"]["trace_id"], root["context"]["span_id"]))
    assert ids[0][0] != ids[1][0] and ids[0][1] != ids[1][1]


def test_a_collector_that_never_answers_is_one_warning_not_silence(
    tmp_path, clean_otel_env, caplog
):
    """Once, the shutdown wait (2 s) was shorter than the request timeout (3 s), so spans
    sent to a collector that accepts but never answers were lost without a word."""
    clean_otel_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "3")  # the request timeout above
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])  # and never answer
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    port = server.getsockname()[1]
    clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    try:
        telemetry = setup_telemetry(tmp_path)
        with caplog.at_level(logging.WARNING):
            started = time.monotonic()
            record_one_restore(telemetry)
            telemetry.shutdown()
            waited = time.monotonic() - started
    finally:
        stop.set()
        for conn in accepted:
            conn.close()
        server.close()
    assert accepted  # the collector did take the connection
    ours = [r for r in caplog.records if r.name == "ckptprof" and "could not export" in r.message]
    assert len(ours) == 1 and f"127.0.0.1:{port}" in ours[0].message
    assert waited < shutdown_bound_s(3.0) + 5.0  # bounded: the request timeout and a margin
    assert len(read_spans(telemetry.trace_file)) == 3  # the local file has everything


def test_otel_sdk_disabled_exports_nothing_and_the_run_still_completes(
    tmp_path, clean_otel_env, checkpoints
):
    """OTEL_SDK_DISABLED=true: no trace file, no network; a synthetic restore still writes
    its results and says where the traces went (nowhere)."""
    clean_otel_env.setenv("OTEL_SDK_DISABLED", "true")
    telemetry = setup_telemetry(tmp_path / "traces")
    record_one_restore(telemetry)
    telemetry.shutdown()
    assert telemetry.trace_file is None and not (tmp_path / "traces").exists()
    assert telemetry.describe_trace() == "traces: none (OTEL_SDK_DISABLED=true)"
    done = run_cli(
        "synth", "restore", str(checkpoints("torch")), "--cache", "hot", "--concurrency", "1",
        "--repeat", "1", "--ceiling-gbps", "1", "--no-first-step", "--no-report",
        "--out", str(tmp_path / "out"), env={"OTEL_SDK_DISABLED": "true"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "traces: none (OTEL_SDK_DISABLED=true)" in done.stdout
    assert json.loads((tmp_path / "out" / "results.json").read_text())["trace_file"] is None
    assert not (tmp_path / "out" / "traces").exists()


def test_otel_traces_exporter_console_prints_the_spans(tmp_path, clean_otel_env, capsys):
    clean_otel_env.setenv("OTEL_TRACES_EXPORTER", "console")
    telemetry = setup_telemetry(tmp_path)
    record_one_restore(telemetry)
    telemetry.shutdown()
    printed = capsys.readouterr().out
    assert '"name": "ckpt.restore"' in printed and '"name": "ckpt.fetch"' in printed
    assert len(read_spans(telemetry.trace_file)) == 3  # and the trace file as always


def test_the_otlp_request_timeout_is_the_sdks_own(clean_otel_env):
    from ckptprof.tracing.otel_settings import otlp_timeout_s

    assert otlp_timeout_s() == 10.0  # a busy backend gets the SDK's time
    clean_otel_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "25")
    assert otlp_timeout_s() == 25.0


def test_a_replay_to_a_collector_that_accepts_and_never_answers_is_bounded(tmp_path):
    """Once, replay was tried against a refused port only, so a missing request timeout
    would have passed. This collector reads the request and never answers."""
    telemetry = setup_telemetry(tmp_path, otlp=False)
    record_one_restore(telemetry)
    telemetry.shutdown()
    never = threading.Event()
    with collector(hold=never) as (endpoint, received):
        done = run_cli("export", "--otlp", str(telemetry.trace_file), timeout=120,
                       env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                            "OTEL_EXPORTER_OTLP_TIMEOUT": "2"})  # fmt: skip
        assert received  # the request arrived: the wait was for an answer
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert f"no answer from {endpoint}/v1/traces within 2 s" in lines[0]


@pytest.mark.parametrize(
    "variable, value",
    [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "notaurl"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4318"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://u:secret@collector:${PORT}/v1/traces"),
    ],
)
def test_a_replay_to_an_endpoint_that_is_no_url_names_the_variable(tmp_path, variable, value):
    """``export --otlp`` with a variable that holds no http(s) URL: one line naming the
    variable and the form it takes, before the traces are read (it was "unexpected
    ValueError", or "no answer within 10 s" at once); the password is not repeated."""
    telemetry = setup_telemetry(tmp_path, otlp=False)
    record_one_restore(telemetry)
    telemetry.shutdown()
    refused = run_cli("export", "--otlp", str(telemetry.trace_file), env={variable: value})
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert variable + "=" in lines[0] and "http://collector:4318" in lines[0], lines[0]
    assert "secret" not in lines[0] and "unexpected" not in lines[0]


def test_a_refusing_collector_costs_each_shutdown_one_short_wait_and_no_thread(
    tmp_path, clean_otel_env
):
    """A refused connection is known at once: every shutdown (a fit per trial of a sweep)
    waits about one short try, the first too (it waited out the SDK's retries, 6 s per
    fit in a reviewer's job), and no export thread outlives it (they piled up, a pair a
    fit); the trace file still has every span. A collector that answers, slowly, is
    waited for in full."""
    from ckptprof.tracing import export

    clean_otel_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "5")

    def exporting() -> list[str]:
        names = ("ckptprof-export", "OtelBatchSpanRecordProcessor")
        return [t.name for t in threading.enumerate() if t.name.startswith(names)]

    before = exporting()
    with refused_port() as port:
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        for trial in range(3):
            telemetry = setup_telemetry(tmp_path / str(trial))
            record_one_restore(telemetry)
            started = time.monotonic()
            telemetry.shutdown()
            took = time.monotonic() - started
            assert took < 5.0 / 2, (trial, took)  # well inside the request timeout
            assert wait_for(lambda: exporting() == before, 1.0), exporting()
            assert len(read_spans(telemetry.trace_file)) == 3
    held = threading.Event()
    with collector(200, b"", hold=held) as (endpoint, received):
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        telemetry = setup_telemetry(tmp_path / "back")
        record_one_restore(telemetry)
        threading.Timer(1.5, held.set).start()  # answers 1.5 s after the fit ends
        started = time.monotonic()
        telemetry.shutdown()
        assert 1.5 <= time.monotonic() - started < 5.0 + export.NETWORK_FLUSH_MARGIN_S
    assert len(received_spans(received)) == 3


SECRET_URI = ("https://AKIAEXAMPLE:hunter2@bucket.s3.amazonaws.com/ck?X-Amz-Credential=AKIA"
              "%2F2026&X-Amz-Signature=deadbeef&X-Amz-Security-Token=TOKENXYZ")  # fmt: skip


def test_every_export_and_report_of_a_trace_from_elsewhere_leaves_its_secrets_out(
    tmp_path, clean_otel_env, capsys
):
    """ckptprof's own spans never hold a URL's secrets; a trace written elsewhere (or by
    hand) may: export copied them into both files and the collector, word for word."""
    from ckptprof.cli import main

    telemetry = setup_telemetry(tmp_path / "t")
    record_one_restore(telemetry)
    telemetry.shutdown()
    text = telemetry.trace_file.read_text()
    telemetry.trace_file.write_text(text.replace('"torch"', json.dumps(SECRET_URI)))
    secrets = ("hunter2", "deadbeef", "TOKENXYZ", "AKIAEXAMPLE:")
    for fmt in ("otlp-json", "perfetto"):
        out = tmp_path / f"x.{fmt}"
        assert main(["export", str(tmp_path / "t"), "--format", fmt, "-o", str(out)]) == 0
        assert not any(s.encode() in out.read_bytes() for s in secrets), fmt
    with collector() as (endpoint, received):
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        assert main(["export", str(tmp_path / "t"), "--otlp"]) == 0
    sent = b"".join(body for _, body in received)
    assert sent and not any(s.encode() in sent for s in secrets)
    assert main(["report", str(tmp_path / "t")]) == 0
    shown = capsys.readouterr()
    assert not any(s in shown.out + shown.err for s in secrets)


def test_nothing_to_export_is_one_line_in_every_mode_and_a_newer_results_file_too(
    tmp_path, clean_otel_env, capsys
):
    """An empty trace file wrote an empty file (otlp-json) or sent nothing (--otlp), exit
    0, where perfetto said there was nothing; a results.json a newer ckptprof wrote was
    exported as if this one could read it."""
    from ckptprof.cli import main

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "e.jsonl").write_text("")
    modes = (["--format", "otlp-json", "-o", str(tmp_path / "x")],
             ["--format", "perfetto", "-o", str(tmp_path / "y")], ["--otlp"])  # fmt: skip
    with refused_port() as port:
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        for mode in modes:
            assert main(["export", str(tmp_path / "empty"), *mode]) == 2, mode
            (line,) = capsys.readouterr().err.strip().splitlines()
            assert line.startswith(f"ckptprof: error: {tmp_path / 'empty'}: no "), line
    assert not (tmp_path / "x").exists()
    newer = tmp_path / "newer"
    telemetry = setup_telemetry(newer / "traces")
    record_one_restore(telemetry)
    telemetry.shutdown()
    (newer / "results.json").write_text(json.dumps({"schema_version": 99, "runs": []}))
    assert main(["export", str(newer / "results.json"), *modes[0]]) == 2
    assert "written by a newer ckptprof (results.json schema 99" in capsys.readouterr().err
