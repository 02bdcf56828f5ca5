"""Writes on the I/O core: a file's bytes cut at the part size, written by N workers at once.

A file to save is given as segments in order (its header, then views of the tensors'
own memory: nothing is copied to assemble it). :func:`cut_parts` cuts that byte stream
into part-size :class:`Part` requests, each a list of views, and :func:`write_parts`
keeps ``concurrency`` of them in flight on a :class:`FileWriter` from the storage
(``pwritev`` at the part's offset on a POSIX file, ``UploadPart`` on S3): the write side
of what :mod:`ckptprof.io.window` does for reads. Memory held beyond the state is at most
one part per worker, where a storage must join a part's views into one body.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

from ckptprof.storage.base import FileWriter, Part


def as_bytes(segment) -> memoryview:
    """A segment as a flat byte view (tensors' memory through numpy, no copy)."""
    view = memoryview(segment)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def cut_parts(segments: Iterable, part_size: int) -> list[Part]:
    """The concatenation of ``segments`` cut every ``part_size`` bytes (the last part
    may be short; an empty file is one empty part)."""
    if part_size < 1:
        raise ValueError("part_size must be positive")
    parts: list[Part] = []
    views: list[memoryview] = []
    filled = offset = 0
    for segment in segments:
        view = as_bytes(segment)
        while view.nbytes:
            take = min(part_size - filled, view.nbytes)
            views.append(view[:take])
            view, filled = view[take:], filled + take
            if filled == part_size:
                parts.append(Part(len(parts) + 1, offset, tuple(views)))
                offset, views, filled = offset + filled, [], 0
    if views or not parts:
        parts.append(Part(len(parts) + 1, offset, tuple(views)))
    return parts


def write_parts(
    writer: FileWriter,
    parts: list[Part],
    concurrency: int,
    on_part: Callable[[Part], None] | None = None,
) -> int:
    """Write every part with up to ``concurrency`` in flight (``on_part`` is called from
    the worker that wrote it); the first failure (or an interrupt, e.g. Ctrl-C) cancels
    the parts not started and is raised once the running ones end, so the caller's abort
    comes after the last part. Returns the bytes written."""

    def one(part: Part) -> None:
        writer.write_part(part)
        if on_part:
            on_part(part)

    if concurrency <= 1 or len(parts) == 1:
        for part in parts:
            one(part)
        return sum(p.size for p in parts)
    with ThreadPoolExecutor(min(concurrency, len(parts)), "ckptprof-write") as pool:
        futures = []
        try:
            for part in parts:
                futures.append(pool.submit(one, part))
            wait(futures, return_when=FIRST_EXCEPTION)
        finally:  # a failure, or an interrupt while waiting: only the running parts finish
            for future in futures:
                future.cancel()
    for future in futures:
        if future.done() and not future.cancelled() and future.exception() is not None:
            raise future.exception()
    return sum(p.size for p in parts)


__all__ = ["as_bytes", "cut_parts", "write_parts"]
