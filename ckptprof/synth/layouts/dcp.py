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

    # DCP brings its own loader: every strategy restores through dcp.load, which plans
    # the reads for the target rank's rows and fills the state's existing tensors
    def staged_restore(self, ctx) -> None:
        """Every file fetched into memory, verified, then dcp.load over the bytes."""
        from ckptprof.synth.strategies import fetch_all, verify_all

        buffers = fetch_all(ctx)
        try:
            verify_all(ctx, buffers)
            reader = MemoryStorageReader(buffers, ctx.op)
            self.load_targets(ctx, reader, _read_metadata(bytes(buffers[METADATA].view)))
        finally:
            for buffer in buffers.values():
                buffer.close()

    def pipelined_restore(self, ctx) -> None:
        """dcp.load with a reader that fetches only the items DCP asks for, ``concurrency``
        at a time inside the memory budget, loading each as it lands."""
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
        md = _read_metadata(raw)
        reader = FetchingStorageReader(ctx, md)
        reader.clocks.note(METADATA, start, end, len(raw))
        self.load_targets(ctx, reader, md)
        reader.finish()

    def framework_restore(self, ctx) -> None:
        """dcp.load with DCP's own FileSystemReader on the path (after the files it will
        read are in the page cache): its reads, parsing and copies are one interval."""
        from torch.distributed.checkpoint import FileSystemReader

        from ckptprof.synth.strategies import verify_files, warm_files

        warm_files(ctx)
        verify_files(ctx)
        reader = FileSystemReader(ctx.storage.uri)
        with ctx.op.phase(Phase.DESERIALIZE, **{"ckpt.fused": "deserialize+reshard (dcp.load)"}):
            self.load_targets(ctx, reader, reader.read_metadata(), timed=False)

    def load_targets(self, ctx, reader, md: Metadata, timed: bool = True) -> None:
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
                    state,
                    storage_reader=reader,
                    planner=RowShardLoadPlanner(offsets),
                    no_dist=True,
                )


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


class FetchingStorageReader(MemoryStorageReader):
    """A DCP StorageReader that fetches items from storage as DCP asks for them:
    ``concurrency`` ranged reads in flight, as many bytes buffered as the memory budget
    allows; each item is ``torch.load``-ed (deserialize) and its chunk copied into the
    target (reshard) as soon as it lands, while later items are still on the wire."""

    def __init__(self, ctx, metadata: Metadata) -> None:
        from ckptprof.synth.strategies import FetchClocks

        super().__init__({}, ctx.op)
        self.ctx = ctx
        self.metadata = metadata
        self.clocks = FetchClocks()
        self.digests = {}
        if ctx.verify in ("full", "sample"):
            from ckptprof.manifest import StreamingDigest

            self.digests = {
                f.path: StreamingDigest(ctx.manifest.files[f.path].size, ctx.verify)
                for f in ctx.files
                if f.path != METADATA
            }

    def read_metadata(self, *args, **kwargs) -> Metadata:
        return self.metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future:
        import queue
        from concurrent.futures import ThreadPoolExecutor

        from ckptprof.fetch import HostBuffer

        ctx, op = self.ctx, self.op
        op.add_interval(Phase.RESHARD, self.plan_started_ns, time.time_ns())
        by_item: dict[MetadataIndex, list[ReadItem]] = {}
        for req in plan.items:
            if req.type != LoadItemType.BYTE_IO:
                by_item.setdefault(req.storage_index, []).append(req)
        items = sorted(by_item, key=lambda i: (self.storage_data[i].relative_path,
                                                self.storage_data[i].offset))  # fmt: skip
        if self.digests:  # a file hash needs every item of the file, wanted or not
            wanted = {self.storage_data[i].relative_path for i in items}
            extra = [i for i, info in self.storage_data.items()
                     if info.relative_path in wanted and i not in by_item]  # fmt: skip
            items = sorted(items + extra, key=lambda i: (self.storage_data[i].relative_path,
                                                         self.storage_data[i].offset))  # fmt: skip
        budget = ByteBudget(ctx.memory_budget)
        landed: queue.Queue = queue.Queue()

        def fetch_item(index: MetadataIndex) -> None:
            info = self.storage_data[index]
            try:
                budget.acquire(info.length)
                buffer = HostBuffer(info.length, info.relative_path)
                start = time.time_ns()
                try:
                    ctx.storage.read_into(info.relative_path, info.offset, buffer.view)
                except BaseException:
                    buffer.close()
                    budget.release(info.length)
                    raise
                end = time.time_ns()
                op.add_interval(Phase.FETCH, start, end)
                self.clocks.note(info.relative_path, start, end, info.length)
                landed.put((index, buffer, None))
            except BaseException as exc:  # noqa: BLE001 - handed to the loading thread
                landed.put((index, None, exc))

        with ThreadPoolExecutor(max(1, ctx.concurrency)) as pool:
            futures = [pool.submit(fetch_item, i) for i in items]
            try:
                for _ in items:
                    index, buffer, error = landed.get()
                    if error is not None:
                        raise error
                    try:
                        self._place(index, buffer, by_item.get(index, []), planner)
                    finally:
                        buffer.close()
                        budget.release(self.storage_data[index].length)
            except BaseException:
                for future in futures:
                    future.cancel()
                budget.abandon()
                raise
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(None)
        return fut

    def _place(self, index, buffer, requests, planner) -> None:
        info = self.storage_data[index]
        digest = self.digests.get(info.relative_path)
        if digest is not None:
            with self.op.phase(Phase.VERIFY):
                digest.feed(info.offset, buffer.view)
        if not requests:
            return
        t0 = time.time_ns()
        self.current_path = info.relative_path
        tensor = torch.load(buffer.reader(), map_location="cpu", weights_only=True)
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

    def finish(self) -> None:
        """Check the file hashes the items made up (``--verify full`` / ``sample``)."""
        from ckptprof.errors import CkptprofError
        from ckptprof.manifest import check_digest

        ctx = self.ctx
        self.clocks.record(ctx.op)
        with ctx.op.phase(Phase.VERIFY, **{"ckpt.verify.mode": ctx.verify}):
            for path, digest in self.digests.items():
                if digest.hashed == 0:
                    continue  # a file this rank did not need
                if not digest.done:
                    raise CkptprofError(f"{ctx.where(path)}: not every byte was read to hash it")
                check_digest(
                    ctx.where(path), ctx.manifest.files[path], ctx.verify, digest.hexdigest()
                )
                ctx.op.add_bytes(Phase.VERIFY, digest.hashed)


class ByteBudget:
    """Bytes in flight, at most ``limit`` (one item larger than the limit still goes,
    alone): all-or-nothing, so fetching threads never deadlock holding halves."""

    def __init__(self, limit: int) -> None:
        import threading

        self.limit, self.used = limit, 0
        self._cond = threading.Condition()
        self._abandoned = False

    def acquire(self, n: int) -> None:
        with self._cond:
            while self.used and self.used + n > self.limit and not self._abandoned:
                self._cond.wait()
            self.used += n

    def release(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()

    def abandon(self) -> None:
        """A failure: let every waiting fetch through (they are being cancelled)."""
        with self._cond:
            self._abandoned = True
            self._cond.notify_all()
