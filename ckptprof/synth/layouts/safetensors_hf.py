"""Hugging Face ``save_pretrained`` / Trainer checkpoint folder.

``model-0000k-of-0000N.safetensors`` shards plus ``model.safetensors.index.json``
(the weights, bf16, whole tensors in state-dict order), ``optimizer.pt`` (a
``torch.save`` of the Adam state, as the Trainer writes it), scheduler, RNG,
trainer state, config and tokenizer files.
"""

from __future__ import annotations

import json
import math

import torch

from ckptprof.synth.layouts.base import Layout
from ckptprof.synth.layouts.small_files import hf_small_files
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


def _param_index(plan: CheckpointPlan) -> dict[str, int]:
    """Parameter name -> its index in the optimizer state, as ``optimizer.state_dict()`` has."""
    return {t.name: i for i, t in enumerate(plan.preset.tensors())}


class SafetensorsLayout(Layout):
    name = "safetensors"
    format = "safetensors"
    index_file = INDEX

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

    def codec(self, file: FilePlan) -> str:
        return "safetensors" if file.kind == "weights" else "torch"

    def small_bytes(self, plan, file, placed) -> bytes:
        if file.path != INDEX:
            return super().small_bytes(plan, file, placed)
        weight_map = {p.key: f.path for f in plan.files if f.kind == "weights" for p in f.pieces}
        total = sum(f.payload_bytes for f in plan.files if f.kind == "weights")
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        return json.dumps(index, indent=2).encode()

    def archive(self, plan, file, tensors: dict) -> dict:
        """A shard's tensors by name, or the Trainer's ``optimizer.pt``: AdamW's state by
        parameter index."""
        if file.kind == "weights":
            return {p.key: tensors[p] for p in file.pieces}
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

    def named_files(self, plan, index: bytes) -> list[str]:
        """The shards the index's ``weight_map`` names, then the Trainer's other files."""
        shards = sorted(set(json.loads(index)["weight_map"].values()))
        return shards + [f.path for f in plan.files if f.path not in shards]

    def pieces(self, plan, file, obj) -> dict[Piece, torch.Tensor]:
        if file.kind == "weights":
            return {p: obj[p.key] for p in file.pieces}
        index = _param_index(plan)
        return {p: obj["state"][index[p.name]][p.group] for p in file.pieces}
