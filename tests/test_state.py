"""Where ckptprof keeps its records: never in the user's checkpoint directories."""

from __future__ import annotations

from ckptprof.state import StateStore, default_state_root, directory_key


def test_the_default_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CKPTPROF_STATE_DIR", str(tmp_path / "mine"))
    assert default_state_root() == str(tmp_path / "mine")
    monkeypatch.delenv("CKPTPROF_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_root() == str(tmp_path / "xdg" / "ckptprof")
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_state_root() == str(tmp_path / "home" / ".local" / "state" / "ckptprof")


def test_records_are_kept_per_checkpoint_directory(tmp_path):
    a, b = tmp_path / "run-a" / "checkpoints", tmp_path / "run-b" / "checkpoints"
    assert directory_key(str(a)) != directory_key(str(b))
    assert directory_key(str(a)) == directory_key(str(a) + "/")  # the same directory
    assert directory_key(str(a)).startswith(str(a).strip("/").replace("/", "_")[-48:][:10])
    store = StateStore(tmp_path / "state")
    store.write(str(a), "checkpoint-5/ckptprof-manifest.rank0.json", b"{}")
    assert store.read(str(a), "checkpoint-5/ckptprof-manifest.rank0.json") == b"{}"
    assert store.read(str(b), "checkpoint-5/ckptprof-manifest.rank0.json") is None
    assert store.names(str(a), "checkpoint-5") == ["checkpoint-5/ckptprof-manifest.rank0.json"]
    assert not a.exists()  # nothing was written where the checkpoints are


def test_beside_is_the_explicit_opt_in(tmp_path):
    store = StateStore("beside")
    store.write(str(tmp_path), "last.ckpt.ckptprof.json", b"{}")
    assert (tmp_path / "last.ckpt.ckptprof.json").read_bytes() == b"{}"
    assert store.location(str(tmp_path)) == str(tmp_path)
