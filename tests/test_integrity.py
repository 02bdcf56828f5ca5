"""A checkpoint file's own integrity data, for files no ckptprof record describes."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from ckptprof.integrity import check


def test_torch_save_zip_directory_and_crcs(tmp_path):
    path = tmp_path / "optimizer.pt"
    torch.save({"exp_avg": torch.randn(256, 64)}, path)
    assert check(str(path)).problem is None
    assert check(str(path)).method == "zip central directory"
    full = check(str(path), deep=True)
    assert full.method == "zip crc32" and full.problem is None
    assert full.checked_bytes == path.stat().st_size
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x55  # inside a tensor: only the CRC sees it
    (tmp_path / "flipped.pt").write_bytes(bytes(raw))
    assert check(str(tmp_path / "flipped.pt")).problem is None
    assert "fails its CRC-32" in check(str(tmp_path / "flipped.pt"), deep=True).problem
    (tmp_path / "short.pt").write_bytes(path.read_bytes()[:-200])
    assert "truncated" in check(str(tmp_path / "short.pt")).problem


def test_safetensors_header_against_the_file_size(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.randn(64, 64)}, path)
    assert check(str(path)).method == "safetensors header" and check(str(path)).problem is None
    (tmp_path / "cut.safetensors").write_bytes(path.read_bytes()[:-10])
    assert "truncated" in check(str(tmp_path / "cut.safetensors")).problem
    (tmp_path / "tiny.safetensors").write_bytes(b"\x01")
    assert "too short" in check(str(tmp_path / "tiny.safetensors")).problem


def test_json_and_formats_without_integrity_data(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 5}))
    (tmp_path / "broken.json").write_text('{"global_step": ')
    (tmp_path / "latest").write_text("global_step5")
    assert check(str(tmp_path / "trainer_state.json")).problem is None
    assert "not valid JSON" in check(str(tmp_path / "broken.json")).problem
    assert check(str(tmp_path / "latest")).method.startswith("none")


def test_dcp_metadata_byte_ranges(tmp_path):
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "dcp"
    dcp.save({"w": torch.randn(128, 128)}, checkpoint_id=str(folder), no_dist=True)
    assert check(str(folder)).method == "dcp metadata" and check(str(folder)).problem is None
    (shard,) = folder.glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:100])
    assert f"{shard.name} has 100 bytes" in check(str(folder)).problem
    assert check(str(tmp_path)).method.startswith("none")  # a folder without metadata
