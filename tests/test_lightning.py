"""The Lightning callback with real Lightning training on CPU and real checkpoints."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy

from ckptprof.errors import VerifyError
from ckptprof.integrations.base import manifest_path
from ckptprof.integrations.lightning import CkptProf
from tests.conftest import (
    RESTORE_PHASES,
    children,
    linked_story,
    run_cli,
    sigterm_when,
    spans_in,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lightning_resume.py"
sys.path.insert(0, str(EXAMPLE.parent))
from lightning_resume import TinyModel, data  # noqa: E402
from lightning_resume import make_trainer as example_trainer  # noqa: E402


def make_trainer(root: Path, max_steps: int, callback: CkptProf | None, **kw) -> L.Trainer:
    callbacks = [callback] if callback is not None else []
    return example_trainer(root, max_steps, callbacks, checkpoint_dir=root / "ckpt", **kw)


def run_example(directory: Path, phase: str, devices: int = 1, env=None):
    import os

    return subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--dir",
            str(directory),
            "--phase",
            phase,
            "--devices",
            str(devices),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def test_save_then_resume_last_in_a_fresh_process(tmp_path):
    first = run_example(tmp_path, "train")
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_example(tmp_path, "resume")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "ckptprof: RTO" in second.stderr  # the one-line summary after resume
    spans = spans_in(tmp_path / "traces")
    saves = [s for s in spans if s["name"] == "ckpt.save"]
    assert len(saves) >= 4  # every 5 steps + last, in both runs
    save_phases = children(spans, saves[0])
    assert {"ckpt.serialize", "ckpt.write", "ckpt.commit"} <= set(save_phases)
    restores = [s for s in spans if s["name"] == "ckpt.restore"]
    assert len(restores) == 1
    phases = children(spans, restores[0])
    assert set(phases) >= RESTORE_PHASES
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert restores[0]["attributes"]["ckpt.path"] == str(last)
    # torch.load reads every byte once, plus a few zip headers twice
    size = last.stat().st_size
    assert size <= phases["ckpt.fetch"]["attributes"]["ckpt.bytes"] <= size * 1.02
    assert restores[0]["attributes"]["ckpt.framework"] == "lightning"
    assert restores[0]["attributes"]["ckpt.step"] >= 10
    assert Path(manifest_path(str(last))).exists()


def test_resume_restores_the_same_state_and_adds_nothing_to_the_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = TinyModel()
    make_trainer(tmp_path, 10, CkptProf(trace_dir=tmp_path / "t")).fit(model, data())
    ckpt = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    assert not any("CkptProf" in key for key in ckpt.get("callbacks", {}))
    resumed = TinyModel()
    trainer = make_trainer(tmp_path, 10, CkptProf(trace_dir=tmp_path / "t"))
    trainer.fit(resumed, data(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    for key, value in ckpt["state_dict"].items():
        assert torch.equal(resumed.state_dict()[key], value)


def test_corrupted_checkpoint_fails_verify_naming_the_file(tmp_path):
    make_trainer(tmp_path, 5, CkptProf(trace_dir=tmp_path / "t", verify="full")).fit(
        TinyModel(), data()
    )
    path = tmp_path / "ckpt" / "last.ckpt"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x55
    path.write_bytes(bytes(raw))
    trainer = make_trainer(tmp_path, 10, CkptProf(trace_dir=tmp_path / "t", verify="full"))
    with pytest.raises(VerifyError, match="last.ckpt.*does not match"):
        trainer.fit(TinyModel(), data(), ckpt_path=str(path))


def test_teardown_undoes_every_patch_and_attach_is_idempotent(tmp_path):
    callback = CkptProf(trace_dir=tmp_path / "t")
    trainer = make_trainer(tmp_path, 3, callback)
    io = trainer.strategy.checkpoint_io
    before = {n for n in vars(io)}
    trainer.fit(TinyModel(), data())
    assert not callback._inst.attached
    assert {n for n in vars(io)} == before  # no instance attribute left behind
    assert "save_checkpoint" not in vars(trainer)
    assert "resume_end" not in vars(trainer._checkpoint_connector)
    # attaching twice to the same trainer wraps once
    callback.setup(trainer, None, "fit")
    callback.setup(trainer, None, "fit")
    assert len(callback._inst._patches) == 7
    callback.teardown(trainer, None, "fit")
    assert "load_checkpoint" not in vars(io)


def test_unreachable_collector_does_not_break_training(tmp_path, monkeypatch, caplog):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    callback = CkptProf(trace_dir=tmp_path / "t")
    with caplog.at_level(logging.WARNING):
        make_trainer(tmp_path, 10, callback).fit(TinyModel(), data())
        trainer = make_trainer(tmp_path, 12, callback)
        trainer.fit(TinyModel(), data(), ckpt_path="last")
        callback._inst.close()
    assert trainer.global_step == 12
    assert callback.last_restore is not None and callback.last_restore.wall_s > 0
    assert len([r for r in caplog.records if "could not export" in r.message]) == 1


def test_ddp_two_processes_tag_ranks(tmp_path):
    first = run_example(tmp_path, "train", devices=2)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_example(tmp_path, "resume", devices=2)
    assert second.returncode == 0, second.stderr[-3000:]
    restores = [s for s in spans_in(tmp_path / "traces") if s["name"] == "ckpt.restore"]
    assert sorted(r["attributes"]["ckpt.rank"] for r in restores) == [0, 1]
    assert {r["attributes"]["ckpt.world_size"] for r in restores} == {2}
    assert len({r["attributes"]["ckpt.run_id"] for r in restores}) == 1  # one run, two ranks
    assert "slowest rank" in run_cli("report", str(tmp_path / "traces")).stdout


def test_async_checkpoint_io_shows_blocking_and_background_time(tmp_path):
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    callback = CkptProf(trace_dir=tmp_path / "t")
    trainer = make_trainer(tmp_path, 10, callback, plugins=[AsyncCheckpointIO()])
    trainer.fit(TinyModel(), data())
    spans = spans_in(tmp_path / "t")
    saves = [s for s in spans if s["name"] == "ckpt.save"]
    blocking = [s for s in saves if not s["attributes"].get("ckpt.save.background")]
    background = [s for s in saves if s["attributes"].get("ckpt.save.background")]
    assert blocking and len(background) == len(blocking)
    write = children(spans, blocking[0])["ckpt.write"]
    assert write["attributes"]["ckpt.write.async"] is True
    linked = {link["context"]["span_id"] for s in background for link in s["links"]}
    assert {s["context"]["span_id"] for s in blocking} == linked
    bg_write = children(spans, background[0])["ckpt.write"]
    assert bg_write["attributes"]["ckpt.bytes"] > 0
    last = tmp_path / "ckpt" / "last.ckpt"
    assert Path(manifest_path(str(last))).exists()


def test_resume_from_a_checkpoint_on_s3(tmp_path, s3_bucket, s3_env):
    """Saved locally, uploaded to the loopback S3 server, resumed from s3://."""
    make_trainer(tmp_path, 5, CkptProf(trace_dir=tmp_path / "t", verify="full")).fit(
        TinyModel(), data()
    )
    s3_env()
    last = tmp_path / "ckpt" / "last.ckpt"
    for path in (last, Path(manifest_path(str(last)))):
        s3_bucket.client.upload_file(str(path), s3_bucket.name, f"run/{path.name}")
    url = f"s3://{s3_bucket.name}/run/last.ckpt"
    callback = CkptProf(trace_dir=tmp_path / "s3t", verify="full")
    trainer = make_trainer(tmp_path / "again", 8, callback)
    trainer.fit(TinyModel(), data(), ckpt_path=url)
    assert trainer.global_step == 8
    spans = spans_in(tmp_path / "s3t")
    restore = next(s for s in spans if s["name"] == "ckpt.restore")
    assert restore["attributes"]["ckpt.storage.kind"] == "s3"
    phases = children(spans, restore)
    assert set(phases) >= RESTORE_PHASES
    assert phases["ckpt.fetch"]["attributes"]["ckpt.bytes"] == last.stat().st_size
    assert phases["ckpt.verify"]["attributes"]["ckpt.verify.mode"] == "full"


def test_sigterm_mid_training_saves_and_the_resume_links_back(tmp_path):
    """A real SIGTERM: Lightning's own handler ends fit at the batch boundary; ckptprof
    saves last.ckpt there, and the resume in a new process links back."""
    import json
    import os

    from ckptprof.interrupt.record import RECORD_NAME

    flags = ["--dir", str(tmp_path), "--interruptions", "--step-delay", "0.1"]
    command = [sys.executable, str(EXAMPLE), *flags, "--phase", "train", "--steps", "1000"]
    ready = Path(manifest_path(str(tmp_path / "checkpoints" / "last.ckpt")))
    _, stderr = sigterm_when(command, ready)
    assert "emergency save saved" in stderr, stderr[-3000:]
    record = json.loads((tmp_path / "checkpoints" / RECORD_NAME).read_text())
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert record["outcome"] == "saved" and record["checkpoint"] == str(last)
    assert torch.load(last, weights_only=False)["global_step"] == record["checkpoint_step"]
    assert not list((tmp_path / "checkpoints").glob("*.partial*"))
    resume = subprocess.run(
        [sys.executable, str(EXAMPLE), *flags[:3], "--phase", "resume", "--steps", "20"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CKPTPROF_NOTICE_SOURCES": ""},
    )
    assert resume.returncode == 0, resume.stderr[-3000:]
    _, restore = linked_story(spans_in(tmp_path / "traces"))
    attrs = restore["attributes"]
    assert attrs["ckpt.restored_step"] == record["checkpoint_step"]
    assert attrs["ckpt.interruption.steps_lost"] == 0
    assert 0 < attrs["ckpt.interruption.downtime_s"] < attrs["ckpt.interruption.recovery_s"]


class OwnCheckpointingStrategy(SingleDeviceStrategy):
    """Like Lightning's DeepSpeed, FSDP and ModelParallel strategies (which need CUDA):
    restores after setup and reads and writes checkpoints itself, not via CheckpointIO."""

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    def load_checkpoint(self, checkpoint_path, weights_only=None):
        return torch.load(checkpoint_path, map_location="cpu", weights_only=False)

    def save_checkpoint(self, checkpoint, filepath, storage_options=None):
        if self.is_global_zero:
            Path(filepath).parent.mkdir(parents=True, exist_ok=True)
            torch.save(checkpoint, filepath)


def test_strategies_that_checkpoint_themselves_are_traced(tmp_path):
    def strategy():
        return OwnCheckpointingStrategy(device=torch.device("cpu"))

    callback = CkptProf(trace_dir=tmp_path / "t")
    make_trainer(tmp_path, 5, callback, strategy=strategy()).fit(TinyModel(), data())
    last = tmp_path / "ckpt" / "last.ckpt"
    write = callback.last_save.phases["write"]
    assert write.nbytes == last.stat().st_size
    assert Path(manifest_path(str(last))).exists()
    callback = CkptProf(trace_dir=tmp_path / "t")
    trainer = make_trainer(tmp_path, 7, callback, strategy=strategy())
    trainer.fit(TinyModel(), data(), ckpt_path=str(last))
    summary = callback.last_restore
    assert {"deserialize", "reshard", "first_step"} <= set(summary.phases)
    deserialize = summary.phases["deserialize"].attributes
    assert deserialize["ckpt.fused_fetch"] is True
    assert deserialize["ckpt.loader"] == "OwnCheckpointingStrategy.load_checkpoint"
    assert summary.attributes["ckpt.strategy"] == "OwnCheckpointingStrategy"
    assert not callback._inst.attached  # and unwrapped at teardown
    assert "load_checkpoint" not in vars(trainer.strategy)
