"""DCP checkpoints restored through DCP itself: ``dcp.load`` plans the reads for a target
rank's rows and fills the state's existing tensors, with a planner that asks for one
target rank (:class:`RowShardLoadPlanner`), so DCP's own resharding runs in one process
without a process group. What differs per strategy is the ``StorageReader``:

* staged: every file fetched first, then :class:`MemoryStorageReader` over the bytes;
* pipelined: :class:`FetchingStorageReader`, the items DCP asks for read through the
  I/O core's window (on an object store, neighbouring items are one request) and each
  loaded as it lands;
* framework: DCP's own ``FileSystemReader`` on the path, traced by the same reader
  wrapper the DCP integration puts around a real job's reader, so the synthetic
  baseline splits list / fetch / reshard / deserialize exactly as the callback reports.
"""

from __future__ import annotations

import time
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.distributed.checkpoint.storage import StorageReader

from ckptprof.io.buffers import view_reader
from ckptprof.io.requests import RequestSummary, group_atoms
from ckptprof.io.window import FileClocks, Window
from ckptprof.manifest import StreamingDigest
from ckptprof.phases import Attr, Phase
from ckptprof.synth.layouts.dcp import METADATA, fqn, read_metadata


def restore_staged(ctx) -> None:
    """Every file fetched into memory, verified, then dcp.load over the bytes."""
    from ckptprof.synth.strategies.base import fetch_all, verify_all

    buffers = fetch_all(ctx)
    try:
        verify_all(ctx, buffers)
        reader = MemoryStorageReader(buffers, ctx.op)
        load_targets(ctx, reader, read_metadata(bytes(buffers[METADATA].view)))
    finally:
        for buffer in buffers.values():
            buffer.close()


def restore_pipelined(ctx) -> None:
    """dcp.load with a reader that fetches only the items DCP asks for, ``concurrency``
    requests in flight inside the memory budget, loading each item as it lands."""
    start = time.time_ns()
    raw = ctx.storage.read_bytes(METADATA)
    end = time.time_ns()
    ctx.op.add_interval(Phase.FETCH, start, end)
    if ctx.verify in ("full", "sample"):
        from ckptprof.manifest import check_digest, hash_full, hash_sample

        with ctx.op.phase(Phase.VERIFY):
            digest = (hash_full if ctx.verify == "full" else hash_sample)(raw)
            check_digest(ctx.where(METADATA), ctx.manifest.files[METADATA], ctx.verify, digest)
        ctx.op.add_bytes(Phase.VERIFY, len(raw))
    md = read_metadata(raw)
    reader = FetchingStorageReader(ctx, md)
    reader.clocks.note(METADATA, start, end, len(raw))
    load_targets(ctx, reader, md)
    reader.finish()


def restore_framework(ctx) -> None:
    """dcp.load with DCP's own FileSystemReader on the path (after the files it will read
    are in the page cache), traced as the DCP integration traces a job's reader."""
    from torch.distributed.checkpoint import FileSystemReader

    from ckptprof.synth.strategies.base import verify_files, warm_files
    from ckptprof.tracing.dcp_reader import TracedReader

    warm_files(ctx)
    verify_files(ctx)
    reader = TracedReader.into(FileSystemReader(ctx.storage.uri), ctx.op, count_bytes=False)
    load_targets(ctx, reader, None, timed=False)


def load_targets(ctx, reader, md: Metadata | None, timed: bool = True) -> None:
    """dcp.load into the state of each target rank (one process plays every rank)."""
    for rank in sorted({t.rank for t in ctx.state.targets}):
        t0 = time.time_ns()
        state, offsets = {}, {}
        for target, tensor in zip(ctx.state.targets, ctx.state.tensors, strict=True):
            if target.rank == rank:
                key = fqn(target.group, target.name)
                state[key], offsets[key] = tensor, target.row_start
        if timed:
            ctx.op.add_interval(Phase.RESHARD, t0, time.time_ns())
            reader.plan_started_ns = time.time_ns()
        with warnings.catch_warnings(), _named_errors(reader):
            # no_dist=True is the point: one process plays every target rank
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(
                state, storage_reader=reader, planner=RowShardLoadPlanner(offsets), no_dist=True
            )


class _named_errors:
    """DCP wraps item failures in CheckpointException; say which file was bad instead."""

    def __init__(self, reader) -> None:
        self.reader = reader

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None or not isinstance(exc, Exception):
            return False
        from ckptprof.errors import CkptprofError, unreadable

        if isinstance(exc, CkptprofError):
            return False
        where = getattr(self.reader, "current_path", None) or METADATA
        raise unreadable(where, exc) from None


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
        self.storage_data: dict = {}
        self.plan_started_ns = time.time_ns()
        self.current_path: str | None = None  # the file being read, for error messages

    def reset(self, checkpoint_id=None) -> None:
        pass

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False

    def read_metadata(self, *args, **kwargs) -> Metadata:
        return read_metadata(bytes(self.buffers[METADATA].view))

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *a, **k) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future:
        self.op.add_interval(Phase.RESHARD, self.plan_started_ns, time.time_ns())
        for index, requests in _by_item(plan).items():
            info = self.storage_data[index]
            self.place(info, self.buffers[info.relative_path].reader(info.offset, info.length),
                       requests, planner)  # fmt: skip
        return _done()

    def place(self, info, stream, requests: list[ReadItem], planner: LoadPlanner) -> None:
        """One item: ``torch.load`` of its archive (deserialize), its chunks narrowed and
        copied into the target tensors (reshard)."""
        t0 = time.time_ns()
        self.current_path = info.relative_path
        tensor = torch.load(stream, map_location="cpu", weights_only=True)
        self.op.add_bytes(Phase.DESERIALIZE, info.length)
        t1 = time.time_ns()
        self.op.add_interval(Phase.DESERIALIZE, t0, t1)
        for req in requests:
            chunk = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            target.copy_(chunk)
            planner.commit_tensor(req, target)
            self.op.add_bytes(Phase.RESHARD, chunk.numel() * chunk.element_size())
        self.op.add_interval(Phase.RESHARD, t1, time.time_ns())


def _by_item(plan: LoadPlan) -> dict:
    by_item: dict[MetadataIndex, list[ReadItem]] = {}
    for req in plan.items:
        if req.type != LoadItemType.BYTE_IO:
            by_item.setdefault(req.storage_index, []).append(req)
    return by_item


def _done() -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(None)
    return fut


class FetchingStorageReader(MemoryStorageReader):
    """A DCP StorageReader that fetches the items DCP asks for through the I/O core's
    window: items of a file grouped into requests as the storage's policy plans them
    (each item whole), ``concurrency`` in flight inside the memory budget; each item is
    ``torch.load``-ed and its chunk copied into the target as soon as its request lands,
    while later requests are on the wire. With ``--verify full|sample`` every item of a
    file that is read at all is read, so its hash can be checked."""

    def __init__(self, ctx, metadata: Metadata) -> None:
        super().__init__({}, ctx.op)
        self.ctx = ctx
        self.metadata = metadata
        self.clocks = FileClocks()
        self.digests = {}
        if ctx.verify in ("full", "sample"):
            self.digests = {
                f.path: StreamingDigest(ctx.size(f.path), ctx.verify)
                for f in ctx.files
                if f.path != METADATA
            }

    def read_metadata(self, *args, **kwargs) -> Metadata:
        return self.metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future:
        ctx, op = self.ctx, self.op
        op.add_interval(Phase.RESHARD, self.plan_started_ns, time.time_ns())
        by_item = _by_item(plan)
        items = set(by_item)
        if self.digests:  # a file hash needs every item of the file, wanted or not
            wanted = {self.storage_data[i].relative_path for i in items}
            items |= {i for i, info in self.storage_data.items() if info.relative_path in wanted}
        at: dict[tuple[str, int], MetadataIndex] = {}
        atoms: dict[str, list[tuple[int, int]]] = {}
        for index in items:
            info = self.storage_data[index]
            at[(info.relative_path, info.offset)] = index
            span = (info.offset, info.offset + info.length)
            atoms.setdefault(info.relative_path, []).append(span)
        policy, summary = ctx.policy(), RequestSummary()
        planned = {}
        for path in sorted(atoms):
            for request, held in group_atoms(path, atoms[path], policy):
                planned[request] = held
                summary.add(request.length, sum(b - a for a, b in held))
        op.set_phase_attributes(Phase.FETCH, **summary.attributes())

        def land(request, view: memoryview) -> None:
            for start, end in planned[request]:
                index = at[(request.path, start)]
                wanted = by_item.get(index)
                if wanted:
                    piece = view[start - request.offset : end - request.offset]
                    self.place(self.storage_data[index], view_reader(piece), wanted, planner)

        window = Window(
            ctx.storage, op, ctx.concurrency, budget=ctx.memory_budget, digests=self.digests,
            progress=ctx.progress, desc="restore", clocks=self.clocks,
        )  # fmt: skip
        window.run(list(planned), land=land)
        op.set_phase_attributes(Phase.FETCH, **{Attr.CONCURRENCY: window.in_flight})
        return _done()

    def finish(self) -> None:
        """Check the file hashes the items made up (``--verify full`` / ``sample``)."""
        from ckptprof.synth.strategies.base import finish_digests

        self.clocks.record(self.ctx.op)
        finish_digests(self.ctx, self.digests, skip_unread=True)


__all__ = [
    "FetchingStorageReader",
    "MemoryStorageReader",
    "RowShardLoadPlanner",
    "load_targets",
    "restore_framework",
    "restore_pipelined",
    "restore_staged",
]
