"""``parallel``: the same bytes through ckptprof's I/O core: each file serialized
(``serialize``: the archive's or header's small parts, and views of the tensors' memory
for their bytes: nothing copied; a ``torch.save`` archive's CRC-32 is the one pass over
them), cut at the part size, and written through the window with ``concurrency`` parts
in flight (``pwritev`` at offsets on a POSIX file, a multipart upload on S3). Files are
serialized one after another on a thread of their own while what is serialized is
written, as a pipeline: a large file whose size its codec knows first (a ``torch.save``
archive) is handed over a window's worth of parts at a time, so its records are written
while the next ones are checksummed; the serialize and write phases overlap."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import FIRST_EXCEPTION, wait
from dataclasses import dataclass

from ckptprof.atomic import fsync_dir
from ckptprof.io.buffers import BufferPool, HostBuffer
from ckptprof.io.window import FileClocks
from ckptprof.io.writes import STAGING, FileParts, PartCutter, cut_parts, write_files
from ckptprof.phases import Attr, Phase
from ckptprof.storage.base import FileWriter, Part
from ckptprof.synth.layouts import get_layout
from ckptprof.synth.savers.base import SaveContext, Saver, Written, named, serialized, streamed
from ckptprof.threads import thread_pool

#: a file of more parts than this is streamed (where its codec knows its size first)
STREAM_FROM = 4


class Parallel(Saver):
    name = "parallel"
    refused_layouts = {
        "dcp": "a DCP checkpoint is laid out by DCP's own writer; use --strategy framework "
        "(dcp.save) or async (dcp.async_save)."
    }
    object_store = True

    def save(self, ctx: SaveContext) -> Written:
        """Files written as they are serialized (all the parts serialized so far in one
        window run, while the next are serialized), ``concurrency`` parts at once; then
        each file forced to the device, and all renamed into place."""
        op = ctx.op
        files: list[_Opened] = []  # opened and not yet committed
        total = finished = 0
        op.set_phase_attributes(Phase.WRITE, **{Attr.CONCURRENCY: ctx.concurrency})
        # a direct writer's staging buffers, made before the first save (synth save), kept
        pool = ctx.kept.setdefault(STAGING, BufferPool(HostBuffer))
        clocks = FileClocks()  # a file streamed over several window runs: one clock each
        serialized = _Serializer(ctx)
        try:
            while finished < len(ctx.plan.files):
                batch = []
                for item in serialized.ready():
                    if isinstance(item, _Opened):
                        files.append(item)  # first: aborted with the rest if the save ends here
                        item.writer = ctx.storage.open_writer(item.path, item.size, ctx.part_size)
                        continue
                    assert item.path == files[-1].path  # a file's parts follow its opening
                    if item.parts:
                        batch.append(FileParts(item.path, files[-1].writer, item.parts))
                    finished += item.last
                if batch:
                    run = FileClocks()
                    try:
                        with named(ctx.storage.uri):
                            total += write_files(batch, ctx.concurrency, op, pool=pool, clocks=run)
                    finally:  # a failed save's writes are recorded too
                        clocks.fold(run)
            direct = bool(files) and all(f.writer.direct for f in files)  # what was done
            if ctx.fsync and not ctx.storage.object_store:
                _sync(files, ctx)
                op.add_bytes(Phase.FSYNC, total)
            with op.phase(Phase.COMMIT):
                while files:  # a writer leaves the list once committed
                    files[0].writer.commit()
                    files.pop(0)
                if ctx.fsync and not ctx.storage.object_store:
                    for folder in sorted({(ctx.root / f.path).parent for f in ctx.plan.files}):
                        fsync_dir(folder)
        except BaseException:  # an unfinished save, interrupted in its commit too, leaves nothing
            try:  # first: a second Ctrl-C while the serializer ends must not leave them
                for f in files:
                    if f.writer is not None:  # None: a Ctrl-C inside its opening
                        f.writer.abort()
            finally:
                serialized.stop()
            raise
        finally:
            clocks.record(op, Phase.WRITE)
        op.set_attributes({Attr.FILES: len(ctx.plan.files), Attr.SAVE_DIRECT_IO: direct})
        return Written(total)


def _sync(files: list[_Opened], ctx: SaveContext) -> None:
    """Each file forced to the device, ``concurrency`` at once, as they were written: a
    device or a network file system takes several flushes at a time, and one file's wait
    hides the next's (2,000 files' fsyncs one after another were a fifth of their save)."""

    def one(f: _Opened) -> None:
        with ctx.op.phase(Phase.FSYNC), named(f"{ctx.storage.uri}/{f.path}"):
            f.writer.sync()

    # leaving the pool: what has not started never starts; what has ends (one fsync
    # each) before the save aborts its writers, even through a second Ctrl-C
    with thread_pool(min(ctx.concurrency, len(files)), "fsyncs", "ckptprof-fsync") as pool:
        futures = [pool.submit(one, f) for f in files]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)  # a failure: at once
        failed = [f.exception() for f in futures if f in done and f.exception() is not None]
        if failed:
            raise failed[0]  # the first in file order of those that failed by then


class _Stopped(Exception):
    """The save has failed: the file being streamed is not made to its end."""


@dataclass
class _Opened:
    """A file the serializer has begun: its bytes, and the writer the saver opens."""

    path: str
    size: int
    writer: FileWriter | None = None


@dataclass(frozen=True)
class _Cut:
    """Parts of the file opened last, in order; ``last``: its final ones."""

    path: str
    parts: list[Part]
    last: bool


class _Serializer:
    """The plan's files serialized in order on a thread of their own (``torch.save``'s
    CRC-32 runs without the GIL), each opened, then handed over part by part: a file
    streamed a window's worth of parts at a time (:func:`streamed`), a file larger than
    :data:`STREAM_FROM` parts whose codec knows its size first; any other whole, once
    cut."""

    def __init__(self, ctx: SaveContext) -> None:
        self._ctx, self._done = ctx, queue.Queue()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ckptprof-serialize", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        ctx = self._ctx
        layout = get_layout(ctx.plan.spec.layout)
        try:
            for file in ctx.plan.files:
                if self._stopped.is_set():
                    return
                with ctx.op.phase(Phase.SERIALIZE):
                    self._one(layout, file)
        except _Stopped:
            return
        except BaseException as exc:  # noqa: BLE001 - raised in the saving thread
            self._done.put(exc)

    def _one(self, layout, file) -> None:
        ctx = self._ctx
        large = file.payload_bytes > STREAM_FROM * ctx.part_size
        stream = streamed(layout, ctx.plan, file, ctx.tensors) if large else None
        if stream is None:
            parts = cut_parts(serialized(layout, ctx.plan, file, ctx.tensors), ctx.part_size)
            self._done.put(_Opened(file.path, sum(p.size for p in parts)))
            self._done.put(_Cut(file.path, parts, last=True))
            return
        size, make = stream
        self._done.put(_Opened(file.path, size))
        cutter, pending = PartCutter(ctx.part_size), []

        def emit(segment) -> None:
            if self._stopped.is_set():  # the save has failed: the rest of the file is not made
                raise _Stopped
            pending.extend(cutter.add(segment))
            if cutter.offset > size:  # the writer was opened for the size said first
                raise RuntimeError(f"{file.path}: serialized more than the {size} bytes said")
            if len(pending) >= ctx.concurrency:  # a window's worth: written while the rest is made
                self._done.put(_Cut(file.path, pending[:], last=False))
                pending.clear()

        make(emit)
        pending.extend(cutter.finish())
        if cutter.offset != size:
            raise RuntimeError(f"{file.path}: serialized {cutter.offset} bytes, not {size}")
        self._done.put(_Cut(file.path, pending, last=True))

    def ready(self) -> list:
        """The files serialized since the last call: at least one (waiting for it)."""
        found = [self._done.get()]
        while True:
            try:
                found.append(self._done.get_nowait())
            except queue.Empty:
                break
        for item in found:
            if isinstance(item, BaseException):
                raise item
        return found

    def stop(self) -> None:
        """Nothing more serialized: a file streamed stops at its next segment, any other
        ends first; the thread ends with it."""
        self._stopped.set()
        self._thread.join()
