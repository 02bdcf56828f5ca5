"""``ckptprof synth save``: real writers, real files, every phase, and a checkpoint the
restore accepts, for every layout x strategy, on a local disk and on S3 (SeaweedFS)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from ckptprof.manifest import GENERATING_NAME, MANIFEST_NAME
from tests.conftest import SMALL_SCALE, TINY_SCALE, read_spans, run_cli
from tests.conftest import children as phase_spans
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
    return [(root, phase_spans(spans, root)) for root in roots]  # phases, not progress records


def restore_full(dest, out, strategies: str = "pipelined", env=None):
    """``synth restore --verify full`` of what was saved: every byte against the manifest."""
    return run_cli(
        "synth", "restore", str(dest), "--verify", "full", "--cache", "hot",
        "--concurrency", "2", "--repeat", "1", "--no-first-step", "--ceiling-gbps", "1",
        "--strategy", strategies, "--out", str(out), "--no-report", env=env,
    )  # fmt: skip


def manifest_total(dest, less: str = "") -> int:
    """The saved files' bytes (``less``: one left out, e.g. DCP's .metadata, its commit)."""
    manifest = json.loads((dest / MANIFEST_NAME).read_text())
    return sum(f["size"] for name, f in manifest["files"].items() if name != less)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["torch", "safetensors"])
def test_a_save_is_timed_phase_by_phase_and_restores_with_full_verify(layout, tmp_path):
    dest, out = tmp_path / "ckpt", tmp_path / "out"
    saved = save_cli(dest, out, "--repeat", "2", "--strategy", "framework", layout=layout)
    assert saved.returncode == 0, saved.stderr
    assert "median" in saved.stdout and "GB/s" in saved.stdout
    named = saved.stdout.strip().splitlines()[-1].rsplit("traces: ", 1)[1]
    assert Path(named).parent == out / "traces" and read_spans(Path(named))  # flushed, named
    total = manifest_total(dest)
    assert not (dest / GENERATING_NAME).exists()
    assert not list(dest.rglob("*.partial"))  # every file renamed into place
    assert not list(dest.rglob(".ckptprof-write-probe*"))  # the write probe left nothing
    doc = json.loads((out / "save.json").read_text())  # the result, with what it ran on
    assert doc["environment"]["storage.kind"] == "posix" and "version.torch" in doc["environment"]
    assert "probe" in doc["ceiling"]["source"] and doc["ceiling"]["write_gbps"] > 0
    assert [r["repeat"] for r in doc["saves"]] == [0, 1]
    assert doc["summary"]["of_ceiling"] == pytest.approx(
        doc["summary"]["median_gbps"] / doc["ceiling"]["write_gbps"]
    )
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
    restored = restore_full(dest, tmp_path / "rout", "pipelined,staged,framework")
    assert restored.returncode == 0, restored.stderr
    results = json.loads((tmp_path / "rout" / "results.json").read_text())
    assert {r["strategy"] for r in results["runs"]} == {"pipelined", "staged", "framework"}
    assert all(r["phases"]["verify"]["bytes"] == total for r in results["runs"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout, strategy, phases",
    [
        ("torch", "parallel", {"serialize", "write", "fsync", "commit"}),
        ("safetensors", "parallel", {"serialize", "write", "fsync", "commit"}),
        ("deepspeed", "framework", {"write", "fsync", "commit"}),
        ("deepspeed", "parallel", {"serialize", "write", "fsync", "commit"}),
        ("dcp", "framework", {"write", "commit"}),  # DCP's writer syncs inside its write
    ],
)
def test_every_layout_and_strategy_saves_a_checkpoint_the_restore_accepts(
    layout, strategy, phases, tmp_path
):
    dest, out = tmp_path / "ckpt", tmp_path / "out"
    saved = save_cli(dest, out, "--repeat", "1", "--strategy", strategy,
                     "--concurrency", "4", "--part-size", "1M", layout=layout)  # fmt: skip
    assert saved.returncode == 0, saved.stderr
    total = manifest_total(dest, less=".metadata")  # DCP writes it in its commit
    [(root, children)] = save_spans(out)
    assert {f"ckpt.{p}" for p in phases} == set(children)
    assert children["ckpt.write"]["attributes"]["ckpt.bytes"] == total
    assert root["attributes"]["ckpt.strategy"] == strategy
    if strategy == "parallel":  # the I/O core's writes: part by part, 4 at once
        assert children["ckpt.write"]["attributes"]["ckpt.concurrency"] == 4
        assert children["ckpt.fsync"]["attributes"]["ckpt.bytes"] == total
    if layout == "dcp":
        assert "fsync" in children["ckpt.write"]["attributes"]["ckpt.fused"]
    assert not list(dest.rglob("*.partial"))
    restored = restore_full(dest, tmp_path / "rout")
    assert restored.returncode == 0, restored.stderr


@pytest.mark.slow
def test_an_async_save_blocks_only_for_its_staging(tmp_path):
    """DCP's async_save: the save's span is the blocking part (stage); the write and the
    commit are a background ckpt.save linked to it, as the callbacks record them."""
    dest, out = tmp_path / "ckpt", tmp_path / "out"
    saved = save_cli(dest, out, "--repeat", "2", "--strategy", "async", layout="dcp")
    assert saved.returncode == 0, saved.stderr
    assert "blocking" in saved.stdout and "in the background" in saved.stdout
    total = manifest_total(dest, less=".metadata")
    saves = save_spans(out)
    blocking = [(r, c) for r, c in saves if not r["attributes"].get("ckpt.save.background")]
    background = [(r, c) for r, c in saves if r["attributes"].get("ckpt.save.background")]
    assert len(blocking) == len(background) == 2
    for (root, children), (bg_root, bg_children) in zip(blocking, background, strict=True):
        assert set(children) == {"ckpt.stage"}
        assert {"ckpt.write", "ckpt.commit"} == set(bg_children)
        assert bg_children["ckpt.write"]["attributes"]["ckpt.bytes"] == total
        [link] = bg_root["links"]
        assert link["context"]["span_id"] == root["context"]["span_id"]
        # training goes on before the write ends: the blocking part is over first, and
        # shorter than the background save it started
        assert root["end_time"] < bg_children["ckpt.write"]["end_time"]
        assert root["attributes"]["ckpt.wall_s"] < bg_root["attributes"]["ckpt.wall_s"]
    # its GB/s is to the storage (blocking part and background write): the blocking part
    # alone is a copy into memory, no share of a write ceiling, in every view
    doc = json.loads((out / "save.json").read_text())
    durable = statistics.median(s["wall_s"] + s["background_s"] for s in doc["saves"])
    gbps = doc["saves"][0]["bytes"] / durable / 1e9
    assert doc["summary"]["median_gbps"] == pytest.approx(gbps)
    assert f"{gbps:.2f} GB/s to the storage" in saved.stdout
    shown = run_cli("report", str(out))
    assert shown.returncode == 0 and "of the write ceiling" not in shown.stdout, shown.stdout
    restored = restore_full(dest, tmp_path / "rout")
    assert restored.returncode == 0, restored.stderr


def test_an_s3_save_is_a_multipart_upload_the_restore_reads_back(s3_bucket, s3_env, tmp_path):
    env = s3_env()
    location = f"s3://{s3_bucket.name}/saved/torch"
    out = tmp_path / "out"
    saved = run_cli(
        "synth", "save", location, "--layout", "torch", "--scale", str(TINY_SCALE),
        "--strategy", "parallel", "--concurrency", "4", "--repeat", "1", "--out", str(out),
        env=env,
    )  # fmt: skip
    assert saved.returncode == 0, saved.stderr
    [(root, children)] = save_spans(out)
    assert {"ckpt.serialize", "ckpt.write", "ckpt.commit"} == set(children)  # S3: no fsync
    keys = [o["Key"] for o in s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name)["Contents"]]
    assert not [k for k in keys if "write-probe" in k]  # the probe's upload was aborted
    uploads = s3_bucket.client.list_multipart_uploads(Bucket=s3_bucket.name)
    assert not uploads.get("Uploads")  # and no upload is left open
    head = s3_bucket.client.head_object(
        Bucket=s3_bucket.name, Key="saved/torch/checkpoint_rank0.pt"
    )
    assert "-" in head["ETag"]  # "<md5>-<parts>": uploaded part by part
    assert root["attributes"]["ckpt.storage.kind"] == "s3"
    restored = restore_full(location, tmp_path / "rout", env=env)
    assert restored.returncode == 0, restored.stderr


@pytest.mark.slow
def test_no_fsync_is_recorded_and_leaves_the_phase_out(tmp_path):
    out = tmp_path / "out"
    saved = save_cli(tmp_path / "ckpt", out, "--repeat", "1", "--no-fsync", "--ceiling-gbps", "2")
    doc = json.loads((out / "save.json").read_text())
    assert doc["ceiling"] == {"write_gbps": 2.0, "source": "given (--ceiling-gbps)", "bytes": 0}
    assert saved.returncode == 0, saved.stderr
    assert "no fsync" in saved.stdout
    [(root, phases)] = save_spans(out)
    assert "ckpt.fsync" not in phases and "ckpt.write" in phases
    assert root["attributes"]["ckpt.save.fsync"] is False


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["framework", "parallel"])
def test_a_full_disk_mid_save_never_leaves_a_complete_looking_checkpoint(strategy, tmp_path):
    # room for one copy of the checkpoint but not two: the second save (written beside
    # the first, as a job keeps its last checkpoint while writing the next) runs out
    with small_fs(tmp_path / "fs", "200M") as fs:  # the checkpoint: ~145 MB
        dest = fs / "ckpt"
        saved = save_cli(dest, tmp_path / "out", "--repeat", "2", "--no-fsync",
                         "--strategy", strategy, scale=SMALL_SCALE)  # fmt: skip
        line = assert_one_line_error(saved, "could not be written", str(dest))
        assert "free space" in line
        assert not (dest / MANIFEST_NAME).exists()  # never complete-looking
        assert (dest / GENERATING_NAME).exists()  # and --force knows the files are ours
        assert not list(dest.rglob("*.partial"))


def test_what_save_cannot_do_is_one_line(tmp_path):
    parallel_dcp = save_cli(tmp_path / "a", tmp_path / "out", "--strategy", "parallel",
                            layout="dcp")  # fmt: skip
    assert_one_line_error(parallel_dcp, "--strategy parallel", "DCP's own writer")
    async_torch = save_cli(tmp_path / "a", tmp_path / "out", "--strategy", "async")
    assert_one_line_error(async_torch, "--strategy async", "--layout dcp")
    here = tmp_path / "cwd"  # where the default --out (ckptprof-save) would go
    here.mkdir()
    s3 = run_cli("synth", "save", "s3://bucket/ckpt", "--scale", str(TINY_SCALE),
                 "--strategy", "framework", cwd=here)  # fmt: skip
    assert_one_line_error(s3, "--strategy framework", "--strategy parallel")
    assert list(here.iterdir()) == []  # refused before its --out was made
    ranks_dcp = save_cli(tmp_path / "a", tmp_path / "out", "--nproc-per-node", "2", layout="dcp")
    line = assert_one_line_error(ranks_dcp, "--layout dcp", "one process")
    assert "rank 1 of 2" not in line  # before any rank starts (once, after both ranks had)
    mismatched = save_cli(tmp_path / "a", tmp_path / "out", "--nproc-per-node", "2", "--ranks",
                          "3")  # fmt: skip
    assert_one_line_error(mismatched, "--ranks 3", "use --ranks 2")
    assert "rank 1 of 2" not in mismatched.stderr
    assert not (tmp_path / "a").exists()  # refused before anything was written


def test_direct_io_staging_that_does_not_fit_beside_the_state_is_refused_first(
    tmp_path, monkeypatch, capsys
):
    """--direct-io holds its staging buffers (one part per write in flight, and two) beside
    the state: with memory for the state and a little more (faked), 8 parts of 16M in
    flight are refused in one line naming the options and the fix, before anything is
    written; the state alone fits, so it is the staging the check counted."""
    import types

    import psutil

    from ckptprof.cli import main
    from ckptprof.synth.layouts import get_layout
    from ckptprof.synth.plan import SynthSpec
    from ckptprof.synth.save import MEMORY_HEADROOM

    state = get_layout("torch").plan(SynthSpec("llama2-7b", "torch", TINY_SCALE)).payload_bytes
    available = int((state + (8 << 20)) / MEMORY_HEADROOM)  # the state and 8 MiB more
    memory = types.SimpleNamespace(available=available, total=available)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory)
    dest = tmp_path / "ckpt"
    code = main([
        "synth", "save", str(dest), "--layout", "torch", "--scale", str(TINY_SCALE),
        "--strategy", "parallel", "--direct-io", "--concurrency", "8", "--part-size", "16M",
        "--repeat", "1", "--ceiling-gbps", "1", "--out", str(tmp_path / "out"),
    ])  # fmt: skip
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code != 0 and len(err) == 1, err
    for needle in ("--direct-io", "--concurrency 8", "--part-size", "of memory available",
                   "lower --concurrency or --part-size, or drop --direct-io"):  # fmt: skip
        assert needle in err[0], err[0]
    assert "--scale" not in err[0]  # the state alone fits
    assert not dest.exists()  # refused before the location was claimed or the state built


@pytest.mark.slow
def test_save_refuses_a_location_that_is_not_its_own(tmp_path):
    dest = tmp_path / "ckpt"
    dest.mkdir()
    (dest / "notes.txt").write_text("the user's")
    refused = save_cli(dest, tmp_path / "out", "--force")
    assert_one_line_error(refused, str(dest), "not a ckptprof checkpoint")
    assert (dest / "notes.txt").read_text() == "the user's"
