"""A checkpoint layout: how state is planned into files, written, and read back.

Every layout plans pure data (:meth:`Layout.plan`), writes one file at a time
(:meth:`Layout.write_file`), finds its files the way its framework does
(:meth:`Layout.discover`, the ``list`` phase), and turns fetched bytes back
into :class:`~ckptprof.synth.plan.Piece` tensors (:meth:`Layout.deserialize` from fetched
bytes, :meth:`Layout.load_path` with the framework's own loader on a path), and says where
each piece's bytes lie (:meth:`Layout.sources`). Copying them into the state of the
target ranks is shared (:mod:`ckptprof.synth.strategies`) unless the layout's own loader
does it (DCP's ``<strategy>_restore`` methods).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

from ckptprof.synth.plan import CheckpointPlan, FilePlan, Piece, SynthSpec

if TYPE_CHECKING:
    import torch

    from ckptprof.io.buffers import HostBuffer
    from ckptprof.storage.base import Storage
    from ckptprof.synth.fill import RandomFiller


def unreadable(path: str, exc: Exception, verify: str | None = None):
    """A loader failed on the file's bytes: name the file and the fix. ``verify`` is the
    mode that checked those bytes before the loader ran (None: it ran before any check,
    as index parsing does); only a check weaker than ``full`` is worth re-running."""
    from ckptprof.errors import VerifyError

    first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
    fix = "regenerate it (ckptprof synth generate --force) or restore a good copy"
    if verify is not None and verify != "full":
        fix = f"re-run with --verify full to check it against the manifest, or {fix}"
    return VerifyError(
        f"{path}: the {type(exc).__name__} while deserializing says the file is corrupt "
        f"({first}); {fix}."
    )


class Layout(ABC):
    name: str
    format: str
    #: bytes a data file holds beyond its tensor payload, per file and per piece
    #: (archive headers, pickles, RNG state, index entries), measured with a margin; they
    #: dominate checkpoints of many small files, so space checks must count them
    file_overhead: int = 8 << 10
    piece_overhead: int = 512

    def overhead(self, file: FilePlan) -> int:
        """Bytes ``file`` takes beyond its payload (an upper estimate)."""
        return self.file_overhead + self.piece_overhead * len(file.pieces)

    @abstractmethod
    def plan(self, spec: SynthSpec) -> CheckpointPlan:
        """Every file of the checkpoint, as data."""

    @abstractmethod
    def write_file(self, plan: CheckpointPlan, file: FilePlan, dest: Path, filler: RandomFiller):
        """Write ``file`` to the local path ``dest`` (random tensor bytes)."""

    def small_bytes(self, plan: CheckpointPlan, file: FilePlan) -> bytes:
        """A file without tensors (config, ``latest``, an index), as the framework writes it."""
        from ckptprof.synth.layouts.small_files import small_file_bytes

        return small_file_bytes(plan.spec, file.path)

    def archive(self, plan: CheckpointPlan, file: FilePlan, tensors: dict[Piece, torch.Tensor]):
        """The object the framework hands ``torch.save`` for ``file`` (``tensors[piece]``
        are its tensors: real ones for a save, fake ones for generation)."""
        raise NotImplementedError(f"the {self.name} layout has no torch.save archive")

    def save_file(
        self, plan: CheckpointPlan, file: FilePlan, dest: Path, tensors: dict[Piece, torch.Tensor]
    ) -> None:
        """Write ``file`` from real tensors through the framework's own writer, as a job
        saves (``ckptprof synth save --strategy framework`` times it)."""
        import torch

        if not file.pieces:
            dest.write_bytes(self.small_bytes(plan, file))
            return
        with open(dest, "wb") as handle:
            torch.save(self.archive(plan, file, tensors), handle)

    def serialize_file(
        self, plan: CheckpointPlan, file: FilePlan, tensors: dict[Piece, torch.Tensor]
    ) -> list:
        """``file``'s bytes as the framework's writer lays them out, as segments in order,
        for ckptprof's own parallel writer: the archive's small parts, and views of the
        tensors' memory for their bytes (nothing copied)."""
        from ckptprof.synth.layouts.torchfile import torch_save_segments

        if not file.pieces:
            return [self.small_bytes(plan, file)]
        archive = self.archive(plan, file, tensors)
        return torch_save_segments(archive, [tensors[p] for p in file.pieces])

    def discover(self, storage: Storage, plan: CheckpointPlan) -> list[str]:
        """Read the layout's own index as its framework does at resume (``latest``,
        DCP ``.metadata``, the HF index json) and return the files it names.

        Runs inside the timed ``list`` phase, after eviction, like a real resume; the
        runner checks the names against the manifest. The default names every file.
        """
        return [f.path for f in plan.files]

    def deserialize(
        self, plan: CheckpointPlan, file: FilePlan, buffer: HostBuffer
    ) -> dict[Piece, torch.Tensor]:
        """Tensors of ``file``'s pieces, read from the fetched bytes with the layout's loader
        (views of the bytes; with :class:`~ckptprof.synth.index.SparseFile` bytes, only the
        index is read)."""
        from ckptprof.synth.layouts.torchfile import load_fetched

        return self.pieces(plan, file, load_fetched(buffer))

    def load_path(
        self, plan: CheckpointPlan, file: FilePlan, path: str
    ) -> dict[Piece, torch.Tensor]:
        """Tensors of ``file``'s pieces, loaded from the path by the framework's own loader
        (``torch.load(mmap=True)`` here; the pages are read as the tensors are used)."""
        import torch

        return self.pieces(plan, file, torch.load(path, mmap=True, weights_only=True))

    def pieces(self, plan: CheckpointPlan, file: FilePlan, obj) -> dict[Piece, torch.Tensor]:
        """Where each of ``file``'s pieces is in the object its loader returned."""
        raise NotImplementedError(f"{self.name} has no pieces in {file.path}")

    def index_hints(self, file: FilePlan, sparse) -> list[tuple[int, int]]:
        """Ranges of ``file`` its loader reads to index it, fetched together first; a
        ``torch.save`` archive's record headers by default."""
        from ckptprof.synth.layouts.torchfile import zip_hints

        return zip_hints(sparse)

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
