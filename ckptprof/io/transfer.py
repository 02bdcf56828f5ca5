"""Whole files through the window: into host memory, or copied into a local folder.

:func:`fetch` is what a staged restore does (every byte into memory, then load);
:func:`download` is what ``s5cmd cp`` or ``aws s3 cp`` do before a job loads from local
disk. Both cut files into part-size requests (:func:`~ckptprof.io.requests.whole_files`)
and run them in one :class:`~ckptprof.io.window.Window`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ckptprof.atomic import named
from ckptprof.io.buffers import HostBuffer
from ckptprof.io.requests import whole_files
from ckptprof.io.window import POOLED, Window
from ckptprof.storage.base import DEFAULT_PART_SIZE, ObjectInfo, Storage


def fetch(
    storage: Storage,
    files: list[ObjectInfo],
    concurrency: int,
    op=None,
    part_size: int = DEFAULT_PART_SIZE,
    progress: bool | None = None,
) -> dict[str, HostBuffer]:
    """Read ``files`` fully into memory with ``concurrency`` requests in flight."""
    buffers = {f.path: HostBuffer(f.size, f.path) for f in files}
    try:
        requests = whole_files({f.path: f.size for f in files}, part_size)
        window = Window(storage, op, concurrency, progress=progress, desc="fetch")
        window.run(requests, into=lambda r: buffers[r.path].view[r.offset : r.offset + r.length])
    except BaseException:
        for buf in buffers.values():
            buf.close()
        raise
    return buffers


def download(
    storage: Storage,
    files: list[ObjectInfo],
    dest: Path,
    concurrency: int,
    op=None,
    part_size: int = DEFAULT_PART_SIZE,
    progress: bool | None = None,
) -> None:
    """Copy ``files`` into the local directory ``dest``, ``concurrency`` ranged reads in
    flight. Each part is written as it lands, its file opened for that write only, so
    open files stay few however many files there are. Write errors name the file."""
    for f in files:
        _create(dest / f.path, f.size)

    def land(request, view: memoryview) -> None:
        target = dest / request.path
        try:
            fd = os.open(target, os.O_WRONLY)
            try:
                written = 0
                while written < request.length:
                    written += os.pwrite(fd, view[written:], request.offset + written)
            finally:
                os.close(fd)
        except OSError as exc:
            raise named(exc, target) from None

    requests = whole_files({f.path: f.size for f in files}, part_size)
    budget = (concurrency + 2) * part_size  # a buffer per request in flight, two landing
    window = Window(storage, op, concurrency, budget=budget, progress=progress, desc="download")
    window.run(requests, into=lambda r: POOLED, land=land)


def _create(target: Path, size: int) -> None:
    """An empty file of ``size`` bytes (sparse until written), its folders made."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
    except OSError as exc:
        raise named(exc, target) from None


__all__ = ["download", "fetch"]
