"""What a synthetic checkpoint contains, as pure data (no I/O).

The generator and the restore runner both build the same :class:`CheckpointPlan`
from a :class:`SynthSpec`, so the restore side knows every file, every tensor
piece and its rows without trusting anything but the manifest's spec.

State is described as :class:`Piece` s: a dim-0 row range of one logical tensor of
one state group (model weights, Adam moments, fp32 master weights). Ranks shard
every tensor along dim 0 the way FSDP2/DCP ``Shard(0)`` does; ``--files`` splits
pieces further and packs them into files in state-dict order.
"""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass, field, replace

from ckptprof import schema
from ckptprof.errors import CkptprofError
from ckptprof.synth import ranges
from ckptprof.synth.presets import BF16, DTYPE_SIZE, FP32, PRESETS, ModelPreset, get_preset

GROUP_MODEL = "model"
GROUP_EXP_AVG = "exp_avg"
GROUP_EXP_AVG_SQ = "exp_avg_sq"
GROUP_MASTER = "master"


SPEC_FIX = "regenerate the checkpoint with `ckptprof synth generate`"


@functools.cache
def spec_schema() -> schema.Check:
    """What a :class:`SynthSpec` (as stored in a manifest) may hold."""

    return schema.record(
        {
            "model": schema.text(choices=PRESETS),
            "layout": schema.text(choices=tuple(ranges.LAYOUTS)),
            "scale": ranges.SCALE,
            "ranks": ranges.RANKS,
            "optimizer": schema.boolean(),
            "master_weights": schema.boolean(),
            "files": schema.optional(ranges.FILES),
            "step": ranges.STEP,
            "seed": ranges.SEED,
        },
        required=("model", "layout"),
    )


@dataclass(frozen=True)
class SynthSpec:
    """The knobs of ``ckptprof synth generate``; stored in the manifest.

    Checked on construction (:func:`spec_schema`), so a plan is never built from a
    value out of range, whether it came from the CLI, code or a manifest.
    """

    model: str
    layout: str
    scale: float = 1.0
    ranks: int = 1
    optimizer: bool = True
    master_weights: bool = False
    files: int | None = None
    step: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        schema.require(
            self.to_dict(), spec_schema(), "synthetic spec", "see `ckptprof synth generate --help`"
        )

    def preset(self) -> ModelPreset:
        return get_preset(self.model).scaled(self.scale)

    def full_preset(self) -> ModelPreset:
        return get_preset(self.model)

    def scale_label(self) -> str:
        """``x0.01``; where the widths hit their floor (every tensor keeps its name and
        rank, so dimensions stop at a few elements), also the scale really written."""
        label = f"x{self.scale:g}"
        real = self.preset().params / self.full_preset().params
        if real > self.scale * 1.5:
            label += (f" (floored to x{real:.2g}: the widths stop at their smallest, so the "
                      "checkpoint is larger than asked)")  # fmt: skip
        return label

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict, where: str = "spec") -> SynthSpec:
        """The spec a manifest recorded; a wrong type or range names ``where`` and the field."""
        schema.require(data, spec_schema(), where, SPEC_FIX)
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Piece:
    """Rows ``[row_start, row_end)`` of tensor ``name`` in state group ``group``."""

    group: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    row_start: int
    row_end: int

    @property
    def rows(self) -> int:
        return self.row_end - self.row_start

    @property
    def piece_shape(self) -> tuple[int, ...]:
        if not self.shape:
            return ()
        return (self.rows, *self.shape[1:])

    @property
    def numel(self) -> int:
        return math.prod(self.piece_shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZE[self.dtype]

    @property
    def whole(self) -> bool:
        return not self.shape or (self.row_start == 0 and self.row_end == self.shape[0])

    @property
    def key(self) -> str:
        """Unique key of this piece inside a file's state dict."""
        if self.whole:
            return self.name
        return f"{self.name}#rows={self.row_start}:{self.row_end}"

    def split(self) -> tuple[Piece, Piece]:
        mid = self.row_start + self.rows // 2
        return replace(self, row_end=mid), replace(self, row_start=mid)


@dataclass(frozen=True)
class FilePlan:
    """One file of the checkpoint: data (``pieces``) or a small metadata file (``kind``)."""

    path: str
    kind: str  # weights | optim | model_states | metadata | small
    rank: int | None = None
    pieces: tuple[Piece, ...] = ()

    @property
    def payload_bytes(self) -> int:
        return sum(p.nbytes for p in self.pieces)


@dataclass(frozen=True)
class CheckpointPlan:
    spec: SynthSpec
    preset: ModelPreset
    files: tuple[FilePlan, ...]
    extras: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def data_files(self) -> list[FilePlan]:
        return [f for f in self.files if f.pieces]

    @property
    def payload_bytes(self) -> int:
        return sum(f.payload_bytes for f in self.files)


# ------------------------------------------------------------------ helpers


def state_groups(spec: SynthSpec) -> list[tuple[str, str]]:
    """(group, dtype) pairs the checkpoint holds, in save order."""
    groups = [(GROUP_MODEL, BF16)]
    if spec.optimizer:
        groups += [(GROUP_EXP_AVG, FP32), (GROUP_EXP_AVG_SQ, FP32)]
        if spec.master_weights:
            groups.append((GROUP_MASTER, FP32))
    return groups


def whole_pieces(preset: ModelPreset, group: str, dtype: str) -> list[Piece]:
    return [
        Piece(group, t.name, t.shape, dtype, 0, t.shape[0] if t.shape else 1)
        for t in preset.tensors()
    ]


def shard_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """Rows of ``rank`` when ``rows`` are chunked like ``torch.chunk`` / ``Shard(0)``."""
    chunk = math.ceil(rows / world)
    start = min(rows, rank * chunk)
    return start, min(rows, start + chunk)


def shard_pieces(pieces: list[Piece], world: int, rank: int) -> list[Piece]:
    out = []
    for p in pieces:
        start, end = shard_rows(p.row_end - p.row_start, world, rank)
        if end > start:
            out.append(replace(p, row_start=p.row_start + start, row_end=p.row_start + end))
    return out


def split_to_count(pieces: list[Piece], count: int, what: str) -> list[Piece]:
    """Split the largest pieces by rows until there are at least ``count``, keeping order.

    A heap of (bytes, position) makes this O(n log n): 100,000 files plan in seconds.
    Positions are tuples, so the halves of a split sort between their neighbours.
    """
    heap = [(-p.nbytes, (i,), p) for i, p in enumerate(pieces)]
    heapq.heapify(heap)
    while len(heap) < count:
        neg, key, largest = heapq.heappop(heap)
        if largest.rows < 2:
            raise CkptprofError(
                f"--files {count} is more than {what} can be split into "
                f"({len(heap) + 1} pieces); use a smaller --files or a larger --scale."
            )
        for half, part in enumerate(largest.split()):
            heapq.heappush(heap, (-part.nbytes, (*key, half), part))
    return [p for _, _, p in sorted(heap, key=lambda item: item[1])]


def pack_in_order(pieces: list[Piece], count: int) -> list[list[Piece]]:
    """Partition ``pieces`` into ``count`` contiguous, non-empty groups of similar bytes."""
    if count <= 0:
        raise CkptprofError(f"--files {count} must be a positive number.")
    pieces = split_to_count(pieces, count, "the tensors")
    total = sum(p.nbytes for p in pieces) or 1
    groups: list[list[Piece]] = [[] for _ in range(count)]
    acc = 0
    g = 0
    for i, p in enumerate(pieces):
        remaining_pieces = len(pieces) - i
        remaining_groups = count - g
        # move on when this group has reached its share, or when we must leave
        # one piece for each group still to fill
        if (
            groups[g]
            and g < count - 1
            and (
                acc + p.nbytes / 2 > total * (g + 1) / count
                or remaining_pieces <= remaining_groups - 1
            )
        ):
            g += 1
        groups[g].append(p)
        acc += p.nbytes
    return groups


def rank_files(spec: SynthSpec, preset: ModelPreset) -> list[tuple[int, int, list[Piece]]]:
    """(rank, file index, pieces) for layouts where every rank writes its own shard of
    every state group, split into ``--files / ranks`` files per rank."""
    per_rank = files_per_rank(spec)
    check_ranks_have_data(spec, preset)
    out = []
    for rank in range(spec.ranks):
        pieces: list[Piece] = []
        for group, dtype in state_groups(spec):
            pieces += shard_pieces(whole_pieces(preset, group, dtype), spec.ranks, rank)
        for k, group_pieces in enumerate(pack_in_order(pieces, per_rank)):
            out.append((rank, k, group_pieces))
    return out


def ranks_reached(heights: set[int], ranks: int) -> int:
    """How many of ``ranks`` get rows of at least one tensor of these heights.

    ``torch.chunk`` sharding gives a tensor of R rows to ``ceil(R / ceil(R / W))`` of W
    ranks, which is not monotonic in R or W, so every height counts.
    """
    return max(math.ceil(r / math.ceil(r / ranks)) for r in heights)


def check_ranks_have_data(spec: SynthSpec, preset: ModelPreset) -> None:
    """Every rank must hold a dim-0 slice of some tensor, or its files would be empty."""
    heights = {t.shape[0] if t.shape else 1 for t in preset.tensors()}
    reached = ranks_reached(heights, spec.ranks)
    if reached < spec.ranks:
        best = next(w for w in range(reached, 0, -1) if ranks_reached(heights, w) == w)
        raise CkptprofError(
            f"--ranks {spec.ranks}: {spec.model} at --scale {spec.scale:g} has at most "
            f"{max(heights)} rows in any tensor, so sharded by rows only {reached} of the ranks "
            f"would hold data; use --ranks {best} (the largest count below {spec.ranks} where "
            "every rank gets rows) or a larger --scale."
        )


def files_per_rank(spec: SynthSpec, default: int = 1) -> int:
    if spec.files is None:
        return default
    if spec.files < spec.ranks or spec.files % spec.ranks:
        raise CkptprofError(
            f"--files {spec.files} must be a multiple of --ranks {spec.ranks} for the "
            f"{spec.layout} layout (each rank writes the same number of files)."
        )
    return spec.files // spec.ranks
