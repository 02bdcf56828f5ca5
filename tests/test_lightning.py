"""The Lightning callback with real Lightning training on CPU and real checkpoints."""

from __future__ import annotations

import copy
import itertools
import logging
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy

from ckptprof.errors import VerifyError
from ckptprof.integrations.lightning import CkptProf, LightningInstrumentor
from ckptprof.integrations.patching import is_ours, resolve
from ckptprof.tracing.times import span_ns
from ckptprof.tracing.watchdog import watchdog
from tests.conftest import (
    RESTORE_PHASES,
    assert_memory_recorded,
    children,
    file_record,
    interruption_record_path,
    linked_story,
    ours_in,
    saved_by,
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
        timeout=400,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
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
    before = [s for s in saves if s["start_time"] < restores[0]["start_time"]]
    wrote_last = [s for s in before if s["attributes"]["ckpt.path"] == str(last)]
    newest = max(wrote_last, key=lambda s: s["start_time"])  # the save the resume reads
    assert saved_by(restores[0]) == [newest["context"]["span_id"]]
    step = children(spans, restores[0])["ckpt.first_step"]["attributes"]
    parts = [step[f"ckpt.first_step.{p}_s"] for p in ("setup", "batch", "compute")]
    # Lightning shows no fetch start: its start-up and the batch's fetch are batch_s, from
    # the last load on, so setup_s is exactly nothing; the step itself (forward, backward,
    # the optimizer's step) really runs, so compute_s is time
    setup, batch, compute = parts
    assert setup == 0 and batch > 0 and compute > 0, parts
    assert sum(parts) == pytest.approx(step["ckpt.busy_s"], abs=0.005)
    assert step["ckpt.first_step.batch_idx"] == 10  # Lightning resumed mid-epoch
    # the file is brought into the page cache once, then torch.load reads it from there:
    # the file as the save it resumed from wrote it (the second run saves last.ckpt again,
    # and its size may differ by the archive's padding)
    written = children(spans, newest)["ckpt.write"]["attributes"]["ckpt.bytes"]
    assert phases["ckpt.fetch"]["attributes"]["ckpt.bytes"] == written
    size = last.stat().st_size
    assert phases["ckpt.verify"]["attributes"]["ckpt.verify.method"] == "record size"
    assert restores[0]["attributes"]["ckpt.framework"] == "lightning"
    assert_memory_recorded(restores[0])
    assert restores[0]["attributes"]["ckpt.step"] >= 10
    assert file_record(last)["files"]["last.ckpt"]["size"] == size
    assert ours_in(tmp_path / "checkpoints") == []  # the records live in the state location


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


def _logged(root: Path, run: str) -> list[dict[str, str]]:
    import csv

    with open(root / run / "version_0" / "metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def test_rto_and_phases_reach_the_trainers_loggers(tmp_path, caplog):
    from lightning.pytorch.loggers import CSVLogger

    caplog.set_level(logging.INFO, logger="ckptprof")

    def fit(steps: int, run: str, resume: bool, **options):
        trainer = make_trainer(
            tmp_path,
            steps,
            CkptProf(trace_dir=tmp_path / "t", **options),
            logger=CSVLogger(tmp_path, name=run),
        )
        last = str(tmp_path / "ckpt" / "last.ckpt") if resume else None
        trainer.fit(TinyModel(), data(), ckpt_path=last)
        return trainer

    fit(10, "first", resume=False)
    saves = [row for row in _logged(tmp_path, "first") if row.get("ckptprof/save_s")]
    assert [int(row["step"]) for row in saves][:2] == [5, 5]  # every-5 and last, at step 5
    assert all(float(row["ckptprof/save/write_s"]) > 0 for row in saves)
    trainer = fit(12, "resumed", resume=True)
    rows = [row for row in _logged(tmp_path, "resumed") if row.get("ckptprof/restore_s")]
    assert len(rows) == 1 and int(rows[0]["step"]) == 11  # logged after the first step
    prefix = "ckptprof/restore/"
    phases = {k.removeprefix(prefix) for k, v in rows[0].items() if k.startswith(prefix) and v}
    assert {"fetch_s", "deserialize_s", "reshard_s", "first_step_s", "fetch_bytes"} <= phases
    assert float(rows[0]["ckptprof/restore_s"]) >= float(rows[0]["ckptprof/restore/fetch_s"])
    # the goodput so far at the resume (computed off the loop, logged once ready): the
    # first fit's run, nothing lost (it saved its last step)
    [goodput] = [row for row in _logged(tmp_path, "resumed") if row.get("ckptprof/goodput")]
    assert 0 < float(goodput["ckptprof/goodput"]) < 1
    assert float(goodput["ckptprof/goodput/lost_work_s"]) == 0
    assert int(goodput["step"]) >= 11
    assert not any(key.startswith("ckptprof") for key in trainer.callback_metrics)
    (summary,) = [r for r in caplog.records if r.getMessage().startswith("ckptprof: RTO")]
    assert summary.levelno == logging.INFO  # a success is not a warning
    fit(14, "quiet", resume=True, log_metrics=False)  # the tiny model logs nothing itself
    assert not (tmp_path / "quiet" / "version_0" / "metrics.csv").exists()


def test_a_corrupt_checkpoint_is_named_and_refused_only_when_strict(tmp_path, caplog):
    make_trainer(tmp_path, 5, CkptProf(trace_dir=tmp_path / "t", verify="full")).fit(
        TinyModel(), data()
    )
    path = tmp_path / "ckpt" / "last.ckpt"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x55
    path.write_bytes(bytes(raw))
    strict = CkptProf(trace_dir=tmp_path / "t", verify="full", strict=True)
    with pytest.raises(VerifyError, match="last.ckpt: xxh3 .* does not match"):
        make_trainer(tmp_path, 10, strict).fit(TinyModel(), data(), ckpt_path=str(path))
    # by default Lightning decides: it loads the file as it would without ckptprof
    callback = CkptProf(trace_dir=tmp_path / "t", verify="full")
    trainer = make_trainer(tmp_path, 10, callback)
    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        trainer.fit(TinyModel(), data(), ckpt_path=str(path))
    assert trainer.global_step == 10
    assert f"{path}: xxh3" in caplog.text and "strict=True" in caplog.text
    verify = callback.last_restore.phases["verify"].attributes
    assert verify["ckpt.verify.problems"] == 1 and str(path) in verify["ckpt.verify.problem"]


def test_without_a_record_verify_uses_the_zip_directory(tmp_path, caplog):
    make_trainer(tmp_path, 5, None).fit(TinyModel(), data())  # saved without ckptprof
    path = tmp_path / "ckpt" / "last.ckpt"
    callback = CkptProf(trace_dir=tmp_path / "t")
    make_trainer(tmp_path, 6, callback).fit(TinyModel(), data(), ckpt_path=str(path))
    verify = callback.last_restore.phases["verify"].attributes
    assert verify["ckpt.verify.method"] == "zip central directory"
    assert "ckpt.verify.problems" not in verify


def test_teardown_undoes_every_patch_and_attach_is_idempotent(tmp_path):
    callback = CkptProf(trace_dir=tmp_path / "t")
    trainer = make_trainer(tmp_path, 3, callback)
    strategy = trainer.strategy
    before = dict(vars(strategy))
    trainer.fit(TinyModel(), data())
    assert not callback._instrumentor.patcher.attached
    assert set(vars(strategy)) == set(before)  # no instance attribute left behind
    assert "save_checkpoint" not in vars(trainer)
    # attaching twice to the same trainer wraps once
    callback.setup(trainer, None, "fit")
    callback.setup(trainer, None, "fit")
    assert len(callback._instrumentor.patcher.layers) == 6
    assert len([v for v in vars(strategy).values() if hasattr(v, "__ckptprof_layer__")]) == 5
    callback.teardown(trainer, None, "fit")
    assert "load_checkpoint" not in vars(strategy)


@pytest.mark.slow
def test_unreachable_collector_does_not_break_training(tmp_path, monkeypatch, caplog):
    from tests.test_export import refused_port

    callback = CkptProf(trace_dir=tmp_path / "t")
    with refused_port() as port, caplog.at_level(logging.WARNING):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        make_trainer(tmp_path, 10, callback).fit(TinyModel(), data())
        trainer = make_trainer(tmp_path, 12, callback)
        trainer.fit(TinyModel(), data(), ckpt_path="last")
    assert trainer.global_step == 12
    assert callback.last_restore is not None and callback.last_restore.wall_s > 0
    assert len([r for r in caplog.records if "could not export" in r.message]) == 1


def test_a_presigned_url_resumes_and_its_secrets_reach_no_span_nor_log(tmp_path, caplog):
    """``fit(ckpt_path=<presigned http URL>)`` (served on 127.0.0.1): Lightning reads it,
    and the span names the object without its signature or credential."""
    import functools
    import http.server

    make_trainer(tmp_path, 5, None).fit(TinyModel(), data())

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(tmp_path / "ckpt"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    where = f"127.0.0.1:{server.server_port}/last.ckpt"
    url = f"http://{where}?X-Amz-Credential=AKIASECRET&X-Amz-Signature=SIGSECRET"
    callback = CkptProf(trace_dir=tmp_path / "t")
    try:
        with caplog.at_level(logging.DEBUG, logger="ckptprof"):
            trainer = make_trainer(tmp_path / "again", 8, callback)
            trainer.fit(TinyModel(), data(), ckpt_path=url)
    finally:
        server.shutdown()
        server.server_close()
    assert trainer.global_step == 8
    restore = next(s for s in spans_in(tmp_path / "t") if s["name"] == "ckpt.restore")
    assert restore["attributes"]["ckpt.path"] == f"http://{where}"
    written = "".join(p.read_text() for p in (tmp_path / "t").rglob("*") if p.is_file())
    logged = "".join(r.getMessage() for r in caplog.records if r.name == "ckptprof")
    assert "RTO" in logged  # ckptprof's own line (Lightning's own log is its business)
    for secret in ("AKIASECRET", "SIGSECRET"):
        assert secret not in written and secret not in logged


# DDP with two processes: tests/test_guest.py runs it with and without ckptprof and
# checks the rank tags.


def test_async_checkpoint_io_shows_blocking_and_background_time(tmp_path):
    """Each background write is linked to the save that queued it. A writer slower than
    the training (as on a busy machine) has last.ckpt queued twice before it writes the
    first: the second save's link went to the first's write, and the second's to none."""
    from lightning.fabric.plugins.io import TorchCheckpointIO
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    class SlowIO(TorchCheckpointIO):
        def save_checkpoint(self, *args, **kwargs):
            time.sleep(0.5)
            return super().save_checkpoint(*args, **kwargs)

    callback = CkptProf(trace_dir=tmp_path / "t")
    trainer = make_trainer(tmp_path, 10, callback, plugins=[AsyncCheckpointIO(SlowIO())])
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
    assert file_record(last)["files"]["last.ckpt"]["size"] == last.stat().st_size


def test_resume_from_s3_is_left_to_lightning(tmp_path, s3_bucket, s3_env):
    """Lightning reads s3:// through fsspec (s3fs); ckptprof times that read as one fused
    interval and never reads the object itself, so the job behaves as it would without
    ckptprof: here, without s3fs installed, the same error either way."""
    make_trainer(tmp_path, 5, None).fit(TinyModel(), data())
    s3_env()
    last = tmp_path / "ckpt" / "last.ckpt"
    s3_bucket.client.upload_file(str(last), s3_bucket.name, "run/last.ckpt")
    url = f"s3://{s3_bucket.name}/run/last.ckpt"

    def resume(callbacks):
        trainer = make_trainer(tmp_path / "again", 8, callbacks[0] if callbacks else None)
        try:
            trainer.fit(TinyModel(), data(), ckpt_path=url)
        except Exception as exc:  # noqa: BLE001 - compared below
            return type(exc), str(exc), trainer.global_step
        return None, "", trainer.global_step

    callback = CkptProf(trace_dir=tmp_path / "s3t")
    assert resume([callback]) == resume([])
    restore = next(s for s in spans_in(tmp_path / "s3t") if s["name"] == "ckpt.restore")
    assert restore["attributes"]["ckpt.storage.kind"] == "s3"
    phases = children(spans_in(tmp_path / "s3t"), restore)
    fused = phases["ckpt.deserialize"]["attributes"]["ckpt.fused"]
    assert fused.startswith("fetch+deserialize (") and fused.endswith(".load_checkpoint)")


def test_records_on_s3_are_found_by_a_resume_elsewhere(tmp_path, s3_bucket, s3_env):
    """state_dir on shared storage: a job resumed on another machine (here another local
    folder for everything but the checkpoint) still verifies against the save's record."""
    s3_env()
    state = f"s3://{s3_bucket.name}/ckptprof-state"
    make_trainer(tmp_path, 5, CkptProf(trace_dir=tmp_path / "t", state_dir=state)).fit(
        TinyModel(), data()
    )
    keys = [o["Key"] for o in s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name)["Contents"]]
    assert any(
        k.startswith("ckptprof-state/") and k.endswith("last.ckpt.ckptprof.json") for k in keys
    )
    assert ours_in(tmp_path / "ckpt") == []
    callback = CkptProf(trace_dir=tmp_path / "t2", state_dir=state)
    trainer = make_trainer(tmp_path, 6, callback)
    trainer.fit(TinyModel(), data(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert callback.last_restore.phases["verify"].attributes["ckpt.verify.method"] == "record size"


def test_records_beside_the_checkpoints_only_when_asked(tmp_path):
    callback = CkptProf(trace_dir=tmp_path / "t", state_dir="beside")
    make_trainer(tmp_path, 5, callback).fit(TinyModel(), data())
    assert (tmp_path / "ckpt" / "last.ckpt.ckptprof.json").exists()


@pytest.mark.slow
def test_sigterm_mid_training_saves_and_the_resume_links_back(tmp_path):
    """A real SIGTERM: Lightning's own handler ends fit at the batch boundary; ckptprof
    saves last.ckpt there, and the resume in a new process links back."""
    import json
    import os

    flags = ["--dir", str(tmp_path), "--interruptions", "--step-delay", "0.1"]
    command = [sys.executable, str(EXAMPLE), *flags, "--phase", "train", "--steps", "1000"]
    checkpoints = tmp_path / "checkpoints"
    ready = checkpoints / "epoch=0-step=5.ckpt"
    _, stderr = sigterm_when(command, ready)
    assert "emergency save saved" in stderr, stderr[-3000:]
    record = json.loads(interruption_record_path(checkpoints).read_text())
    last = checkpoints / "last.ckpt"
    assert ours_in(checkpoints) == []
    assert record["outcome"] == "saved" and record["checkpoint"] == str(last)
    assert torch.load(last, weights_only=False)["global_step"] == record["checkpoint_step"]
    assert not list(checkpoints.glob("*.partial*"))
    assert file_record(last)["files"]["last.ckpt"]["size"] == last.stat().st_size
    resume = subprocess.run(
        [sys.executable, str(EXAMPLE), *flags[:3], "--phase", "resume", "--steps", "20"],
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "CKPTPROF_NOTICE_SOURCES": ""},
    )
    assert resume.returncode == 0, resume.stderr[-3000:]
    _, restore = linked_story(spans_in(tmp_path / "traces"))
    attrs = restore["attributes"]
    assert attrs["ckpt.restored_step"] == record["checkpoint_step"]
    assert attrs["ckpt.interruption.steps_lost"] == 0
    notice_to_start = attrs["ckpt.interruption.notice_to_start_s"]
    assert 0 < notice_to_start < attrs["ckpt.interruption.recovery_s"]


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
    assert file_record(last) is not None
    callback = CkptProf(trace_dir=tmp_path / "t")
    trainer = make_trainer(tmp_path, 7, callback, strategy=strategy())
    trainer.fit(TinyModel(), data(), ckpt_path=str(last))
    summary = callback.last_restore
    assert set(summary.phases) >= {p[5:] for p in RESTORE_PHASES}
    deserialize = summary.phases["deserialize"].attributes
    assert deserialize["ckpt.loader"] == "OwnCheckpointingStrategy.load_checkpoint"
    assert summary.phases["fetch"].nbytes == last.stat().st_size  # a file: fetched first
    assert summary.attributes["ckpt.strategy"] == "OwnCheckpointingStrategy"
    assert not callback._instrumentor.patcher.attached  # and unwrapped at teardown
    assert "load_checkpoint" not in vars(trainer.strategy)


@pytest.mark.slow
def test_an_unwritable_state_dir_is_named_once_and_training_goes_on(tmp_path, monkeypatch, caplog):
    """Once, the only output was `ckptprof: internal error in commit ignored:
    PermissionError(13, 'Permission denied')`."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # root passes permission checks; this fails for all
    monkeypatch.setenv("CKPTPROF_STATE_DIR", str(blocker / "state"))
    torch.manual_seed(0)
    model = TinyModel()
    trainer = make_trainer(tmp_path, 10, CkptProf(trace_dir=tmp_path / "t"))
    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        trainer.fit(model, data())
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("ckptprof")]
    named = [m for m in ours if "cannot write its records to" in m]
    assert len(named) == 1, ours  # once, however many saves
    assert str(blocker / "state") in named[0] and "CKPTPROF_STATE_DIR" in named[0]
    assert "Training goes on" in named[0]
    assert not any("internal error" in m for m in ours)
    assert trainer.global_step == 10  # the training went on to its end
    assert (tmp_path / "ckpt" / "last.ckpt").exists()  # the job's own checkpoints are there


# ---------------------------------------------------------------------- review fixes


class SavesInsideTheSave(L.Callback):
    """A save inside the first save, as Lightning's SLURM SIGUSR1 requeue handler
    (``trainer.save_checkpoint``) firing while the trainer saves, or a hook that saves."""

    def __init__(self, path: Path) -> None:
        self.path, self.done = path, False

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if not self.done:
            self.done = True
            trainer.save_checkpoint(self.path)


def test_a_save_inside_a_save_is_its_own_span_and_nothing_stays_open(tmp_path):
    """Once the inner save ended the outer one: the outer span was never exported, and
    after fit() the watchdog thread went on watching it, logging a stalled save."""
    callback = CkptProf(trace_dir=tmp_path / "t")
    inner = tmp_path / "hpc_ckpt_1.ckpt"
    trainer = make_trainer(tmp_path, 5, callback)
    trainer.callbacks.append(SavesInsideTheSave(inner))
    trainer.fit(TinyModel(), data())
    assert watchdog().watched() == []
    deadline = time.monotonic() + 5
    while "ckptprof-watchdog" in {t.name for t in threading.enumerate()}:
        assert time.monotonic() < deadline, "the watchdog thread outlived fit()"
        time.sleep(0.05)
    spans = spans_in(tmp_path / "t")
    saves = {s["attributes"]["ckpt.path"]: s for s in spans if s["name"] == "ckpt.save"}
    outer = saves[str(tmp_path / "ckpt" / "epoch=0-step=5.ckpt")]
    assert str(inner) in saves and inner.exists()
    assert {"ckpt.serialize", "ckpt.write", "ckpt.commit"} <= set(children(spans, outer))
    assert {"ckpt.write", "ckpt.commit"} <= set(children(spans, saves[str(inner)]))
    when = {edge: span_ns(saves[str(inner)][edge]) for edge in ("start_time", "end_time")}
    assert span_ns(outer["start_time"]) <= when["start_time"] <= when["end_time"]
    assert when["end_time"] <= span_ns(outer["end_time"])  # the inner save inside the outer
    assert callback._instrumentor.session.save_op is None


def _namespaces(trainer) -> dict[str, object]:
    """The instance attribute (or none) of every method in the patch table."""
    return {
        target.label: vars(resolve(trainer, target.owner)).get(target.name, "(absent)")
        for target in LightningInstrumentor.targets
    }


def _assert_as_before(trainer, before: dict[str, object]) -> None:
    after = _namespaces(trainer)
    assert all(after[label] is value for label, value in before.items()), after
    for owner in {target.owner for target in LightningInstrumentor.targets}:
        assert not [v for v in vars(resolve(trainer, owner)).values() if is_ours(v)]


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_stacked_instrumentors_come_off_in_any_order(tmp_path, order):
    """Removed in placement order, the upper layer put back the lower, dead one: the
    objects kept ckptprof's attributes, one more dead layer per run."""
    trainer = make_trainer(tmp_path, 3, None)
    own = trainer.strategy.remove_checkpoint  # one attribute the user placed on the instance
    trainer.strategy.remove_checkpoint = own
    before = _namespaces(trainer)
    stacked = [LightningInstrumentor(trace_dir=tmp_path / "t") for _ in range(3)]
    for instrumentor in stacked:
        instrumentor.instrument(trainer)
    for target in LightningInstrumentor.targets:
        assert is_ours(vars(resolve(trainer, target.owner))[target.name]), target.label
    for index in order:
        stacked[index].uninstrument()
    _assert_as_before(trainer, before)
    assert vars(trainer.strategy)["remove_checkpoint"] is own


def test_two_callbacks_on_one_trainer_both_trace_and_leave_nothing(tmp_path):
    first, second = CkptProf(trace_dir=tmp_path / "a"), CkptProf(trace_dir=tmp_path / "b")
    trainer = example_trainer(tmp_path, 5, [first, second], checkpoint_dir=tmp_path / "ckpt")
    before = _namespaces(trainer)
    trainer.fit(TinyModel(), data())
    _assert_as_before(trainer, before)
    trainer.fit_loop.epoch_loop.max_steps = 8
    trainer.fit(TinyModel(), data(), ckpt_path="last")  # the same trainer again
    _assert_as_before(trainer, before)
    assert trainer.global_step == 8
    for callback in (first, second):
        assert callback.last_save is not None and callback.last_restore is not None


def test_copies_of_a_traced_trainer_are_as_without_ckptprof(tmp_path):
    """Every patched attribute of every framework object: a deep copy or an unpickled
    trainer has its own methods, never a wrapper that calls into the original."""
    callback = CkptProf(trace_dir=tmp_path / "t")
    trainer = make_trainer(tmp_path, 3, callback)
    callback.setup(trainer, None, "fit")
    try:
        placed = {(id(layer.obj), layer.name) for layer in callback._instrumentor.patcher.layers}
        targets = LightningInstrumentor.targets
        assert placed == {(id(resolve(trainer, t.owner)), t.name) for t in targets}
        for copy_of in (copy.deepcopy, lambda obj: pickle.loads(pickle.dumps(obj))):
            copied = copy_of(trainer)
            for target in targets:
                obj, twin = resolve(trainer, target.owner), resolve(copied, target.owner)
                assert is_ours(vars(obj)[target.name])  # the original's layer stays
                method = getattr(twin, target.name)
                assert not hasattr(method, "__ckptprof_layer__"), target.label
                assert method.__self__ is twin, target.label
                assert method.__func__ is getattr(type(obj), target.name), target.label
        copied.fit(TinyModel(), data())  # trains, saves, untraced: the original's session
        assert callback.last_save is None
    finally:
        callback.teardown(trainer, None, "fit")


def test_with_gradient_accumulation_the_first_step_is_the_first_optimizer_step(tmp_path):
    """first_step ended at the first micro-batch's end, before any optimizer step (its
    ckpt.step was the restored step); a notice was looked at on every micro-batch."""
    accumulate = 4
    first = make_trainer(tmp_path, 2, CkptProf(trace_dir=tmp_path / "t"), accumulate_grad_batches=4)
    first.fit(TinyModel(), data())
    callback = CkptProf(trace_dir=tmp_path / "t", interruptions=True)
    restore_open, noticed = [], []

    class Watch(L.Callback):
        def on_train_start(self, trainer, pl_module):
            guard = callback._instrumentor.interruptions
            step_end = guard.step_end
            guard.step_end = lambda step: (noticed.append(step), step_end(step))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            restore_open.append(callback._instrumentor.session.restore_op is not None)

    trainer = make_trainer(tmp_path, 4, callback, accumulate_grad_batches=accumulate)
    trainer.callbacks.append(Watch())
    trainer.fit(TinyModel(), data(), ckpt_path="last")
    restore = callback.last_restore
    assert restore.attributes["ckpt.restored_step"] == 2
    assert restore.attributes["ckpt.step"] == 3  # one optimizer step after the restored one
    assert restore_open[:accumulate] == [True] * (accumulate - 1) + [False]
    assert noticed == [3, 4]  # once per optimizer step, as on HF and DeepSpeed


class _SeesTheRestore(L.Callback):
    """Records, as each evaluation batch starts, whether a restore is still open."""

    def __init__(self, traced: CkptProf) -> None:
        self.traced, self.open = traced, []

    def _batch(self, *_args, **_kw) -> None:
        self.open.append(self.traced._instrumentor.session.restore_op is not None)

    on_validation_batch_start = on_test_batch_start = on_predict_batch_start = _batch


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_an_evaluation_from_a_checkpoint_ends_its_restore_at_the_state(stage, tmp_path):
    """``trainer.validate(ckpt_path=…)`` and its kin run no training step: the restore
    ends before the first evaluation batch (it stayed open through the evaluation, its
    wall time the evaluation's and its watchdog naming a stalled restore), no first step."""
    make_trainer(tmp_path, 3, None).fit(TinyModel(), data())
    [ckpt] = list((tmp_path / "ckpt").glob("*.ckpt"))
    callback = CkptProf(trace_dir=tmp_path / "t")
    seen = _SeesTheRestore(callback)
    trainer = make_trainer(tmp_path / "eval", 3, callback)
    trainer.callbacks.append(seen)
    model = TinyModel()
    model.validation_step = model.test_step = model.training_step
    model.predict_step = lambda batch, batch_idx: model.net(batch[0])
    getattr(trainer, stage)(model, data(32), ckpt_path=str(ckpt))
    assert seen.open and not any(seen.open)
    assert watchdog().watched() == []
    [restore] = [s for s in spans_in(tmp_path / "t") if s["name"] == "ckpt.restore"]
    phases = set(children(spans_in(tmp_path / "t"), restore))
    assert "ckpt.deserialize" in phases and "ckpt.first_step" not in phases


@pytest.mark.parametrize("deadline_s", [30, 0.2])
def test_an_emergency_save_through_async_io_is_written_before_it_is_moved(deadline_s, tmp_path):
    """With ``AsyncCheckpointIO`` the save only queues the write: the emergency save moved
    a ``last.ckpt.partial`` not written yet (recording a failure, and leaving the file in
    the checkpoint folder). A write that does not end by the deadline is never moved over
    the last checkpoint; it is removed once written."""
    import json

    from lightning.fabric.plugins.io import TorchCheckpointIO
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    from ckptprof.interrupt.notice import Notice

    class SlowIO(TorchCheckpointIO):
        def save_checkpoint(self, *args, **kwargs):
            time.sleep(0.5)
            return super().save_checkpoint(*args, **kwargs)

    callback = CkptProf(trace_dir=tmp_path / "t", interruptions=True)

    class Notify(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 6:  # after the step-5 saves (last.ckpt), queued
                now = time.time_ns()
                guard = callback._instrumentor.interruptions
                guard.watcher.inject(Notice("simulated", now, now + int(deadline_s * 1e9)))

    trainer = make_trainer(tmp_path, 10, callback, plugins=[AsyncCheckpointIO(SlowIO())])
    trainer.callbacks.insert(0, Notify())
    trainer.fit(TinyModel(), data())
    saved = deadline_s > 1  # the writer takes 0.5 s a file, two files queued before
    last = tmp_path / "ckpt" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == (6 if saved else 5)
    assert not list((tmp_path / "ckpt").glob("*.partial"))
    record = json.loads(interruption_record_path(tmp_path / "ckpt").read_text())
    assert (record["outcome"] == "saved") == saved, record
    spans = spans_in(tmp_path / "t")
    saves = [s for s in spans if s["name"] == "ckpt.save"]
    background = [s for s in saves if s["attributes"].get("ckpt.save.background")]
    assert len(background) == len(saves) - len(background) > 0
    assert all(s["status"]["status_code"] != "ERROR" for s in background)


def test_a_write_queued_when_training_fails_is_traced_before_ckptprof_closes(tmp_path, caplog):
    """Lightning waits for AsyncCheckpointIO's writes in its teardown, after on_exception,
    where ckptprof closed: a write queued just before the error had no span."""
    from lightning.fabric.plugins.io import TorchCheckpointIO
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    class SlowIO(TorchCheckpointIO):
        def save_checkpoint(self, *args, **kwargs):
            time.sleep(0.5)
            return super().save_checkpoint(*args, **kwargs)

    class Fail(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 2:
                trainer.save_checkpoint(tmp_path / "ckpt" / "before-error.ckpt")
                raise RuntimeError("the job's own error")

    callback = CkptProf(trace_dir=tmp_path / "t")
    trainer = make_trainer(tmp_path, 10, callback, plugins=[AsyncCheckpointIO(SlowIO())])
    trainer.callbacks.append(Fail())
    with caplog.at_level(logging.INFO, logger="ckptprof"), pytest.raises(RuntimeError, match="own"):
        trainer.fit(TinyModel(), data())
    assert (tmp_path / "ckpt" / "before-error.ckpt").is_file()
    spans = spans_in(tmp_path / "t")
    [written] = [
        s
        for s in spans
        if s["name"] == "ckpt.save"
        and s["attributes"].get("ckpt.save.background")
        and s["attributes"]["ckpt.path"].endswith("before-error.ckpt")
    ]
    assert written["status"]["status_code"] != "ERROR"
    assert "waiting up to 120 s for 1 background checkpoint write(s)" in caplog.text
