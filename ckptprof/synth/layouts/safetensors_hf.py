"""Hugging Face ``save_pretrained`` / Trainer checkpoint folder.

``model-0000k-of-0000N.safetensors`` shards plus ``model.safetensors.index.json``
(the weights, bf16, whole tensors in state-dict order), ``optimizer.pt`` (a
``torch.save`` of the Adam state, as the Trainer writes it), scheduler, RNG,
trainer state, config and tokenizer files.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from ckptprof.synth.layouts.base import Layout
from ckptprof.synth.layouts.small_files import hf_small_files
from ckptprof.synth.layouts.torchfile import fake_tensor, write_torch_save
from ckptprof.synth.plan import (
    GROUP_MODEL,
    CheckpointPlan,
    FilePlan,
    Piece,
    SynthSpec,
    pack_in_order,
    state_groups,
    whole_pieces,
)

INDEX = "model.safetensors.index.json"
MAX_SHARD_BYTES = 5_000_000_000  # transformers' default max_shard_size="5GB"
_ST_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "int64": "I64"}


def _header(pieces: tuple[Piece, ...]) -> bytes:
    meta: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for p in pieces:
        meta[p.key] = {
            "dtype": _ST_DTYPES[p.dtype],
            "shape": list(p.piece_shape),
            "data_offsets": [offset, offset + p.nbytes],
        }
        offset += p.nbytes
    raw = json.dumps(meta, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


_TORCH_DTYPES = {v: getattr(torch, k) for k, v in _ST_DTYPES.items()}


def read_safetensors(buffer) -> dict[str, torch.Tensor]:
    """The tensors of a fetched ``.safetensors`` file, in place (what ``safe_open`` does
    over its mmap: parse the JSON header, view each tensor's byte range; no copy)."""
    with buffer.reader() as stream:
        length = int.from_bytes(stream.read(8), "little")
        header = json.loads(stream.read(length))
    base = 8 + length
    out = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = _TORCH_DTYPES[info["dtype"]]
        count = (end - start) // dtype.itemsize
        flat = torch.frombuffer(buffer.view, dtype=dtype, count=count, offset=base + start)
        out[key] = flat.view(info["shape"])
    return out


def _param_index(plan: CheckpointPlan) -> dict[str, int]:
    """Parameter name -> its index in the optimizer state, as ``optimizer.state_dict()`` has."""
    return {t.name: i for i, t in enumerate(plan.preset.tensors())}


class SafetensorsLayout(Layout):
    name = "safetensors"
    format = "safetensors"

    def overhead(self, file: FilePlan) -> int:
        """Shards: 8 bytes plus a JSON header entry (and an index entry) per tensor; the
        optimizer file is a torch.save archive."""
        if file.kind == "weights":
            return 64 + 384 * len(file.pieces)
        return super().overhead(file)

    def plan(self, spec: SynthSpec) -> CheckpointPlan:
        preset = spec.preset()
        model = whole_pieces(preset, GROUP_MODEL, "bfloat16")
        shards = spec.files or max(1, math.ceil(spec.full_preset().params * 2 / MAX_SHARD_BYTES))
        groups = pack_in_order(model, shards)
        files = [
            FilePlan(f"model-{k + 1:05d}-of-{shards:05d}.safetensors", "weights", None, tuple(g))
            for k, g in enumerate(groups)
        ]
        files.append(FilePlan(INDEX, "metadata"))
        optim = [
            p
            for group, dtype in state_groups(spec)
            if group != GROUP_MODEL
            for p in whole_pieces(preset, group, dtype)
        ]
        if optim:
            files.append(FilePlan("optimizer.pt", "optim", None, tuple(optim)))
        files += hf_small_files(spec)
        return CheckpointPlan(spec, preset, tuple(files))

    def write_file(self, plan, file, dest: Path, filler) -> None:
        if file.kind == "weights":
            header = _header(file.pieces)
            with open(dest, "wb") as handle:
                handle.write(len(header).to_bytes(8, "little"))
                handle.write(header)
            fd = os.open(dest, os.O_WRONLY)
            try:
                filler.fill_fd(fd, 8 + len(header), file.payload_bytes)
            finally:
                os.close(fd)
        elif file.kind == "optim":
            fake = {p: fake_tensor(p.piece_shape, p.dtype) for p in file.pieces}
            write_torch_save(dest, self.archive(plan, file, fake), filler)
        else:
            dest.write_bytes(self.small_bytes(plan, file))

    def save_file(self, plan, file, dest: Path, tensors: dict) -> None:
        if file.kind == "weights":  # safetensors' own writer, as save_pretrained calls it
            from safetensors.torch import save_file

            save_file({p.key: tensors[p] for p in file.pieces}, str(dest))
        else:
            super().save_file(plan, file, dest, tensors)

    def serialize_file(self, plan, file, tensors: dict) -> list:
        """A shard is its header, then each tensor's bytes as they are in memory."""
        if file.kind != "weights":
            return super().serialize_file(plan, file, tensors)
        header = _header(file.pieces)
        views = [tensors[p].reshape(-1).view(torch.uint8).numpy() for p in file.pieces]
        return [len(header).to_bytes(8, "little") + header, *views]

    def small_bytes(self, plan, file) -> bytes:
        if file.path != INDEX:
            return super().small_bytes(plan, file)
        weight_map = {p.key: f.path for f in plan.files if f.kind == "weights" for p in f.pieces}
        total = sum(f.payload_bytes for f in plan.files if f.kind == "weights")
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        return json.dumps(index, indent=2).encode()

    def archive(self, plan, file, tensors: dict) -> dict:
        """The Trainer's ``optimizer.pt``: AdamW's state by parameter index."""
        state: dict[int, dict] = {}
        index = _param_index(plan)
        for p in file.pieces:
            state.setdefault(index[p.name], {})[p.group] = tensors[p]
        return {
            "state": state,
            "param_groups": [
                {"lr": 2e-5, "betas": (0.9, 0.999), "params": list(range(len(index)))}
            ],
        }

    def discover(self, storage, plan) -> list[str]:
        index = json.loads(storage.read_bytes(INDEX))
        shards = sorted(set(index["weight_map"].values()))
        return shards + [f.path for f in plan.files if f.path not in shards]

    def deserialize(self, plan, file, buffer) -> dict[Piece, torch.Tensor]:
        if file.kind == "weights":
            tensors = read_safetensors(buffer)
            return {p: tensors[p.key] for p in file.pieces}
        return super().deserialize(plan, file, buffer)

    def index_hints(self, file, sparse) -> list[tuple[int, int]]:
        if file.kind == "weights":  # the header: 8 bytes of length, then the JSON
            sparse.ensure(0, 8)
            return [(8, int.from_bytes(sparse.view[:8], "little"))]
        return super().index_hints(file, sparse)

    def load_path(self, plan, file, path: str) -> dict[Piece, torch.Tensor]:
        if file.kind == "weights":  # safetensors' own reader, over its mmap of the file
            from safetensors import safe_open

            with safe_open(path, framework="pt") as shard:
                return {p: shard.get_tensor(p.key) for p in file.pieces}
        return super().load_path(plan, file, path)

    def pieces(self, plan, file, obj) -> dict[Piece, torch.Tensor]:
        index = _param_index(plan)
        return {p: obj["state"][index[p.name]][p.group] for p in file.pieces}
