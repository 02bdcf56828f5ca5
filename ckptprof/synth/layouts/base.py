"""A checkpoint layout: how state is planned into files, written, and read back.

Every layout plans pure data (:meth:`Layout.plan`), writes one file at a time
(:meth:`Layout.write_file`), finds its files the way its framework does
(:meth:`Layout.discover`, the ``list`` phase), and turns fetched bytes back
into :class:`~ckptprof.synth.plan.Piece` tensors (:meth:`Layout.deserialize`).
Resharding onto the target world size is shared (:mod:`ckptprof.synth.reshard`)
unless the layout's own loader does it (DCP).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from ckptprof.synth.plan import CheckpointPlan, FilePlan, Piece, SynthSpec

if TYPE_CHECKING:
    import torch

    from ckptprof.fetch import HostBuffer
    from ckptprof.storage.base import Storage
    from ckptprof.synth.fill import RandomFiller
    from ckptprof.tracing.recorder import Operation


def unreadable(path: str, exc: Exception):
    """A loader failed on bytes that passed the chosen verify: name the file and the fix."""
    from ckptprof.errors import VerifyError

    first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
    return VerifyError(
        f"{path}: the {type(exc).__name__} while deserializing says the file is corrupt "
        f"({first}); re-run with --verify full to check it against the manifest, or regenerate."
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
        """Tensors of ``file``'s pieces, read from the fetched bytes."""
        return {}

    def prepare_pieces(
        self, plan: CheckpointPlan, pieces: dict[Piece, torch.Tensor]
    ) -> dict[Piece, torch.Tensor]:
        """Turn deserialized pieces into row pieces of real tensors (reshard phase)."""
        return pieces

    def deserialize_all(
        self, plan: CheckpointPlan, buffers: dict[str, HostBuffer], op: Operation, threads: int
    ) -> dict[Piece, torch.Tensor]:
        """The deserialize phase over every data file, ``threads`` at a time."""
        from ckptprof.phases import Phase

        def one(file: FilePlan) -> dict[Piece, torch.Tensor]:
            with op.phase(Phase.DESERIALIZE):
                t0 = time.perf_counter()
                try:
                    tensors = self.deserialize(plan, file, buffers[file.path])
                except Exception as exc:  # noqa: BLE001 - a loader's error on bad bytes
                    raise unreadable(file.path, exc) from None
                seconds = time.perf_counter() - t0
            op.add_file(Phase.DESERIALIZE, file.path, buffers[file.path].size, seconds)
            return tensors

        pieces: dict[Piece, torch.Tensor] = {}
        with ThreadPoolExecutor(max(1, threads)) as pool:
            for tensors in pool.map(one, plan.data_files):
                pieces.update(tensors)
        return pieces

    def load_targets(
        self,
        plan: CheckpointPlan,
        buffers: dict[str, HostBuffer],
        world_size: int,
        op: Operation,
        threads: int = 1,
    ) -> list[dict[tuple[str, str], torch.Tensor]]:
        """deserialize + reshard: the state of each of ``world_size`` target ranks."""
        from ckptprof.phases import Phase
        from ckptprof.synth.reshard import reshard

        pieces = self.deserialize_all(plan, buffers, op, threads)
        with op.phase(Phase.RESHARD):
            return reshard(self.prepare_pieces(plan, pieces), world_size)
