"""Map saved row pieces onto the shards of a target world size (FSDP ``Shard(0)``).

Planning is pure data (:func:`plan_reshard`), so it is unit-tested without
tensors; :func:`reshard` executes the copies. When a target shard is exactly a
saved piece (same world size) nothing is copied.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptprof.errors import CkptprofError
from ckptprof.synth.plan import Piece, shard_rows

if TYPE_CHECKING:
    import torch

TensorKey = tuple[str, str]  # (group, name)


@dataclass(frozen=True)
class Copy:
    """Copy rows ``[src_start, src_end)`` of ``source`` into target rank ``rank``."""

    source: Piece
    rank: int
    src_start: int  # rows relative to the source piece
    src_end: int
    dst_start: int  # rows relative to the target shard


@dataclass(frozen=True)
class TargetShard:
    key: TensorKey
    rank: int
    row_start: int
    row_end: int
    copies: tuple[Copy, ...]

    def is_identity(self) -> bool:
        if len(self.copies) != 1:
            return False
        c = self.copies[0]
        return (c.source.row_start, c.source.row_end) == (self.row_start, self.row_end)


def plan_reshard(pieces: list[Piece], world: int) -> list[TargetShard]:
    """For every tensor and target rank, the copies that build the rank's shard."""
    if world < 1:
        raise CkptprofError(f"--world-size {world} must be at least 1.")
    by_key: dict[TensorKey, list[Piece]] = defaultdict(list)
    for p in pieces:
        by_key[(p.group, p.name)].append(p)
    shards = []
    for key, saved in by_key.items():
        rows = saved[0].shape[0] if saved[0].shape else 1
        for rank in range(world):
            start, end = shard_rows(rows, world, rank)
            if end <= start:
                continue
            copies = []
            covered = 0
            for p in sorted(saved, key=lambda q: q.row_start):
                lo, hi = max(start, p.row_start), min(end, p.row_end)
                if hi > lo:
                    copies.append(Copy(p, rank, lo - p.row_start, hi - p.row_start, lo - start))
                    covered += hi - lo
            if covered != end - start:
                raise CkptprofError(
                    f"the checkpoint holds {covered} of rows {start}:{end} of {key[1]} "
                    f"({key[0]}); a shard file is missing from the listing."
                )
            shards.append(TargetShard(key, rank, start, end, tuple(copies)))
    return shards


def reshard(tensors: dict[Piece, torch.Tensor], world: int) -> list[dict[TensorKey, torch.Tensor]]:
    """Build each target rank's state from saved pieces (copies only where needed)."""
    import torch

    targets: list[dict[TensorKey, torch.Tensor]] = [{} for _ in range(world)]
    for shard in plan_reshard(list(tensors), world):
        if shard.is_identity():
            targets[shard.rank][shard.key] = tensors[shard.copies[0].source]
            continue
        first = shard.copies[0].source
        out = torch.empty(
            (shard.row_end - shard.row_start, *first.shape[1:]), dtype=getattr(torch, first.dtype)
        )
        for c in shard.copies:
            n = c.src_end - c.src_start
            out[c.dst_start : c.dst_start + n].copy_(tensors[c.source][c.src_start : c.src_end])
        targets[shard.rank][shard.key] = out
    return targets
