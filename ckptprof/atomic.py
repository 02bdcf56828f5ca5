"""Atomic file writes: temp name in the same folder, fsync, rename, fsync the folder.

Everything ckptprof writes that a reader may trust (manifests, results, interruption
records, plots, published checkpoint files) goes through here, so nothing half-written
ever looks done, and an I/O error always names the file it was writing. Only regular
files are ever replaced: a link, a device or a FIFO at the path is written through.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from ckptprof.errors import CkptprofError

PARTIAL_SUFFIX = ".partial"


def partial_path(path: str | os.PathLike) -> Path:
    """Where ``path`` is written before it is renamed into place (unique per process)."""
    final = Path(path)
    return final.with_name(f"{final.name}.{os.getpid()}{PARTIAL_SUFFIX}")


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename inside ``path`` durable (best effort: some filesystems refuse)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def named(exc: OSError, path: str | os.PathLike) -> OSError:
    """``exc`` with ``path`` as its filename (write errors such as ENOSPC carry none)."""
    if exc.filename is None and exc.errno is not None:
        return type(exc)(exc.errno, exc.strerror, str(path))
    return exc


def _write_target(final: Path) -> tuple[Path, bool]:
    """Where a write to ``final`` really goes, and whether it may be an atomic replace.

    A link is written through (the link stays, its target changes); a character device
    or a FIFO (``/dev/null``, ``/dev/stdout``, a pipe) is written as a shell redirect
    would, never replaced by a regular file; anything else that is not a regular file
    is refused, so ckptprof never swaps out a file that is not its own kind.
    """
    target = Path(os.path.realpath(final)) if final.is_symlink() else final
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return target, True
    except OSError:
        return target, True  # the write itself will name the file and the error
    if stat.S_ISREG(mode):
        return target, True
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return target, False
    kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
    raise CkptprofError(f"{final}: {kind}; ckptprof writes only regular files. Name a file.")


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path to write; on a clean exit fsync it and rename it to ``path``.

    On any error the temp file is removed and the error (naming the file) re-raised.
    Only a regular file (or none) is replaced: a link is written through and a device
    or FIFO is written in place (see ``_write_target``).
    """
    final, atomic = _write_target(Path(path))
    if not atomic:
        try:
            yield final
        except OSError as exc:
            raise named(exc, final) from None
        return
    tmp = partial_path(final)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise named(exc, final) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(final.parent)


def move_into_place(source: str | os.PathLike, final: str | os.PathLike) -> None:
    """``os.replace(source, final)``, for a folder too (a sharded checkpoint): a folder
    already at ``final`` is moved aside first and removed only once ``source`` is in
    place, so at every moment one complete checkpoint is there under either name."""
    source, final = Path(source), Path(final)
    if not (source.is_dir() and final.is_dir()):
        os.replace(source, final)
        return
    aside = final.with_name(f"{final.name}.{os.getpid()}.replaced")
    os.replace(final, aside)
    try:
        os.replace(source, final)
    except BaseException:
        os.replace(aside, final)  # the previous checkpoint stays the one resumed
        raise
    fsync_dir(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", **kwargs) -> Iterator[IO]:
    """``open(path, mode)`` whose content appears at ``path`` only when the block ends
    cleanly; a failure leaves whatever was there before."""
    with replacing(path) as tmp, open(tmp, mode, **kwargs) as handle:
        yield handle
        handle.flush()


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` to ``path`` atomically (bytes, or text as UTF-8)."""
    raw = data.encode() if isinstance(data, str) else data
    with atomic_open(path, "wb") as handle:
        handle.write(raw)
