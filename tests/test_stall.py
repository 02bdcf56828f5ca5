"""A stalled restore or save named while it is stalled: the watchdog's warning (rank,
host, phase, object, bytes, how long), the threads' stacks in the log and on the phase's
span, repeats at growing intervals, and a job that goes on. Real stalls: an operation
blocked inside a phase, and the S3 server itself paused with SIGSTOP mid-fetch."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from ckptprof import activity
from ckptprof.phases import Attr, Phase
from ckptprof.tracing import CheckpointTracer, setup_telemetry
from ckptprof.tracing.watchdog import stall_after_from_env, watchdog
from tests.conftest import TINY_SCALE, read_spans, spans_in


def watchdog_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ckptprof-watchdog"]


def test_a_phase_without_progress_is_named_and_left_to_finish(tmp_path, caplog):
    telemetry = setup_telemetry(tmp_path / "traces")
    tracer = CheckpointTracer(telemetry.provider, framework="synthetic", stall_after_s=0.3)
    release = threading.Event()
    caplog.set_level(logging.WARNING, logger="ckptprof")
    try:
        with tracer.restore({Attr.RANK: 3, Attr.HOST: "node-7"}) as op:
            assert watchdog().running
            where = "s3://bucket/ckpt/model.safetensors"
            with op.phase(Phase.FETCH), activity.request(where, 16 << 20):
                deadline = time.monotonic() + 10
                while len(caplog.records) < 2 and time.monotonic() < deadline:
                    time.sleep(0.05)  # stalled: nothing moves, no phase changes
            release.set()
    finally:
        telemetry.shutdown()
    warnings = [r.getMessage() for r in caplog.records if "stalled" in r.getMessage()]
    assert len(warnings) >= 2  # said again while it lasts, at growing intervals
    first = warnings[0].splitlines()[0]
    assert first.startswith("ckptprof: warning: restore rank 3 on node-7 stalled in fetch")
    assert "waiting on s3://bucket/ckpt/model.safetensors (16.78 MB" in first
    assert "the job goes on (next warning after 1 s" in first  # 0.3 s, doubled
    assert 'Thread "MainThread"' in warnings[0]  # the stacks, in the log
    assert "test_a_phase_without_progress" in warnings[0]  # where this thread waits
    assert not watchdog_threads()  # gone with the last open operation
    spans = spans_in(tmp_path / "traces")
    [fetch] = [s for s in spans if s["name"] == "ckpt.fetch"]
    events = [e for e in fetch["events"] if e["name"] == "ckpt.stall"]
    assert len(events) == len(warnings)
    assert events[0]["attributes"]["ckpt.stall.warning"] == 1
    assert events[0]["attributes"]["ckpt.stall.idle_s"] >= 0.3
    assert "MainThread" in events[0]["attributes"]["ckpt.stall.stacks"]


def test_progress_is_not_a_stall(tmp_path, caplog):
    """Bytes moving (slowly) or phases changing keep the watchdog quiet."""
    telemetry = setup_telemetry(tmp_path / "traces")
    tracer = CheckpointTracer(telemetry.provider, framework="synthetic", stall_after_s=0.4)
    caplog.set_level(logging.WARNING, logger="ckptprof")
    try:
        with tracer.save({}) as op, op.phase(Phase.WRITE):
            for _ in range(12):  # 1.2 s: three times the threshold, always moving
                with activity.request("/ckpt/file", 4096):
                    time.sleep(0.1)
    finally:
        telemetry.shutdown()
    assert not [r for r in caplog.records if "stalled" in r.getMessage()]


@pytest.mark.parametrize(
    "raw, expected", [("", 120.0), ("30", 30.0), ("0", None), ("off", None), ("soon", 120.0)]
)
def test_stall_after_comes_from_the_environment(raw, expected, monkeypatch):
    monkeypatch.setenv("CKPTPROF_STALL_AFTER", raw)
    assert stall_after_from_env() == expected


def test_off_means_no_thread(tmp_path):
    telemetry = setup_telemetry(tmp_path / "traces")
    tracer = CheckpointTracer(telemetry.provider, framework="synthetic", stall_after_s=None)
    try:
        with tracer.restore({}) as op, op.phase(Phase.FETCH):
            assert not watchdog_threads()
    finally:
        telemetry.shutdown()


def test_a_paused_s3_server_is_named_mid_fetch_and_the_restore_finishes(
    s3_bucket, s3_env, seaweed, fault_proxy, tmp_path
):
    """SeaweedFS stopped with SIGSTOP as the restore's first data GET reaches it: the
    warning names fetch and the object while the server is stopped, before the request's
    own read timeout could have ended the wait; SIGCONT, and the run ends well, its fetch
    span carrying the stall, said after stall_after without progress."""
    from ckptprof.synth.generate import generate
    from ckptprof.synth.plan import SynthSpec
    from tests.s3infra import _ProxyHandler

    s3_env()
    location = f"s3://{s3_bucket.name}/stall/{uuid.uuid4().hex[:6]}"
    generate(location, SynthSpec("llama2-7b", "safetensors", TINY_SCALE), progress=False)
    env = s3_env(endpoint_url=fault_proxy.endpoint_url)
    read_timeout_s, stall_after_s = 30, 2
    env["CKPTPROF_S3_READ_TIMEOUT"] = str(read_timeout_s)  # what ends a wait on its own
    paused: dict = {}
    held: set[str] = set()  # the objects of the requests the stopped server holds
    answering: dict[int, str] = {}  # the requests the proxy is answering now
    lock = threading.Lock()

    class PauseServer(_ProxyHandler):
        """The fetch's first data request (a ranged GET longer than the 1 MiB index reads)
        stops the server (its whole process group) before it is forwarded: the request
        waits on a server that answers nothing."""

        def _handle(self):
            start, _, end = self.headers.get("Range", "bytes=0-0")[6:].partition("-")
            key = self.path.split("?")[0].rsplit("/", 1)[-1]
            with lock:
                first = self.command == "GET" and int(end) - int(start) > 1 << 20 and not paused
                if first:
                    os.killpg(seaweed.proc.pid, signal.SIGSTOP)
                    paused["at"] = time.monotonic()
                    held.update(answering.values())  # sent on before the stop, unanswered
                if paused:
                    held.add(key)
                answering[id(self)] = key
            try:
                super()._handle()
            finally:
                with lock:
                    answering.pop(id(self), None)

    fault_proxy._server.RequestHandlerClass = PauseServer
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "ckptprof", "synth", "restore", location, "--cache", "cold",
        "--concurrency", "2", "--repeat", "1", "--no-first-step", "--ceiling-gbps", "1",
        "--verify", "none", "--strategy", "pipelined", "--stall-after", str(stall_after_s),
        "--no-report", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    lines: list[str] = []
    warned_at = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "stalled" in line:
                warned_at = time.monotonic()
                break
    finally:
        with lock:
            if paused:
                os.killpg(seaweed.proc.pid, signal.SIGCONT)
    stdout, rest = proc.communicate(timeout=120)
    assert paused, "the restore never sent a data request"
    assert warned_at is not None, "".join(lines) + rest
    # by order and configured timeouts, not a fixed figure: said while the server was
    # stopped (it is woken only below), before the request could have timed out on its own
    assert warned_at - paused["at"] < read_timeout_s
    warning = next(line for line in lines if "stalled" in line)
    assert "restore rank 0 stalled in fetch" in warning
    # the object named is one the stopped server holds a request for (which of them was
    # asked first depends on the load: the restore reads its files two at a time)
    waited_on = warning.split("; waiting on ", 1)[1].split(" (", 1)[0]
    assert waited_on.startswith(f"{location}/"), warning
    assert waited_on.rsplit("/", 1)[1] in held, (warning, held)
    assert proc.returncode == 0, rest
    spans = [s for f in sorted((out / "traces").glob("*.jsonl")) for s in read_spans(f)]
    [fetch] = [s for s in spans if s["name"] == "ckpt.fetch"]
    [event] = [e for e in fetch["events"] if e["name"] == "ckpt.stall"][:1]
    assert "waiting on" in event["attributes"]["ckpt.stall.message"]
    assert event["attributes"]["ckpt.stall.idle_s"] >= stall_after_s
