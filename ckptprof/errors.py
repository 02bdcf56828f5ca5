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


def unreadable(path: str, exc: Exception, verify: str | None = None) -> VerifyError:
    """A loader failed on the file's bytes: name the file and the fix. ``verify`` is the
    mode that checked those bytes before the loader ran (None: it ran before any check,
    as index parsing does); only a check weaker than ``full`` is worth re-running."""
    first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
    fix = "regenerate it (ckptprof synth generate --force) or restore a good copy"
    if verify is not None and verify != "full":
        fix = f"re-run with --verify full to check it against the manifest, or {fix}"
    return VerifyError(
        f"{path}: the {type(exc).__name__} while deserializing says the file is corrupt "
        f"({first}); {fix}."
    )


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
