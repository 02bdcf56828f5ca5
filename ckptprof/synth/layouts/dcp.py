"""``torch.distributed.checkpoint`` (DCP): ``.metadata`` plus ``__{rank}_{k}.distcp``.

The files are what ``FileSystemWriter`` writes: each item a ``torch.save``
archive appended to its rank's file, and ``.metadata`` the pickled
:class:`~torch.distributed.checkpoint.metadata.Metadata` with every chunk's
offsets and storage location. The layout gives data (the plan, the files, the
metadata); restoring through ``dcp.load`` is the strategies' (:mod:`ckptprof.synth.strategies.dcp`).
"""

from __future__ import annotations

import pickle

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from ckptprof.synth.layouts.base import Layout, Placed
from ckptprof.synth.plan import (
    GROUP_MODEL,
    CheckpointPlan,
    FilePlan,
    SynthSpec,
    rank_files,
)

METADATA = ".metadata"


def fqn(group: str, name: str) -> str:
    """The flattened key DCP uses for ``{"model": …, "optim": …}`` state dicts."""
    return f"model.{name}" if group == GROUP_MODEL else f"optim.state.{name}.{group}"


def read_metadata(raw: bytes) -> Metadata:
    """Unpickle ``.metadata`` (as DCP does; only restore checkpoints you trust)."""
    try:
        md = pickle.loads(raw)
    except Exception as exc:  # noqa: BLE001
        from ckptprof.errors import unreadable

        raise unreadable(METADATA, exc) from None
    if not isinstance(md, Metadata):
        from ckptprof.errors import VerifyError

        raise VerifyError(f"{METADATA}: not DCP metadata ({type(md).__name__}); regenerate it.")
    return md


class DcpLayout(Layout):
    name = "dcp"
    format = "dcp"
    # each piece is its own torch.save archive (~1.6 KB) plus its entry in .metadata
    file_overhead = 0
    piece_overhead = 2560
    index_file = METADATA

    def plan(self, spec: SynthSpec) -> CheckpointPlan:
        preset = spec.preset()
        files = [
            FilePlan(f"__{rank}_{k}.distcp", "weights", rank, tuple(pieces))
            for rank, k, pieces in rank_files(spec, preset)
        ]
        files.append(FilePlan(METADATA, "metadata"))  # last: it needs every item's offset
        return CheckpointPlan(spec, preset, tuple(files))

    def codec(self, file: FilePlan) -> str:
        return "dcp"

    def archive(self, plan, file, tensors) -> dict:
        """DCP's items of ``file``: each piece's tensor, appended in order."""
        return {p: tensors[p] for p in file.pieces}

    def small_bytes(self, plan, file, placed: Placed) -> bytes:
        """``.metadata``: every chunk's offset in the files written before it."""
        return pickle.dumps(self._metadata(plan, placed))

    def _metadata(self, plan: CheckpointPlan, placed: Placed) -> Metadata:
        state_md: dict[str, TensorStorageMetadata] = {}
        storage: dict[MetadataIndex, _StorageInfo] = {}
        planner_data: dict[str, tuple[str, ...]] = {}
        for f in plan.data_files:
            for p in f.pieces:
                key = fqn(p.group, p.name)
                offsets = torch.Size([p.row_start, *[0] * (len(p.shape) - 1)])
                md = state_md.setdefault(
                    key,
                    TensorStorageMetadata(
                        TensorProperties(dtype=getattr(torch, p.dtype)), torch.Size(p.shape), []
                    ),
                )
                md.chunks.append(ChunkStorageMetadata(offsets, torch.Size(p.piece_shape)))
                storage[MetadataIndex(key, offsets, len(md.chunks) - 1)] = _StorageInfo(*placed[p])
                planner_data[key] = (
                    tuple(key.split(".", 1))
                    if p.group == GROUP_MODEL
                    else ("optim", "state", p.name, p.group)
                )
        return Metadata(state_md, planner_data, storage, version="1.0.0")

    def named_files(self, plan, index: bytes) -> list[str]:
        """The files ``.metadata`` has chunks in, then itself."""
        md = read_metadata(index)
        return sorted({info.relative_path for info in md.storage_data.values()}) + [METADATA]
