"""An operation cut short leaves a record: while a save or restore is open, in-progress
records (``ckpt.progress``) go into the trace at each phase change and each stall warning,
and every view reads a trace without its root for what it holds."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ckptprof import activity
from ckptprof.phases import Attr, Phase
from ckptprof.report import aggregate, load, render_json
from ckptprof.report.cut_short import describe
from ckptprof.tracing import CheckpointTracer, setup_telemetry
from tests.conftest import TINY_SCALE, children, read_spans, run_cli, spans_in


def killed_in_fetch(tmp_path: Path) -> tuple[Path, Path]:
    """A restore open in fetch past a stall; its trace as a process killed then would
    leave it (copied aside before the restore ends), and the whole trace once it ended."""
    telemetry = setup_telemetry(tmp_path / "traces")
    tracer = CheckpointTracer(telemetry.provider, framework="synthetic", stall_after_s=0.5)
    op = tracer.restore({Attr.RANK: 2, Attr.CHECKPOINT_BYTES: 30_100_000_000})
    killed = tmp_path / "killed"
    try:
        with op.phase(Phase.LIST):
            pass
        with op.phase(Phase.FETCH), activity.request(WHERE, 1 << 20):
            op.add_bytes(Phase.FETCH, 12_300_000_000)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not _stall_in(_flushed(telemetry)):
                time.sleep(0.1)
            killed.mkdir()
            shutil.copy(telemetry.trace_file, killed)
    finally:
        op.finish()
        telemetry.shutdown()
    return killed, tmp_path / "traces"


WHERE = "s3://bucket/ckpt/optimizer.pt"


def _flushed(telemetry) -> list[dict]:
    telemetry.flush()
    return read_spans(telemetry.trace_file) if telemetry.trace_file.exists() else []


def _stall_in(spans: list[dict]) -> bool:
    return any(
        s["name"] == "ckpt.progress" and s["attributes"].get("ckpt.progress.reason") == "stall"
        for s in spans
    )


def test_an_open_restore_leaves_records_a_report_reads_without_its_root(tmp_path):
    killed, ended = killed_in_fetch(tmp_path)
    data = load([killed])
    assert data.operations == []  # refused whole before: "did it finish?"
    (cut,) = data.cut_short
    assert (cut.kind, cut.open_phase, cut.nbytes, cut.of_bytes) == (
        "restore", "fetch", 12_300_000_000, 30_100_000_000
    )  # fmt: skip
    assert list(cut.phases) == ["list", "fetch"] and cut.stalled
    assert cut.waiting_on == WHERE and cut.in_flight == 1
    assert describe(cut).startswith(
        f"restore cut short in fetch after {cut.elapsed_s:.1f} s: 12.30 GB of 30.10 GB (rank 2"
    )
    (stall,) = [s for s in spans_in(killed) if _stall_in([s])][:1]
    assert "killed_in_fetch" in stall["attributes"]["ckpt.stall.stacks"]  # where it waited
    # once it ended, the records are only history: the restore is read from its spans
    spans = spans_in(ended)
    (root,) = [s for s in spans if s["name"] == "ckpt.restore"]
    assert set(children(spans, root)) == {"ckpt.list", "ckpt.fetch"}
    after = load([ended])
    assert len(after.operations) == 1 and after.cut_short == []
    assert set(after.operations[0].phases) == {"list", "fetch"}


def test_every_view_shows_the_operation_cut_short(tmp_path, capsys):
    """--interruptions, --goodput and compare name it too (beside what they show)."""
    from ckptprof.cli import main
    from ckptprof.integrations.lifetime import Lifetime

    killed, _ = killed_in_fetch(tmp_path)
    line = describe(load([killed]).cut_short[0])
    telemetry = setup_telemetry(killed)  # the process's life so far, as after a save
    Lifetime().emit(CheckpointTracer(telemetry.provider), 0, final=False)
    telemetry.shutdown()
    for argv in (
        ["report", "--interruptions", str(killed)],
        ["report", "--goodput", str(killed)],
        # (a trace's finished restores would make compare fail in report/compare.py's
        # entries_of, which reads a group's rows as operations: not this test's subject)
        ["compare", str(killed), str(killed), "--label", "before", "--label", "killed"],
    ):
        code = main(argv)
        out = capsys.readouterr()
        assert code == 0, out.err
        assert f"  {line}" in out.out.splitlines(), (argv, out.out)
    assert "killed: cut short" in out.out  # compare says whose


def test_a_short_operation_leaves_no_record(tmp_path):
    telemetry = setup_telemetry(tmp_path / "traces")
    tracer = CheckpointTracer(telemetry.provider, framework="synthetic", stall_after_s=2)
    with tracer.save({}) as op, op.phase(Phase.WRITE):
        time.sleep(0.6)  # the watchdog looked (every 0.5 s), before PROGRESS_AFTER_S
    telemetry.shutdown()
    assert [s["name"] for s in read_spans(telemetry.trace_file)] == ["ckpt.write", "ckpt.save"]


@pytest.mark.slow  # a real synth restore from the suite's S3, killed with SIGKILL
def test_a_synth_restore_killed_mid_fetch_is_reported_cut_short_with_its_bytes(
    s3_bucket, s3_env, fault_proxy, tmp_path
):
    from ckptprof.synth.generate import generate
    from ckptprof.synth.plan import SynthSpec

    s3_env()
    location = f"s3://{s3_bucket.name}/cut/{uuid.uuid4().hex[:6]}"
    generate(location, SynthSpec("llama2-7b", "safetensors", TINY_SCALE), progress=False)
    env = s3_env(endpoint_url=fault_proxy.endpoint_url)
    fault_proxy.stall_next_get(120, "optimizer.pt")  # the fetch waits on it, never done
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "ckptprof", "synth", "restore", location, "--cache", "cold",
        "--concurrency", "2", "--repeat", "1", "--no-first-step", "--ceiling-gbps", "1",
        "--verify", "none", "--strategy", "pipelined", "--stall-after", "1", "--no-report",
        "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None and not _stall_recorded(out):
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        fault_proxy.reset()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert not [s for s in spans_in(out / "traces") if s["name"] == "ckpt.restore"]
    (cut,) = json.loads(render_json(aggregate(load([out / "traces"]))))["cut_short"]
    assert cut["kind"] == "restore" and cut["open_phase"] == "fetch" and cut["stalled"]
    assert 0 < cut["bytes"] < cut["of_bytes"]  # the model's bytes came; the optimizer's not
    assert cut["waiting_on"].startswith(f"{location}/optimizer.pt")
    table = run_cli("report", str(out / "traces"), env=env)
    assert table.returncode == 0, table.stderr
    assert f"  {cut['line']}" in table.stdout.splitlines()
    assert "restore cut short in fetch after" in cut["line"]


def _stall_recorded(out) -> bool:
    traces = out / "traces"
    return traces.is_dir() and _stall_in(spans_in(traces))
