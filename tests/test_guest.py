"""The differential guest tier: the same real job, with and without ckptprof, must behave
identically — the files in its checkpoint directories (bytes), its results, exceptions
and messages, the signal handlers, threads and open files it leaves, the attributes of
its framework objects — and a job killed by SIGTERM after a failed run must still die.

Each variant runs in a fresh process (``tests/guest_job.py``) in the same directory;
``off`` is the job as its user wrote it, ``on`` adds the one ckptprof line, and
``interruptions`` adds it with interruption tracing (SIGTERM/SIGUSR1 handlers).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RESTORE_PHASES, children, run_cli, spans_in

pytestmark = pytest.mark.slow  # real jobs in fresh processes

JOB = Path(__file__).with_name("guest_job.py")
SCENARIOS = {
    "lightning": [
        "save_resume",
        "fit_raises",
        "missing_path",
        "user_layers",
        "mock_checkpoint_io",
        "deepcopy_callbacks",
    ],
    "transformers": [
        "save_resume",
        "train_raises",
        "missing_path",
        "converted_weights",
        "deepcopy_callbacks",
        "many_trainers",
    ],
    "deepspeed": ["save_resume", "step_raises", "missing_path"],
}
# what each job must have done without ckptprof (so an identical pair means something)
EXPECTED_ERRORS = {
    "fit_raises": ("RuntimeError", "training_step failed at batch 7"),
    "train_raises": ("RuntimeError", "the training loop failed at step 6"),
    "step_raises": ("RuntimeError", "the training loop failed after step 6"),
}


def launch(
    framework: str,
    scenarios: list[str],
    variant: str,
    root: Path,
    nproc: int = 1,
    fresh=True,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run the job once as ``variant``: in ``root/work`` (the same for every variant), with
    its own current directory (trace files) and state location (ckptprof's records);
    ``env``: more variables (a test's fault, e.g. ``CKPTPROF_TEST_LATE_LOAD``)."""
    work, home = root / "work", root / variant
    if fresh and work.exists():
        shutil.rmtree(work)
    home.mkdir(exist_ok=True)
    launcher = [sys.executable]
    if nproc > 1 and framework != "lightning":  # Lightning starts its own ranks
        launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
        launcher += ["--standalone", "--local-addr", "127.0.0.1"]  # its own free port
    command = [*launcher, str(JOB), framework, ",".join(scenarios), "--variant", variant]
    command += ["--work", str(work), "--out", str(home / f"{scenarios[0]}.json")]
    env = {**os.environ, "CKPTPROF_STATE_DIR": str(home / "state"), "OMP_NUM_THREADS": "1",
           **(env or {})}  # fmt: skip
    return subprocess.run(command, cwd=home, env=env, capture_output=True, text=True, timeout=400)


def observe(framework, scenarios, variant, root: Path, ends=0, **kwargs) -> dict:
    """What the job saw in each scenario; ``ends``: the exit status it must end with."""
    done = launch(framework, scenarios, variant, root, **kwargs)
    assert done.returncode == ends, f"{variant}: {done.stderr[-4000:]}"
    assert "survived SIGTERM" not in done.stdout, variant
    return json.loads((root / variant / f"{scenarios[0]}.json").read_text())


def assert_same(off: dict, other: dict, variant: str) -> None:
    for scenario, seen in off.items():
        for what, value in seen.items():
            assert other[scenario][what] == value, (
                f"{scenario}: {what} differs with ckptprof ({variant})\n"
                f"without: {json.dumps(value)[:3000]}\nwith:    "
                f"{json.dumps(other[scenario][what])[:3000]}"
            )


def restores_traced(root: Path, variant: str) -> list[dict]:
    spans = spans_in(root / variant / "ckptprof-traces")
    found = [s for s in spans if s["name"] == "ckpt.restore"]
    assert found, f"{variant}: ckptprof traced no restore (it must not pass by doing nothing)"
    return found


@pytest.mark.parametrize("framework", sorted(SCENARIOS))
def test_the_same_job_behaves_identically_with_and_without_ckptprof(framework, tmp_path):
    """Every scenario in one process per variant, and last the platform's SIGTERM after a
    training failure the job caught and went on from: the signal must still end the
    process, as without ckptprof (Kubernetes would otherwise wait out its grace period)."""
    scenarios = [*SCENARIOS[framework], "sigterm_after_failure"]
    killed = -signal.SIGTERM
    off = observe(framework, scenarios, "off", tmp_path, ends=killed)
    # the jobs really did what they are meant to, without ckptprof
    assert off["save_resume"]["error"] is None and off["save_resume"]["files"]
    assert off["missing_path"]["error"] or "None, None" in off["missing_path"]["result"]["loaded"]
    for scenario, (kind, message) in EXPECTED_ERRORS.items():
        if scenario in off:
            assert off[scenario]["error"] == [kind, message]
    for variant in ("on", "interruptions"):
        assert_same(off, observe(framework, scenarios, variant, tmp_path, ends=killed), variant)
        restores_traced(tmp_path, variant)
    ours = [p for p in (tmp_path / "work").rglob("*") if "ckptprof" in p.name]
    assert ours == []


#: a rank that begins its load late (tests/guest_job.py), where the job loads explicitly
LATE_LOAD = {"deepspeed": {"CKPTPROF_TEST_LATE_LOAD": "1:3"}}  # rank 1, 3 s after rank 0


def assert_each_hf_rank_read_its_share(root: Path, traces: Path, found: list[dict], monkeypatch):
    """The Trainer's two ranks: each reads the shared files and its own RNG state, rank 1
    records only the file it wrote, and the report says both read the whole checkpoint."""
    from tests.conftest import folder_record, ours_in

    monkeypatch.setenv("CKPTPROF_STATE_DIR", str(root / "interruptions" / "state"))
    folder = root / "work" / "ddp" / "checkpoints" / "checkpoint-7"  # the last: training's end
    assert {r["attributes"]["ckpt.path"] for r in found} == {str(folder)}
    assert folder_record(folder, 0) is not None
    assert set(folder_record(folder, 1)["files"]) == {"rng_state_1.pth"}
    assert ours_in(folder.parent) == []
    spans = spans_in(traces)
    shared = ["model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"]
    for restore in found:
        rank = restore["attributes"]["ckpt.rank"]
        fetched = children(spans, restore)["ckpt.fetch"]["attributes"]["ckpt.bytes"]
        assert fetched == sum(
            (folder / n).stat().st_size for n in [*shared, f"rng_state_{rank}.pth"]
        )
        held = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        assert restore["attributes"]["ckpt.checkpoint_bytes"] == held
        assert restore["attributes"]["ckpt.memory.training_rss_bytes"] > 0  # at the save
    report = " ".join(run_cli("report", str(traces)).stdout.split())
    assert (
        "read by 2 ranks:" in report and "each of the 2 ranks read the whole checkpoint" in report
    )
    assert "while training (at the save)" in report


@pytest.mark.parametrize("framework", sorted(SCENARIOS))
def test_two_processes_behave_identically_and_tag_their_ranks(framework, tmp_path, monkeypatch):
    runs = {}
    for variant in ("off", "interruptions"):
        late = LATE_LOAD.get(framework) if variant == "interruptions" else None
        trained = observe(framework, ["ddp_train"], variant, tmp_path, nproc=2)
        resumed = observe(
            framework, ["ddp_resume"], variant, tmp_path, nproc=2, fresh=False, env=late
        )
        runs[variant] = {**trained, **resumed}
    assert runs["off"]["ddp_resume"]["result"]["step"] == 9
    assert_same(runs["off"], runs["interruptions"], "interruptions")
    found = restores_traced(tmp_path, "interruptions")
    assert sorted(r["attributes"]["ckpt.rank"] for r in found) == [0, 1]
    assert {r["attributes"]["ckpt.world_size"] for r in found} == {2}
    assert len({r["attributes"]["ckpt.run_id"] for r in found}) == 1  # one run, two ranks
    traces = tmp_path / "interruptions" / "ckptprof-traces"
    spans = spans_in(traces)
    assert all(set(children(spans, r)) >= RESTORE_PHASES for r in found)
    text = run_cli("report", str(traces)).stdout
    assert "slowest rank" in text
    if framework == "transformers":
        assert_each_hf_rank_read_its_share(tmp_path, traces, found, monkeypatch)
    if framework in LATE_LOAD:  # the rank held back is named, from every rank's spans
        late = re.search(
            r"rank 1 began loading ([\d.]+) s after rank 0; the job waited on rank 1",
            " ".join(text.split()),  # as one line, however the terminal wrapped it
        )
        assert late and float(late.group(1)) >= 2.5, text
        report = json.loads(run_cli("report", str(traces), "--format", "json").stdout)
        (skew,) = [s for g in report["groups"] if g["kind"] == "restore" for s in g["skews"]]
        assert (skew["first_rank"], skew["last_rank"], skew["waited_on"]) == (0, 1, 1)
        assert skew["arrival_skew_s"] >= 2.5, skew
