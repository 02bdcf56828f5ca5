"""Lightning's ``AsyncCheckpointIO``, traced: each write its worker thread makes through the
base IO is its own background ``ckpt.save`` (``ckpt.save.background``) linked to the save
that queued it; and the writes are waited for where ckptprof needs them on disk.

Lightning waits for its queued writes only at its own teardown, which runs after the
callbacks' ``on_exception`` (and, on a tuner's exit, after their ``teardown``): ckptprof
waits for them first, up to :data:`WRITES_WAIT_S`, before its patches go and its spans
close — the job would wait for them there anyway. An emergency save waits for its own
write before moving it into place: a queued write is not a checkpoint yet.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections import Counter, defaultdict, deque

from ckptprof import activity
from ckptprof.errors import CkptprofError
from ckptprof.integrations.patching import argument
from ckptprof.integrations.session import timed
from ckptprof.phases import Attr, Phase

log = logging.getLogger("ckptprof")

#: how long ckptprof waits at its close for background writes still queued or running
WRITES_WAIT_S = 120.0


class AsyncWrites:
    """The background writes of one traced trainer's ``AsyncCheckpointIO``."""

    def __init__(self, instrumentor) -> None:
        self.owner = instrumentor
        # path -> the span contexts of its saves not yet written, in order (one path,
        # e.g. last.ckpt, is queued again before a busy writer reaches it)
        self._queued: dict[str, deque] = defaultdict(deque)
        self._pending: Counter[str] = Counter()  # path -> its writes queued or running
        self._running: set = set()  # background operations begun, not ended
        self._changed = threading.Condition()
        self.errors: dict[str, BaseException] = {}  # path -> its last write's error
        self._abandoned: set[str] = set()  # written for a move that was given up

    def written(self, path: str, timeout_s: float) -> None:
        """Return once the writes queued for ``path`` have ended well, within
        ``timeout_s``; else raise (the write's own error, or one saying it goes on): a
        file still being written is never moved into place."""
        if not self.wait(path, timeout_s):
            with self._changed:
                self._abandoned.add(path)  # removed once written: it will not be moved
            raise CkptprofError(
                f"{path}: its background write had not ended {timeout_s:.1f} s later "
                "(removed once it ends)"
            )
        error = self.errors.pop(path, None)
        if error is not None:
            raise error

    def layer(self) -> bool:
        """With an ``AsyncCheckpointIO``: wrap its base IO, which writes on a worker thread
        (once; the strategy's ``checkpoint_io`` makes the base IO when first used, as the
        write that follows would); True while saves are asynchronous."""
        from lightning.pytorch.plugins.io import AsyncCheckpointIO

        strategy = self.owner.trainer.strategy
        io = vars(strategy).get("_checkpoint_io")
        if not isinstance(io, AsyncCheckpointIO) or not strategy.is_global_zero:
            return False
        base = strategy.checkpoint_io.checkpoint_io
        self.owner.patcher.wrap(
            base, "save_checkpoint", self._traced_write, phase="the background write"
        )
        return True

    def queued(self, path: str, span_context) -> None:
        """The save of ``span_context`` queued a write of ``path``."""
        with self._changed:
            self._queued[path].append(span_context)
            self._pending[path] += 1
            self.errors.pop(path, None)  # an earlier write's, not this one's

    def _traced_write(self, original):
        def save_checkpoint(*args, **kwargs):
            path = str(argument(args, kwargs, "path", 1))
            with self._changed:  # the writer thread takes the saves in the order queued
                waiting = self._queued.get(path)
                counted = bool(waiting)
                queued_by = waiting.popleft() if waiting else None
            session = self.owner.session
            op = session.begin_background_save({Attr.FORMAT: "torch", Attr.PATH: path}, queued_by)
            self._track(op, add=True)
            try:
                with activity.growing(path):  # the write's bytes reaching the file: progress
                    result = timed(op, Phase.WRITE, original, *args, **kwargs)
            except BaseException as exc:
                self.errors[path] = exc
                if op is not None:
                    op.finish(exc)
                raise
            else:
                if op is not None:
                    if os.path.isfile(path):
                        op.add_bytes(Phase.WRITE, os.path.getsize(path))
                    self.owner.files.commit_file(path, op)
                    op.finish()
            finally:
                self._track(op, add=False, path=path if counted else None)
            return result

        return save_checkpoint

    def _track(self, op, add: bool, path: str | None = None) -> None:
        with self._changed:
            if op is not None:
                (self._running.add if add else self._running.discard)(op)
            if path is not None and self._pending[path] > 0:
                self._pending[path] -= 1
                if not self._pending[path]:
                    del self._pending[path]
                    if path in self._abandoned:
                        self._abandoned.discard(path)
                        _remove(path)
            self._changed.notify_all()

    def wait(self, path: str | None, timeout_s: float) -> bool:
        """Until no write of ``path`` (None: of any path) is queued or running, at most
        ``timeout_s``; whether none is."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._pending[path] if path is not None else self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def drain(self, wait_s: float = WRITES_WAIT_S) -> None:
        """Before ckptprof closes: the writes still queued or running end first (up to
        ``wait_s``, saying so); one still running then ends now, marked as not seen to
        complete."""
        with self._changed:
            count = sum(self._pending.values())
        if not count:
            return
        log.info(
            "ckptprof: waiting up to %.0f s for %d background checkpoint write(s) to end "
            "before its traces close (Lightning waits for them too)", wait_s, count,
        )  # fmt: skip
        if self.wait(None, wait_s):
            return
        gone = CkptprofError(
            f"ckptprof closed {wait_s:.0f} s into waiting for this background write: its "
            "end and any error are not recorded"
        )
        with self._changed:
            running, self._running = list(self._running), set()
        log.warning("ckptprof: %s", gone)
        for op in running:
            op.finish(gone)


def _remove(path: str) -> None:
    """A file (or a sharded save's folder) ckptprof had written for nothing."""
    try:
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    except OSError as exc:
        log.warning("ckptprof: could not remove %s: %s", path, exc)
