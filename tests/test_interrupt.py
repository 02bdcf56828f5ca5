"""Interruption notices and records, with real signals and a metadata stand-in on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import time
from types import SimpleNamespace

import pytest

from ckptprof.errors import CkptprofError
from ckptprof.interrupt import notice as notice_module
from ckptprof.interrupt.notice import NoticeWatcher, parse_sources
from ckptprof.interrupt.record import (
    RECORD_NAME,
    InterruptionRecord,
    read_record,
    write_record,
)
from tests.conftest import LOOPBACK_ENV, read_spans
from tests.metadata_server import MetadataServer


def wait_for(predicate, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def freeze_notice_clock(monkeypatch, now_ns: int) -> None:
    """The notice module's wall clock stopped at ``now_ns`` (once the watcher has stopped,
    only ``Notice.seconds_left`` reads it): the time left is exact, however busy the
    machine."""
    frozen = SimpleNamespace(time_ns=lambda: now_ns, monotonic=time.monotonic)
    monkeypatch.setattr(notice_module, "time", frozen)


@pytest.mark.parametrize(
    "source,name", [("aws", "aws-spot"), ("gcp", "gcp-preempted"), ("azure", "azure-preempt")]
)
def test_metadata_notice_appears_after_n_seconds(source, name, monkeypatch):
    with MetadataServer(notice_after_s=0.5, deadline_s=120) as server:
        seen = []
        watcher = NoticeWatcher([source], seen.append, server.url, poll_interval_s=0.1).start()
        try:
            assert wait_for(lambda: seen)
        finally:
            watcher.stop()
    notice = seen[0]
    assert notice.source == name
    # not before the server said so: it was received after the server first served it
    assert notice.received_ns >= server.first_served_ns > 0
    if source == "gcp":  # GCE gives 30 s and says nothing more: 30 s from when it was seen
        assert notice.deadline_assumed
        assert notice.deadline_ns - notice.received_ns == 30 * 10**9
    else:  # the deadline the service announced, to the second it gave
        assert not notice.deadline_assumed and notice.deadline_ns == server.deadline_ns
    freeze_notice_clock(monkeypatch, notice.deadline_ns - 25 * 10**9)
    assert notice.seconds_left == 25.0  # the deadline less the clock's now


def gets(server) -> list:
    return [r for r in server.requests if r[0] == "GET"]


def puts(server) -> list:
    return [r for r in server.requests if r[0] == "PUT"]


def test_aws_uses_imdsv2_tokens():
    with MetadataServer(notice_after_s=None) as server:
        seen = []
        watcher = NoticeWatcher(["aws"], seen.append, server.url, poll_interval_s=0.1).start()
        try:
            assert wait_for(lambda: len(gets(server)) >= 6)  # three polls without a notice
            server.post_notice()
            assert wait_for(lambda: seen)
        finally:
            watcher.stop()
    assert server.requests[0][:2] == ("PUT", "/latest/api/token")
    assert all(r[2].get("x-aws-ec2-metadata-token") == server.token for r in gets(server))
    assert len(puts(server)) == 1  # the token is reused, poll after poll
    assert seen[0].source == "aws-spot"


def test_aws_fetches_a_new_token_after_a_401():
    with MetadataServer(notice_after_s=None) as server:
        seen = []
        watcher = NoticeWatcher(["aws"], seen.append, server.url, poll_interval_s=0.1).start()
        try:
            assert wait_for(lambda: len(server.requests) >= 3)  # a token and one poll
            server.token = "rotated"  # the token the poller holds now answers 401
            assert wait_for(lambda: len(puts(server)) == 2)  # ...so it fetched another
            server.post_notice()  # the notice comes after the rotation, whatever the pace
            assert wait_for(lambda: seen)
        finally:
            watcher.stop()
    assert len(puts(server)) == 2  # one more token, then the notice
    assert seen[0].source == "aws-spot"
    second_put = [i for i, r in enumerate(server.requests) if r[0] == "PUT"][1]
    after = server.requests[second_put + 1 :]
    assert after and all(r[2].get("x-aws-ec2-metadata-token") == "rotated" for r in after)


def test_cloud_hint_comes_from_local_dmi_files_only(tmp_path):
    from ckptprof.interrupt.notice import suggest_metadata_source

    (tmp_path / "sys_vendor").write_text("Amazon EC2\n")
    hint = suggest_metadata_source(["sigterm"], tmp_path)
    assert hint and "add 'aws'" in hint
    assert suggest_metadata_source(["sigterm", "aws"], tmp_path) is None
    (tmp_path / "sys_vendor").write_text("QEMU\n")
    assert suggest_metadata_source(["sigterm"], tmp_path) is None


def test_dead_or_slow_metadata_endpoint_is_one_warning_and_never_blocks(caplog, monkeypatch):
    tries = {"aws": 0, "gcp": 0}
    request = notice_module._request

    def counted(url, *args, **kwargs):
        tries["gcp" if "/computeMetadata/" in url else "aws"] += 1
        return request(url, *args, **kwargs)

    monkeypatch.setattr(notice_module, "_request", counted)
    # bound and never listening: every connection is refused, and no other process can
    # take the port while the test runs
    with socket.socket() as s, caplog.at_level(logging.WARNING, logger="ckptprof"):
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        watcher = NoticeWatcher(["aws", "gcp"], None, dead, poll_interval_s=0.05).start()
        try:
            assert wait_for(lambda: min(tries.values()) >= 3)  # every source failed 3 times
        finally:
            watcher.stop()
    warnings = [r.message for r in caplog.records if "not answering" in r.message]
    assert len(warnings) == 2  # one per source, not one per poll
    caplog.clear()
    with MetadataServer(notice_after_s=0) as server, caplog.at_level(logging.WARNING, "ckptprof"):
        server.answering.clear()  # it reads requests and never answers them
        watcher = NoticeWatcher(["gcp"], None, server.url, poll_interval_s=0.05).start()
        try:
            # start() returned while the poller's request is held by the server
            assert wait_for(lambda: server.requests)
            # the poller gives up on its own timeout while the server still holds it
            assert wait_for(lambda: "not answering" in caplog.text)
            assert not server.answering.is_set()
        finally:
            started = time.monotonic()
            watcher.stop()
            stopped_in = time.monotonic() - started
        assert watcher.notice is None  # the answer (TRUE) never came
        # stop() is bounded (it joins the poller for at most 3 request timeouts)
        assert stopped_in <= 3 * notice_module.HTTP_TIMEOUT_S + 2.0


def test_no_network_source_unless_asked(monkeypatch):
    monkeypatch.delenv("CKPTPROF_NOTICE_SOURCES", raising=False)
    watcher = NoticeWatcher()
    assert watcher.sources == ["sigterm", "sigusr1"] and watcher._pollers == []
    with pytest.raises(CkptprofError, match="unknown notice source 'ec2'"):
        parse_sources("sigterm,ec2")


def test_signal_notice_chains_the_previous_handler(monkeypatch):
    calls = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append(signum))
    try:
        seen = []
        watcher = NoticeWatcher(["sigusr1"], seen.append, signal_grace_s=20).start()
        sent = time.time_ns()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert wait_for(lambda: seen)
        assert calls == []  # held until ckptprof has saved
        notice = seen[0]
        assert notice.source == "sigusr1" and notice.deadline_assumed
        assert sent <= notice.received_ns <= time.time_ns()  # noted when it came
        assert notice.deadline_ns - notice.received_ns == 20 * 10**9  # the grace assumed
        watcher.chain()
        assert calls == [signal.SIGUSR1]
        watcher.stop()
        assert signal.getsignal(signal.SIGUSR1) is not watcher._on_signal
    finally:
        signal.signal(signal.SIGUSR1, previous)
    freeze_notice_clock(monkeypatch, notice.received_ns + 10**9)
    assert notice.seconds_left == 19.0  # a second after the signal


def test_record_roundtrip_and_bad_records(tmp_path, caplog):
    record = InterruptionRecord(
        run_id="job-1",
        trace_id="ab" * 16,
        span_id="cd" * 8,
        source="sigterm",
        notice_ns=1_000_000_000,
        deadline_ns=31_000_000_000,
        deadline_assumed=True,
        step=42,
        save_end_ns=4_000_000_000,
    )
    write_record(str(tmp_path), record)
    back = read_record(str(tmp_path), "job-1")
    assert back == record and back.margin_s == 27.0
    assert not list(tmp_path.glob("*.partial"))
    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        assert read_record(str(tmp_path), "job-2") is None  # another run's
        (tmp_path / RECORD_NAME).write_text("{not json")
        assert read_record(str(tmp_path)) is None  # corrupt
    messages = " ".join(r.message for r in caplog.records)
    assert "job-1's, this is run job-2" in messages and "corrupt" in messages
    assert read_record(str(tmp_path / "nothing-here")) is None


# ---------------------------------------------------------------------- synthetic mode
@pytest.mark.slow
def test_simulated_interruption_tells_the_whole_story(checkpoints, tmp_path):
    from tests.conftest import run_cli

    ckpt = checkpoints("torch")
    out = tmp_path / "out"
    common = ["--cache", "hot", "--concurrency", "1", "--repeat", "1", "--no-report"]
    result = run_cli("synth", "restore", str(ckpt), "--out", str(out), *common,
                     "--simulate-interruption")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "simulated interruption: emergency save saved" in result.stdout
    saved = list((out / "emergency").glob("step-*.pt"))
    assert len(saved) == 1 and saved[0].stat().st_size > 0
    story = run_cli("report", "--interruptions", str(out / "traces"))
    assert story.returncode == 0, story.stderr
    text = story.stdout
    assert "simulated notice" in text and "steps lost: 0" in text
    assert "before the deadline" in text and "cost at $32.77/h" in text
    assert "(assumed)" in text  # no --deadline: EC2 Spot's two minutes, said as assumed
    # no price set: the rate is the default, said so (a bare $32.77/h read as the job's)
    assert "cost at $32.77/h (the default, an 8×A100 list price: set " in text
    as_json = json.loads(run_cli("report", "--interruptions", "--format", "json",
                                 str(out / "traces")).stdout)  # fmt: skip
    (entry,) = as_json
    assert entry["outcome"] == "saved" and entry["resumed"]
    assert entry["cost_per_hour"] == 32.77 and entry["cost_per_hour_default"] is True
    # one process: no downtime, the restore started this long after the notice
    assert entry["downtime_s"] is None
    assert 0 < entry["notice_to_start_s"] < entry["recovery_s"]
    assert entry["rto_s"] > 0 and entry["save_s"] > 0


@pytest.mark.slow
def test_deadline_too_short_is_recorded_as_missed(checkpoints, tmp_path):
    from tests.conftest import run_cli

    out = tmp_path / "out"
    result = run_cli("synth", "restore", str(checkpoints("torch")), "--out", str(out),
                     "--cache", "hot", "--concurrency", "1", "--repeat", "1", "--no-report",
                     "--simulate-interruption", "--deadline", "0.001")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "missed_deadline" in result.stdout
    story = run_cli("report", "--interruptions", str(out / "traces")).stdout
    assert "missed_deadline" in story and "after the deadline" in story
    assert "(assumed)" not in story  # the deadline given
    # the log, the run's summary and the story say one margin, one way round, to the ms
    # (it was "-0.1 s before the deadline" in the log, and a 0.001 s deadline "0.0 s")
    logged = re.search(r"emergency save missed_deadline at step \d+, (\d+\.\d{3}) s after "
                       r"the deadline\n", result.stdout + result.stderr)  # fmt: skip
    summary = re.search(r"(\d+\.\d{3}) s after the 0.001 s deadline;", result.stdout)
    told = re.search(r"missed_deadline at step \d+, (\d+\.\d{3}) s after the deadline", story)
    assert logged and summary and told, result.stdout + result.stderr + story
    assert logged[1] == summary[1] == told[1] and float(told[1]) > 0
    assert "deadline 0.001 s later" in story
    about = [line for line in (result.stdout + result.stderr + story).splitlines()
             if "deadline" in line]  # fmt: skip
    assert about and not [line for line in about if re.search(r"(?<![\w.])-\d", line)]


@pytest.mark.slow
def test_report_without_interruptions_says_how_to_get_them(checkpoints, tmp_path):
    from tests.conftest import run_cli

    out = tmp_path / "out"
    run_cli("synth", "restore", str(checkpoints("torch")), "--out", str(out), "--cache", "hot",
            "--concurrency", "1", "--repeat", "1", "--no-report")  # fmt: skip
    story = run_cli("report", "--interruptions", str(out / "traces"))
    assert story.returncode != 0
    assert "no interruptions in these traces" in story.stderr
    assert "Traceback" not in story.stderr


def test_record_beside_a_checkpoint_on_s3(s3_bucket, s3_env):
    """The record goes beside checkpoints on S3 too: one PUT, read back, never a secret."""
    s3_env()
    location = f"s3://{s3_bucket.name}/job/checkpoints"
    record = InterruptionRecord(
        run_id="job-1",
        trace_id="ab" * 16,
        span_id="cd" * 8,
        source="aws-spot",
        notice_ns=1_000_000_000,
        deadline_ns=121_000_000_000,
        deadline_assumed=False,
        step=7,
    )
    write_record(location, record)
    assert read_record(location, "job-1") == record
    raw = s3_bucket.client.get_object(Bucket=s3_bucket.name, Key=f"job/checkpoints/{RECORD_NAME}")
    text = raw["Body"].read().decode()
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in text
    assert os.environ["AWS_ACCESS_KEY_ID"] not in text


def test_a_signal_after_a_handled_notice_is_handed_on(tmp_path):
    """A metadata notice was saved for; the SIGTERM that follows must still reach the
    handler ckptprof replaced (here a Python one, so the test process survives)."""
    import signal

    from ckptprof.interrupt.guard import InterruptionGuard
    from ckptprof.interrupt.notice import Notice
    from ckptprof.synth.interruption import _Host
    from ckptprof.tracing.export import setup_telemetry
    from ckptprof.tracing.tracer import CheckpointTracer

    calls = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append(signum))
    telemetry = setup_telemetry(tmp_path / "traces")
    try:
        host = _Host(CheckpointTracer(telemetry.provider, framework="test"), telemetry)
        guard = InterruptionGuard(
            host, lambda: str(tmp_path), lambda: "saved-here", sources=["sigusr1"]
        ).start()
        now = time.time_ns()
        guard.watcher.inject(Notice("aws-spot", now, now + 120_000_000_000))
        guard.step_end(3)  # the emergency save
        assert guard.record.outcome == "saved" and calls == []
        os.kill(os.getpid(), signal.SIGUSR1)
        guard.step_end(4)
        assert calls == [signal.SIGUSR1]
        guard.close()
    finally:
        signal.signal(signal.SIGUSR1, previous)
        telemetry.shutdown()


def test_a_notice_never_saved_for_is_still_recorded(tmp_path):
    from ckptprof.interrupt.guard import InterruptionGuard
    from ckptprof.interrupt.notice import Notice
    from ckptprof.synth.interruption import _Host
    from ckptprof.tracing.export import setup_telemetry
    from ckptprof.tracing.tracer import CheckpointTracer

    telemetry = setup_telemetry(tmp_path / "traces")
    host = _Host(CheckpointTracer(telemetry.provider, framework="test"), telemetry)
    guard = InterruptionGuard(host, lambda: str(tmp_path), lambda: "x", sources=[]).start()
    now = time.time_ns()
    guard.watcher.inject(Notice("gcp-preempted", now, now + 30_000_000_000, True))
    assert wait_for(lambda: guard.record is not None)  # pending record, from the thread
    guard.close()  # training ended before any step boundary
    telemetry.shutdown()
    assert read_record(str(tmp_path)).outcome == "none"
    (root,) = [s for s in read_spans(telemetry.trace_file) if s["name"] == "ckpt.interruption"]
    assert root["attributes"]["ckpt.interruption.outcome"] == "none"


def test_report_tells_one_story_per_interruption_across_ranks():
    from ckptprof.report.interruptions import build_stories, render_stories

    def span(name, span_id, attrs, links=(), parent=None, start="2026-11-30T00:00:00Z"):
        return {
            "name": name,
            "context": {"trace_id": "0x" + span_id * 2, "span_id": span_id},
            "parent_id": parent,
            "start_time": start,
            "end_time": start,
            "attributes": attrs,
            "links": [{"context": {"span_id": s}} for s in links],
        }

    common = {"ckpt.run_id": "job", "ckpt.interruption.source": "sigterm"}
    spans = [
        span("ckpt.interruption", "0xa0", {**common, "ckpt.rank": 0}),
        span("ckpt.interruption", "0xa1", {**common, "ckpt.rank": 1}),
    ]
    for rank, (root, wall) in enumerate((("0xa0", 1.0), ("0xa1", 2.5))):
        attrs = {
            "ckpt.rank": rank,
            "ckpt.wall_s": wall,
            "ckpt.interruption.source": "sigterm",
            "ckpt.interruption.steps_lost": 0,
            "ckpt.interruption.restored_step": 7,
        }
        spans.append(span("ckpt.restore", f"0xb{rank}", attrs, links=[root]))
    (story,) = build_stories(spans)
    assert story.ranks == 2 and story.rto_s == 2.5  # the job's restore: its slowest rank
    text = render_stories([story])
    assert "2 ranks" in text and "RTO 2.500 s, slowest rank" in text
    # rank 0 took rank 1's notice at the step boundary: the story names where it came
    spans[0]["attributes"] = {**spans[0]["attributes"], "ckpt.interruption.source": "peer"}
    (story,) = build_stories(spans)
    assert story.source == "sigterm (one rank; the others agreed)"
    # times that are not times (hand-edited or foreign traces): the story, without them
    for bad in ("yesterday", 12345, None):
        spans[0]["start_time"] = bad
        spans.append(span("ckpt.emergency_save", "0xc0", {}, parent="0xa0", start=bad))
        (story,) = build_stories(spans)
        assert story.notice_at is None and story.save_after_notice_s is None
        assert "RTO 2.500 s" in render_stories([story])
        spans.pop()


# ---------------------------------------------------------------------- never swallowed
def _guard(tmp_path, sources):
    from ckptprof.integrations.session import TracingSession
    from ckptprof.interrupt.guard import InterruptionGuard

    session = TracingSession("test", trace_dir=tmp_path / "traces")
    session.start()
    guard = InterruptionGuard(session, lambda: str(tmp_path), lambda: "saved", sources=sources)
    return session, guard


def test_a_handler_placed_over_ckptprofs_stays_and_signals_still_get_through():
    """Another library installs its handler after ckptprof's and calls ours from it (as
    Lightning composes its SIGTERM handler): stopping leaves theirs in place, and ours,
    still called, hands every signal to the handler it replaced."""
    replaced, theirs = [], []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: replaced.append(signum))
    try:
        watcher = NoticeWatcher(["sigusr1"]).start()
        ours = signal.getsignal(signal.SIGUSR1)

        def composed(signum, frame):
            theirs.append(signum)
            ours(signum, frame)

        signal.signal(signal.SIGUSR1, composed)
        watcher.stop()
        assert signal.getsignal(signal.SIGUSR1) is composed
        os.kill(os.getpid(), signal.SIGUSR1)
        assert wait_for(lambda: replaced)
        assert theirs == [signal.SIGUSR1] and replaced == [signal.SIGUSR1]
        assert watcher.notice is None  # a closed watcher notes nothing
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_handler_set_from_c_is_left_in_place_and_stop_never_raises(monkeypatch, caplog):
    """Python reports a handler installed from C (a launcher's or an MPI library's) as
    None and can never install it again: ckptprof leaves that signal alone, and its
    teardown never raises. Python's view is simulated; the handlers are real."""
    real_signal, real_getsignal = signal.signal, signal.getsignal
    from_c = {signal.SIGUSR1}

    def getsignal(signum):
        return None if signum in from_c else real_getsignal(signum)

    def set_signal(signum, handler):
        previous = real_signal(signum, handler)
        if signum in from_c:
            from_c.discard(signum)
            return None
        return previous

    before = real_getsignal(signal.SIGUSR1)
    monkeypatch.setattr(signal, "getsignal", getsignal)
    monkeypatch.setattr(signal, "signal", set_signal)
    try:
        with caplog.at_level(logging.WARNING, logger="ckptprof"):
            watcher = NoticeWatcher(["sigusr1"]).start()
            watcher.stop()
        assert real_getsignal(signal.SIGUSR1) == before  # never replaced
        assert "sigusr1 has a handler set outside Python" in caplog.text
    finally:
        real_signal(signal.SIGUSR1, before)


def test_a_noted_signal_reaches_the_replaced_handler_when_training_ends_first(tmp_path):
    calls = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append(signum))
    session, guard = _guard(tmp_path, ["sigusr1"])
    try:
        guard.start()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert wait_for(lambda: guard.record is not None)
        assert calls == []  # held for the emergency save at the next step boundary
        guard.close()  # ...which never comes: training ended
        assert signal.getsignal(signal.SIGUSR1) is not guard.watcher._on_signal
        guard.release_signal()
        assert wait_for(lambda: calls == [signal.SIGUSR1])
        assert read_record(str(tmp_path)).outcome == "none"
    finally:
        signal.signal(signal.SIGUSR1, previous)
        session.close()


def test_a_noted_signal_is_handed_on_when_no_step_boundary_comes(tmp_path, caplog):
    """A job whose loop failed (or hangs) reaches no step boundary: after a few steps'
    time the signal goes on anyway, without an emergency save."""
    from ckptprof.interrupt.guard import MIN_HANDOFF_S

    calls = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append(signum))
    session, guard = _guard(tmp_path, ["sigusr1"])
    try:
        guard.start()
        for step in range(3):  # fast steps: the wait is the minimum
            guard.step_end(step)
        sent = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="ckptprof"):
            os.kill(os.getpid(), signal.SIGUSR1)
            assert wait_for(lambda: calls, timeout=MIN_HANDOFF_S + 10)
        assert MIN_HANDOFF_S <= time.monotonic() - sent < MIN_HANDOFF_S + 10
        assert "handing the signal on without an emergency save" in caplog.text
        record = read_record(str(tmp_path))
        assert record.outcome == "none" and "no step boundary" in record.error
    finally:
        guard.close()
        signal.signal(signal.SIGUSR1, previous)
        session.close()


# ---------------------------------------------------------------------- across ranks
@pytest.mark.slow
def test_a_notice_on_one_rank_saves_every_rank_at_the_same_step(tmp_path):
    """Two real ranks (gloo): rank 1 alone gets the signal; at the next step boundary both
    agree (one all-reduce) and both save at that step; rank 0 tells it as a peer's notice.
    SIGUSR1's default action would end rank 1, so the job ignores it (the watcher notes it
    first and hands it on to SIG_IGN)."""
    import subprocess
    import sys
    from pathlib import Path

    job = Path(__file__).with_name("agree_job.py")

    def run(*flags):
        out = tmp_path / ("-".join(flags) or "agree")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", str(job), str(out), *flags]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                              env={**os.environ, **LOOPBACK_ENV})  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]

    agreed = run()
    assert [r["saved"] for r in agreed] == [[3], [3]]
    assert [r["source"] for r in agreed] == ["peer", "sigusr1"]
    apart = run("--no-agree")  # without the agreement only the signalled rank saves
    assert [r["saved"] for r in apart] == [[], [3]]
    # a rank that gave up waiting for a step boundary: every rank gives up with it, and
    # the ranks stay in step (its agreement skipped, the peer's met a training
    # collective: a hang)
    gave_up = run("--give-up")
    assert [r["saved"] for r in gave_up] == [[], []]
    assert [r["outcome"] for r in gave_up] == ["none", "none"]
    assert [r["steps"] for r in gave_up] == [7, 7]


@pytest.mark.parametrize("odd", ["wall_s is text", "link without a context"])
def test_odd_values_in_a_story_read_as_absent_as_in_the_plain_report(odd, tmp_path, capsys):
    """A resumed restore whose ``ckpt.wall_s`` is text, or with a link whose context is
    null (a hand-edited or foreign trace): ``report``, ``report --interruptions``,
    ``--goodput`` and ``--html`` all go on (they died with "unexpected ValueError" and
    "TypeError", naming no file)."""
    from ckptprof.cli import main
    from ckptprof.tracing.times import span_ns
    from tests.conftest import spans_in, traced_job

    traces = tmp_path / "traces"
    traced_job(traces, tmp_path / "ckpt", notice=True)
    for file in traces.glob("*.jsonl"):
        spans = read_spans(file)
        for span in spans:
            if span["name"] == "ckpt.restore" and odd == "wall_s is text":
                span["attributes"]["ckpt.wall_s"] = "fast"
            elif span["name"] == "ckpt.restore":
                span["links"].append({"context": None, "attributes": {}})
        file.write_text("".join(json.dumps(s) + "\n" for s in spans))
    for view in ([], ["--interruptions"], ["--goodput"], ["--html", str(tmp_path / "r.html")]):
        assert main(["report", *view, str(traces)]) == 0, view
        out, err = capsys.readouterr()
        assert "unexpected" not in err, (view, err)
    assert main(["report", "--interruptions", str(traces)]) == 0
    out = capsys.readouterr().out
    assert "interruption 1: simulated notice" in out and "steps lost: " in out
    if odd == "wall_s is text":  # not a number: the span's length, as the plain report
        (restore,) = [s for s in spans_in(traces) if s["name"] == "ckpt.restore"]
        length = span_ns(restore["end_time"]) - span_ns(restore["start_time"])
        assert f"RTO {length / 1e9:.3f} s" in out
    else:  # the link that says where it goes still tells the story
        assert "emergency save: started" in out
