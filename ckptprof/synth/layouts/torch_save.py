"""``torch.save`` per rank: the layout of plain PyTorch and Lightning checkpoints.

Each rank writes ``checkpoint_rank{r}.pt`` holding its shard of the model, the
Adam state and the loop state; with ``--files N`` each rank's state is split
into ``N / ranks`` archives ``checkpoint_rank{r}_part{k}.pt`` in state-dict order.
"""

from __future__ import annotations

import torch

from ckptprof.synth.layouts.base import Layout
from ckptprof.synth.layouts.small_files import rng_state
from ckptprof.synth.plan import (
    GROUP_MODEL,
    CheckpointPlan,
    FilePlan,
    Piece,
    SynthSpec,
    files_per_rank,
    rank_files,
)


class TorchSaveLayout(Layout):
    name = "torch"
    format = "torch"

    def plan(self, spec: SynthSpec) -> CheckpointPlan:
        preset = spec.preset()
        single = files_per_rank(spec) == 1
        files: list[FilePlan] = [FilePlan("config.json", "small")]
        for rank, k, pieces in rank_files(spec, preset):
            name = (
                f"checkpoint_rank{rank}.pt" if single else f"checkpoint_rank{rank}_part{k:04d}.pt"
            )
            files.append(FilePlan(name, "weights", rank, tuple(pieces)))
        return CheckpointPlan(spec, preset, tuple(files))

    def archive(self, plan, file, tensors: dict) -> dict:
        """What the rank's ``torch.save`` holds: its model shard, Adam state, loop state."""
        state: dict[str, dict] = {}
        for piece in file.pieces:
            state.setdefault(piece.group, {})[piece.key] = tensors[piece]
        return {
            "model": state.pop(GROUP_MODEL, {}),
            "optimizer": {
                "state": state,
                "param_groups": [{"lr": 2e-5, "betas": (0.9, 0.95), "weight_decay": 0.1}],
            },
            "global_step": plan.spec.step,
            "rank": file.rank,
            "rng": rng_state()["cpu"],
        }

    def pieces(self, plan, file, obj) -> dict[Piece, torch.Tensor]:
        groups = {GROUP_MODEL: obj["model"], **obj["optimizer"]["state"]}
        return {p: groups[p.group][p.key] for p in file.pieces}
