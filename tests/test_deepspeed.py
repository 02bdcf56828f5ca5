"""The DeepSpeed adapter with the real DeepSpeed engine on CPU (gloo), in real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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

pytestmark = pytest.mark.slow  # real training jobs

pytest.importorskip("deepspeed")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "deepspeed_resume.py"


def env() -> dict[str, str]:
    """The test's environment (its state location included) for a DeepSpeed process."""
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def command(directory: Path, phase: str, *flags: str, nproc: int = 1) -> list[str]:
    launcher = [sys.executable]
    if nproc > 1:
        # --standalone: the rendezvous and the workers' store take ports the kernel gives
        # them as they bind (no port picked, released and raced for by other processes)
        launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
        launcher += ["--standalone", "--local-addr", "127.0.0.1"]
    return [*launcher, str(EXAMPLE), "--dir", str(directory), "--phase", phase, *flags]


def run(directory: Path, phase: str, *flags: str, nproc: int = 1):
    args = command(directory, phase, *flags, nproc=nproc)
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env=env())


def ok(result) -> None:
    assert result.returncode == 0, result.stderr[-4000:]


def restores(directory: Path) -> list[dict]:
    return [s for s in spans_in(directory / "traces") if s["name"] == "ckpt.restore"]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_save_then_load_in_a_fresh_process(tmp_path, stage):
    ok(run(tmp_path, "train", "--stage", str(stage), "--steps", "5"))
    second = run(tmp_path, "resume", "--stage", str(stage), "--steps", "6")
    ok(second)
    assert "ckptprof: RTO" in second.stderr
    spans = spans_in(tmp_path / "traces")
    (restore,) = [s for s in spans if s["name"] == "ckpt.restore"]
    folder = tmp_path / "checkpoints" / "global_step5"
    attrs = restore["attributes"]
    assert attrs["ckpt.path"] == str(folder) and attrs["ckpt.framework"] == "deepspeed"
    assert attrs["ckpt.strategy"] == f"zero{stage}"
    assert attrs["ckpt.restored_step"] == 5 and attrs["ckpt.step"] == 6
    assert_memory_recorded(restore)
    phases = children(spans, restore)
    assert set(phases) >= RESTORE_PHASES
    # bytes = the files DeepSpeed read, the model states twice (a real cost, shown)
    model = (
        "zero_pp_rank_0_mp_rank_00_model_states.pt" if stage == 3 else "mp_rank_00_model_states.pt"
    )
    read = [model, model] + (["zero_pp_rank_0_mp_rank_00_optim_states.pt"] if stage else [])
    fetch = phases["ckpt.fetch"]["attributes"]
    total = sum((folder / n).stat().st_size for n in read)
    # torch.load rereads a few KiB of zip headers per file
    assert total <= fetch["ckpt.bytes"] <= total + 16384 * len(read)
    assert fetch["ckpt.files"] == len(read)
    assert fetch["ckpt.fetch.repeated_reads"] == 1
    assert fetch["ckpt.fetch.repeated_bytes"] == (folder / model).stat().st_size
    assert phases["ckpt.verify"]["attributes"]["ckpt.verify.mode"] == "size"
    saves = [s for s in spans if s["name"] == "ckpt.save"]
    (save,) = [s for s in saves if s["attributes"]["ckpt.path"] == str(folder)]
    assert saved_by(restore) == [save["context"]["span_id"]]
    save_phases = children(spans, save)
    assert {"ckpt.serialize", "ckpt.write", "ckpt.commit"} <= set(save_phases)
    written = {p.name: p.stat().st_size for p in folder.iterdir()}
    assert save_phases["ckpt.write"]["attributes"]["ckpt.bytes"] == sum(written.values())
    manifest = folder_record(folder)
    assert {n: e["size"] for n, e in manifest["files"].items()} == written
    assert ours_in(tmp_path / "checkpoints") == []


def test_two_ranks_checkpoint_resumed_by_two_then_by_one_through_a_universal_checkpoint(
    tmp_path,
):
    """One 2-rank training (a launch of two DeepSpeed processes), resumed first by two
    ranks, whose restores carry their ranks, then by one, through a universal checkpoint.
    The 2-rank resume saves nothing (no step 10), so both resumes load global_step5."""
    ok(run(tmp_path, "train", "--steps", "5", nproc=2))
    ok(run(tmp_path, "resume", "--steps", "6", nproc=2))
    found = restores(tmp_path)
    assert sorted(r["attributes"]["ckpt.rank"] for r in found) == [0, 1]
    assert {r["attributes"]["ckpt.world_size"] for r in found} == {2}
    assert {r["attributes"]["ckpt.saved_world_size"] for r in found} == {2}
    assert len({r["attributes"]["ckpt.run_id"] for r in found}) == 1
    folder = tmp_path / "checkpoints" / "global_step5"
    assert set(folder_record(folder, 1)["files"]) == {"zero_pp_rank_1_mp_rank_00_optim_states.pt"}
    assert "slowest rank" in run_cli("report", str(tmp_path / "traces")).stdout

    refused = run(tmp_path, "resume", "--steps", "6")
    assert refused.returncode != 0
    assert "saved by 2 data-parallel ranks and this job has 1" in refused.stderr
    assert "ZeRORuntimeException" in refused.stderr  # DeepSpeed's own reason
    ok(run(tmp_path, "resume", "--steps", "6", "--universal", "convert"))
    spans = spans_in(tmp_path / "traces")
    restore = max(
        (s for s in spans if s["name"] == "ckpt.restore"), key=lambda s: span_ns(s["start_time"])
    )  # the last
    attrs = restore["attributes"]
    assert attrs["ckpt.universal"] is True and attrs["ckpt.saved_world_size"] == 2
    assert attrs["ckpt.path"].endswith("global_step5_universal")
    phases = children(spans, restore)
    assert "ckpt.universal_convert" in phases and set(phases) >= RESTORE_PHASES
    assert phases["ckpt.fetch"]["attributes"]["ckpt.files"] > 3  # the per-parameter files


def test_corrupt_optimizer_states_are_named_and_refused_only_when_strict(tmp_path):
    ok(run(tmp_path, "train", "--steps", "5", "--verify", "full"))
    path = tmp_path / "checkpoints" / "global_step5" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x55
    path.write_bytes(bytes(raw))
    failed = run(tmp_path, "resume", "--steps", "6", "--verify", "full", "--strict")
    assert failed.returncode != 0
    assert f"{path}: xxh3" in failed.stderr and "does not match" in failed.stderr
    # without strict, DeepSpeed decides (a flipped byte in a tensor loads) and is told
    warned = run(tmp_path, "resume", "--steps", "6", "--verify", "full")
    ok(warned)
    assert f"{path}: xxh3" in warned.stderr and "strict=True" in warned.stderr


def test_rto_and_phases_reach_deepspeeds_own_monitor(tmp_path):
    script = f"""
import sys
sys.path.insert(0, {str(EXAMPLE.parent)!r})
from deepspeed_resume import make_engine, single_process_env, train
single_process_env()
from ckptprof.integrations.deepspeed import instrument
monitor = {{"csv_monitor": {{"enabled": True, "output_path": {str(tmp_path)!r}, "job_name": "m"}}}}
engine = make_engine(2, 32, 1, config_extra=monitor)
instrument(engine, trace_dir={str(tmp_path / "t")!r})
train(engine, 5, save_dir={str(tmp_path / "c")!r}, every=5)
engine.load_checkpoint({str(tmp_path / "c")!r})
train(engine, 6)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env()
    )
    assert result.returncode == 0, result.stderr[-3000:]

    def logged(name: str) -> list[list[str]]:
        return (tmp_path / "m" / f"ckptprof_{name}.csv").read_text().splitlines()[1:]

    assert [row.split(",")[0] for row in logged("save_s")] == ["5"]
    (row,) = logged("restore_s")
    step, rto = row.split(",")
    assert step == "6" and float(rto) > 0
    for phase in ("list", "fetch", "verify", "deserialize", "reshard", "first_step"):
        assert len(logged(f"restore_{phase}_s")) == 1


def test_instrument_touches_only_this_engine_and_undoes_everything(tmp_path):
    script = f"""
import sys, torch
sys.path.insert(0, {str(EXAMPLE.parent)!r})
from deepspeed_resume import make_engine, single_process_env, train
single_process_env()
import torch.nn.functional as F
linear = F.linear
engine = make_engine(3, 32, 1)
from ckptprof.integrations.deepspeed import instrument, uninstrument
def ours(obj):
    items = vars(obj).items()
    return {{n for n, v in items if "ckptprof" in n or hasattr(v, "__ckptprof_layer__")}}
first = instrument(engine, trace_dir={str(tmp_path / "t")!r})
assert instrument(engine) is first and ours(engine) and ours(engine.checkpoint_engine)
train(engine, 2, save_dir={str(tmp_path / "c")!r}, every=2)
engine.load_checkpoint({str(tmp_path / "c")!r})
uninstrument(engine)
assert not ours(engine) and not ours(engine.checkpoint_engine), ours(engine)
assert F.linear is linear and torch.load.__module__ == "torch.serialization"
print("clean")
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "clean" in result.stdout


def test_sigterm_mid_training_saves_and_the_resume_links_back(tmp_path):
    flags = ["--interruptions", "--step-delay", "0.1", "--steps", "1000"]
    ready = folder_record_path(tmp_path / "checkpoints" / "global_step5")
    returncode, stderr = sigterm_when(command(tmp_path, "train", *flags), ready, env=env())
    assert returncode == -signal.SIGTERM, stderr[-3000:]
    record = json.loads(interruption_record_path(tmp_path / "checkpoints").read_text())
    assert ours_in(tmp_path / "checkpoints") == []
    assert record["outcome"] == "saved" and record["checkpoint_step"] > 5
    ok(run(tmp_path, "resume", "--interruptions", "--steps", str(record["checkpoint_step"] + 2)))
    _, restore = linked_story(spans_in(tmp_path / "traces"))
    attrs = restore["attributes"]
    assert attrs["ckpt.restored_step"] == record["checkpoint_step"]
    assert attrs["ckpt.interruption.steps_lost"] == 0
    assert attrs["ckpt.interruption.notice_to_start_s"] > 0


def test_decoupled_writer_shows_blocking_and_background_time(tmp_path):
    # saves at steps 5 and 10; DeepSpeed commits each at the next step
    ok(run(tmp_path, "train", "--stage", "0", "--steps", "11", "--decoupled"))
    spans = spans_in(tmp_path / "traces")
    saves = [s for s in spans if s["name"] == "ckpt.save"]
    blocking = [s for s in saves if not s["attributes"].get("ckpt.save.background")]
    background = [s for s in saves if s["attributes"].get("ckpt.save.background")]
    assert len(blocking) == len(background) == 2
    assert children(spans, blocking[0])["ckpt.write"]["attributes"]["ckpt.write.async"] is True
    linked = {link["context"]["span_id"] for s in background for link in s["links"]}
    assert linked == {s["context"]["span_id"] for s in blocking}
    folder = tmp_path / "checkpoints" / "global_step10"
    (last,) = [s for s in background if s["attributes"]["ckpt.path"] == str(folder)]
    commit = children(spans, last)["ckpt.commit"]["attributes"]
    model = folder / "mp_rank_00_model_states.pt"
    assert commit["ckpt.bytes"] == model.stat().st_size > 0
    manifest = folder_record(folder)
    assert manifest["files"]["mp_rank_00_model_states.pt"]["size"] == model.stat().st_size
    # and the checkpoint resumes, verified against that manifest
    ok(run(tmp_path, "resume", "--stage", "0", "--steps", "12"))
    (restore,) = restores(tmp_path)
    assert restore["attributes"]["ckpt.restored_step"] == 10


def test_a_universal_load_leaves_the_engines_config_as_it_was():
    """The conversion asks DeepSpeed for a universal load for that one call only."""
    from types import SimpleNamespace

    from ckptprof.integrations.ds_load import loading_universal

    config = SimpleNamespace(load_universal_checkpoint=False)
    engine = SimpleNamespace(_config=config)
    with pytest.raises(RuntimeError), loading_universal(engine):
        assert config.load_universal_checkpoint is True
        raise RuntimeError("the load failed")
    assert config.load_universal_checkpoint is False


def run_script(script: str, tmp_path: Path, nproc: int = 1, timeout: int = 300):
    """``script`` (after the example's imports, as ``main()``) in a fresh process, or
    ``nproc`` of them."""
    path = tmp_path / "job.py"
    header = f"""
import os, sys, threading, torch
sys.path.insert(0, {str(EXAMPLE.parent)!r})
from deepspeed_resume import make_engine, single_process_env, train
single_process_env()
os.environ.setdefault("OMP_NUM_THREADS", "1")
"""
    # in a main guard: DeepSpeed's decoupled writer is a spawned process (it imports this)
    body = textwrap.indent(textwrap.dedent(script), "    ")
    path.write_text(f"{header}\ndef main():\n{body}\n\nif __name__ == '__main__':\n    main()\n")
    launcher = [sys.executable]
    if nproc > 1:
        launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
        launcher += ["--standalone", "--local-addr", "127.0.0.1"]
    result = subprocess.run(
        [*launcher, str(path)], capture_output=True, text=True, timeout=timeout, env=env()
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def test_every_decoupled_save_gets_its_background_span_and_record(tmp_path):
    """Two saves before one step (one DeepSpeed commit covers both), the last save before
    engine.destroy() (committed by its cleanup), and a save still pending when ckptprof is
    removed (its background span ends, marked, without a record)."""
    ckpt, traces = tmp_path / "c", tmp_path / "t"
    run_script(
        f"""
from ckptprof.integrations.deepspeed import instrument
engine = make_engine(0, 16, 1, decoupled=True)
instrument(engine, trace_dir={str(traces)!r})
train(engine, 2)
engine.save_checkpoint({str(ckpt)!r}, tag="a")
engine.save_checkpoint({str(ckpt)!r}, tag="b")
train(engine, 3)  # DeepSpeed commits both here
engine.save_checkpoint({str(ckpt)!r}, tag="c")
engine.destroy()  # and this one in checkpoint_engine.cleanup()

second = make_engine(0, 16, 1, decoupled=True)
ckptprof = instrument(second, trace_dir={str(traces)!r})
train(second, 1)
second.save_checkpoint({str(ckpt)!r}, tag="d")
ckptprof.uninstrument()
second.destroy()
print("threads", sorted(t.name for t in threading.enumerate() if "ckptprof" in t.name))
""",
        tmp_path,
    )
    spans = spans_in(traces)
    saves = [s for s in spans if s["name"] == "ckpt.save"]
    blocking = {
        s["attributes"]["ckpt.path"]: s
        for s in saves
        if not s["attributes"].get("ckpt.save.background")
    }
    background = {
        s["attributes"]["ckpt.path"]: s
        for s in saves
        if s["attributes"].get("ckpt.save.background")
    }
    folders = [str(ckpt / tag) for tag in "abcd"]
    assert sorted(blocking) == sorted(background) == folders
    for folder in folders:
        (link,) = background[folder]["links"]
        assert link["context"]["span_id"] == blocking[folder]["context"]["span_id"]
    for tag in "abc":
        model = ckpt / tag / "mp_rank_00_model_states.pt"
        commit = children(spans, background[str(ckpt / tag)])["ckpt.commit"]["attributes"]
        assert commit["ckpt.bytes"] == model.stat().st_size > 0
        assert background[str(ckpt / tag)]["status"]["status_code"] != "ERROR"
        assert folder_record(ckpt / tag)["files"]["mp_rank_00_model_states.pt"]["size"] == (
            model.stat().st_size
        )
    # removed before DeepSpeed committed it: ended, said so, no record of its files
    assert background[str(ckpt / "d")]["status"]["status_code"] == "ERROR"
    assert folder_record(ckpt / "d") is None


def test_an_evaluation_only_restore_ends_at_its_first_forward_and_a_training_one_at_its_step(
    tmp_path,
):
    traces = tmp_path / "t"
    result = run_script(
        f"""
import time
from ckptprof.integrations.deepspeed import instrument
engine = make_engine(2, 16, 1)
ckptprof = instrument(engine, trace_dir={str(traces)!r})
train(engine, 2, save_dir={str(tmp_path / "c")!r}, every=2)
engine.load_checkpoint({str(tmp_path / "c")!r})
engine.eval()
with torch.no_grad():
    engine(torch.randn(2, 16))
open_after_eval = ckptprof.session.restore_op is not None
restore_threads = ("ckptprof-memory", "ckptprof-watchdog")
busy = sorted(t.name for t in threading.enumerate() if t.name in restore_threads)
engine.train()
engine.load_checkpoint({str(tmp_path / "c")!r})
# a training resume: its first forward (train mode, gradients on) leaves it open
loss = engine(torch.randn(2, 16)).sum()
open_after_forward = ckptprof.session.restore_op is not None
engine.backward(loss)
engine.step()
print("eval", open_after_eval, busy, "train", open_after_forward,
      ckptprof.session.restore_op is not None)
engine.destroy()
""",
        tmp_path,
    )
    assert "eval False [] train True False" in result.stdout, result.stdout
    evaluation, training = sorted(
        (s for s in spans_in(traces) if s["name"] == "ckpt.restore"),
        key=lambda s: span_ns(s["start_time"]),
    )
    spans = spans_in(traces)
    assert "ckpt.first_step" not in children(spans, evaluation)
    assert evaluation["attributes"]["ckpt.restored_step"] == 2
    assert "ckpt.first_step" in children(spans, training)
    assert training["attributes"]["ckpt.step"] == 3


def test_a_module_only_load_records_the_step_its_checkpoint_was_saved_at(tmp_path):
    """``load_module_only=True`` leaves the engine's ``global_steps`` as they were (6): the
    restored step is the checkpoint's (3), the first step the engine's next (7). A load
    that finds no checkpoint (a first launch: DeepSpeed returns (None, None)) is no
    restore at all (it was one, counted by reports and goodput)."""
    traces, ckpt = tmp_path / "t", tmp_path / "c"
    run_script(
        f"""
from ckptprof.integrations.deepspeed import instrument
engine = make_engine(2, 16, 1)
instrument(engine, trace_dir={str(traces)!r})
assert engine.load_checkpoint({str(tmp_path / "nothing")!r}) == (None, None)
train(engine, 3)
engine.save_checkpoint({str(ckpt)!r}, tag="s3")
train(engine, 6)
engine.load_checkpoint({str(ckpt)!r}, tag="s3", load_module_only=True)
train(engine, 7)
engine.destroy()
""",
        tmp_path,
    )
    spans = spans_in(traces)
    (restore,) = [s for s in spans if s["name"] == "ckpt.restore"]
    assert restore["attributes"]["ckpt.restored_step"] == 3
    assert restore["attributes"]["ckpt.step"] == 7
    assert "ckpt.first_step" in children(spans, restore)


def test_a_pipeline_engine_counts_train_batch_as_its_step(tmp_path):
    """PipelineEngine.step() only raises: train_batch is its step (one stage, gloo, CPU)."""
    traces = tmp_path / "t"
    result = run_script(
        f"""
import deepspeed, deepspeed.ops
from deepspeed.pipe import PipelineModule
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
layers = [torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)]
net = PipelineModule(layers=layers, num_stages=1, loss_fn=torch.nn.MSELoss())
config = {{"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2,
          "steps_per_print": 10**9, "zero_optimization": {{"stage": 0}}}}
optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
engine, *_ = deepspeed.initialize(model=net, optimizer=optimizer, config=config)
from ckptprof.integrations.deepspeed import instrument
ckptprof = instrument(engine, trace_dir={str(traces)!r})
def data():
    g = torch.Generator().manual_seed(0)
    while True:
        x = torch.randn(2, 16, generator=g)
        yield x, x[:, :4]
batches = data()
for _ in range(3):
    engine.train_batch(batches)
engine.save_checkpoint({str(tmp_path / "c")!r})
engine.load_checkpoint({str(tmp_path / "c")!r})
engine.train_batch(batches)
trained = ckptprof.session.restore_op is None
engine.load_checkpoint({str(tmp_path / "c")!r})
engine.eval_batch(batches)
print("pipeline", trained, ckptprof.session.restore_op is None, engine.global_steps)
engine.destroy()
""",
        tmp_path,
    )
    assert "pipeline True True 3" in result.stdout, result.stdout
    first, evaluation = sorted(
        (s for s in spans_in(traces) if s["name"] == "ckpt.restore"),
        key=lambda s: span_ns(s["start_time"]),
    )
    spans = spans_in(traces)
    assert first["attributes"]["ckpt.restored_step"] == 3
    assert first["attributes"]["ckpt.step"] == 4
    assert "ckpt.first_step" in children(spans, first)
    assert "ckpt.first_step" not in children(spans, evaluation)


def test_universal_convert_keeps_every_rank_in_step_whatever_ckptprof_finds(tmp_path):
    """Saved by one rank, loaded by two with universal='convert': a conversion that fails
    on rank 0 fails on both ranks (neither waits for the other), and rank 0's finding
    decides for a rank whose own listing failed (both load the universal copy)."""
    ok(run(tmp_path, "train", "--steps", "5"))
    ckpt = tmp_path / "checkpoints"
    result = run_script(
        f"""
import deepspeed.checkpoint.ds_to_universal as d2u
from ckptprof.integrations.deepspeed import instrument
from ckptprof.integrations.files import CheckpointFiles
engine = make_engine(2, 64, 2)
rank = engine.global_rank
instrument(engine, trace_dir={str(tmp_path / "traces")!r}, universal="convert")
convert = d2u.main
def broken(args):
    raise OSError("disk full")
d2u.main = broken
try:
    engine.load_checkpoint({str(ckpt)!r})
    print(f"rank{{rank}} loaded", flush=True)
except Exception as exc:
    print(f"rank{{rank}} refused: {{exc}}", flush=True)
d2u.main = convert
list_folder = CheckpointFiles.list_folder
def unlisted(self, folder, op):
    if rank == 1:
        raise OSError("EIO")
    return list_folder(self, folder, op)
CheckpointFiles.list_folder = unlisted
engine.load_checkpoint({str(ckpt)!r})
print(f"rank{{rank}} resumed at {{engine.global_steps}}", flush=True)
engine.destroy()
""",
        tmp_path,
        nproc=2,
        timeout=240,
    )
    out = result.stdout
    assert "rank0 refused: disk full" in out, out
    assert "rank1 refused: the universal conversion of" in out and "failed on rank 0" in out
    assert "rank0 resumed at 5" in out and "rank1 resumed at 5" in out, out
    assert (ckpt / "global_step5_universal").is_dir()
