"""DeepSpeed ZeRO (stages 1-2) checkpoint folder, as ``engine.save_checkpoint`` writes it.

``latest`` names the tag; ``global_step{N}/mp_rank_00_model_states.pt`` holds the
bf16 module state dict and engine state; each data-parallel rank writes
``zero_pp_rank_{r}_mp_rank_00_optim_states.pt`` with its partition of the
*flattened* fp32 master weights and Adam moments. Those flat partitions cut
tensors at arbitrary element offsets, so the reshard phase here is ZeRO's own
cost: concatenate partitions, unflatten into tensors, re-partition.
"""

from __future__ import annotations

import torch

from ckptprof.errors import CkptprofError
from ckptprof.synth.layouts.base import Layout
from ckptprof.synth.plan import (
    GROUP_MASTER,
    GROUP_MODEL,
    CheckpointPlan,
    FilePlan,
    Piece,
    SynthSpec,
    shard_pieces,
    state_groups,
    whole_pieces,
)

FLAT = "__flat_fp32_group_0__"
DS_VERSION = "0.19.8"


def _flat_groups(spec: SynthSpec) -> list[str]:
    groups = [g for g, _ in state_groups(spec) if g != GROUP_MODEL]
    if groups and GROUP_MASTER not in groups:
        groups.append(GROUP_MASTER)  # ZeRO always keeps fp32 master partitions
    return groups


class DeepSpeedLayout(Layout):
    name = "deepspeed"
    format = "deepspeed"
    index_file = "latest"

    def plan(self, spec: SynthSpec) -> CheckpointPlan:
        if spec.files is not None:
            raise CkptprofError(
                "--files does not apply to the deepspeed layout: ZeRO writes one optim_states "
                "file per rank; use --ranks to change the file count."
            )
        preset = spec.preset()
        tag = f"global_step{spec.step}"
        numel = preset.params
        align = 2 * spec.ranks
        padded = (numel + align - 1) // align * align
        files = [
            FilePlan("latest", "small"),
            FilePlan(
                f"{tag}/mp_rank_00_model_states.pt",
                "model_states",
                0,
                tuple(whole_pieces(preset, GROUP_MODEL, "bfloat16")),
            ),
        ]
        flat = [Piece(g, FLAT, (padded,), "float32", 0, padded) for g in _flat_groups(spec)]
        if flat:
            for rank in range(spec.ranks):
                files.append(
                    FilePlan(
                        f"{tag}/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt",
                        "optim",
                        rank,
                        tuple(shard_pieces(flat, spec.ranks, rank)),
                    )
                )
        files.append(FilePlan("zero_to_fp32.py", "small"))
        return CheckpointPlan(spec, preset, tuple(files), extras={"tag": tag, "numel": numel})

    def archive(self, plan, file, tensors: dict) -> dict:
        """What DeepSpeed's engine saves: the module states, or one rank's ZeRO partition."""
        spec = plan.spec
        if file.kind == "model_states":
            return {
                "module": {p.key: tensors[p] for p in file.pieces},
                "buffer_names": [],
                "optimizer": None,
                "param_shapes": [{t.name: t.shape for t in plan.preset.tensors()}],
                "frozen_param_shapes": None,
                "shared_params": {},
                "lr_scheduler": {"last_batch_iteration": spec.step},
                "sparse_tensor_module_names": set(),
                "skipped_steps": 0,
                "global_steps": spec.step,
                "global_samples": spec.step * 8,
                "dp_world_size": spec.ranks,
                "mp_world_size": 1,
                "ds_config": {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}},
                "ds_version": DS_VERSION,
            }
        parts = {p.group: tensors[p] for p in file.pieces}
        master = parts.pop(GROUP_MASTER)
        return {
            "optimizer_state_dict": {
                "loss_scaler": None,
                "dynamic_loss_scale": False,
                "overflow": False,
                "clip_grad": 1.0,
                "base_optimizer_state": {
                    "state": {0: parts},
                    "param_groups": [{"lr": 2e-5, "betas": (0.9, 0.95), "params": [0]}],
                },
                "single_partition_of_fp32_groups": [master],
                "zero_stage": 2,
                "group_paddings": [file.pieces[0].shape[0] - plan.extras["numel"]],
                "partition_count": [spec.ranks],
                "ds_version": DS_VERSION,
            },
            "ds_config": {"zero_optimization": {"stage": 2}},
            "ds_version": DS_VERSION,
        }

    def named_files(self, plan, index: bytes) -> list[str]:
        """Every file, once ``latest`` names the tag the manifest describes."""
        tag = index.decode().strip()
        if tag != plan.extras["tag"]:
            raise CkptprofError(
                f"it names {tag!r} but the manifest describes "
                f"{plan.extras['tag']!r}; regenerate the checkpoint."
            )
        return [f.path for f in plan.files]

    def pieces(self, plan, file, obj) -> dict[Piece, torch.Tensor]:
        if file.kind == "model_states":
            return {p: obj["module"][p.key] for p in file.pieces}
        osd = obj["optimizer_state_dict"]
        groups = dict(osd["base_optimizer_state"]["state"][0])
        groups[GROUP_MASTER] = osd["single_partition_of_fp32_groups"][0]
        return {p: groups[p.group] for p in file.pieces}

    def sources(self, plan, file, offsets: dict) -> list:
        """Model states are row pieces; an optimizer partition is a slice of each group's
        flattened fp32 vector, cut back into tensors here (ZeRO's unflatten)."""
        from ckptprof.synth.layouts.base import piece_sources
        from ckptprof.synth.readplan import flat_sources

        if file.kind == "model_states":
            return piece_sources(file, offsets)
        order = [(t.name, t.numel, "float32") for t in plan.preset.tensors()]
        out = []
        for p, offset in offsets.items():
            out += flat_sources(file.path, offset, p.group, p.row_start, p.row_end, order)
        return out

    def state_groups(self, spec: SynthSpec) -> list[tuple[str, str]]:
        return [(GROUP_MODEL, "bfloat16")] + [(g, "float32") for g in _flat_groups(spec)]
