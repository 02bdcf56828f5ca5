"""Check an output folder before any timed work: it can be written, and what will go
there fits (bytes and files).

A sweep that discovers an unwritable or full ``--out`` only when it writes its results
has wasted the whole measurement, so every output (results, traces, the staging copy)
is proved writable first, with a real write of a small file, and its free space and
free inodes are compared with what the run will put there.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import tempfile
from pathlib import Path

from ckptprof.atomic import named
from ckptprof.errors import CkptprofError
from ckptprof.units import fmt_bytes

PROBE_BYTES = 4096


def check_output_dir(path: Path, option: str, need_bytes: int, need_files: int = 8) -> None:
    """Create ``path`` and prove it takes a write; refuse when ``need_bytes`` or
    ``need_files`` do not fit. Errors name ``option`` (``--out``…) and the folder."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        _probe_write(path)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise CkptprofError(
            f"{option} {path}: cannot write there ({reason}); choose a writable folder "
            "with free space."
        ) from None
    stats = os.statvfs(path)
    free = stats.f_bavail * stats.f_frsize
    if free < need_bytes:
        raise CkptprofError(
            f"{option} {path}: the run will write about {fmt_bytes(need_bytes)} there but only "
            f"{fmt_bytes(free)} is free; free space or choose another folder."
        )
    if stats.f_files and stats.f_favail < need_files:
        raise CkptprofError(
            f"{option} {path}: the run will create {need_files} files there but the "
            f"filesystem can create only {stats.f_favail} more (free inodes); free some or "
            "choose another folder."
        )


def _probe_write(folder: Path) -> None:
    """Write, fsync and remove a small file: permissions, read-only mounts, quotas and a
    full disk all show here rather than after the sweep."""
    fd, name = tempfile.mkstemp(prefix=".ckptprof-write-test-", dir=folder)
    try:
        written = 0
        block = b"\0" * PROBE_BYTES
        while written < PROBE_BYTES:
            written += os.write(fd, block[written:])
        os.fsync(fd)
    except OSError as exc:
        raise named(exc, name) from None
    finally:
        os.close(fd)
        os.unlink(name)


class OutputClaim:
    """This run's hold on a folder it writes until :meth:`release`: a second ckptprof
    run writing the same ``--out`` or checkpoint is refused at its start, naming the
    holder, rather than both measuring and one silently overwriting the other's files
    (an advisory ``flock`` on the folder itself, so nothing is added to it; where the
    filesystem has no locks, no claim)."""

    def __init__(self, path: Path, option: str, what: str = "its results") -> None:
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            busy = exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
            holder = lock_holder(self._fd) if busy else None
            self.release()
            if busy:
                who = f" ({holder})" if holder else ""
                raise CkptprofError(
                    f"{option} {path}: another ckptprof run{who} is writing {what} there; "
                    f"wait for it to finish, or give this one another {option}."
                ) from None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> OutputClaim:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_holder(fd: int) -> str | None:
    """The process holding a ``flock`` on ``fd``'s file, from ``/proc/locks``: "pid N:
    its command line" (None where that cannot be read)."""
    info = os.fstat(fd)
    inode = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        with open("/proc/locks") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == inode and fields[4] != "-1":
            pid = fields[4]
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    argv = handle.read().split(b"\0")
                command = " ".join(a.decode(errors="replace") for a in argv if a)[:200]
            except OSError:
                command = ""
            return f"pid {pid}: {command}" if command else f"pid {pid}"
    return None


def earlier_results(path: Path) -> str | None:
    """A line on the results file (results.json, save.json) an earlier run left where this
    one writes its own: this run replaces it (an interrupted run's partial results too),
    never without a word; None where there is none."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    partial = isinstance(doc, dict) and doc.get("partial")
    what = "partial results (that run was interrupted)" if partial else "results"
    return f"{path}: an earlier run's {what}; this run replaces them"
