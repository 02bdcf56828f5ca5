"""Writes on the I/O core: files' bytes cut at the part size and written through the
same :class:`~ckptprof.io.window.Window` as reads, N parts in flight.

A file to save is given as segments in order (its header, then views of the tensors'
own memory: nothing is copied to assemble it). :func:`cut_parts` cuts that byte stream
into part-size :class:`Part` requests, each a list of views, and :func:`write_files`
runs every part of every file through the window on a :class:`FileWriter` from the
storage (``pwritev`` at the part's offset on a POSIX file, ``UploadPart`` on S3): the
window's slots bound the parts in flight, each part is a ``write`` interval, each file
gets its clock (first start to last end, its bytes) and the progress bar counts bytes
written. Memory held beyond the state is at most one part per request in flight, where a
storage must join a part's views into one body.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ckptprof.io.buffers import BufferPool, HostBuffer
from ckptprof.io.window import POOLED, FileClocks, Window
from ckptprof.phases import Phase
from ckptprof.storage.base import FileWriter, Part, whole_blocks


def as_bytes(segment) -> memoryview:
    """A segment as a flat byte view (tensors' memory through numpy, no copy)."""
    view = memoryview(segment)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class PartCutter:
    """A byte stream given segment by segment, cut every ``part_size`` bytes as it comes:
    each part is handed out once full (a file streamed as it is serialized is written
    while the rest of it is still being made)."""

    def __init__(self, part_size: int) -> None:
        if part_size < 1:
            raise ValueError("part_size must be positive")
        self.part_size = part_size
        self.count = self.offset = 0  # the parts handed out, and their bytes
        self._views: list[memoryview] = []
        self._filled = 0

    def add(self, segment) -> list[Part]:
        """The parts ``segment`` completes."""
        full = []
        view = as_bytes(segment)
        while view.nbytes:
            take = min(self.part_size - self._filled, view.nbytes)
            self._views.append(view[:take])
            view, self._filled = view[take:], self._filled + take
            if self._filled == self.part_size:
                full.append(self._part())
        return full

    def finish(self) -> list[Part]:
        """The last, short part (an empty stream is one empty part)."""
        return [self._part()] if self._views or not self.count else []

    def _part(self) -> Part:
        self.count += 1
        part = Part(self.count, self.offset, tuple(self._views))
        self.offset, self._views, self._filled = self.offset + self._filled, [], 0
        return part


def cut_parts(segments: Iterable, part_size: int) -> list[Part]:
    """The concatenation of ``segments`` cut every ``part_size`` bytes (the last part
    may be short; an empty file is one empty part)."""
    cutter = PartCutter(part_size)
    parts = [part for segment in segments for part in cutter.add(segment)]
    return parts + cutter.finish()


@dataclass(frozen=True)
class FileParts:
    """One file to write: its name (its clock's), its writer and its parts."""

    path: str
    writer: FileWriter
    parts: list[Part]


@dataclass(frozen=True)
class _WriteRequest:
    """One part of one file, as the window runs it (a request's path, offset, length)."""

    path: str
    writer: FileWriter
    part: Part

    @property
    def offset(self) -> int:
        return self.part.offset

    @property
    def length(self) -> int:
        return self.part.size

    @property
    def buffer_length(self) -> int:
        """A direct writer's part is staged in whole blocks."""
        size = self.part.size
        return whole_blocks(size) if self.writer.direct else size


def write_files(
    files: Sequence[FileParts],
    concurrency: int,
    op=None,
    *,
    progress: bool | None = None,
    pool: BufferPool | None = None,
    clocks: FileClocks | None = None,
) -> int:
    """Every part of every file written, ``concurrency`` at once, in file order (the
    window's slots are taken in order); each part a ``write`` interval on ``op`` and each
    file's clock recorded there. A direct writer's parts are first copied into the
    window's aligned buffers (``pool``'s, when given: kept from one save to the next, as
    a job keeps them), as many as the window holds, and written from there. A file
    written over several calls shares their ``clocks`` (recorded by the caller). The first
    failure (or an interrupt, e.g. Ctrl-C) stops the parts not started and is raised once
    the running ones end, so the caller's abort comes after the last part. Returns the
    bytes written."""
    requests = [_WriteRequest(f.path, f.writer, part) for f in files for part in f.parts]
    window = Window(
        None,
        op,
        concurrency,
        progress=progress,
        desc="write",
        phase=Phase.WRITE,
        pool=pool,
        clocks=clocks,
    )
    window.run(requests, into=_staging, read=_write)
    return sum(r.length for r in requests)


#: ``SaveContext.kept``'s key for a direct writer's staging buffers
STAGING = "write_buffers"


def staging_shape(concurrency: int, part_size: int) -> tuple[int, int]:
    """How many staging buffers a direct writer holds, and the bytes of each: one per
    write in flight and two for the writes handed back, each a part in whole blocks
    (what :func:`staging_buffers` makes, and a save's memory check counts)."""
    return concurrency + 2, whole_blocks(part_size)


def staging_buffers(concurrency: int, part_size: int) -> BufferPool:
    """A direct writer's staging buffers (:func:`staging_shape`), made and touched now
    (before any timing), as a job keeps them."""
    pool = BufferPool(HostBuffer)
    pool.reserve(*staging_shape(concurrency, part_size), "ckptprof-staging")
    for buffer in pool.free_buffers():
        for offset in range(0, buffer.size, mmap.PAGESIZE):
            buffer.view[offset] = 0  # fresh memory costs a fault a page: paid here
    return pool


def write_parts(writer: FileWriter, parts: list[Part], concurrency: int) -> int:
    """One file's parts, untimed (the write probe times them itself)."""
    return write_files([FileParts("", writer, parts)], concurrency, progress=False)


def _staging(request: _WriteRequest):
    """A direct write is staged in a window buffer; any other leaves the state's own
    memory as it is (nothing lands)."""
    return POOLED if request.writer.direct else None


def _write(request: _WriteRequest, view) -> None:
    if view is None:
        request.writer.write_part(request.part)
        return
    at = 0
    for piece in request.part.views:
        view[at : at + piece.nbytes] = piece
        at += piece.nbytes
    request.writer.write_staged(view, request.part.offset, request.part.size)


__all__ = [
    "STAGING",
    "FileParts",
    "as_bytes",
    "cut_parts",
    "staging_buffers",
    "staging_shape",
    "write_files",
    "write_parts",
]
