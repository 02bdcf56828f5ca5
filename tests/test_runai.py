"""``--strategy runai``: the real Run:ai Model Streamer on local safetensors shards."""

from __future__ import annotations

import json

import pytest

from tests.conftest import read_spans, run_cli
from tests.test_bad_input import assert_one_line_error
from tests.test_synth import restored_state

pytestmark = pytest.mark.slow  # real jobs in fresh processes


def test_runai_restores_the_same_state_as_every_strategy(checkpoints):
    path = checkpoints("safetensors")
    for world, rank in ((None, None), (3, 1)):
        streamed = restored_state(path, "runai", world_size=world, rank=rank).digest()
        assert streamed == restored_state(path, "pipelined", world_size=world, rank=rank).digest()


def test_runai_is_one_fused_interval_beside_the_other_phases(checkpoints, tmp_path):
    out = tmp_path / "out"
    done = run_cli("synth", "restore", str(checkpoints("safetensors")), "--strategy",
                   "runai,pipelined", "--cache", "cold", "--concurrency", "4", "--repeat", "1",
                   "--ceiling-gbps", "1", "--out", str(out), "--world-size", "1")  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "results.json").read_text())
    (run,) = [r for r in doc["runs"] if r["strategy"] == "runai"]
    assert set(run["phases"]) >= {"list", "fetch", "verify", "deserialize", "reshard"}
    spans = read_spans(doc["trace_file"])
    (root,) = [s for s in spans if s["name"] == "ckpt.restore"
               and s["attributes"]["ckpt.strategy"] == "runai"]  # fmt: skip
    deserialize = next(s for s in spans if s["name"] == "ckpt.deserialize"
                       and s["parent_id"] == root["context"]["span_id"])  # fmt: skip
    attrs = deserialize["attributes"]
    assert attrs["ckpt.fused"] == "fetch+deserialize (runai-model-streamer)"
    assert attrs["ckpt.loader"] == "runai-model-streamer"
    assert attrs["ckpt.loader.concurrency"] == 4 and attrs["ckpt.loader.streamed_s"] > 0
    shards = sum(f["size"] for n, f in json.loads((checkpoints("safetensors") /
                 "ckptprof-manifest.json").read_text())["files"].items()
                 if n.endswith(".safetensors"))  # fmt: skip
    assert attrs["ckpt.bytes"] >= shards
    assert "runai" in done.stdout  # side by side in the sweep table


def test_runai_on_another_layout_is_one_clear_line(checkpoints):
    done = run_cli("synth", "restore", str(checkpoints("torch")), "--strategy", "runai",
                   "--cache", "hot", "--concurrency", "1", "--repeat", "1")  # fmt: skip
    assert_one_line_error(
        done, "--strategy runai streams safetensors shards", "--layout safetensors"
    )
