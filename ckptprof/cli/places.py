"""What is wrong with a path a command was given, known before any work starts.

Every path option's type (:mod:`ckptprof.cli.options`) asks one of these while the
command line is parsed, so a symlink loop, a file where a folder goes, a FIFO, a
read-only or full filesystem costs one line naming the option, never a measurement
thrown away at its end. Nothing is created, written or followed past a ``stat``: the
command itself makes its folders once every option has passed.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

from ckptprof.storage.registry import is_path

#: a folder with less free space than this is full (room for what a run writes there is
#: then checked by the command, against what it will write)
MIN_FREE_BYTES = 4096

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _stat(path: Path) -> tuple[os.stat_result | None, str | None]:
    """``stat`` through links: (result, None); (None, None) when nothing is there; or
    (None, problem) for a link that loops or leads nowhere."""
    try:
        return os.stat(path), None
    except FileNotFoundError:
        if os.path.islink(path):
            return None, f"{path} is a dangling symlink (to {os.readlink(path)}); fix or remove it"
        return None, None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, f"{path} is a symlink loop; point it at a real folder or remove it"
        if exc.errno == errno.ENOTDIR:
            return None, f"{path}: a part of it is a file, not a folder; choose another path"
        return None, f"{path}: {exc.strerror or exc}"


def _writable_folder(folder: Path, what: str) -> str | None:
    """Why files cannot be created in the existing folder ``folder`` (None: they can)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        try:
            read_only = os.statvfs(folder).f_flag & os.ST_RDONLY
        except OSError:
            read_only = False
        why = "is on a read-only filesystem" if read_only else "is not writable (permissions)"
        return f"{what} {folder} {why}; choose a writable place"
    try:
        stats = os.statvfs(folder)
    except OSError:
        return None
    free = stats.f_bavail * stats.f_frsize
    if free < MIN_FREE_BYTES:
        return f"{what} {folder} has {free} bytes free; free space or choose another place"
    return None


def _nearest_existing(path: Path) -> tuple[Path | None, str | None]:
    """The nearest ancestor of ``path`` that exists (the folder creation starts in)."""
    for parent in path.absolute().parents:
        found, problem = _stat(parent)
        if problem:
            return None, problem
        if found is not None:
            if not stat.S_ISDIR(found.st_mode):
                return None, f"{parent} is a file, so {path} cannot be created; choose another path"
            return parent, None
    return None, None


def output_folder_problem(text: str) -> str | None:
    """A folder to create (with its parents) and write into."""
    path = Path(text).expanduser()
    found, problem = _stat(path)
    if problem:
        return problem
    if found is None:
        ancestor, problem = _nearest_existing(path)
        if problem:
            return problem
        return _writable_folder(ancestor, f"{path}: the folder") if ancestor else None
    if stat.S_ISREG(found.st_mode):
        return f"{path} is a file, not a folder; name a folder"
    if not stat.S_ISDIR(found.st_mode):
        return f"{path} is {_kind(found.st_mode)}, not a folder; name a folder"
    return _writable_folder(path, "the folder")


def output_file_problem(text: str) -> str | None:
    """A file to write (replaced if there; a FIFO or a character device written through,
    never replaced); its folder must exist."""
    path = Path(text).expanduser()
    found, problem = _stat(path)
    if problem:
        return problem
    if found is not None:
        if stat.S_ISDIR(found.st_mode):
            return f"{path} is a folder; name a file in it"
        if stat.S_ISFIFO(found.st_mode) or stat.S_ISCHR(found.st_mode):
            return None  # written through, as `> file` would (a pipe's reader, /dev/null)
        if not stat.S_ISREG(found.st_mode):
            return f"{path} is {_kind(found.st_mode)}, not a file; name a regular file"
    folder = path.absolute().parent
    parent, problem = _stat(folder)
    if problem:
        return problem
    if parent is None:
        return f"{path}: folder {folder} does not exist; create it first"
    if not stat.S_ISDIR(parent.st_mode):
        return f"{path}: {folder} is not a folder; name a file in a folder"
    return _writable_folder(folder, f"{path}: the folder")


def input_problem(text: str) -> str | None:
    """A file or folder to read."""
    path = Path(text).expanduser()
    found, problem = _stat(path)
    if problem:
        return problem
    if found is None:
        return f"{path} does not exist; name a trace file, results file or their folder"
    if not (stat.S_ISREG(found.st_mode) or stat.S_ISDIR(found.st_mode)):
        return f"{path} is {_kind(found.st_mode)}; name a file or a folder"
    if not os.access(path, os.R_OK):
        return f"{path} is not readable (permissions)"
    return None


def location_problem(write: bool) -> Callable[[str], str | None]:
    """A checkpoint location: ``s3://`` is the storage's to check (it needs the network);
    a local folder to write is checked as an output folder; one to read must be a folder
    if it is there (a missing one is the command's to explain: it names how to make it)."""

    def problem(text: str) -> str | None:
        if not is_path(text):
            return None
        if write:
            return output_folder_problem(text)
        path = Path(text).expanduser()
        found, trouble = _stat(path)
        if trouble:
            return trouble
        if found is not None and not stat.S_ISDIR(found.st_mode):
            what = "a file" if stat.S_ISREG(found.st_mode) else _kind(found.st_mode)
            return f"{path} is {what}, not a checkpoint folder; name the folder"
        return None

    return problem
