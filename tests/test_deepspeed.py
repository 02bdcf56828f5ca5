"""The DeepSpeed adapter with the real DeepSpeed engine on CPU (gloo), in real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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
    assert attrs["ckpt.interruption.downtime_s"] > 0


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
