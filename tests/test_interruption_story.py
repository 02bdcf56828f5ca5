"""One interruption story in every view: a real Lightning job killed by SIGKILL while its
Spot notice waited for a step boundary (its emergency save never began), resumed, then
stopped by a real SIGTERM (its emergency save ended), resumed again. The story, the
goodput and the exported spans must tell the same seconds, none of them negative."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptprof.tracing.times import span_ns
from tests.conftest import interruption_record_path, run_cli

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lightning_resume.py"


def _start(job: Path, phase: str, steps: int, step_delay: float) -> subprocess.Popen:
    command = [sys.executable, str(EXAMPLE), "--dir", str(job), "--phase", phase, "--steps",
               str(steps), "--step-delay", str(step_delay), "--interruptions"]  # fmt: skip
    env = {**os.environ, "CKPTPROF_NOTICE_SOURCES": "sigterm"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)  # fmt: skip


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert path.exists(), proc.stderr.read()[-3000:] if proc.poll() is not None else path


def _killed_during_its_notice(job: Path) -> dict:
    """Steps of 1 s; the step after step 5's checkpoint ends at once, then 1 s each. A
    SIGTERM half way between two step ends, a SIGKILL as soon as the pending record is
    written: no step boundary comes between, so the emergency save never starts."""
    proc = _start(job, "train", 1000, 1.0)
    _wait_for(job / "checkpoints" / "epoch=0-step=5.ckpt", proc)
    time.sleep(1.5)  # step 6 ended just after the checkpoint, step 7 about 1 s later
    record = interruption_record_path(job / "checkpoints")
    proc.send_signal(signal.SIGTERM)
    _wait_for(record, proc, timeout=5)
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    return json.loads(record.read_text())


def _otlp_restores(path: Path) -> list[dict]:
    """The exported restores' attributes, as an OTLP reader sees them."""
    found = []
    for line in path.read_text().splitlines():
        for resource in json.loads(line)["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    if span["name"] == "ckpt.restore":
                        values = {a["key"]: a["value"] for a in span["attributes"]}
                        found.append({k: next(iter(v.values())) for k, v in values.items()})
    return sorted(found, key=lambda a: a["ckpt.interruption.notice_at"])


@pytest.mark.slow
def test_a_spot_job_killed_before_its_emergency_save_tells_one_story(tmp_path):
    job = tmp_path / "job"
    record = _killed_during_its_notice(job)
    assert record["outcome"] == "pending" and record["save_start_ns"] is None
    assert record["last_step"] > 5  # steps trained after the checkpoint the resume reads
    second = _start(job, "resume", 1000, 0.1)
    _wait_for(job / "checkpoints" / "epoch=0-step=10.ckpt", second)
    second.send_signal(signal.SIGTERM)
    _, stderr = second.communicate(timeout=240)
    assert second.returncode == 0 and "emergency save saved" in stderr, stderr[-3000:]
    third = _start(job, "resume", 16, 0.1)
    _, stderr = third.communicate(timeout=300)
    assert third.returncode == 0, stderr[-3000:]
    traces = str(job / "traces")

    shown = run_cli("report", "--goodput", traces, "--format", "json")
    assert shown.returncode == 0, shown.stderr
    goodput = json.loads(shown.stdout)
    killed = goodput["lifetimes"][0]
    # its life reaches the notice and its last step, which its record saw: those steps
    # were trained and lost (redone by the next process), not downtime
    assert killed["end_ns"] >= max(record["notice_ns"], record["last_step_ns"]) - 1000
    assert killed["last_step"] == record["last_step"]
    lost = record["last_step"] - 5
    assert killed["lost_steps"] == lost and goodput["lifetimes"][1]["resumed_from"] == 5
    assert killed["buckets"]["lost_work"] == pytest.approx(
        min(lost * killed["step_median_s"], killed["unseen_s"]), abs=1e-6
    )
    assert killed["buckets"]["lost_work"] > 0.5  # steps of 1 s
    assert all(v >= 0 for lt in goodput["lifetimes"] for v in lt["buckets"].values())
    walls = sum(lt["wall_s"] for lt in goodput["lifetimes"]) + sum(goodput["downtimes_s"])
    assert sum(goodput["total"].values()) == pytest.approx(walls, rel=1e-6)

    told = run_cli("report", "--interruptions", traces, "--format", "json")
    assert told.returncode == 0, told.stderr
    stories = json.loads(told.stdout)
    assert len(stories) == 2
    first = stories[0]
    assert first["outcome"] == "pending" and first["deadline_s"] == 30.0
    assert first["deadline_assumed"] and first["notice_at"]
    assert first["steps_lost"] == lost and first["last_step"] == record["last_step"]
    # the story's downtime is the goodput's, and recovery adds up from parts none negative
    assert [s["downtime_s"] for s in stories] == goodput["downtimes_s"]
    for story in stories:
        parts = story["recovery"]
        assert parts["wind_down_s"] >= 0 and parts["downtime_s"] > 0
        total = parts["wind_down_s"] + parts["downtime_s"] + parts["startup_s"] + parts["rto_s"]
        assert total == pytest.approx(story["recovery_s"], abs=0.02)
    text = run_cli("report", "--interruptions", traces).stdout
    assert "deadline 30.000 s later (assumed)" in text and "never finished" in text
    assert not re.search(r"(?<![\w.])-\d", text), text  # no negative seconds
    assert f"steps lost: {lost} (restored step 5, the last trained {record['last_step']})" in text

    # the exported spans: the interval the resumed process measured has its own name, and
    # it is the report's wind-down and downtime together; no attribute says downtime
    otlp = tmp_path / "spans.otlp.jsonl"
    exported = run_cli("export", "--format", "otlp-json", traces, "-o", str(otlp))
    assert exported.returncode == 0, exported.stderr
    restores = _otlp_restores(otlp)
    assert len(restores) == 2
    for attrs, story in zip(restores, stories, strict=True):
        assert not [key for key in attrs if "downtime" in key]
        notice_to_start = attrs["ckpt.interruption.notice_to_start_s"]
        assert story["notice_to_start_s"] == notice_to_start
        parts = story["recovery"]
        assert parts["wind_down_s"] + parts["downtime_s"] == pytest.approx(
            notice_to_start, abs=0.005
        )
        rate = attrs["ckpt.interruption.cost_per_hour"]
        assert attrs["ckpt.interruption.notice_to_start_cost"] == pytest.approx(
            notice_to_start / 3600 * rate, abs=1e-4
        )
        assert story["downtime_cost"] == round(story["downtime_s"] / 3600 * rate, 4)
        assert span_ns(attrs["ckpt.interruption.notice_at"]) == span_ns(story["notice_at"])
    assert f"downtime ${stories[0]['downtime_cost']:.4f}" in text
