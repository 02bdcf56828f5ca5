"""The one atomic-write helper: nothing half-written looks done, errors name the file."""

from __future__ import annotations

import errno
import os

import pytest

from ckptprof.atomic import atomic_open, atomic_write, move_into_place, named, partial_path


def test_content_appears_only_after_a_clean_exit(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_open(target, "w") as handle:
        handle.write("new, half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"  # the previous version survives
    assert os.listdir(tmp_path) == ["results.json"]  # and no temp file is left
    atomic_write(target, "new")
    assert target.read_text() == "new"
    assert os.listdir(tmp_path) == ["results.json"]


def test_write_errors_name_the_file(tmp_path):
    exc = named(OSError(errno.ENOSPC, "No space left on device"), tmp_path / "x.json")
    assert exc.filename == str(tmp_path / "x.json") and "x.json" in str(exc)
    with pytest.raises(OSError, match="missing-dir"):
        atomic_write(tmp_path / "missing-dir" / "x.json", b"data")


def test_temp_name_is_beside_the_target_and_per_process(tmp_path):
    tmp = partial_path(tmp_path / "m.json")
    assert tmp.parent == tmp_path and str(os.getpid()) in tmp.name


def test_a_folder_checkpoint_replaces_the_previous_one_whole(tmp_path):
    """Lightning's emergency save of a sharded checkpoint is a folder; os.replace alone
    refuses a non-empty folder (the save would be lost)."""
    final, partial = tmp_path / "last.ckpt", tmp_path / "last.ckpt.partial"
    final.mkdir()
    (final / "__0_0.distcp").write_bytes(b"old")
    (final / "stale.distcp").write_bytes(b"old")
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"new")
    with pytest.raises(OSError):
        os.replace(partial, final)
    move_into_place(partial, final)
    assert sorted(p.name for p in final.iterdir()) == ["__0_0.distcp"]
    assert (final / "__0_0.distcp").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # nothing left aside
    file_partial = tmp_path / "x.partial"
    file_partial.write_bytes(b"file")
    move_into_place(file_partial, tmp_path / "x")  # a file: os.replace
    assert (tmp_path / "x").read_bytes() == b"file" and not file_partial.exists()
