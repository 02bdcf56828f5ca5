"""``ckptprof synth save``: real writers, real files, every phase, and a checkpoint the
restore accepts (#24, first part)."""

from __future__ import annotations

import json

import pytest

from ckptprof.manifest import GENERATING_NAME, MANIFEST_NAME
from tests.conftest import SMALL_SCALE, TINY_SCALE, read_spans, run_cli
from tests.test_bad_input import assert_one_line_error
from tests.test_full_disk import small_fs


def save_cli(dest, out, *args: str, layout: str = "torch", scale: float = TINY_SCALE):
    return run_cli(
        "synth", "save", str(dest), "--layout", layout, "--scale", str(scale),
        "--out", str(out), *args,
    )  # fmt: skip


def save_spans(out) -> list[dict]:
    spans = [s for f in sorted((out / "traces").glob("*.jsonl")) for s in read_spans(f)]
    roots = [s for s in spans if s["name"] == "ckpt.save"]
    children = {
        root["context"]["span_id"]: {
            s["name"]: s for s in spans if s.get("parent_id") == root["context"]["span_id"]
        }
        for root in roots
    }
    return [(root, children[root["context"]["span_id"]]) for root in roots]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["torch", "safetensors"])
def test_a_save_is_timed_phase_by_phase_and_restores_with_full_verify(layout, tmp_path):
    dest, out = tmp_path / "ckpt", tmp_path / "out"
    saved = save_cli(dest, out, "--repeat", "2", layout=layout)
    assert saved.returncode == 0, saved.stderr
    assert "median" in saved.stdout and "GB/s" in saved.stdout
    manifest = json.loads((dest / MANIFEST_NAME).read_text())
    total = sum(f["size"] for f in manifest["files"].values())
    assert not (dest / GENERATING_NAME).exists()
    assert not list(dest.rglob("*.partial"))  # every file renamed into place
    saves = save_spans(out)
    assert len(saves) == 2
    for root, phases in saves:
        assert {"ckpt.write", "ckpt.fsync", "ckpt.commit"} <= set(phases)
        write = phases["ckpt.write"]["attributes"]
        assert write["ckpt.bytes"] == total  # what the writers wrote is the checkpoint
        assert write["ckpt.fused"].startswith("serialize+write")
        assert phases["ckpt.fsync"]["attributes"]["ckpt.bytes"] == total  # every file synced
        assert root["attributes"]["ckpt.save.fsync"] is True
        assert root["attributes"]["ckpt.format"] == layout
    # the same bytes restore, checked against the manifest, through every strategy
    restored = run_cli(
        "synth", "restore", str(dest), "--verify", "full", "--cache", "hot",
        "--concurrency", "2", "--repeat", "1", "--no-first-step", "--ceiling-gbps", "1",
        "--strategy", "pipelined,staged,framework", "--out", str(tmp_path / "rout"),
        "--no-report",
    )  # fmt: skip
    assert restored.returncode == 0, restored.stderr
    results = json.loads((tmp_path / "rout" / "results.json").read_text())
    assert {r["strategy"] for r in results["runs"]} == {"pipelined", "staged", "framework"}
    assert all(r["phases"]["verify"]["bytes"] == total for r in results["runs"])


@pytest.mark.slow
def test_no_fsync_is_recorded_and_leaves_the_phase_out(tmp_path):
    out = tmp_path / "out"
    saved = save_cli(tmp_path / "ckpt", out, "--repeat", "1", "--no-fsync")
    assert saved.returncode == 0, saved.stderr
    assert "no fsync" in saved.stdout
    [(root, phases)] = save_spans(out)
    assert "ckpt.fsync" not in phases and "ckpt.write" in phases
    assert root["attributes"]["ckpt.save.fsync"] is False


@pytest.mark.slow
def test_a_full_disk_mid_save_never_leaves_a_complete_looking_checkpoint(tmp_path):
    # room for one copy of the checkpoint but not two: the second save (written beside
    # the first, as a job keeps its last checkpoint while writing the next) runs out
    with small_fs(tmp_path / "fs", "200M") as fs:  # the checkpoint: ~145 MB
        dest = fs / "ckpt"
        saved = save_cli(dest, tmp_path / "out", "--repeat", "2", "--no-fsync",
                         scale=SMALL_SCALE)  # fmt: skip
        line = assert_one_line_error(saved, "could not be written", str(dest))
        assert "free space" in line
        assert not (dest / MANIFEST_NAME).exists()  # never complete-looking
        assert (dest / GENERATING_NAME).exists()  # and --force knows the files are ours
        assert not list(dest.rglob("*.partial"))


def test_what_save_cannot_do_yet_is_one_line(tmp_path):
    dcp = save_cli(tmp_path / "a", tmp_path / "out", layout="dcp")
    assert_one_line_error(dcp, "--layout dcp", "torch and safetensors")
    s3 = run_cli("synth", "save", "s3://bucket/ckpt", "--scale", str(TINY_SCALE))
    assert_one_line_error(s3, "s3://bucket/ckpt", "local or mounted path")


@pytest.mark.slow
def test_save_refuses_a_location_that_is_not_its_own(tmp_path):
    dest = tmp_path / "ckpt"
    dest.mkdir()
    (dest / "notes.txt").write_text("the user's")
    refused = save_cli(dest, tmp_path / "out", "--force")
    assert_one_line_error(refused, str(dest), "not a ckptprof checkpoint")
    assert (dest / "notes.txt").read_text() == "the user's"
