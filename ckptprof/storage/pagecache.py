"""Page-cache control for cold/hot runs: evict with posix_fadvise, check with mincore.

``posix_fadvise(DONTNEED)`` only drops clean pages, so files are fsynced first.
Residency is measured, not assumed: a run is only called cold when mincore says
so (docs/design.md §9).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

import numpy as np

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = mmap.PAGESIZE


def resident_pages(path: Path) -> tuple[int, int]:
    """(resident, total) pages of ``path`` in the page cache, via mincore(2)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    total = (size + PAGE - 1) // PAGE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap failed for {path}")
        try:
            vec = (ctypes.c_ubyte * total)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore failed for {path}")
            resident = int(np.count_nonzero(np.frombuffer(vec, dtype=np.uint8) & 1))
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)
    return resident, total


def resident_fraction(paths: list[Path]) -> float:
    resident = total = 0
    for path in paths:
        r, t = resident_pages(path)
        resident += r
        total += t
    return resident / total if total else 0.0


def evict(paths: list[Path]) -> None:
    """fsync then POSIX_FADV_DONTNEED every file (per-file, not machine-wide)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            with contextlib.suppress(OSError):  # read-only mounts: pages are clean anyway
                os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def drop_caches() -> bool:
    """Machine-wide ``echo 3 > /proc/sys/vm/drop_caches`` (root only). True when it ran."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
        return True
    except OSError:
        return False


def warm(paths: list[Path], chunk: int = 8 << 20) -> None:
    """Read every byte once so the page cache holds the files."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while handle.readinto(view):
                pass


def warm_file(path: Path) -> None:
    """Bring ``path`` into the page cache without copying it into this process (see
    :func:`warm_range`)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        warm_range(fd, 0, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def warm_range(fd: int, offset: int, length: int) -> None:
    """Bring ``length`` bytes at ``offset`` of an open file into the page cache without a
    copy into this process: ``sendfile`` to ``/dev/null`` (the kernel reads the pages and
    discards nothing but the copy); where ``sendfile`` is refused, a small reused buffer."""
    sink = os.open(os.devnull, os.O_WRONLY)
    try:
        end = offset + length
        while offset < end:
            sent = os.sendfile(sink, fd, offset, min(end - offset, 1 << 30))
            if sent == 0:
                return
            offset += sent
    except OSError:
        buf = memoryview(bytearray(8 << 20))
        while offset < end:
            n = os.preadv(fd, [buf[: min(len(buf), end - offset)]], offset)
            if n == 0:
                return
            offset += n
    finally:
        os.close(sink)
