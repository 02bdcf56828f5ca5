"""`synth generate` never overwrites or deletes what it did not write (#17).

Each test puts the user's own files in and around DEST, runs the real CLI, and checks
they are all still there, byte for byte.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ckptprof.errors import CkptprofError
from ckptprof.manifest import GENERATING_NAME, MANIFEST_NAME
from ckptprof.storage.posix import PosixStorage
from tests.conftest import TINY_SCALE, run_cli
from tests.test_bad_input import assert_one_line_error, restore_cli


def generate(dest, *extra, **popen):
    return run_cli("synth", "generate", str(dest), "--scale", str(TINY_SCALE), *extra, **popen)


def snapshot(root) -> dict[str, bytes]:
    """Every regular file under ``root`` (links not followed), with its bytes."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            if not path.is_symlink():
                out[str(path.relative_to(root))] = path.read_bytes()
    return out


@pytest.mark.parametrize("force", [False, True])
def test_a_dangling_link_does_not_make_dest_look_empty(tmp_path, force):
    dest = tmp_path / "d"
    (dest / "sub").mkdir(parents=True)
    (dest / "config.json").write_text("mine")
    missing_target = tmp_path / "outside" / "not-there"
    (dest / "sub" / "x").symlink_to(missing_target)
    before = snapshot(tmp_path)
    result = generate(dest, *(["--force"] if force else []))
    assert_one_line_error(result, str(dest), "choose an empty location")
    assert snapshot(tmp_path) == before  # config.json is still "mine"
    assert not missing_target.exists() and (dest / "sub" / "x").is_symlink()
    assert not (dest / MANIFEST_NAME).exists()


def test_an_empty_dest_is_refused_not_the_current_folder(tmp_path):
    (tmp_path / "config.json").write_text("mine")
    result = generate("", cwd=tmp_path)
    assert_one_line_error(result, "DEST", "a folder")
    assert os.listdir(tmp_path) == ["config.json"]
    assert (tmp_path / "config.json").read_text() == "mine"


def test_restore_ignores_an_unrelated_dangling_link(checkpoints, tmp_path):
    import shutil

    dest = tmp_path / "ckpt"
    shutil.copytree(checkpoints("torch"), dest)
    (dest / "notes").symlink_to(tmp_path / "nowhere")
    result = restore_cli(dest)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("escape", ["../victim.txt", "/ABS/victim.txt", "sub/../../victim.txt"])
def test_force_never_deletes_a_manifest_path_outside_dest(tmp_path, escape):
    dest = tmp_path / "ckpt"
    assert generate(dest).returncode == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    named = escape.replace("/ABS", str(tmp_path))
    manifest = json.loads((dest / MANIFEST_NAME).read_text())
    manifest["files"][named] = {"size": 8, "xxh3": "", "sample_xxh3": ""}
    (dest / MANIFEST_NAME).write_text(json.dumps(manifest))
    before = snapshot(tmp_path)
    result = generate(dest, "--force")
    assert_one_line_error(result, MANIFEST_NAME, repr(named), "relative path", "will not replace")
    assert victim.read_text() == "precious"
    assert snapshot(tmp_path) == before  # nothing at all was deleted or rewritten


def test_writes_and_deletes_never_follow_a_link_out_of_the_location(tmp_path):
    """A folder inside DEST that is a link to elsewhere: nothing there is touched."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.pt").write_text("precious")
    dest = tmp_path / "ckpt"
    dest.mkdir()
    (dest / "global_step1000").symlink_to(outside)
    storage = PosixStorage(str(dest))
    for touch in (
        lambda: storage.delete("global_step1000/model.pt"),
        lambda: storage.write_bytes("global_step1000/model.pt", b"new"),
        lambda: storage.write_bytes("global_step1000/new.pt", b"new"),
    ):
        with pytest.raises(CkptprofError, match="outside"):
            touch()
    assert os.listdir(outside) == ["model.pt"] and (outside / "model.pt").read_text() == "precious"


def test_an_interrupted_generate_can_be_replaced_with_force(tmp_path):
    """#17: after a failed generate, `generate` said "pass --force" and --force refused."""
    dest = tmp_path / "partial"
    blocker = dest / "checkpoint_rank0_part0002.pt"
    blocker.mkdir(parents=True)  # publishing the third file fails for real
    (tmp_path / "mine.txt").write_text("precious")
    failed = generate(dest, "--files", "4")
    assert_one_line_error(failed, "checkpoint_rank0_part0002.pt")
    assert (dest / "checkpoint_rank0_part0001.pt").exists() and (dest / GENERATING_NAME).exists()
    assert_one_line_error(restore_cli(dest), MANIFEST_NAME, "did not finish", "--force")
    again = generate(dest, "--files", "4")
    assert_one_line_error(again, "not empty", "pass --force")
    blocker.rmdir()
    (dest / "user-notes.txt").write_text("mine")  # not the generation's: --force refuses
    assert_one_line_error(generate(dest, "--force", "--files", "4"), "user-notes.txt")
    (dest / "user-notes.txt").unlink()
    replaced = generate(dest, "--force", "--files", "4")
    assert replaced.returncode == 0, replaced.stderr
    assert (dest / MANIFEST_NAME).exists() and not (dest / GENERATING_NAME).exists()
    assert restore_cli(dest).returncode == 0
    assert (tmp_path / "mine.txt").read_text() == "precious"
