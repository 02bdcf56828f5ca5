"""What ckptprof says inside a real Trainer job is true: a speed verdict after a resume
only on enough steps, none of them a save's; a ``torch.save`` file the Trainer reads
that is junk is a verify problem, and the Trainer's own error still reaches the job."""

from __future__ import annotations

import logging
import re
import shutil
import time
from pathlib import Path

import pytest
from transformers import TrainerCallback

from ckptprof.integrations.health import HEALTH_STEPS
from ckptprof.integrations.transformers import CkptProfCallback
from tests.conftest import children, run_cli, spans_in
from tests.test_transformers import Paced, StepTime, make_trainer, restores

pytestmark = pytest.mark.slow  # real training jobs

DOCS = Path(__file__).resolve().parents[1] / "docs" / "callbacks.md"
STEP_S = 0.02  # each step's pace, as the step clock sees it
SAVE_S = 0.2  # a save's own time, inside the step it runs in


class SlowSaves(TrainerCallback):
    """Each save takes ``SAVE_S`` longer, and the step clock sees it (as ``Paced``)."""

    def __init__(self, clock: StepTime) -> None:
        self.clock = clock

    def on_save(self, args, state, control, **kwargs):
        time.sleep(SAVE_S)
        self.clock.ns += round(SAVE_S * 1e9)


class SaveAt(TrainerCallback):
    """The Trainer saves at these steps (its own ``should_save``), besides ``save_steps``."""

    def __init__(self, steps: range) -> None:
        self.steps = steps

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.steps:
            control.should_save = True


def after_resume_spans(traces: Path) -> list[dict]:
    return [s for s in spans_in(traces) if s["name"] == "ckpt.after_resume"]


@pytest.fixture
def clock(monkeypatch) -> StepTime:
    from ckptprof.integrations import health

    clock = StepTime()
    monkeypatch.setattr(health, "time", clock)  # the pace is the subject, not the machine's
    return clock


def test_steps_with_a_save_count_on_neither_side_of_the_resume(tmp_path, clock, caplog):
    traces = tmp_path / "traces"
    saving = [CkptProfCallback(trace_dir=traces), Paced(clock, STEP_S), SlowSaves(clock)]
    # before the save: 13 of its 23 timed steps hold a save, 10 do not
    make_trainer(tmp_path, 24, [*saving, SaveAt(range(3, 16))], save_steps=100).train()
    with caplog.at_level(logging.WARNING, logger="ckptprof"):  # a save every other step
        make_trainer(tmp_path, 44, saving, save_steps=2).train(resume_from_checkpoint=True)
    assert not any("slower after the resume" in r.getMessage() for r in caplog.records)
    (span,) = after_resume_spans(traces)
    attrs = span["attributes"]
    assert attrs["ckpt.after_resume.steps"] == HEALTH_STEPS
    assert attrs["ckpt.after_resume.before_save_step_median_s"] == pytest.approx(STEP_S)
    assert attrs["ckpt.after_resume.step_median_s"] == pytest.approx(STEP_S)
    assert attrs["ckpt.after_resume.slowdown"] == pytest.approx(1.0)


def test_a_resume_too_short_to_judge_claims_no_slowdown(tmp_path, clock, caplog):
    traces = tmp_path / "traces"
    steady = [CkptProfCallback(trace_dir=traces), Paced(clock, STEP_S)]
    make_trainer(tmp_path, 20, steady, save_steps=20).train()  # 19 steps before its save
    slow = [CkptProfCallback(trace_dir=traces), Paced(clock, 5 * STEP_S)]
    with caplog.at_level(logging.INFO, logger="ckptprof"):  # 3 steps timed after the resume
        make_trainer(tmp_path, 24, slow).train(resume_from_checkpoint=True)
    messages = [r.getMessage() for r in caplog.records]
    assert not any("slower after the resume" in m for m in messages)
    assert any("speed after the resume not judged: 3 steps" in m for m in messages)
    (span,) = after_resume_spans(traces)
    attrs = span["attributes"]
    assert attrs["ckpt.after_resume.steps"] == 3
    assert "ckpt.after_resume.slowdown" not in attrs
    assert "ckpt.after_resume.before_save_step_median_s" not in attrs
    report = run_cli("report", str(traces)).stdout
    assert "after the resume: median step" in report and "slower after the resume" not in report


def test_the_docs_name_the_window_the_code_uses():
    text = re.sub(r"\s+", " ", DOCS.read_text())
    assert f"time the {HEALTH_STEPS} steps after the resume's first step" in text
    assert f"with fewer than {HEALTH_STEPS} steps on either side" in text


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state.pth"])
def test_a_junk_torch_save_file_is_a_verify_problem_and_the_trainers_error_passes(
    tmp_path, caplog, name
):
    make_trainer(tmp_path, 5, []).train()  # no ckptprof at the save: no record to check
    folder = tmp_path / "checkpoints" / "checkpoint-5"
    (folder / name).write_bytes(b"junk")

    def resume(callbacks):
        shutil.rmtree(tmp_path / "checkpoints" / "checkpoint-6", ignore_errors=True)
        try:
            make_trainer(tmp_path, 6, callbacks).train(resume_from_checkpoint=str(folder))
        except Exception as exc:  # noqa: BLE001 - compared below
            return type(exc), str(exc)
        return None

    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        with_ckptprof = resume([CkptProfCallback(trace_dir=tmp_path / "traces")])
    assert with_ckptprof == resume([]) and with_ckptprof is not None  # the Trainer's own
    expected = f"{folder / name}: 4 bytes, neither a zip archive nor a legacy torch.save pickle"
    assert expected in caplog.text
    (root,) = restores(tmp_path)
    verify = children(spans_in(tmp_path / "traces"), root)["ckpt.verify"]["attributes"]
    assert verify["ckpt.verify.problems"] == 1
    assert verify["ckpt.verify.problem"].startswith(expected)
    assert "torch.save legacy magic" in verify["ckpt.verify.method"]
