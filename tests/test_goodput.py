"""A job's goodput across restarts, from a real Lightning job killed twice by a real
SIGTERM and resumed twice, the gaps between its processes set by the test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptprof.tracing.times import span_ns
from tests.conftest import children, read_spans, run_cli, spans_in

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lightning_resume.py"
GAP_S = 1.5  # the test's own downtime between a process's exit and the next one's start


def run_process(directory: Path, phase: str, steps: int, kill_at: str | None = None):
    """One process of the job; with ``kill_at``, a real SIGTERM once that checkpoint is
    written. Returns (start, exit) on the wall clock."""
    command = [sys.executable, str(EXAMPLE), "--dir", str(directory), "--step-delay", "0.2",
               "--phase", phase, "--steps", str(steps)]  # fmt: skip
    env = {**os.environ, "CKPTPROF_NOTICE_SOURCES": ""}
    started = time.time()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)  # fmt: skip
    spawned = time.time()  # the OS started it between these two
    if kill_at:
        ready = directory / "checkpoints" / kill_at
        deadline = time.monotonic() + 240
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a step or two past the save: work the next process redoes
        proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    return started, spawned, time.time()


@pytest.mark.slow
def test_the_goodput_of_a_job_killed_twice_adds_up(tmp_path):
    job = tmp_path / "job"
    lives = [run_process(job, "train", 1000, kill_at="epoch=0-step=5.ckpt")]
    time.sleep(GAP_S)
    lives.append(run_process(job, "resume", 1000, kill_at="epoch=0-step=10.ckpt"))
    time.sleep(GAP_S)
    lives.append(run_process(job, "resume", 20))
    shown = run_cli("report", "--goodput", str(job / "traces"), "--format", "json",
                    "--price-per-hour", "36")  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    lifetimes = report["lifetimes"]
    assert len(lifetimes) == 3
    walls = sum(lt["wall_s"] for lt in lifetimes) + sum(report["downtimes_s"])
    assert sum(report["total"].values()) == pytest.approx(walls, rel=0.01)  # they add up
    spans = spans_in(job / "traces")
    for index, lt in enumerate(lifetimes):
        assert lt["buckets"]["other"] >= -0.01 * lt["wall_s"]  # no bucket overcounted
        assert lt["buckets"]["productive"] > 0
        assert lt["step_median_s"] >= 0.2  # each step sleeps the job's --step-delay
        # each bucket against the spans this process wrote inside its life
        mine = [s for s in spans if s["resource"]["attributes"]["process.pid"] == lt["pid"]
                and lt["start_ns"] <= span_ns(s["start_time"]) <= lt["end_ns"]]  # fmt: skip
        blocking = [s["attributes"]["ckpt.wall_s"] for s in mine if s["name"] == "ckpt.save"
                    and not s["attributes"].get("ckpt.save.background")]  # fmt: skip
        assert blocking and lt["buckets"]["save_blocking"] == pytest.approx(sum(blocking))
        restores = [s for s in mine if s["name"] == "ckpt.restore"]
        assert len(restores) == (1 if index else 0)  # none before the first resume
        first_steps = [children(spans, r)["ckpt.first_step"]["attributes"]["ckpt.busy_s"]
                       for r in restores]  # fmt: skip
        assert lt["buckets"]["first_step"] == pytest.approx(sum(first_steps))
        restored = sum(r["attributes"]["ckpt.wall_s"] for r in restores) - sum(first_steps)
        assert lt["buckets"]["restore"] == pytest.approx(restored)
        assert (lt["buckets"]["restore"] > 0) == bool(index)
    # lost work: the steps each killed process trained after its last completed save
    runs = sorted(
        (s for s in spans if s["name"] == "ckpt.run" and s["attributes"]["ckpt.run.final"]),
        key=lambda s: s["start_time"],
    )  # one per process at its close (others were written at its saves)
    assert len(runs) == 3
    for index, (lt, run) in enumerate(zip(lifetimes[:2], runs, strict=False)):
        start, end = span_ns(run["start_time"]), span_ns(run["end_time"])
        saved = [
            s["attributes"]["ckpt.step"] for s in spans
            if s["name"] == "ckpt.save" and start <= span_ns(s["start_time"]) <= end
        ]  # fmt: skip
        assert lt["lost_steps"] == lt["last_step"] - max(saved), index
        assert lifetimes[index + 1]["resumed_from"] == max(saved)
        assert lt["buckets"]["lost_work"] == pytest.approx(
            lt["lost_steps"] * lt["step_median_s"], rel=1e-6
        )
    assert lifetimes[0]["lost_steps"] + lifetimes[1]["lost_steps"] > 0  # work was redone
    assert lifetimes[2]["lost_steps"] == 0
    # downtime, by order: from the old process's last record (before it exited) to the
    # new one's start (after the test's gap): at least the gap, at most from the old
    # process's last save to the moment the new one had surely started
    for index, downtime in enumerate(report["downtimes_s"]):
        exited, (_, spawned, _) = lives[index][2], lives[index + 1]
        run_end = span_ns(runs[index]["end_time"]) / 1e9
        last_save = max(span_ns(s["end_time"]) for s in spans if s["name"] == "ckpt.save"
                        and span_ns(s["end_time"]) <= run_end * 1e9) / 1e9  # fmt: skip
        assert run_end <= exited
        tick = 1 / os.sysconf("SC_CLK_TCK")  # the OS's record of a start is in clock ticks
        assert GAP_S - tick <= downtime <= spawned - last_save
        assert downtime == pytest.approx(span_ns(runs[index + 1]["start_time"]) / 1e9 - run_end)
    assert report["cost"]["productive"] == pytest.approx(report["total"]["productive"] / 100)
    text = run_cli("report", "--goodput", str(job / "traces"), "--plot",
                   str(tmp_path / "goodput.png"))  # fmt: skip
    assert text.returncode == 0, text.stderr
    assert "goodput:" in text.stdout and "lost work (redone)" in text.stdout
    assert (tmp_path / "goodput.png").stat().st_size > 10_000
    page = run_cli("report", str(job / "traces"), "--html", str(tmp_path / "job.html"))
    assert page.returncode == 0, page.stderr
    html = (tmp_path / "job.html").read_text()
    assert "Goodput across restarts" in html and 'data-chart="goodput"' in html


def test_goodput_without_run_spans_is_one_line(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "empty.jsonl").write_text("")
    done = run_cli("report", "--goodput", str(traces))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no ckpt.run spans" in lines[0] and "callback" in lines[0]


@pytest.mark.parametrize("background", [True, False])
def test_steps_during_a_background_save_are_measured_apart(background, tmp_path):
    """A real Lightning job saving every 5 steps, with AsyncCheckpointIO (the write runs
    on a thread while training goes on) or without: the steps that end while a
    background save writes are counted apart, and their slowdown is what they took
    beyond as many steps at the job's median pace; none without a background save."""
    sys.path.insert(0, str(EXAMPLE.parent))
    from lightning.pytorch.plugins.io import AsyncCheckpointIO
    from lightning_resume import TinyModel, data, make_trainer

    from ckptprof.integrations.lightning import CkptProf
    from ckptprof.report.goodput import build_goodput

    plugins = [AsyncCheckpointIO()] if background else []
    trainer = make_trainer(tmp_path, 30, [CkptProf(trace_dir=tmp_path / "t")],
                           checkpoint_dir=tmp_path / "ckpt", plugins=plugins)  # fmt: skip
    trainer.fit(TinyModel(hidden=1024, layers=4), data(n=512))  # ~50 MB to write each time
    spans = spans_in(tmp_path / "t")
    [run] = [s for s in spans if s["name"] == "ckpt.run" and s["attributes"]["ckpt.run.final"]]
    attrs = run["attributes"]
    assert attrs["ckpt.run.steps"] == 29 and attrs["ckpt.run.last_step"] == 30
    [lifetime] = build_goodput(spans).lifetimes
    slowdown = lifetime.buckets["background_slowdown"]
    if background:
        assert attrs["ckpt.run.background_steps"] > 0  # steps ran while the writes did
        expected = attrs["ckpt.run.background_step_s"] - (
            attrs["ckpt.run.background_steps"] * attrs["ckpt.run.step_median_s"]
        )
        assert slowdown == pytest.approx(max(0.0, expected), abs=1e-6)
    else:
        assert attrs["ckpt.run.background_steps"] == 0 and slowdown == 0
    assert lifetime.buckets["productive"] == pytest.approx(attrs["ckpt.run.step_s"] - slowdown)


@pytest.mark.slow
def test_a_process_killed_without_closing_keeps_its_life_to_its_last_save(tmp_path):
    """A real HF Trainer job killed by SIGTERM (its emergency save, then the default
    action: the process dies without closing), then resumed: its life is known up to
    that save from the ckpt.run written there, and nothing is lost (the resume starts at
    the step it was killed at)."""
    from tests.conftest import sigterm_when

    example = EXAMPLE.parent / "hf_trainer_resume.py"
    flags = ["--dir", str(tmp_path), "--interruptions", "--step-delay", "0.1"]
    ready = tmp_path / "checkpoints" / "checkpoint-5" / "trainer_state.json"
    returncode, stderr = sigterm_when(
        [sys.executable, str(example), *flags, "--phase", "train", "--steps", "1000"], ready
    )
    assert returncode == -signal.SIGTERM and "emergency save saved" in stderr, stderr[-2000:]
    resumed = subprocess.run(
        [sys.executable, str(example), *flags, "--phase", "resume", "--steps", "20"],
        capture_output=True, text=True, timeout=400,
        env={**os.environ, "CKPTPROF_NOTICE_SOURCES": ""},
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    spans = spans_in(tmp_path / "traces")
    runs = sorted((s for s in spans if s["name"] == "ckpt.run"), key=lambda s: s["start_time"])
    killed, resumed_pid = dict.fromkeys(r["attributes"]["ckpt.run.pid"] for r in runs)
    killed_runs = [r for r in runs if r["attributes"]["ckpt.run.pid"] == killed]
    assert killed_runs and not any(r["attributes"]["ckpt.run.final"] for r in killed_runs)
    assert any(r["attributes"]["ckpt.run.final"] for r in runs if r not in killed_runs)
    shown = run_cli("report", "--goodput", str(tmp_path / "traces"), "--format", "json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    first, second = report["lifetimes"]
    assert (first["pid"], second["pid"]) == (killed, resumed_pid)
    saves = [
        s for s in spans
        if s["name"] == "ckpt.save" and not s["attributes"].get("ckpt.save.background")
        and s["resource"]["attributes"]["process.pid"] == killed
    ]  # fmt: skip
    last_save_end = max(span_ns(s["end_time"]) for s in saves)
    last_record = max(span_ns(r["end_time"]) for r in killed_runs)
    # its life ends at its last record, written once its last save had ended
    assert first["end_ns"] == last_record and last_save_end <= first["end_ns"]
    assert first["end_ns"] < second["start_ns"]
    assert second["resumed_from"] == first["last_step"] and first["lost_steps"] == 0
    assert report["downtimes_s"][0] > 0


def _edit_spans(path: Path, edit) -> None:
    """Rewrite a trace file with ``edit(span)`` applied to every span (in place)."""
    spans = [json.loads(line) for line in path.read_text().splitlines() if line]
    for span in spans:
        edit(span)
    path.write_text("".join(json.dumps(s) + "\n" for s in spans))


def test_two_jobs_are_two_goodputs_never_one_with_downtime_between(tmp_path, capsys):
    """Two jobs traced into one folder (the default ./ckptprof-traces of two jobs started
    from one place) are told apart by the job each process names (its checkpoint
    folder); traces written without one are told apart by their folders."""
    from ckptprof.cli import main
    from tests.conftest import traced_job

    traces = tmp_path / "traces"
    traced_job(traces, tmp_path / "job-a")
    traced_job(traces, tmp_path / "job-b")
    assert main(["report", "--goodput", str(traces), "--format", "json"]) == 0
    jobs = json.loads(capsys.readouterr().out)["jobs"]
    assert [j["job"] for j in jobs] == [str(tmp_path / "job-a"), str(tmp_path / "job-b")]
    for job in jobs:
        assert len(job["lifetimes"]) == 2 and job["lifetimes"][1]["resumed_from"] == 3
        assert sum(job["total"].values()) == pytest.approx(
            sum(lt["wall_s"] for lt in job["lifetimes"]) + sum(job["downtimes_s"])
        )
    assert main(["report", "--goodput", str(traces)]) == 0
    text = capsys.readouterr().out
    assert text.count("goodput of job ") == 2 and "(2 process(es))" in text
    # older traces name no job: each folder is one
    for name in ("job-a", "job-b"):
        (tmp_path / name / "traces").mkdir()
    for file in traces.glob("*.jsonl"):
        job = Path(read_spans(file)[-1]["attributes"]["ckpt.run.job"]).name
        moved = tmp_path / job / "traces" / file.name
        file.rename(moved)
        _edit_spans(moved, lambda s: (s.get("attributes") or {}).pop("ckpt.run.job", None))
    folders = [str(tmp_path / n / "traces") for n in ("job-a", "job-b")]
    assert main(["report", "--goodput", *folders, "--format", "json"]) == 0
    jobs = json.loads(capsys.readouterr().out)["jobs"]
    assert [j["job"] for j in jobs] == folders
    # a picture shows one job: refused up front, naming both
    plot = tmp_path / "g.png"
    assert main(["report", "--goodput", *folders, "--plot", str(plot)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "2 jobs" in line and folders[0] in line and folders[1] in line
    assert not plot.exists()


@pytest.mark.parametrize(
    "clock",
    ["run ends before it starts", "save ends before it starts", "steps beyond life", "overlap"],
)
def test_impossible_clocks_are_named_with_their_file_never_negative(clock, tmp_path, capsys):
    """Spans whose clocks cannot be gave "-6.15 s" and shares of 395.1% and -304.4%:
    now the file is named in one line."""
    from ckptprof.cli import main
    from tests.conftest import traced_job

    traces = tmp_path / "traces"
    traced_job(traces, tmp_path / "ckpt")
    first, second = sorted(traces.glob("*.jsonl"), key=lambda f: read_spans(f)[0]["start_time"])
    broken = first

    def swap(span):
        span["start_time"], span["end_time"] = span["end_time"], span["start_time"]

    def edit(span):
        attrs = span["attributes"]
        if clock == "run ends before it starts" and span["name"] == "ckpt.run":
            swap(span)
        elif clock == "save ends before it starts" and span["name"] == "ckpt.save":
            swap(span)
            attrs["ckpt.wall_s"] = -attrs["ckpt.wall_s"]
        elif clock == "steps beyond life" and span["name"] == "ckpt.run":
            life_s = (span_ns(span["end_time"]) - span_ns(span["start_time"])) / 1e9
            attrs["ckpt.run.step_s"] = life_s + 60.0  # the run's life is the worker's, however long
        elif clock == "overlap" and span["name"] == "ckpt.run":  # ends 5 s after the next starts
            end = span_ns(span["end_time"]) // 1000 + 5_000_000
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(end // 1_000_000))
            span["end_time"] = f"{stamp}.{end % 1_000_000:06d}Z"

    _edit_spans(broken, edit)
    assert main(["report", "--goodput", str(traces)]) == 2
    out, err = capsys.readouterr()
    (line,) = err.strip().splitlines()
    assert str(broken) in line and "impossible clocks" in line, line
    if clock == "overlap":  # both processes are named
        assert str(second) in line and "starts 5." in line
    assert out == ""  # no table of negative seconds or shares beyond 100%
