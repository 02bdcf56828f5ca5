"""``torch.distributed.checkpoint`` (DCP): ``.metadata`` plus ``__{rank}_{k}.distcp``.

The files are what ``FileSystemWriter`` writes: each item a ``torch.save``
archive appended to its rank's file, and ``.metadata`` the pickled
:class:`~torch.distributed.checkpoint.metadata.Metadata` with every chunk's
offsets and storage location. The layout gives data (the plan, the files, the
metadata); restoring through ``dcp.load`` is the strategies' (:mod:`ckptprof.synth.strategies.dcp`).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from ckptprof.synth.layouts.base import Layout
from ckptprof.synth.layouts.torchfile import fake_tensor, write_torch_save
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
        from ckptprof.synth.layouts.base import unreadable

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

    def plan(self, spec: SynthSpec) -> CheckpointPlan:
        preset = spec.preset()
        files = [
            FilePlan(f"__{rank}_{k}.distcp", "weights", rank, tuple(pieces))
            for rank, k, pieces in rank_files(spec, preset)
        ]
        files.append(FilePlan(METADATA, "metadata"))  # last: it needs every item's offset
        return CheckpointPlan(spec, preset, tuple(files), extras={"items": {}})

    def write_file(self, plan, file, dest: Path, filler) -> None:
        items = plan.extras["items"]
        if file.path == METADATA:
            dest.write_bytes(pickle.dumps(self._metadata(plan, items)))
            return
        dest.write_bytes(b"")
        for piece in file.pieces:
            start, end = write_torch_save(
                dest, fake_tensor(piece.piece_shape, piece.dtype), filler, append=True
            )
            items[piece] = _StorageInfo(file.path, start, end - start)

    def _metadata(self, plan: CheckpointPlan, items: dict) -> Metadata:
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
                storage[MetadataIndex(key, offsets, len(md.chunks) - 1)] = items[p]
                planner_data[key] = (
                    tuple(key.split(".", 1))
                    if p.group == GROUP_MODEL
                    else ("optim", "state", p.name, p.group)
                )
        return Metadata(state_md, planner_data, storage, version="1.0.0")

    def discover(self, storage, plan) -> list[str]:
        md = read_metadata(storage.read_bytes(METADATA))
        return sorted({info.relative_path for info in md.storage_data.values()}) + [METADATA]
