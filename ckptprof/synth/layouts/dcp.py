"""``torch.distributed.checkpoint`` (DCP): ``.metadata`` plus ``__{rank}_{k}.distcp``.

The files are what ``FileSystemWriter`` writes: each item a ``torch.save``
archive appended to its rank's file, and ``.metadata`` the pickled
:class:`~torch.distributed.checkpoint.metadata.Metadata` with every chunk's
offsets and storage location. Restore goes through DCP itself: ``dcp.load``
with a :class:`MemoryStorageReader` over the fetched bytes and a planner that
asks for one target rank's rows, so DCP's own resharding runs in one process
without a process group.
"""

from __future__ import annotations

import pickle
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.distributed.checkpoint.storage import StorageReader

from ckptprof.phases import Phase
from ckptprof.synth.layouts.base import Layout
from ckptprof.synth.layouts.torchfile import fake_tensor, write_torch_save
from ckptprof.synth.plan import (
    GROUP_MODEL,
    CheckpointPlan,
    FilePlan,
    SynthSpec,
    rank_files,
    shard_rows,
)

METADATA = ".metadata"


def fqn(group: str, name: str) -> str:
    """The flattened key DCP uses for ``{"model": …, "optim": …}`` state dicts."""
    return f"model.{name}" if group == GROUP_MODEL else f"optim.state.{name}.{group}"


def parse_fqn(key: str) -> tuple[str, str]:
    if key.startswith("model."):
        return GROUP_MODEL, key[len("model.") :]
    name, group = key[len("optim.state.") :].rsplit(".", 1)
    return group, name


def _read_metadata(raw: bytes) -> Metadata:
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
        md = _read_metadata(storage.read_bytes(METADATA))
        return sorted({info.relative_path for info in md.storage_data.values()}) + [METADATA]

    def load_targets(self, plan, buffers, world_size, op, threads=1):
        md = _read_metadata(bytes(buffers[METADATA].view))
        reader = MemoryStorageReader(buffers, op)
        targets = []
        for rank in range(world_size):
            t0 = time.time_ns()
            state: dict[str, torch.Tensor] = {}
            offsets: dict[str, int] = {}
            for key, tmd in md.state_dict_metadata.items():
                start, end = shard_rows(tmd.size[0], world_size, rank)
                if end > start:
                    shape = (end - start, *tmd.size[1:])
                    state[key] = torch.empty(shape, dtype=tmd.properties.dtype)
                    offsets[key] = start
            op.add_interval(Phase.RESHARD, t0, time.time_ns())
            reader.plan_started_ns = time.time_ns()
            with warnings.catch_warnings(), _named_errors(reader):
                # no_dist=True is the point: one process plays every target rank
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load(
                    state,
                    storage_reader=reader,
                    planner=RowShardLoadPlanner(offsets),
                    no_dist=True,
                )
            targets.append({parse_fqn(k): v for k, v in state.items()})
        return targets


class _named_errors:
    """DCP wraps item failures in CheckpointException; say which file was bad instead."""

    def __init__(self, reader: MemoryStorageReader) -> None:
        self.reader = reader

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None or not isinstance(exc, Exception):
            return False
        from ckptprof.errors import CkptprofError
        from ckptprof.synth.layouts.base import unreadable

        if isinstance(exc, CkptprofError):
            return False
        raise unreadable(self.reader.current_path or METADATA, exc) from None


class RowShardLoadPlanner(DefaultLoadPlanner):
    """Asks DCP for rows ``[offset, offset + len)`` of each tensor (one target rank)."""

    def __init__(self, row_offsets: dict[str, int]) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.row_offsets = row_offsets

    def create_local_plan(self) -> LoadPlan:
        requests: list[ReadItem] = []
        for key, tensor in self.state_dict.items():
            md = self.metadata.state_dict_metadata[key]
            offsets = torch.Size([self.row_offsets[key], *[0] * (tensor.dim() - 1)])
            chunk = ChunkStorageMetadata(offsets, tensor.size())
            requests += create_read_items_for_chunk_list(key, md, [chunk])
        return LoadPlan(requests)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        return self.state_dict[index.fqn]


class MemoryStorageReader(StorageReader):
    """DCP StorageReader over fetched bytes: item ``torch.load`` is the deserialize
    phase, copying the narrowed chunk into the target shard is the reshard phase."""

    def __init__(self, buffers: dict, op) -> None:
        super().__init__()
        self.buffers = buffers
        self.op = op
        self.storage_data: dict[MetadataIndex, _StorageInfo] = {}
        self.plan_started_ns = time.time_ns()
        self.current_path: str | None = None  # the file being read, for error messages

    def reset(self, checkpoint_id=None) -> None:
        pass

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False

    def read_metadata(self, *args, **kwargs) -> Metadata:
        return _read_metadata(bytes(self.buffers[METADATA].view))

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *a, **k) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future:
        self.op.add_interval(Phase.RESHARD, self.plan_started_ns, time.time_ns())
        cache: dict[MetadataIndex, torch.Tensor] = {}
        for req in plan.items:
            if req.type == LoadItemType.BYTE_IO:
                continue
            info = self.storage_data[req.storage_index]
            t0 = time.time_ns()
            tensor = cache.get(req.storage_index)
            if tensor is None:
                self.current_path = info.relative_path
                stream = self.buffers[info.relative_path].reader(info.offset, info.length)
                tensor = torch.load(stream, map_location="cpu", weights_only=True)
                cache[req.storage_index] = tensor
                self.op.add_bytes(Phase.DESERIALIZE, info.length)
            t1 = time.time_ns()
            self.op.add_interval(Phase.DESERIALIZE, t0, t1)
            chunk = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            target.copy_(chunk)
            planner.commit_tensor(req, target)
            self.op.add_interval(Phase.RESHARD, t1, time.time_ns())
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(None)
        return fut
