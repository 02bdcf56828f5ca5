"""Spans leave before the process does: at the interpreter's exit and before a signal is
handed on, the trace file and the collector are flushed within a bound, and a flush that
runs out of time is one line. The real SIGTERM'd training job is in test_transformers."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

from ckptprof.tracing.export import (
    EXIT_FLUSH_MAX_S,
    EXIT_FLUSH_MIN_S,
    exit_flush_budget_s,
    setup_telemetry,
)
from tests.conftest import read_spans
from tests.test_export import clean_otel_env, collector, record_one_restore, span_names

__all__ = ["clean_otel_env"]  # the fixture, shared with test_export

EXITS_WITH_A_RESTORE = """
import sys
from ckptprof.tracing.export import setup_telemetry
from tests.test_export import record_one_restore
telemetry = setup_telemetry(sys.argv[1])
record_one_restore(telemetry)
sys.exit(3)  # no shutdown: the exit's own flush sends the spans
"""


def test_spans_reach_the_collector_when_the_script_calls_sys_exit(tmp_path, clean_otel_env):
    with collector() as (endpoint, received):
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        done = subprocess.run(
            [sys.executable, "-c", EXITS_WITH_A_RESTORE, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 3, done.stderr
    assert span_names(received) == {"ckpt.restore", "ckpt.list", "ckpt.fetch"}
    (trace_file,) = tmp_path.glob("*.jsonl")
    assert len(read_spans(trace_file)) == 3


def test_a_collector_that_does_not_answer_in_time_is_one_line(tmp_path, clean_otel_env, caplog):
    hold = threading.Event()
    with collector(hold=hold) as (endpoint, received):
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "60")  # a request may take 60 s
        telemetry = setup_telemetry(tmp_path)
        record_one_restore(telemetry)
        with caplog.at_level(logging.WARNING, logger="ckptprof"):
            started = time.monotonic()
            delivered = telemetry.flush_before_exit(0.5)
            waited = time.monotonic() - started
        assert received  # the batch reached it; its answer never came
        hold.set()
        telemetry.shutdown()
    assert not delivered
    lines = [r.getMessage() for r in caplog.records if "before the exit" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"ckptprof: spans not all sent to OTLP endpoint {endpoint} within")
    assert str(telemetry.trace_file) in lines[0]  # where the spans are (it was written)
    assert len(read_spans(telemetry.trace_file)) == 3
    assert waited < 60  # the exit's budget, not the request's timeout


def test_the_exit_budget_is_a_share_of_the_grace_left():
    assert exit_flush_budget_s(None) == EXIT_FLUSH_MAX_S
    assert exit_flush_budget_s(600) == EXIT_FLUSH_MAX_S  # a few seconds at most
    assert EXIT_FLUSH_MIN_S < exit_flush_budget_s(8) < 8  # a share of what is left
    assert exit_flush_budget_s(-3) == EXIT_FLUSH_MIN_S  # past the deadline: still a try
