"""The state a restore fills: what one target rank of the job holds, as data, and the
tensors it lives in.

A real job's model and optimizer exist before its restore starts; the load copies the
checkpoint into them (``load_state_dict``, or ``dcp.load`` filling existing tensors). The
synthetic restore does the same: :func:`plan_targets` says which rows of which tensors
target rank ``rank`` of ``world`` holds (FSDP/DCP ``Shard(0)``: every tensor split by
rows), :class:`TargetState` allocates and touches them before any timing (as a model's
initialization would), and every strategy copies into them, so ``reshard`` is never a
no-op and two strategies can be compared by hashing what they restored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptprof.synth.plan import CheckpointPlan, shard_rows
from ckptprof.synth.presets import DTYPE_SIZE

if TYPE_CHECKING:
    import torch

TensorKey = tuple[str, str]  # (group, name)


@dataclass(frozen=True)
class TargetTensor:
    """Rows ``[row_start, row_end)`` of tensor ``name`` of state group ``group``."""

    group: str
    name: str
    shape: tuple[int, ...]  # the whole logical tensor
    dtype: str
    row_start: int
    row_end: int
    rank: int = 0  # the target rank holding it

    @property
    def key(self) -> TensorKey:
        return self.group, self.name

    @property
    def row_numel(self) -> int:
        return math.prod(self.shape[1:]) if len(self.shape) > 1 else 1

    @property
    def local_shape(self) -> tuple[int, ...]:
        if not self.shape:
            return ()
        return (self.row_end - self.row_start, *self.shape[1:])

    @property
    def elem_start(self) -> int:
        """First element of the whole tensor (row-major) this target holds."""
        return self.row_start * self.row_numel

    @property
    def numel(self) -> int:
        return (self.row_end - self.row_start) * self.row_numel if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZE[self.dtype]


def plan_targets(
    plan: CheckpointPlan, groups: list[tuple[str, str]], world: int, ranks: list[int]
) -> list[TargetTensor]:
    """The tensors each of ``ranks`` (of ``world``) holds: its rows of every tensor of every
    state ``group`` (``(group, dtype)``), in the preset's order."""
    out = []
    for rank in ranks:
        for group, dtype in groups:
            for tensor in plan.preset.tensors():
                rows = tensor.shape[0] if tensor.shape else 1
                start, end = shard_rows(rows, world, rank)
                if end > start:
                    out.append(
                        TargetTensor(group, tensor.name, tensor.shape, dtype, start, end, rank)
                    )
    return out


class TargetState:
    """The target tensors (of one rank or several), allocated and touched once, filled by
    every run; ``tensors[i]`` holds ``targets[i]``.

    ``allocate(existing)`` lets tensors that already exist stand in (the parameters of a
    model built for the first step), so the restore copies straight into them. With a
    CUDA ``device`` the tensors live there (a GPU job's state): copies into them are the
    host→device copies of ``reshard``.
    """

    def __init__(self, targets: list[TargetTensor], device: str | torch.device = "cpu") -> None:
        self.targets = targets
        self.device = device
        self.tensors: list[torch.Tensor] = []

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.targets)

    def allocate(self, existing: dict[TensorKey, torch.Tensor] | None = None) -> None:
        """Make every target tensor (not timed: a job's model exists before it restores)."""
        import torch

        existing = existing or {}
        self.tensors = []
        for target in self.targets:
            tensor = existing.get(target.key)
            if tensor is None or tuple(tensor.shape) != target.local_shape:
                dtype = getattr(torch, target.dtype)
                tensor = torch.zeros(target.local_shape, dtype=dtype, device=self.device)
            self.tensors.append(tensor)

    def byte_view(self, index: int) -> torch.Tensor:
        """Target ``index``'s bytes, flat, to copy raw checkpoint bytes into."""
        import torch

        return self.tensors[index].detach().reshape(-1).view(torch.uint8)

    @property
    def on_host(self) -> bool:
        return all(t.device.type == "cpu" for t in self.tensors)

    def memory(self, index: int, offset: int, length: int) -> memoryview:
        """Bytes ``[offset, offset + length)`` of target ``index``, writable, in place
        (what a read lands in when it goes straight into the state; host tensors only)."""
        return memoryview(self.byte_view(index)[offset : offset + length].numpy())

    def of_rank(self, rank: int) -> dict[TensorKey, torch.Tensor]:
        return {t.key: x for t, x in zip(self.targets, self.tensors, strict=True) if t.rank == rank}

    def digest(self) -> str:
        """xxh3 of every target tensor's bytes, in order: what was restored."""
        import xxhash

        h = xxhash.xxh3_64()
        for i, target in enumerate(self.targets):
            h.update(f"{target.rank}/{target.group}/{target.name}".encode())
            h.update(self.byte_view(i).cpu().numpy().data)
        return h.hexdigest()

    def release(self) -> None:
        self.tensors = []


__all__ = ["TargetState", "TargetTensor", "TensorKey", "plan_targets"]
