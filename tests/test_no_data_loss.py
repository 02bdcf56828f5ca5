"""`synth generate` never overwrites or deletes what it did not write.

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
from tests.conftest import TINY_SCALE, interrupted_generation, run_cli
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_restore_ignores_an_unrelated_dangling_link(checkpoints, tmp_path):
    """A dangling link the user left in the checkpoint folder: the restore reads every
    file of the checkpoint and leaves the folder as it was, byte for byte, link and all."""
    import shutil

    dest = tmp_path / "ckpt"
    shutil.copytree(checkpoints("torch"), dest)
    nowhere = tmp_path / "nowhere"
    (dest / "notes").symlink_to(nowhere)
    before = snapshot(dest)
    result = restore_cli(dest)
    assert result.returncode == 0, result.stderr
    assert snapshot(dest) == before  # every file as it was, byte for byte, and no new one
    assert sorted(os.listdir(dest)) == sorted([*before, "notes"])  # nor a new link or folder
    assert (dest / "notes").is_symlink() and os.readlink(dest / "notes") == str(nowhere)
    assert not os.path.lexists(nowhere)  # nothing was made where it points
    # and the restore read the checkpoint, every file the manifest names, not the link
    files = json.loads((dest / MANIFEST_NAME).read_text())["files"]
    (run,) = json.loads((tmp_path / "out" / "results.json").read_text())["runs"]
    assert run["phases"]["fetch"]["files"] == len(files)
    assert run["phases"]["fetch"]["bytes"] == sum(f["size"] for f in files.values())


@pytest.mark.slow
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


@pytest.mark.slow
def test_an_interrupted_generate_can_be_replaced_with_force(tmp_path, monkeypatch):
    """Once, after a failed generate, `generate` said "pass --force" and --force refused."""
    dest = tmp_path / "partial"
    (tmp_path / "mine.txt").write_text("precious")
    interrupted_generation(dest, 3, monkeypatch)  # config.json and two of the four parts
    assert (dest / "checkpoint_rank0_part0001.pt").exists() and (dest / GENERATING_NAME).exists()
    assert_one_line_error(restore_cli(dest), MANIFEST_NAME, "did not finish", "--force")
    again = generate(dest, "--files", "4")
    assert_one_line_error(again, "not empty", "pass --force")
    (dest / "user-notes.txt").write_text("mine")  # not the generation's: --force refuses
    assert_one_line_error(generate(dest, "--force", "--files", "4"), "user-notes.txt")
    (dest / "user-notes.txt").unlink()
    replaced = generate(dest, "--force", "--files", "4")
    assert replaced.returncode == 0, replaced.stderr
    assert (dest / MANIFEST_NAME).exists() and not (dest / GENERATING_NAME).exists()
    assert restore_cli(dest).returncode == 0
    assert (tmp_path / "mine.txt").read_text() == "precious"


def test_force_checks_every_path_before_deleting_anything(tmp_path):
    """Once, a checkpoint file replaced by a folder made --force delete the old
    checkpoint and then fail: the user had neither. Now nothing is deleted."""
    from ckptprof.synth.generate import generate as generate_in_process
    from ckptprof.synth.plan import SynthSpec

    dest = tmp_path / "ckpt"
    spec = SynthSpec("llama2-7b", "deepspeed", TINY_SCALE)
    generate_in_process(str(dest), spec, progress=False)
    data = sorted(p for p in dest.rglob("*.pt") if p.stat().st_size > 100_000)
    data[0].unlink()
    data[0].mkdir()  # an empty folder where the checkpoint writes a file
    before = snapshot(tmp_path)
    with pytest.raises(CkptprofError, match=f"{data[0].name}: is a folder"):
        generate_in_process(str(dest), spec, force=True, progress=False)
    assert snapshot(tmp_path) == before  # not one byte deleted or rewritten
    assert data[0].is_dir()


def test_force_over_a_link_replaces_the_link_never_its_target(tmp_path):
    """A checkpoint file that became a link elsewhere: --force removes the link (ours to
    replace) and writes a file in its place; what it pointed to is untouched."""
    from ckptprof.synth.generate import generate as generate_in_process
    from ckptprof.synth.plan import SynthSpec

    dest = tmp_path / "ckpt"
    spec = SynthSpec("llama2-7b", "torch", TINY_SCALE)
    generate_in_process(str(dest), spec, progress=False)
    (data,) = [p for p in dest.rglob("*.pt") if p.stat().st_size > 100_000]
    outside = tmp_path / "outside.pt"
    outside.write_text("precious")
    data.unlink()
    data.symlink_to(outside)
    generate_in_process(str(dest), spec, force=True, progress=False)
    assert outside.read_text() == "precious"
    assert not data.is_symlink() and data.stat().st_size > 100_000


def special_files(tmp_path: Path) -> dict[str, Path]:
    """A link to a regular file elsewhere, a FIFO and (as root) a character device."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "real.png").write_text("old")
    paths = {"link": tmp_path / "link.png"}
    paths["link"].symlink_to(elsewhere / "real.png")
    paths["fifo"] = tmp_path / "fifo.png"
    os.mkfifo(paths["fifo"])
    if os.geteuid() == 0:
        import stat

        paths["null"] = tmp_path / "null.png"  # what /dev/null is: char device 1:3
        os.mknod(paths["null"], stat.S_IFCHR | 0o666, os.makedev(1, 3))
        paths["full"] = tmp_path / "full.png"  # /dev/full: every write fails with ENOSPC
        os.mknod(paths["full"], stat.S_IFCHR | 0o666, os.makedev(1, 7))
    return paths


def output_commands(source: Path) -> dict[str, list[str]]:
    """Every command that writes a file the user names, and how it names it."""
    return {
        "report --plot": ["report", str(source), "--plot"],
        "report --html": ["report", str(source), "--html"],
        "export -o": ["export", str(source / "traces"), "--format", "otlp-json", "-o"],
        "compare --plot": ["compare", str(source), str(source), "--plot"],
    }


@pytest.fixture(scope="module")
def traced_results(tmp_path_factory):
    """A real restore's results.json and traces (the inputs every output command reads)."""
    from ckptprof.synth.generate import generate as generate_in_process
    from ckptprof.synth.plan import SynthSpec

    root = tmp_path_factory.mktemp("outputs")
    generate_in_process(str(root / "ckpt"), SynthSpec("llama2-7b", "torch", TINY_SCALE),
                        progress=False)  # fmt: skip
    done = restore_cli(root / "ckpt", "--repeat", "2")
    assert done.returncode == 0, done.stderr
    return root / "out"


@pytest.mark.slow
@pytest.mark.parametrize("command", ["report --plot", "report --html", "export -o",
                                     "compare --plot"])  # fmt: skip
def test_outputs_write_through_links_devices_and_fifos_never_replace_them(
    traced_results, tmp_path, command, capsys
):
    """Once, `--html /dev/full` replaced the machine's /dev/full with a regular file."""
    import stat
    import threading

    from ckptprof.cli import main

    argv = output_commands(traced_results)[command]
    for kind, path in special_files(tmp_path).items():
        got: list[bytes] = []
        reader = None
        if kind == "fifo":  # a reader on the other end, as `cmd > fifo` would need
            reader = threading.Thread(target=lambda p=path, g=got: g.append(p.read_bytes()))
            reader.start()
        code = main([*argv, str(path)])
        err = capsys.readouterr().err
        if reader is not None:
            reader.join(30)
        mode = path.lstat().st_mode
        if kind == "link":
            assert code == 0, err
            assert path.is_symlink() and (tmp_path / "elsewhere" / "real.png").stat().st_size > 3
        elif kind == "fifo":
            assert code == 0, err
            assert stat.S_ISFIFO(mode) and got and len(got[0]) > 100
        elif kind == "null":
            assert code == 0, err
            assert stat.S_ISCHR(mode)
        else:  # /dev/full: the write fails, one line naming the file; the device stays
            assert code != 0 and str(path) in err and "Traceback" not in err
            assert stat.S_ISCHR(mode)
    folder = tmp_path / "a-folder.png"
    folder.mkdir()
    assert main([*argv, str(folder)]) != 0
    assert "a folder" in capsys.readouterr().err and folder.is_dir()
    if os.geteuid() != 0:
        pytest.skip("character devices (mknod) need root; link and FIFO were checked")
