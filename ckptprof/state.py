"""Where ckptprof keeps its own records about a job's checkpoints.

The framework callbacks write two kinds of records: manifests (each saved file's size,
and its xxh3 with ``verify="full"``) and interruption records. None of them go into the
user's checkpoint directories: code that lists, counts or picks files there must see
only what the framework wrote. They live in a *state location* instead:

* ``$CKPTPROF_STATE_DIR`` when set, else ``$XDG_STATE_HOME/ckptprof``, else
  ``~/.local/state/ckptprof`` — or the ``state_dir=`` a callback is given;
* a local path, a shared mount (EFS, FSx …) or an ``s3://bucket/prefix``: point it at
  shared storage so a job resumed on a new machine finds the records of the old one;
* ``"beside"`` puts them next to the checkpoints instead (the explicit opt-in).

Inside the location, the records of one checkpoint directory sit in a folder named after
that directory (a readable tail of its absolute path plus a hash), under the same names
they would have beside the checkpoints.
"""

from __future__ import annotations

import hashlib
import os
import re

from ckptprof.errors import CkptprofError
from ckptprof.storage import Storage, is_path, open_storage

STATE_DIR_ENV = "CKPTPROF_STATE_DIR"
BESIDE = "beside"


def default_state_root() -> str:
    """``$CKPTPROF_STATE_DIR``, else the XDG state home's ``ckptprof`` folder."""
    configured = os.environ.get(STATE_DIR_ENV)
    if configured:
        return configured
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(base, "ckptprof")


def directory_key(directory: str) -> str:
    """A stable folder name for the records of ``directory`` (a path or ``s3://`` URI)."""
    if not is_path(directory):
        canonical = directory.rstrip("/")
    else:
        canonical = os.path.realpath(os.path.abspath(os.path.expanduser(directory)))
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", canonical.split("://")[-1].strip("/"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:12]
    return f"{slug[-48:].strip('_.') or 'root'}-{digest}"


def unwritable_state(where: str, exc: OSError) -> CkptprofError:
    """The one-line warning for a state location ckptprof cannot write: the folder, why,
    and the fix (the training itself goes on)."""
    reason = exc.strerror or type(exc).__name__
    return CkptprofError(
        f"cannot write its records to {where} ({reason}); set {STATE_DIR_ENV} (or the "
        "callback's state_dir=) to a folder this user can write. Training goes on; verify "
        "uses the format's own integrity data until then."
    )


class StateStore:
    """The records of checkpoints, kept apart from them (see the module docstring).

    Args:
        root: the state location; default :func:`default_state_root`; ``"beside"`` for
            records next to the checkpoints.
    """

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = str(root) if root is not None else default_state_root()

    @property
    def beside(self) -> bool:
        return self.root == BESIDE

    def location(self, checkpoint_dir: str | os.PathLike) -> str:
        """The folder (or ``s3://`` prefix) holding the records about ``checkpoint_dir``."""
        checkpoint_dir = str(checkpoint_dir)
        if self.beside:
            return checkpoint_dir
        return f"{self.root.rstrip('/')}/{directory_key(checkpoint_dir)}"

    def _storage(self, checkpoint_dir: str | os.PathLike) -> Storage:
        return open_storage(self.location(checkpoint_dir))

    def read(self, checkpoint_dir: str | os.PathLike, name: str) -> bytes | None:
        """The record ``name`` about ``checkpoint_dir``, or None when there is none."""
        try:
            return self._storage(checkpoint_dir).read_bytes(name)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write(self, checkpoint_dir: str | os.PathLike, name: str, data: bytes) -> None:
        """Write ``name`` atomically (temp name, fsync, rename; one PUT on S3).

        Raises:
            CkptprofError: the state location cannot be written (naming it and the fix).
        """
        try:
            self._storage(checkpoint_dir).write_bytes(name, data)
        except OSError as exc:
            raise unwritable_state(self._where(checkpoint_dir), exc) from None

    def _where(self, checkpoint_dir: str | os.PathLike) -> str:
        """The folder to name in a message: the state location the user set."""
        return self.location(checkpoint_dir) if self.beside else self.root

    def delete(self, checkpoint_dir: str | os.PathLike, name: str) -> None:
        """Forget ``name``; nothing to forget where its folder cannot even exist."""
        try:
            self._storage(checkpoint_dir).delete(name)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise unwritable_state(self._where(checkpoint_dir), exc) from None

    def names(self, checkpoint_dir: str | os.PathLike, folder: str) -> list[str]:
        """Names of the records about ``checkpoint_dir`` inside its sub-folder ``folder``."""
        try:
            found = self._storage(checkpoint_dir).list(folder)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [info.path for info in found]

    def describe(self) -> str:
        return "beside the checkpoints" if self.beside else self.root


__all__ = ["BESIDE", "STATE_DIR_ENV", "StateStore", "default_state_root", "directory_key"]
