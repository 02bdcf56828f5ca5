"""A checkpoint layout, as data: which files a framework writes, what object each holds,
where each piece's bytes lie, and how its index names its files.

A layout does no I/O. Each of its tensor files is in a codec (:mod:`ckptprof.synth.codecs`:
``torch.save`` archives, safetensors shards, DCP items) that turns the object
:meth:`Layout.archive` gives into bytes and back; generation (:mod:`ckptprof.synth.generate`),
the savers (:mod:`ckptprof.synth.savers`) and the restore strategies
(:mod:`ckptprof.synth.strategies`) do the writing and reading, through storage.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ckptprof.synth.plan import CheckpointPlan, FilePlan, Piece, SynthSpec

if TYPE_CHECKING:
    import torch

#: where generation wrote each piece: ``{piece: (file path, offset, length)}``, for
#: indexes that name byte offsets (DCP's ``.metadata``)
Placed = Mapping[Piece, tuple[str, int, int]]


class Layout(ABC):
    name: str
    format: str
    #: bytes a data file holds beyond its tensor payload, per file and per piece
    #: (archive headers, pickles, RNG state, index entries), measured with a margin; they
    #: dominate checkpoints of many small files, so space checks must count them
    file_overhead: int = 8 << 10
    piece_overhead: int = 512
    #: the file a resume reads first to find the others (``latest``, DCP's ``.metadata``,
    #: the HF index json); None: the framework opens the files by their names
    index_file: str | None = None

    def overhead(self, file: FilePlan) -> int:
        """Bytes ``file`` takes beyond its payload (an upper estimate)."""
        return self.file_overhead + self.piece_overhead * len(file.pieces)

    @abstractmethod
    def plan(self, spec: SynthSpec) -> CheckpointPlan:
        """Every file of the checkpoint, as data."""

    def codec(self, file: FilePlan) -> str:
        """The encoding of a file with pieces (a name of :mod:`ckptprof.synth.codecs`)."""
        return "torch"

    def archive(self, plan: CheckpointPlan, file: FilePlan, tensors: Mapping[Piece, Any]) -> Any:
        """The object the framework hands its writer for ``file`` (``tensors[piece]`` are
        its tensors: real ones for a save, fake ones for generation)."""
        raise NotImplementedError(f"the {self.name} layout has no archive for {file.path}")

    def pieces(self, plan: CheckpointPlan, file: FilePlan, obj) -> dict[Piece, torch.Tensor]:
        """Where each of ``file``'s pieces is in the object its codec read back."""
        raise NotImplementedError(f"{self.name} has no pieces in {file.path}")

    def small_bytes(self, plan: CheckpointPlan, file: FilePlan, placed: Placed) -> bytes:
        """A file without tensors (config, ``latest``, an index), as the framework writes
        it; ``placed``: where the tensor files before it put each piece."""
        from ckptprof.synth.layouts.small_files import small_file_bytes

        return small_file_bytes(plan.spec, file.path)

    def named_files(self, plan: CheckpointPlan, index: bytes) -> list[str]:
        """The files :attr:`index_file`'s bytes name, read as the framework does at
        resume (the runner checks them against the manifest). The default names every
        file."""
        return [f.path for f in plan.files]

    def sources(self, plan: CheckpointPlan, file: FilePlan, offsets: dict) -> list:
        """Byte offsets of ``file``'s pieces (``{piece: offset}``) as readplan Sources."""
        return piece_sources(file, offsets)

    def state_groups(self, spec: SynthSpec) -> list[tuple[str, str]]:
        """The restored state's groups, ``(group, dtype)``."""
        from ckptprof.synth.plan import state_groups

        return state_groups(spec)


def piece_sources(file: FilePlan, offsets: dict) -> list:
    """Sources of row pieces (each piece contiguous, row-major, at its offset)."""
    from ckptprof.synth.readplan import Source

    out = []
    for piece, offset in offsets.items():
        cols = piece.numel // piece.rows if piece.rows else 1
        start, end = piece.row_start * cols, piece.row_end * cols
        out.append(Source(file.path, offset, (piece.group, piece.name), piece.dtype, start, end))
    return out
