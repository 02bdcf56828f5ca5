"""User-facing errors: one line that names the file or option and the fix."""

from __future__ import annotations


class CkptprofError(Exception):
    """A mistake the user can fix (bad path, bad option, corrupt file).

    The CLI prints ``str(error)`` as a single line and exits non-zero, with no
    traceback. Library callers can catch it like any other exception.
    """

    exit_code = 2


class VerifyError(CkptprofError):
    """A checkpoint file does not match its manifest (size or hash)."""

    exit_code = 3


class StorageError(CkptprofError):
    """A storage operation failed for a reason outside ckptprof's control."""

    exit_code = 4


class UnreachableError(StorageError):
    """The storage stopped answering (refused, timed out): every later run would wait
    the same way, so a sweep stops at once instead of recording each as a failure."""


class Terminated(BaseException):
    """SIGTERM (a scheduler ending the job, ``kill``): raised in the main thread, like
    ``KeyboardInterrupt`` for SIGINT, so that every ``finally`` removes its temporary
    files and a sweep keeps the runs it finished before the command exits 143."""

    exit_code = 143
