"""What every strategy shares: the run context, the Strategy contract, and the steps
several strategies take (verify, deserialize, reshard, warm the page cache).

A strategy restores the formats its :meth:`Strategy.handlers` names, each with a
function of the run context; a format it does not name is refused up front in one line.
Layouts give data only (their files, indexes, byte sources, loaders); strategies decide
how the bytes move, always through the I/O core (:mod:`ckptprof.io`).
"""

from __future__ import annotations

import contextlib
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from ckptprof.errors import CkptprofError
from ckptprof.io.buffers import BufferPool
from ckptprof.io.requests import RequestPolicy
from ckptprof.io.window import Window
from ckptprof.manifest import check_digest, verify_buffers
from ckptprof.phases import Attr, Phase
from ckptprof.progress import bar as progress_bar
from ckptprof.storage.base import ObjectInfo
from ckptprof.synth.device import synchronize
from ckptprof.synth.readplan import Source, plan_copies
from ckptprof.threads import thread_pool

if TYPE_CHECKING:
    import torch

    from ckptprof.io.buffers import HostBuffer
    from ckptprof.manifest import Manifest
    from ckptprof.storage.base import Storage
    from ckptprof.synth.layouts.base import Layout
    from ckptprof.synth.plan import CheckpointPlan, FilePlan, Piece
    from ckptprof.synth.targets import TargetState
    from ckptprof.tracing.recorder import Operation

ANY = "*"  # a handler for every format the strategy does not name otherwise


@dataclass(frozen=True)
class RunContext:
    """What one restore run works with."""

    storage: Storage
    layout: Layout
    plan: CheckpointPlan
    manifest: Manifest
    state: TargetState
    files: list[FilePlan]  # what this restore reads: the rank's data files and small files
    op: Operation
    concurrency: int
    part_size: int
    memory_budget: int
    verify: str
    progress: bool | None = None
    threads: int = 1
    stage_dir: Path | None = None
    buffers: BufferPool | None = None  # the pinned window's, for a state on a device

    def where(self, path: str) -> str:
        return f"{self.storage.uri}/{path}"

    def infos(self) -> list[ObjectInfo]:
        return [ObjectInfo(f.path, self.size(f.path)) for f in self.files]

    def size(self, path: str) -> int:
        return self.manifest.files[path].size

    def policy(self) -> RequestPolicy:
        """How this storage's requests are planned (part size, read-through gaps)."""
        return RequestPolicy.for_storage(self.storage, self.part_size)

    def path_of(self, file: FilePlan) -> str:
        return str(Path(self.storage.uri) / file.path)


Handler = Callable[[RunContext], None]


class Strategy(ABC):
    """One way of restoring. Subclasses name the formats they restore (:meth:`handlers`)
    and what they hold in memory besides the state (:meth:`memory_held`)."""

    name: ClassVar[str]
    #: what it holds is its --memory-budget (the advice for too little memory differs)
    bounded_by_budget: ClassVar[bool] = False

    @abstractmethod
    def handlers(self) -> dict[str, Handler]:
        """Layout format → the function restoring it (:data:`ANY` for the rest)."""

    def handler(self, layout: Layout) -> Handler:
        table = self.handlers()
        found = table.get(layout.format) or table.get(ANY)
        if found is None:
            raise CkptprofError(self.refusal(layout))
        return found

    def refusal(self, layout: Layout) -> str:
        formats = ", ".join(f for f in self.handlers() if f != ANY)
        return (
            f"--strategy {self.name} restores {formats} checkpoints; this checkpoint's layout "
            f"is {layout.name}: choose another --strategy."
        )

    def run(self, ctx: RunContext) -> None:
        self.handler(ctx.layout)(ctx)
        if not ctx.state.on_host:  # the device copies end when they have landed
            with ctx.op.phase(Phase.RESHARD):
                synchronize(ctx.state.tensors[0].device)
        ctx.op.set_attributes({Attr.STRATEGY: self.name})

    def check(self, storage: Storage) -> None:  # noqa: B027 - most strategies run anywhere
        """Refuse up front where this strategy cannot run (one line, with the fix)."""

    def check_layout(self, layout: Layout) -> None:
        """Refuse a checkpoint layout this strategy cannot read (one line, with the fix)."""
        self.handler(layout)

    def memory_held(self, read_bytes: int, memory_budget: int) -> int:
        """Bytes it holds besides the state, at most, reading ``read_bytes``."""
        return read_bytes


# ---------------------------------------------------------------------- needed files
def needed_files(plan: CheckpointPlan, targets) -> list[FilePlan]:
    """The files a restore of ``targets`` reads: data files holding rows any target
    needs (from the plan: what each file holds is known before reading it), and every
    small file (config, RNG and trainer state: a resume reads them all)."""
    wanted: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for t in targets:
        wanted.setdefault(t.key, []).append((t.row_start, t.row_end))
    return [f for f in plan.files if not f.pieces or any(_holds(p, wanted) for p in f.pieces)]


def _holds(piece: Piece, wanted) -> bool:
    if piece.name.startswith("__flat"):  # a ZeRO flat partition: any tensor may be in it
        return any(group == piece.group for group, _ in wanted)
    spans = wanted.get((piece.group, piece.name), ())
    return any(lo < piece.row_end and piece.row_start < hi for lo, hi in spans)


# ---------------------------------------------------------------------- reshard
def piece_sources(layout: Layout, plan, file: FilePlan, tensors: dict) -> tuple[list, dict]:
    """Sources that point into each loaded piece tensor (its bytes, not the file's)."""
    import torch

    sources: list[Source] = []
    memory: dict[str, torch.Tensor] = {}
    for n, (piece, tensor) in enumerate(tensors.items()):
        tag = f"{file.path}#{n}"
        memory[tag] = tensor.detach().reshape(-1).view(torch.uint8)
        sources += [replace(s, path=tag) for s in layout.sources(plan, file, {piece: 0})]
    return sources, memory


def copy_into(
    state: TargetState, copies, memory: dict, advance=None, non_blocking: bool = False
) -> int:
    """Execute copies from source bytes (``memory[path]``: flat uint8 tensors);
    ``advance(n)`` after each (a progress bar). ``non_blocking``: from pinned memory to a
    device, queued on the current stream (the caller fences the source's reuse)."""
    moved = 0
    for c in copies:
        source = memory[c.path]
        state.byte_view(c.target)[c.target_offset : c.target_offset + c.length].copy_(
            source[c.offset : c.offset + c.length], non_blocking=non_blocking
        )
        moved += c.length
        if advance is not None:
            advance(c.length)
    return moved


def load_pieces(ctx: RunContext, loaded: Iterable[tuple[FilePlan, dict]]) -> None:
    """``reshard``: copy every loaded piece's rows into the target state."""
    sources, memory = [], {}
    for file, tensors in loaded:
        more, mem = piece_sources(ctx.layout, ctx.plan, file, tensors)
        sources += more
        memory.update(mem)
    with ctx.op.phase(Phase.RESHARD):
        copies = plan_copies(ctx.state.targets, sources)
        with progress_bar(sum(c.length for c in copies), "reshard", ctx.progress) as bar:
            moved = copy_into(ctx.state, copies, memory, bar.update)
    ctx.op.add_bytes(Phase.RESHARD, moved)


# ---------------------------------------------------------------------- deserialize
def pieces_read(ctx: RunContext, file: FilePlan, buffer: HostBuffer) -> dict:
    """``file``'s pieces from its fetched bytes, by its codec's loader (views of them)."""
    from ckptprof.synth.codecs import get_codec

    obj = get_codec(ctx.layout.codec(file)).read(buffer)
    return ctx.layout.pieces(ctx.plan, file, obj)


def pieces_loaded(ctx: RunContext, file: FilePlan) -> dict:
    """``file``'s pieces loaded from its path by the framework's own loader."""
    from ckptprof.synth.codecs import get_codec

    obj = get_codec(ctx.layout.codec(file)).load(ctx.path_of(file))
    return ctx.layout.pieces(ctx.plan, file, obj)


def deserialize_files(
    ctx: RunContext, load, files: list[FilePlan] | None = None
) -> list[tuple[FilePlan, dict]]:
    """The deserialize phase: ``load(file)`` for every data file read (of ``files``, by
    default all), ``threads`` at a time; a loader's failure names the file."""
    from ckptprof.errors import unreadable

    def one(file: FilePlan):
        with ctx.op.phase(Phase.DESERIALIZE):
            t0 = time.perf_counter()
            try:
                tensors = load(file)
            except CkptprofError:
                raise
            except Exception as exc:  # noqa: BLE001 - a loader's error on bad bytes
                raise unreadable(ctx.where(file.path), exc, ctx.verify) from None
        size = ctx.size(file.path)
        ctx.op.add_file(Phase.DESERIALIZE, file.path, size, time.perf_counter() - t0)
        bar.update(size)
        return file, tensors

    data = [f for f in (ctx.files if files is None else files) if f.pieces]
    total = sum(ctx.size(f.path) for f in data)
    with (
        progress_bar(total, "deserialize", ctx.progress) as bar,
        thread_pool(ctx.threads, "deserializations") as pool,
    ):
        return list(pool.map(one, data))


def load_from_buffers(ctx: RunContext, buffers: dict[str, HostBuffer]) -> None:
    """verify, deserialize and reshard files already in memory; the buffers are released."""
    try:
        verify_all(ctx, buffers)
        loaded = deserialize_files(ctx, lambda f: pieces_read(ctx, f, buffers[f.path]))
        load_pieces(ctx, loaded)
        del loaded
    finally:
        for buffer in buffers.values():
            buffer.close()


# ---------------------------------------------------------------------- verify
def verify_attributes(ctx: RunContext) -> dict:
    """The verify phase's mode and the bytes of the files it checks (what a share of
    ``sample`` is a share of)."""
    of = sum(ctx.size(f.path) for f in ctx.files)
    return {Attr.VERIFY_MODE: ctx.verify, Attr.VERIFY_OF_BYTES: of}


def verify_all(ctx: RunContext, buffers: dict) -> None:
    """verify: every file's bytes in memory against the manifest."""
    with ctx.op.phase(Phase.VERIFY, **verify_attributes(ctx)):
        verify_buffers(
            buffers, ctx.manifest, ctx.verify, ctx.storage.uri, ctx.op, threads=ctx.threads
        )


def finish_digests(ctx: RunContext, digests: dict, skip_unread: bool = False) -> None:
    """verify: check the digests the reads fed as they landed (``--verify full|sample``);
    ``skip_unread``: a file none of whose bytes were needed is not checked."""
    hashed = 0
    with ctx.op.phase(Phase.VERIFY, **verify_attributes(ctx)):
        for path, digest in digests.items():
            if skip_unread and digest.hashed == 0:
                continue
            hashed += digest.hashed
            if not digest.done:
                raise CkptprofError(f"{ctx.where(path)}: not every byte was read to hash it")
            check_digest(ctx.where(path), ctx.manifest.files[path], ctx.verify, digest.hexdigest())
    ctx.op.add_bytes(Phase.VERIFY, hashed)


def verify_files(ctx: RunContext) -> None:
    """verify from the page cache: the same check, each file read through a mapping."""
    mapped = {f.path: _Mapped(ctx.path_of(f)) for f in ctx.files}
    try:
        verify_all(ctx, mapped)
    finally:
        for m in mapped.values():
            m.close()


class _Mapped:
    """A file's bytes through a read-only mapping, shaped like a HostBuffer."""

    def __init__(self, path: str) -> None:
        import mmap

        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            self._map = mmap.mmap(handle.fileno(), size, prot=mmap.PROT_READ) if size else None
        self.view = memoryview(self._map) if self._map is not None else memoryview(b"")

    def close(self) -> None:
        self.view.release()
        if self._map is not None:
            self._map.close()


# ---------------------------------------------------------------------- fetch helpers
def warm_files(ctx: RunContext, files: list[FilePlan] | None = None) -> None:
    """fetch: every file into the page cache (no copy into this process), ``concurrency``
    at a time: what a framework loader's mmap then reads from."""
    from ckptprof.io.requests import Request
    from ckptprof.storage.pagecache import warm_file

    chosen = files if files is not None else ctx.files
    requests = [Request(f.path, 0, ctx.size(f.path)) for f in chosen]

    def warm(request: Request, _view) -> None:
        warm_file(Path(ctx.storage.uri) / request.path)

    window = Window(ctx.storage, ctx.op, ctx.concurrency, progress=ctx.progress, desc="warm")
    window.run(requests, into=lambda r: None, read=warm)


def fetch_all(ctx: RunContext) -> dict[str, HostBuffer]:
    """Every file this restore reads, into memory (or ``--stage DIR``, then from there)."""
    import shutil

    from ckptprof.io.requests import RequestSummary, whole_files
    from ckptprof.io.transfer import download, fetch
    from ckptprof.storage import PosixStorage

    infos, op = ctx.infos(), ctx.op
    summary = RequestSummary()
    for request in whole_files({i.path: i.size for i in infos}, ctx.part_size):
        summary.add(request.length, request.length)
    with op.phase(Phase.FETCH, **{Attr.CONCURRENCY: ctx.concurrency, **summary.attributes()}):
        if ctx.stage_dir is None:
            return fetch(ctx.storage, infos, ctx.concurrency, op, ctx.part_size, ctx.progress)
        stage = Path(ctx.stage_dir) / f"ckptprof-stage-{os.getpid()}"
        shutil.rmtree(stage, ignore_errors=True)
        try:
            t0 = time.perf_counter()
            download(ctx.storage, infos, stage, ctx.concurrency, op, ctx.part_size, ctx.progress)
            t1 = time.perf_counter()
            local = PosixStorage(str(stage))
            buffers = fetch(local, infos, ctx.concurrency, None, ctx.part_size, ctx.progress)
            t2 = time.perf_counter()
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        op.set_phase_attributes(
            Phase.FETCH,
            **{
                Attr.FETCH_STAGE_DIR: str(stage),
                Attr.FETCH_STAGE_DOWNLOAD_S: round(t1 - t0, 6),
                Attr.FETCH_STAGE_READ_S: round(t2 - t1, 6),
            },
        )
        return buffers


@contextlib.contextmanager
def env_for_run(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` for one run (loaders configured through the
    environment), then as it was."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


__all__ = [
    "ANY",
    "RunContext",
    "Strategy",
    "copy_into",
    "deserialize_files",
    "env_for_run",
    "fetch_all",
    "finish_digests",
    "load_from_buffers",
    "load_pieces",
    "needed_files",
    "verify_all",
    "verify_attributes",
    "verify_files",
    "warm_files",
]
