"""The Hugging Face Trainer callback with the real Trainer training a tiny Llama on CPU."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import pickle
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from transformers import Trainer, TrainerCallback

from ckptprof.cli import main
from ckptprof.errors import VerifyError
from ckptprof.integrations.patching import is_ours, resolve
from ckptprof.integrations.transformers import CkptProfCallback, instrument, uninstrument
from ckptprof.tracing.pieces import JOIN_GAP_NS
from ckptprof.tracing.times import span_ns
from tests.conftest import (
    RESTORE_PHASES,
    assert_memory_recorded,
    children,
    folder_record,
    folder_record_path,
    interruption_record_path,
    linked_story,
    ours_in,
    run_cli,
    saved_by,
    sigterm_when,
    spans_in,
)
from tests.test_export import collector, received_spans

pytestmark = pytest.mark.slow  # real training jobs

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hf_trainer_resume.py"
sys.path.insert(0, str(EXAMPLE.parent))
from hf_trainer_resume import make_trainer  # noqa: E402

READ_AT_RESUME = ["model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"]


def run_example(directory: Path, *flags: str, nproc: int = 1) -> subprocess.CompletedProcess:
    launcher = [sys.executable]
    if nproc > 1:
        # --standalone: the rendezvous and the workers' store take ports the kernel gives
        # them as they bind (no port picked, released and raced for by other processes)
        launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
        launcher += ["--standalone", "--local-addr", "127.0.0.1"]
    return subprocess.run(
        [*launcher, str(EXAMPLE), "--dir", str(directory), *flags],
        capture_output=True,
        text=True,
        timeout=270,  # a test launches two: both within pytest's own 600 s
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )


def traced(directory: Path, max_steps: int, **kw) -> tuple[Trainer, CkptProfCallback]:
    options = {k: kw.pop(k) for k in ("verify", "strict") if k in kw}
    callback = CkptProfCallback(trace_dir=directory / "traces", **options)
    return make_trainer(directory, max_steps, [callback], **kw), callback


def restores(directory: Path) -> list[dict]:
    return [s for s in spans_in(directory / "traces") if s["name"] == "ckpt.restore"]


def test_save_then_resume_last_in_a_fresh_process(tmp_path):
    first = run_example(tmp_path, "--phase", "train")
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_example(tmp_path, "--phase", "resume")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "ckptprof: RTO" in second.stderr  # the one-line summary after resume
    spans = spans_in(tmp_path / "traces")
    (restore,) = [s for s in spans if s["name"] == "ckpt.restore"]
    folder = tmp_path / "checkpoints" / "checkpoint-10"  # resume_from_checkpoint=True: the last
    assert restore["attributes"]["ckpt.path"] == str(folder)
    assert restore["attributes"]["ckpt.framework"] == "transformers"
    assert restore["attributes"]["ckpt.format"] == "safetensors"
    assert restore["attributes"]["ckpt.step"] == 11
    assert_memory_recorded(restore)
    phases = children(spans, restore)
    assert set(phases) >= RESTORE_PHASES
    fetch = phases["ckpt.fetch"]["attributes"]
    read = [*READ_AT_RESUME, "trainer_state.json"]
    assert fetch["ckpt.bytes"] == sum((folder / n).stat().st_size for n in read)
    assert fetch["ckpt.files"] == len(read)
    assert phases["ckpt.verify"]["attributes"]["ckpt.verify.mode"] == "size"
    saves = [s for s in spans if s["name"] == "ckpt.save"]
    assert len(saves) == 3  # steps 5 and 10, then 15
    (save,) = [s for s in saves if s["attributes"]["ckpt.path"] == str(folder)]
    assert saved_by(restore) == [save["context"]["span_id"]]  # save → restore, one story
    save_phases = children(spans, save)
    assert {"ckpt.serialize", "ckpt.write", "ckpt.commit"} <= set(save_phases)
    write = save_phases["ckpt.write"]["attributes"]
    for group in ("model", "optimizer", "rng", "state"):
        assert write[f"ckpt.write.{group}_bytes"] > 0
    written = {p.name: p.stat().st_size for p in folder.iterdir()}
    assert write["ckpt.bytes"] == sum(written.values())
    manifest = folder_record(folder)
    assert {n: e["size"] for n, e in manifest["files"].items()} == written
    assert ours_in(tmp_path / "checkpoints") == []  # the records live in the state location


def test_checkpoint_bytes_and_training_are_the_same_with_and_without_ckptprof(tmp_path):
    def digests(folder: Path) -> dict[str, str]:
        return {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.iterdir()
            if p.name != "training_args.bin"  # holds output_dir
        }

    plain = make_trainer(tmp_path / "plain", 10, [])
    plain.train()
    make_trainer(tmp_path / "plain", 15, []).train(resume_from_checkpoint=True)
    trainer, _ = traced(tmp_path / "traced", 10)
    trainer.train()
    traced(tmp_path / "traced", 15)[0].train(resume_from_checkpoint=True)
    for step in (5, 10, 15):
        folder = f"checkpoints/checkpoint-{step}"
        assert digests(tmp_path / "traced" / folder) == digests(tmp_path / "plain" / folder)


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files under ``log_dir``, read back with
    TensorBoard's own reader: (step, value) per tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[tuple[int, float]]] = {}
    for folder in sorted({events.parent for events in log_dir.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:  # the integration files training logs under train/
            name = tag.removeprefix("train/")
            scalars.setdefault(name, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return scalars


def test_rto_and_phases_reach_report_to_without_changing_the_checkpoint(tmp_path, capsys):
    from transformers import TrainerCallback

    class Events(TrainerCallback):  # a user's own callback: it sees only the Trainer's events
        def __init__(self) -> None:
            self.seen: list[tuple[str, int]] = []

        def __getattribute__(self, name):
            attr = super().__getattribute__(name)
            if name.startswith("on_"):
                seen = super().__getattribute__("seen")

                def record(args, state, control, **kwargs):
                    seen.append((name, state.global_step))
                    return attr(args, state, control, **kwargs)

                return record
            return attr

    def job(folder: Path, steps: int, traced: bool, **kw) -> tuple[Trainer, Events]:
        user = Events()
        callbacks = [CkptProfCallback(trace_dir=tmp_path / "t", **kw)] if traced else []
        trainer = make_trainer(folder, steps, [*callbacks, user], report_to=["tensorboard"],
                               logging_strategy="steps", logging_steps=4)  # fmt: skip
        return trainer, user

    plain, plain_events = job(tmp_path / "plain", 10, traced=False)
    plain.train()
    traced, traced_events = job(tmp_path / "traced", 10, traced=True)
    traced.train()
    assert traced_events.seen == plain_events.seen  # not one event more, the same order

    def logged(folder: str) -> dict[str, list[tuple[int, float]]]:
        return tensorboard_scalars(tmp_path / folder / "checkpoints" / "runs")

    saves = logged("traced")["ckptprof/save_s"]
    assert [step for step, _ in saves] == [5, 10]
    assert all(value > 0 for _, value in logged("traced")["ckptprof/save/write_s"])
    assert not any(k.startswith("ckptprof") for k in logged("plain"))
    plain, plain_events = job(tmp_path / "plain", 12, traced=False)
    plain.train(resume_from_checkpoint=True)
    resumed, resumed_events = job(tmp_path / "traced", 12, traced=True)
    resumed.train(resume_from_checkpoint=True)
    assert resumed_events.seen == plain_events.seen
    scalars = logged("traced")
    assert [step for step, _ in scalars["ckptprof/restore_s"]] == [11]
    fetch_bytes = [v for _, v in scalars["ckptprof/restore/fetch_bytes"]]
    assert fetch_bytes and fetch_bytes[0] > 0
    for phase in ("fetch", "deserialize", "first_step"):
        assert scalars[f"ckptprof/restore/{phase}_s"][0][1] > 0
    for phase in ("list", "verify", "reshard"):
        assert f"ckptprof/restore/{phase}_s" in scalars
    # the Trainer's own history, saved in trainer_state.json, holds none of it
    assert not any(k.startswith("ckptprof") for entry in resumed.state.log_history for k in entry)
    saved = tmp_path / "traced" / "checkpoints" / "checkpoint-12" / "trainer_state.json"
    state = json.loads(saved.read_text())
    assert not any(k.startswith("ckptprof") for entry in state["log_history"] for k in entry)
    assert "ckptprof/" not in capsys.readouterr().out  # the Trainer's printer stays quiet
    quiet, _ = job(tmp_path / "traced", 14, traced=True, log_metrics=False)
    before = len(logged("traced")["ckptprof/restore_s"])
    quiet.train(resume_from_checkpoint=True)
    after = logged("traced")["ckptprof/restore_s"]
    assert len(after) == before  # log_metrics=False: nothing more


#: one example's read time: long enough that the fast-forward is most of the resume even
#: when the machine is busy (the report's hint needs it above half the RTO)
EXAMPLE_READ_S = 0.05


class SlowStream(torch.utils.data.IterableDataset):
    """A streamed dataset (as with `datasets` streaming): every example costs read time,
    so the Trainer's fast-forward over already-seen batches costs it too. ``read``
    counts the examples it gave."""

    def __init__(self) -> None:
        self.read = 0

    def __iter__(self):
        from hf_trainer_resume import TokenDataset

        ids, i = TokenDataset().ids, 0
        while True:
            time.sleep(EXAMPLE_READ_S)
            self.read += 1
            yield {"input_ids": ids[i % len(ids)], "labels": ids[i % len(ids)]}
            i += 1


def test_first_step_is_split_and_the_data_fast_forward_named(tmp_path):
    def resume(**arguments):
        callback = CkptProfCallback(trace_dir=tmp_path / "traces")
        stream = SlowStream()
        trainer = make_trainer(tmp_path, 12, [callback], train_dataset=stream, **arguments)
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoints" / "checkpoint-10"))
        step = [s for s in spans_in(tmp_path / "traces") if s["name"] == "ckpt.first_step"]
        return step[-1]["attributes"], stream.read

    make_trainer(tmp_path, 10, [], train_dataset=SlowStream()).train()
    skipping, read_skipping = resume()
    assert skipping["ckpt.first_step.skipped_batches"] == 10  # the Trainer's own count
    # the skipped examples' read time alone (sleeps: a floor however busy the machine) is
    # in the first batch's fetch, not in the step's compute
    floor_s = 10 * 4 * EXAMPLE_READ_S
    assert skipping["ckpt.first_step.batch_s"] >= floor_s  # read and thrown away
    parts = sum(skipping[f"ckpt.first_step.{p}_s"] for p in ("setup", "batch", "compute"))
    assert parts == pytest.approx(skipping["ckpt.busy_s"], abs=0.01)
    assert skipping["ckpt.first_step.compute_s"] <= skipping["ckpt.busy_s"] - floor_s + 0.01
    report = run_cli("report", str(tmp_path / "traces")).stdout
    assert "data-fast-forward" in report or "fast-forwarding 10" in report
    assert "ignore_data_skip=True" in report
    direct, read_direct = resume(ignore_data_skip=True)
    assert direct["ckpt.first_step.skipped_batches"] == 0
    # the advice's saving, counted: the direct resume reads none of the 10 batches the
    # fast-forward threw away (how much sooner it is: benchmark material), and its first
    # batch is still measured
    assert read_skipping - read_direct == 10 * 4
    assert direct["ckpt.first_step.batch_s"] >= 4 * EXAMPLE_READ_S


class StepTime:
    """Stands in for the step clock's ``time`` module (integrations/health.py): a step
    lasts exactly what :class:`Paced` adds, however busy the machine. It never runs ahead
    of the real clock (each step also sleeps its pace), so spans keep their order."""

    def __init__(self) -> None:
        self.ns = time.time_ns()

    def time_ns(self) -> int:
        return self.ns


class Paced(TrainerCallback):
    """As the example's SlowSteps (each step takes ``delay`` s longer, standing in for a
    bigger model), and the step clock sees exactly that ``delay`` per step."""

    def __init__(self, clock: StepTime, delay: float) -> None:
        self.clock, self.delay = clock, delay

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.delay)
        self.clock.ns += round(self.delay * 1e9)


def test_training_slower_after_the_resume_is_measured_and_named(tmp_path, caplog, monkeypatch):
    from ckptprof.integrations import health

    clock = StepTime()
    monkeypatch.setattr(health, "time", clock)  # the pace is the subject, not the machine's

    def resume(delay: float, steps: int):
        callbacks = [CkptProfCallback(trace_dir=tmp_path / "traces"), Paced(clock, delay)]
        trainer = make_trainer(tmp_path, steps, callbacks, save_steps=100)  # a save at the end
        trainer.train(resume_from_checkpoint=True)
        after = [s for s in spans_in(tmp_path / "traces") if s["name"] == "ckpt.after_resume"]
        return after[-1]

    callbacks = [CkptProfCallback(trace_dir=tmp_path / "traces"), Paced(clock, 0.05)]
    make_trainer(tmp_path, 12, callbacks, save_steps=100).train()  # 11 steps timed, 1 save
    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        steady = resume(0.05, 23)["attributes"]  # resumed at 12; steps 14..23 are timed
    assert not any("slower after the resume" in r.getMessage() for r in caplog.records)
    assert steady["ckpt.after_resume.steps"] == 10
    assert steady["ckpt.after_resume.before_save_step_median_s"] == pytest.approx(0.05)
    assert steady["ckpt.after_resume.step_median_s"] == pytest.approx(0.05)
    assert steady["ckpt.after_resume.slowdown"] == pytest.approx(1.0)  # as fast as before
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        slow = resume(0.25, 34)  # resumed at 23, the steady run's save
    (restore,) = [s for s in restores(tmp_path) if s["attributes"]["ckpt.restored_step"] == 23]
    assert slow["links"][0]["context"]["span_id"] == restore["context"]["span_id"]
    assert slow["attributes"]["ckpt.after_resume.before_save_step_median_s"] == pytest.approx(0.05)
    assert slow["attributes"]["ckpt.after_resume.slowdown"] == pytest.approx(5.0)  # 0.25 / 0.05
    assert any("slower after the resume" in r.getMessage() for r in caplog.records)
    report = run_cli("report", str(tmp_path / "traces")).stdout
    assert "after the resume: median step" in report and "slower-after-resume" not in report
    assert "slower after the resume" in report


#: what a user's own create_optimizer takes in the resume below (outside every phase)
SLOW_OPTIMIZER_S = 0.4


def build_optimizer_slowly(trainer: Trainer):
    """A user's ``create_optimizer`` (param groups built by hand, say) that takes
    :data:`SLOW_OPTIMIZER_S`: inside the resume, outside every phase ckptprof times."""
    time.sleep(SLOW_OPTIMIZER_S)
    return Trainer.create_optimizer(trainer)


def drawn_widths(page: str, phase: str) -> list[float]:
    """The widths (SVG units) of the bars the HTML timeline draws for ``phase``."""
    group = re.search(rf'<g id="phase-{phase}">(.*?)</g>', page, re.S)
    assert group is not None, f"no {phase} bars in the timeline"
    bars = re.findall(r"M ([\d.]+) [\d.]+\s+L [\d.]+ [\d.]+\s+L ([\d.]+)", group.group(1))
    return [float(right) - float(left) for left, right in bars]


def test_resume_splits_its_phases_names_the_time_outside_them_and_draws_pieces(tmp_path, capsys):
    trainer, _ = traced(tmp_path, 10)
    trainer.train()
    folder = tmp_path / "checkpoints" / "checkpoint-5"
    trainer, callback = traced(tmp_path, 7)
    trainer.create_optimizer = types.MethodType(build_optimizer_slowly, trainer)
    trainer.train(resume_from_checkpoint=str(folder))
    assert trainer.state.global_step == 7
    summary = callback.last_restore
    assert summary is not None and set(summary.phases) >= {p[5:] for p in RESTORE_PHASES}
    assert summary.attributes["ckpt.path"] == str(folder)
    # reshard (load_state_dict) and deserialize never overlap
    reshard, deserialize = summary.phases["reshard"], summary.phases["deserialize"]
    for rs, re_ in reshard.intervals:
        assert all(re_ <= ds or rs >= de for ds, de in deserialize.intervals)
    assert summary.wall_s >= summary.phase_sum_s
    # every second named: the user's slow create_optimizer, by name, with its time
    named = dict(
        zip(summary.attributes["ckpt.outside.functions"],
            summary.attributes["ckpt.outside.function_s"], strict=True)
    )  # fmt: skip
    (ours,) = [n for n in named if n.startswith("build_optimizer_slowly (")]
    assert "test_transformers.py:" in ours
    assert named[ours] == pytest.approx(SLOW_OPTIMIZER_S, abs=0.1)
    # the report says it (--html prints the text report too, and writes the page)
    page_path = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "traces"), "--html", str(page_path)]) == 0
    said = re.search(r"outside any\s+phase: .*?([\d.]+) s in build_optimizer_slowly \(",
                     " ".join(capsys.readouterr().out.split()))  # fmt: skip
    assert said is not None and float(said.group(1)) == pytest.approx(SLOW_OPTIMIZER_S, abs=0.1)
    page = page_path.read_text()
    assert "s in build_optimizer_slowly (" in page
    # the phases interleave (a file fetched, verified, deserialized, the next...): each is
    # recorded as its busy pieces, whose durations add up to the table's busy time
    spans = spans_in(tmp_path / "traces")
    (restore,) = [s for s in spans if s["name"] == "ckpt.restore"]
    phases = {name[5:]: span for name, span in children(spans, restore).items()}
    in_pieces = {}
    for name, span in phases.items():
        mine = [s for s in spans if s["parent_id"] == span["context"]["span_id"]
                and s["name"] == "ckpt.piece"]  # fmt: skip
        durations = [(span_ns(s["end_time"]) - span_ns(s["start_time"])) / 1e9 for s in mine]
        if mine:
            in_pieces[name] = durations
            assert span["attributes"]["ckpt.pieces"] == len(mine) >= 2
            # within rounding: 1 µs a timestamp, and the few µs between two stretches
            # of the phase so close that they are one piece (tracing/pieces.py)
            slack = len(mine) * (2e-6 + JOIN_GAP_NS / 1e9)
            assert sum(durations) == pytest.approx(span["attributes"]["ckpt.busy_s"], abs=slack)
    assert {"fetch", "verify", "deserialize"} <= set(in_pieces)
    # the page's timeline draws those pieces, in proportion to busy time, not the extents
    scale = (
        sum(drawn_widths(page, "first_step")) / phases["first_step"]["attributes"]["ckpt.busy_s"]
    )
    for name, durations in in_pieces.items():
        widths = drawn_widths(page, name)
        assert len(widths) == len(durations), name
        assert sum(widths) / scale == pytest.approx(sum(durations), abs=2e-4), name


def test_sharded_safetensors_fetches_every_shard_and_the_index(tmp_path):
    trainer, _ = traced(tmp_path, 5, max_shard_size="100KB")
    trainer.train()
    folder = tmp_path / "checkpoints" / "checkpoint-5"
    shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
    assert len(shards) > 1 and (folder / "model.safetensors.index.json").exists()
    trainer, callback = traced(tmp_path, 6, max_shard_size="100KB")
    trainer.train(resume_from_checkpoint=True)
    fetch = callback.last_restore.phases["fetch"]
    fetched = {Path(f.path).name for f in fetch.files}
    assert set(shards) | {"model.safetensors.index.json"} <= fetched
    assert callback.last_restore.attributes["ckpt.format"] == "safetensors"


def test_missing_optimizer_is_named_and_refused_only_when_strict(tmp_path, caplog):
    traced(tmp_path, 5)[0].train()
    (tmp_path / "checkpoints" / "checkpoint-5" / "optimizer.pt").unlink()
    trainer, callback = traced(tmp_path, 6, strict=True)
    with pytest.raises(VerifyError, match=r"checkpoint-5/optimizer\.pt: missing"):
        trainer.train(resume_from_checkpoint=True)
    assert callback.last_restore is not None  # the failed restore is traced too
    (root,) = restores(tmp_path)
    assert root["status"]["status_code"] == "ERROR"
    # by default the Trainer decides (it starts a fresh optimizer), and the log says why
    trainer, callback = traced(tmp_path, 6)
    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 6
    assert "checkpoint-5/optimizer.pt: missing, but the save wrote it" in caplog.text
    verify = callback.last_restore.phases["verify"].attributes
    assert verify["ckpt.verify.problems"] == 1


def test_truncated_weights_are_named_and_the_trainers_own_error_passes(tmp_path, caplog):
    traced(tmp_path, 5)[0].train()
    weights = tmp_path / "checkpoints" / "checkpoint-5" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    trainer, _ = traced(tmp_path, 6, strict=True)
    with pytest.raises(VerifyError, match=r"model\.safetensors: \d+ bytes, but the save wrote"):
        trainer.train(resume_from_checkpoint=True)

    def resume(callbacks):
        try:
            make_trainer(tmp_path, 6, callbacks).train(resume_from_checkpoint=True)
        except Exception as exc:  # noqa: BLE001 - compared below
            return type(exc), str(exc)
        return None

    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        with_ckptprof = resume([CkptProfCallback(trace_dir=tmp_path / "traces")])
    assert with_ckptprof == resume([]) and with_ckptprof is not None  # the Trainer's own
    assert f"{weights}: {weights.stat().st_size} bytes, but the save wrote" in caplog.text


def test_corrupt_optimizer_fails_full_strict_verify(tmp_path):
    traced(tmp_path, 5, verify="full")[0].train()
    path = tmp_path / "checkpoints" / "checkpoint-5" / "optimizer.pt"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x55
    path.write_bytes(bytes(raw))
    trainer, _ = traced(tmp_path, 6, verify="full", strict=True)
    with pytest.raises(VerifyError, match=r"optimizer\.pt: xxh3 .* does not match"):
        trainer.train(resume_from_checkpoint=True)


def test_weights_converted_to_shards_after_the_save_resume_as_usual(tmp_path, caplog):
    """The Trainer loads single or sharded weights alike; so does ckptprof's check."""
    from safetensors.torch import load_file, save_file

    traced(tmp_path, 5)[0].train()
    folder = tmp_path / "checkpoints" / "checkpoint-5"
    tensors = load_file(folder / "model.safetensors")
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half]}
    shards["model-00002-of-00002.safetensors"] = names[half:]
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, folder / shard, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: s for s, ks in shards.items() for k in ks}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "model.safetensors").unlink()
    trainer, callback = traced(tmp_path, 6)
    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 6
    assert "missing" not in caplog.text
    verify = callback.last_restore.phases["verify"].attributes
    assert verify["ckpt.verify.weights_converted"] == "model.safetensors"
    assert "safetensors header" in verify["ckpt.verify.method"]  # the shards: no record


def test_rotation_is_its_own_span(tmp_path):
    trainer, callback = traced(tmp_path, 15, save_total_limit=1)
    trainer.train()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["checkpoint-15"]
    rotate = callback.last_save.phases["rotate"]
    assert rotate.attributes["ckpt.rotate.removed"] == 1
    assert rotate.attributes["ckpt.rotate.limit"] == 1


def test_a_push_to_the_hub_is_its_own_interval_not_the_rotations(tmp_path):
    """``push_to_hub``: the upload between the last file group and the rotation is
    ``push`` (it was timed as ``rotate``). The Hub is not reached from a test: the
    Trainer's own upload call is given 0.3 s of work in its place."""
    trainer, callback = traced(tmp_path, 5, save_total_limit=1)
    pushed = []

    def upload(output_dir):  # where Trainer._push_from_checkpoint uploads the folder
        time.sleep(0.3)
        pushed.append(output_dir)

    trainer._push_from_checkpoint = upload
    trainer.args.push_to_hub = True  # after __init__: no Hub repository is made
    trainer.train()
    assert pushed == [str(tmp_path / "checkpoints" / "checkpoint-5")]
    phases = callback.last_save.phases
    assert phases["push"].busy_s >= 0.3
    assert phases["rotate"].busy_s < 0.3


def test_only_this_trainer_is_touched_and_everything_is_undone(tmp_path):
    before = dict(vars(Trainer))
    trainer, callback = traced(tmp_path, 5)
    assert callback.trainer is trainer  # found through on_init_end, no extra line
    assert set(vars(trainer)) & {"_save_checkpoint", "_load_from_checkpoint"} == set()
    trainer.train()
    # after train() nothing of ckptprof stays on the instance
    assert not [n for n, v in vars(trainer).items() if hasattr(v, "__ckptprof_layer__")]
    other = make_trainer(tmp_path / "other", 1, [])
    assert not any(hasattr(v, "__ckptprof_layer__") for v in vars(other).values())
    uninstrument(trainer)
    assert not any(hasattr(v, "__ckptprof_layer__") for v in vars(trainer).values())
    assert not any(isinstance(c, CkptProfCallback) for c in trainer.callback_handler.callbacks)
    assert dict(vars(Trainer)) == before
    # the callback is not an ExportableState: nothing of ckptprof in the trainer state
    state = json.loads((tmp_path / "checkpoints/checkpoint-5/trainer_state.json").read_text())
    assert "CkptProfCallback" not in json.dumps(state["stateful_callbacks"])


def test_instrument_a_trainer_built_without_the_callback(tmp_path):
    make_trainer(tmp_path, 5, []).train()
    trainer = make_trainer(tmp_path, 6, [])
    callback = instrument(trainer, trace_dir=tmp_path / "traces")
    assert instrument(trainer) is callback  # once
    trainer.train(resume_from_checkpoint=True)
    assert callback.last_restore is not None
    assert callback.last_restore.attributes["ckpt.step"] == 6
    # a later train() of the same Trainer: traced after instrument() again
    trainer.args.max_steps = 7
    assert instrument(trainer) is callback
    trainer.train(resume_from_checkpoint=True)
    assert callback.last_restore.attributes["ckpt.step"] == 7


def test_save_callable_from_outside_the_loop(tmp_path):
    trainer, callback = traced(tmp_path, 3)
    trainer.train()
    folder = callback.save()
    assert folder.endswith("checkpoint-3") and Path(folder, "optimizer.pt").exists()
    assert callback.last_save.attributes["ckpt.path"] == folder
    assert folder_record(Path(folder)) is not None
    assert callback._instrumentor.session.telemetry is None  # closed again after the save


def test_a_bug_inside_ckptprof_never_stops_training(tmp_path, monkeypatch, caplog):
    from ckptprof.integrations import files

    traced(tmp_path, 5)[0].train()

    def broken(*args, **kwargs):
        raise RuntimeError("ckptprof bug")

    monkeypatch.setattr(files.CheckpointFiles, "fetch_from_folder", broken)
    trainer, callback = traced(tmp_path, 7)
    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 7
    assert len([r for r in caplog.records if "ckptprof bug" in r.message]) == 1


def test_unreachable_collector_does_not_hurt_training(tmp_path, monkeypatch, caplog):
    from tests.test_export import refused_port

    with refused_port() as port, caplog.at_level(logging.WARNING):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        traced(tmp_path, 5)[0].train()
        trainer, callback = traced(tmp_path, 7)
        trainer.train(resume_from_checkpoint=True)
        callback.detach()
    assert trainer.state.global_step == 7
    assert callback.last_restore is not None and callback.last_restore.wall_s > 0
    assert len([r for r in caplog.records if "could not export" in r.message]) == 1


def test_a_collector_endpoint_that_does_not_parse_never_stops_training(
    tmp_path, monkeypatch, caplog
):
    """An unexpanded ``${OTEL_PORT}`` in the endpoint: training runs, nothing of ckptprof
    stays on the Trainer, and the credentials in the endpoint are in no log line."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://me:pw-secret@collector:${OTEL_PORT}")
    trainer, callback = traced(tmp_path, 5)
    with caplog.at_level(logging.WARNING):
        trainer.train()
        callback.detach()
    assert trainer.state.global_step == 5
    assert not [n for n, v in vars(trainer).items() if hasattr(v, "__ckptprof_layer__")]
    assert [s for s in spans_in(tmp_path / "traces") if s["name"] == "ckpt.save"]
    assert not [r for r in caplog.records if "pw-secret" in r.getMessage()]


def test_telemetry_that_fails_to_start_leaves_training_untraced(tmp_path, monkeypatch, caplog):
    from ckptprof.integrations.session import TracingSession

    def broken(self):
        raise RuntimeError("ckptprof start bug")

    monkeypatch.setattr(TracingSession, "start", broken)
    trainer, callback = traced(tmp_path, 5)
    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        trainer.train()
        folder = callback.save()  # the save from outside the loop still happens
    assert trainer.state.global_step == 5 and Path(folder, "optimizer.pt").exists()
    assert not [n for n, v in vars(trainer).items() if hasattr(v, "__ckptprof_layer__")]
    assert any("ckptprof start bug" in r.getMessage() for r in caplog.records)


def test_resume_true_goes_on_when_the_records_cannot_be_read(tmp_path, monkeypatch, caplog):
    """EIO from ckptprof's state folder (an NFS failure) while ``resume_from_checkpoint=True``
    looks for the last complete checkpoint: the Trainer resumes from its own choice."""
    import errno

    from ckptprof.state import StateStore

    traced(tmp_path, 5)[0].train()

    def eio(self, *args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(StateStore, "names", eio)
    monkeypatch.setattr(StateStore, "read", eio)
    trainer, callback = traced(tmp_path, 7)
    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 7
    restore = callback.last_restore
    assert restore is not None
    assert restore.attributes["ckpt.path"].endswith("checkpoint-5")


# ---------------------------------------------------------------------- interruptions
def test_sigterm_mid_training_saves_and_the_resume_links_back(tmp_path):
    """A real SIGTERM to a real training process, then a resume in a new process."""
    import signal

    flags = ["--dir", str(tmp_path), "--interruptions", "--step-delay", "0.1"]
    command = [sys.executable, str(EXAMPLE), *flags, "--phase", "train", "--steps", "1000"]
    checkpoints = tmp_path / "checkpoints"
    ready = folder_record_path(checkpoints / "checkpoint-5")
    with collector() as (endpoint, received):  # a real OTLP/HTTP receiver
        env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
        returncode, stderr = sigterm_when(command, ready, env=env)
    assert returncode == -signal.SIGTERM, stderr[-3000:]  # the default action, chained
    assert "emergency save saved" in stderr
    # the story left for the collector before the signal was handed on: the notice, the
    # emergency save and the adapter's save under it
    sent = {span.name: span for span in received_spans(received)}
    assert {"ckpt.interruption", "ckpt.notice", "ckpt.emergency_save", "ckpt.save"} <= set(sent)
    emergency_saves = [span for span in received_spans(received) if span.name == "ckpt.save"
                       and span.parent_span_id == sent["ckpt.emergency_save"].span_id]  # fmt: skip
    assert len(emergency_saves) == 1
    record = json.loads(interruption_record_path(checkpoints).read_text())
    assert record["outcome"] == "saved" and record["source"] == "sigterm"
    saved = checkpoints / f"checkpoint-{record['checkpoint_step']}"
    assert record["checkpoint"] == str(saved) and record["checkpoint_step"] > 5
    assert folder_record(saved) is not None
    assert ours_in(checkpoints) == []
    assert 0 < record["margin_s"] <= 30

    until = str(record["checkpoint_step"] + 10)  # a few steps past the resume
    resume = run_example(tmp_path, "--interruptions", "--phase", "resume", "--steps", until)
    assert resume.returncode == 0, resume.stderr[-3000:]
    spans = spans_in(tmp_path / "traces")
    story, restore = linked_story(spans)
    story_children = children(spans, story)
    assert {"ckpt.notice", "ckpt.emergency_save"} <= set(story_children)
    emergency = story_children["ckpt.emergency_save"]
    (emergency_save,) = [s for s in spans if s["parent_id"] == emergency["context"]["span_id"]]
    assert emergency_save["name"] == "ckpt.save"  # the adapter's save, nested
    # traced once (not twice, one left unfinished), and the resume links to that save
    assert [s for s in spans if s["name"] == "ckpt.save"
            and s["attributes"]["ckpt.path"] == str(saved)] == [emergency_save]  # fmt: skip
    assert saved_by(restore) == [emergency_save["context"]["span_id"]]
    attrs = restore["attributes"]
    assert attrs["ckpt.path"] == str(saved)
    assert attrs["ckpt.interruption.steps_lost"] == 0
    assert attrs["ckpt.interruption.restored_step"] == record["checkpoint_step"]
    notice_to_start = attrs["ckpt.interruption.notice_to_start_s"]
    assert 0 < notice_to_start < attrs["ckpt.interruption.recovery_s"]
    rate = attrs["ckpt.interruption.cost_per_hour"]
    assert attrs["ckpt.interruption.notice_to_start_cost"] == pytest.approx(
        notice_to_start / 3600 * rate, abs=1e-3
    )
    assert not interruption_record_path(checkpoints).exists()  # retired after linking
    report = subprocess.run(
        [sys.executable, "-m", "ckptprof", "report", "--interruptions", str(tmp_path / "traces")],
        capture_output=True,
        text=True,
    )
    assert report.returncode == 0, report.stderr
    assert "steps lost: 0" in report.stdout and "sigterm" in report.stdout
    # one story, one set of numbers: the downtime the story tells is the goodput's, and
    # recovery is named to the second: the wind-down to the killed process's end, the
    # downtime, the new process's start-up, the RTO
    from ckptprof.report.goodput import build_goodput
    from ckptprof.report.interruptions import build_stories
    from ckptprof.report.load import read_trace_spans

    read = read_trace_spans([tmp_path / "traces"])
    (told,) = build_stories(read)
    assert build_goodput(read).downtimes_s == [told.downtime_s]
    assert told.startup_s == attrs["ckpt.interruption.startup_s"] > 0
    wind_down = told.recovery.wind_down_s
    assert 0 < wind_down < 30  # the emergency save, within the grace
    parts = wind_down + told.downtime_s + told.startup_s + told.rto_s
    assert parts == pytest.approx(told.recovery_s, abs=0.02)  # to the rounding of each
    assert told.downtime_s + wind_down == pytest.approx(notice_to_start, abs=0.02)  # recorded
    assert f"  start-up: {told.startup_s:.3f} s (the new process started" in report.stdout
    assert (f"from the notice to the first step done = wind-down {wind_down:.3f} s + downtime "
            f"{told.downtime_s:.3f} s + start-up {told.startup_s:.3f} s + RTO "
            f"{told.rto_s:.3f} s") in report.stdout  # fmt: skip


def cut_short_after_ten_steps(tmp_path: Path) -> Path:
    """Ten steps trained (checkpoint-10), then an emergency save of step 12 killed half
    way: its files, no record of them, and rank 0's interruption record of step 12."""
    import shutil

    from ckptprof.interrupt.record import InterruptionRecord, write_record
    from ckptprof.state import StateStore

    traced(tmp_path, 10)[0].train()
    checkpoints = tmp_path / "checkpoints"
    # the emergency save of step 12 was killed half way: files, no record of them
    partial = checkpoints / "checkpoint-12"
    shutil.copytree(checkpoints / "checkpoint-10", partial)
    assert folder_record(partial) is None
    weights = partial / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    now = __import__("time").time_ns()
    write_record(
        StateStore().location(str(checkpoints)),
        InterruptionRecord(
            run_id="r",
            trace_id="ab" * 16,
            span_id="cd" * 8,
            source="aws-spot",
            notice_ns=now - 5_000_000_000,
            deadline_ns=now - 4_000_000_000,
            deadline_assumed=False,
            step=12,
            save_start_ns=now - 4_500_000_000,
            last_step=12,
        ),
    )
    return checkpoints


def test_save_cut_short_by_the_deadline_leaves_the_previous_checkpoint_in_use(tmp_path, caplog):
    checkpoints = cut_short_after_ten_steps(tmp_path)
    callback = CkptProfCallback(trace_dir=tmp_path / "traces", interruptions={"sources": []})
    trainer = make_trainer(tmp_path, 11, [callback])
    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        trainer.train(resume_from_checkpoint=True)
    assert "checkpoint-12 was being saved when the job was stopped" in caplog.text
    assert "missing" not in caplog.text  # the files of checkpoint-10 are all there
    attrs = callback.last_restore.attributes
    assert attrs["ckpt.path"] == str(checkpoints / "checkpoint-10")
    assert attrs["ckpt.interruption.outcome"] == "pending"  # the save never finished
    assert attrs["ckpt.interruption.steps_lost"] == 2


def test_with_more_ranks_the_trainers_choice_stands_over_a_node_local_record(
    tmp_path, caplog, monkeypatch
):
    """The interruption record is rank 0's, in a state location that may be node-local:
    with more than one rank, ranks could decide differently, so none substitutes."""
    from transformers import TrainingArguments

    checkpoints = cut_short_after_ten_steps(tmp_path)
    trainer = make_trainer(tmp_path, 11, [])
    ckptprof = instrument(trainer, trace_dir=tmp_path / "traces")._instrumentor
    monkeypatch.setattr(TrainingArguments, "world_size", property(lambda self: 2))
    try:
        with caplog.at_level(logging.WARNING, logger="ckptprof"):
            given = ckptprof._resume.begin(trainer, True, False)
        assert given is True  # the Trainer's own choice: its last checkpoint
        assert ckptprof.session.restore_op.attributes["ckpt.path"] == str(
            checkpoints / "checkpoint-12"
        )
        assert "resuming from it as the Trainer chose (2 ranks" in caplog.text
    finally:
        ckptprof.session.end_restore()
        uninstrument(trainer)


def test_a_resume_path_with_a_trailing_slash_keeps_its_restored_step(tmp_path):
    traced(tmp_path, 4, save_steps=2)[0].train()
    trainer, callback = traced(tmp_path, 6, save_steps=2)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoints" / "checkpoint-4") + "/")
    assert callback.last_restore.attributes["ckpt.restored_step"] == 4


def test_notice_during_a_save_is_handled_after_it(tmp_path):
    import signal

    calls = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append(signum))
    try:
        callback = CkptProfCallback(
            trace_dir=tmp_path / "traces", interruptions={"sources": ["sigusr1"]}
        )
        trainer = make_trainer(tmp_path, 7, [callback])
        save_pretrained = trainer.model.save_pretrained
        sent = []

        def save_and_get_noticed(*args, **kwargs):
            if not sent:
                sent.append(True)
                os.kill(os.getpid(), signal.SIGUSR1)  # arrives mid-save (the first one)
            return save_pretrained(*args, **kwargs)

        trainer.model.save_pretrained = save_and_get_noticed
        trainer.train()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert calls == [signal.SIGUSR1]  # chained once, after the emergency save
    spans = spans_in(tmp_path / "traces")
    (story,) = [s for s in spans if s["name"] == "ckpt.interruption"]
    assert story["attributes"]["ckpt.interruption.outcome"] == "saved"
    assert story["attributes"]["ckpt.interruption.checkpoint_step"] == 5
    folder = tmp_path / "checkpoints" / "checkpoint-5"
    manifest = folder_record(folder)
    assert {n: e["size"] for n, e in manifest["files"].items()} == {
        p.name: p.stat().st_size for p in folder.iterdir()
    }


def test_metadata_notice_saves_and_stops_training(tmp_path):
    from tests.metadata_server import MetadataServer

    with MetadataServer(notice_after_s=0, deadline_s=120) as server:
        options = {"sources": ["aws"], "metadata_url": server.url}
        callback = CkptProfCallback(trace_dir=tmp_path / "traces", interruptions=options)
        trainer = make_trainer(tmp_path, 1000, [callback])
        from hf_trainer_resume import SlowSteps

        trainer.add_callback(SlowSteps(0.05))
        trainer.train()
    assert trainer.state.global_step < 1000  # stopped after the emergency save
    (story,) = [s for s in spans_in(tmp_path / "traces") if s["name"] == "ckpt.interruption"]
    attrs = story["attributes"]
    assert attrs["ckpt.interruption.source"] == "aws-spot"
    assert attrs["ckpt.interruption.outcome"] == "saved"  # the save ended before the deadline
    # the margin is to the deadline the service announced, from the save's end
    record = json.loads(interruption_record_path(tmp_path / "checkpoints").read_text())
    assert record["deadline_ns"] == server.deadline_ns
    assert record["notice_ns"] <= record["save_end_ns"] <= record["deadline_ns"]
    margin_s = (record["deadline_ns"] - record["save_end_ns"]) / 1e9
    assert attrs["ckpt.interruption.margin_s"] == pytest.approx(margin_s, abs=1e-3)
    assert 0 < margin_s <= 120
    step = attrs["ckpt.interruption.checkpoint_step"]
    assert (tmp_path / "checkpoints" / f"checkpoint-{step}" / "optimizer.pt").exists()


def test_deepspeed_path_traces_the_engine_inside_the_trainer(tmp_path):
    pytest.importorskip("deepspeed")
    flags = ["--deepspeed-stage", "2"]
    ok = run_example(tmp_path, *flags, "--phase", "train", "--steps", "5")
    assert ok.returncode == 0, ok.stderr[-3000:]
    again = run_example(tmp_path, *flags, "--phase", "resume", "--steps", "6")
    assert again.returncode == 0, again.stderr[-3000:]
    spans = spans_in(tmp_path / "traces")
    (restore,) = [s for s in spans if s["name"] == "ckpt.restore"]
    assert restore["attributes"]["ckpt.format"] == "deepspeed"
    assert restore["attributes"]["ckpt.strategy"] == "deepspeed"
    assert restore["attributes"]["ckpt.path"].endswith("checkpoint-5")  # the Trainer's
    assert restore["attributes"]["ckpt.deepspeed.path"].endswith("checkpoint-5/global_step5")
    assert restore["attributes"]["ckpt.restored_step"] == 5
    phases = children(spans, restore)
    assert set(phases) >= RESTORE_PHASES
    assert "accelerate.prepare" in phases["ckpt.reshard"]["attributes"]["ckpt.reshard.includes"]
    tag = tmp_path / "checkpoints" / "checkpoint-5" / "global_step5"
    read = ["mp_rank_00_model_states.pt"] * 2 + ["zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    fetch = phases["ckpt.fetch"]["attributes"]
    assert fetch["ckpt.fetch.repeated_reads"] == 1  # DeepSpeed's double read, seen from HF
    assert fetch["ckpt.bytes"] >= sum((tag / n).stat().st_size for n in read)
    manifest = folder_record(tag)
    assert set(manifest["files"]) == {p.name for p in tag.iterdir()}
    (save,) = [s for s in spans if s["name"] == "ckpt.save" and s["attributes"]["ckpt.step"] == 5]
    write = children(spans, save)["ckpt.write"]["attributes"]
    assert write["ckpt.bytes"] >= sum(p.stat().st_size for p in tag.iterdir())
    assert ours_in(tmp_path / "checkpoints") == []


def test_bad_interruption_options_are_one_clear_error(tmp_path):
    from ckptprof.errors import CkptprofError

    with pytest.raises(CkptprofError, match=r"interruptions=.*expected True or a dict"):
        CkptProfCallback(trace_dir=tmp_path / "t", interruptions={"source": ["aws"]})
    callback = CkptProfCallback(trace_dir=tmp_path / "t", interruptions={"sources": ["nope"]})
    with pytest.raises(CkptprofError, match=r"unknown notice source 'nope'"):
        make_trainer(tmp_path, 2, [callback]).train()


def _pickled(obj):
    return pickle.loads(pickle.dumps(obj))


def copies_behave_as_without_ckptprof(directory: str) -> None:
    """Every attribute ckptprof places on the Trainer, before train() and within it, on
    a deep copy and an unpickled copy: the copy's own method, never ckptprof's wrapper;
    each copy trains itself, and the original is traced as usual after."""
    trainer, callback = traced(Path(directory), 2)
    instrumentor = callback._instrumentor
    with contextlib.ExitStack() as scope:
        for placed in (instrumentor.targets, instrumentor.call_targets):
            if placed is instrumentor.call_targets:  # what train() places for its call
                instrumentor.apply(placed, trainer, scope)
            applied = [
                t for t in placed if t.when is None or getattr(instrumentor, t.when)(trainer)
            ]
            assert applied
            for copy_of in (copy.deepcopy, _pickled):
                twin = copy_of(trainer)
                for target in applied:
                    obj, mine = resolve(trainer, target.owner), resolve(twin, target.owner)
                    assert is_ours(vars(obj)[target.name]), target.label  # the original's
                    method = getattr(mine, target.name)
                    assert not hasattr(method, "__ckptprof_layer__"), target.label
                    assert method.__self__ is mine, target.label
                    assert method.__func__ is getattr(type(obj), target.name), target.label
    # both copies first: once a Trainer has trained, accelerate's shared GradientState
    # holds a weakref and no Trainer of the process pickles (with or without ckptprof)
    for twin in [copy.deepcopy(trainer), _pickled(trainer)]:
        twin.train()
        assert twin.state.global_step == 2 and trainer.state.global_step == 0
    assert callback.last_save is None  # the copies' saves were never the original's
    trainer.train()
    assert trainer.state.global_step == 2 and callback.last_save is not None
    assert not any(hasattr(v, "__ckptprof_layer__") for v in vars(trainer).values())


def test_a_traced_trainer_pickles_and_deep_copies_as_without_ckptprof(tmp_path):
    """The ``train`` wrapper on the instance made pickle.dumps(trainer) raise (Ray Tune
    pickles Trainers), and a deep copy's train() trained the original. In a fresh
    process: a Trainer trained earlier in this one makes every Trainer unpicklable."""
    check = "from tests.test_transformers import copies_behave_as_without_ckptprof as check"
    check += f"; check({str(tmp_path)!r})"
    done = subprocess.run(
        [sys.executable, "-c", check],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=270,
    )
    assert done.returncode == 0, done.stderr[-3000:]
