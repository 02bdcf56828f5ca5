"""``dcp.async_save`` (thread-based) traced as every asynchronous save is recorded: two
linked operations, as the Lightning callback and DeepSpeed's decoupled writer record
theirs and ``ckptprof synth save --strategy async`` records DCP's.

* the blocking ``ckpt.save`` (``ckpt.strategy=async``): what the training waits for, from
  the call until ``async_save`` returns (or raises). Its one phase, ``stage``, is that
  call: the stager's copy of the state into host memory (``ckpt.stage.stager`` names the
  stager: DCP's ``DefaultStager``, the writer's own, or the user's), with the bytes of
  the state dict's tensors (a DTensor's local shard; none where a ``Stateful`` holds
  them), and the hand-over to DCP's save thread;
* the background ``ckpt.save`` (``ckpt.save.background``, linked to the blocking one):
  the save in DCP's thread, begun by its first storage call: ``serialize`` (planning),
  ``write`` and ``commit``, recorded by the traced writer. It ends when the upload future
  completes, with the future's error if the save failed, and never before the blocking
  one has ended (a save done before ``async_save`` returned ends as it returns).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time

from ckptprof import activity
from ckptprof.errors import CkptprofError
from ckptprof.phases import Attr, Phase
from ckptprof.tracing.dcp_reader import storage_attributes
from ckptprof.tracing.recorder import phase_or_nothing

try:
    from torch.distributed.checkpoint.staging import AsyncStager
except ImportError:  # a torch without async staging: no writer is one
    AsyncStager = None

ASYNC = "async"  # ckpt.strategy of both halves, as synth save's async strategy
STAGER = Attr.phase_key(Phase.STAGE, "stager")  # who staged the state
_OPEN: set[BackgroundSave] = set()  # background saves not ended yet
_OPEN_LOCK = threading.Lock()


class BackgroundSave:
    """The traced writer's operation for the background half of one ``async_save``.

    The writer's storage calls in DCP's thread ``begin`` it (the first one does) and ask to
    ``end`` it (``finish``, a non-coordinator's ``write_data``): that waits for
    :meth:`complete`, which the upload future's completion calls."""

    def __init__(self, session, queued_by, attributes: dict) -> None:
        self.session, self.queued_by = session, queued_by
        self.attributes = {**attributes, Attr.STRATEGY: ASYNC}
        self.op = None
        self.future = None  # the upload future, once async_save returned it
        self.ended = threading.Event()  # set once complete() has recorded the end
        self._closed = False
        self._growing = contextlib.ExitStack()
        self._lock = threading.Lock()
        with _OPEN_LOCK:
            _OPEN.add(self)

    def begin(self, attributes: dict) -> None:
        with self._lock:
            if self.op is None and not self._closed:
                self.op = self._begin({**self.attributes, **attributes})

    def _begin(self, attributes: dict):
        op = self.session.begin_background_save(attributes, self.queued_by)
        if op is not None and attributes.get(Attr.PATH):  # DCP's bytes reaching it: progress
            self._growing.enter_context(activity.growing(str(attributes[Attr.PATH])))
        return op

    def end(self, error: BaseException | None = None) -> None:
        """The save's last storage call: the operation ends with the upload future."""

    def warn_once(self, key: str, exc: BaseException) -> None:
        self.session.warn_once(key, exc)

    def complete(self, error: BaseException | None, failed_unseen: bool = True) -> None:
        """End the background operation (once), with ``error``. A save that failed before
        its first storage call (``failed_unseen``) gets one, to carry its error."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                op, self.op = self.op, None
                if op is None and error is not None and failed_unseen:
                    op = self._begin(self.attributes)
                self._growing.close()
                if op is not None:
                    op.finish(error)
            finally:
                with _OPEN_LOCK:
                    _OPEN.discard(self)
                self.ended.set()


def end_background_saves(session, wait_s: float = 2.0) -> None:
    """Before ``session`` closes (``uninstrument()``), its background saves end, so that
    none is left open or ends after its spans could be written: one whose upload future
    has completed is given up to ``wait_s`` in all (its callback runs just after
    ``result()`` returns); one still saving ends now, marked as not seen to complete."""
    with _OPEN_LOCK:
        pending = [save for save in _OPEN if save.session is session]
    deadline = time.monotonic() + wait_s
    gone = CkptprofError(
        "ckptprof was removed (uninstrument) before this async save completed: its end "
        "and any error are not recorded"
    )
    for save in pending:
        try:
            if save.future is not None and save.future.done():
                save.ended.wait(max(0.0, deadline - time.monotonic()))
            save.complete(gone)  # nothing when it has ended
        except Exception as exc:  # noqa: BLE001 - a guest's bookkeeping never fails a call
            session.warn_once("dcp.uninstrument", exc)


def traced_async_save(original, traced, state_dict, args, kwargs):
    """``original`` (``dcp.async_save``) with ``traced`` as its storage writer, recorded as
    the blocking and the background save (the module docstring). DCP's error is raised
    unchanged, its return value returned as is; nothing stays open on any path."""
    blocking = _begin_blocking(traced, kwargs)
    try:
        with phase_or_nothing(blocking, Phase.STAGE):
            result = original(state_dict, *args, **{**kwargs, "storage_writer": traced})
    except BaseException as exc:  # nothing handed to the background: nothing left open
        _end_blocking(traced, blocking, exc, state_dict)
        _complete(traced, exc, failed_unseen=False)
        raise
    _end_blocking(traced, blocking, None, state_dict)
    _complete_when_done(traced, result)  # after the blocking part ended: ends after it
    return result


def _begin_blocking(traced, kwargs):
    """The blocking ``ckpt.save``, and ``traced``'s background operation linked to it.
    Where ckptprof fails here (a warning), the writer's own single operation is left."""
    session, blocking = traced._session, None
    try:
        attrs = {Attr.FRAMEWORK: "dcp", Attr.FORMAT: "dcp"}
        attrs.update(storage_attributes(traced.writer, kwargs.get("checkpoint_id")))
        blocking = session.begin_save(
            {**attrs, Attr.STRATEGY: ASYNC, Attr.WORLD_SIZE: _world_size(kwargs)}
        )
        context = blocking.span_context if blocking is not None else None
        traced._call = BackgroundSave(session, context, attrs)
        if blocking is not None:
            blocking.set_phase_attributes(Phase.STAGE, **{STAGER: _stager(traced, kwargs)})
        return blocking
    except Exception as exc:  # noqa: BLE001 - a guest's bookkeeping never fails a call
        session.warn_once("dcp.async_save", exc)
        return blocking  # begun: ended as the call returns


def _end_blocking(traced, blocking, error: BaseException | None, state_dict) -> None:
    if blocking is None:
        return
    session = traced._session
    try:
        staged = _tensor_bytes(state_dict) if error is None else None
        if staged is not None:
            blocking.add_bytes(Phase.STAGE, staged)
    except Exception as exc:  # noqa: BLE001
        session.warn_once("dcp.stage", exc)
    session.end_save(error, blocking)


def _complete(traced, error: BaseException | None, failed_unseen: bool = True) -> None:
    call = traced._call
    try:
        if isinstance(call, BackgroundSave):
            call.complete(error, failed_unseen)
    except Exception as exc:  # noqa: BLE001
        call.warn_once("dcp.async_save", exc)


def _complete_when_done(traced, result) -> None:
    """End the background save when ``async_save``'s upload future completes (with its
    error; a cancelled one with ``CancelledError``)."""
    future = getattr(result, "upload_completion", result)
    if isinstance(traced._call, BackgroundSave):
        traced._call.future = future

    def done(future) -> None:
        try:
            if future.cancelled():
                error = concurrent.futures.CancelledError("the upload future was cancelled")
            else:
                error = future.exception()
        except BaseException as exc:  # noqa: BLE001
            error = exc
        _complete(traced, error)

    try:
        future.add_done_callback(done)
    except Exception as exc:  # noqa: BLE001 - no future: DCP's own return value, as is
        _complete(traced, None)
        traced._call.warn_once("dcp.async_save", exc)


def _world_size(kwargs) -> int:
    """The ranks saving together: DCP's (one without a process group or with ``no_dist``)."""
    import torch.distributed as dist

    if kwargs.get("no_dist") or not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(kwargs.get("process_group"))


def _stager(traced, kwargs) -> str:
    """The stager DCP picks: the user's ``async_stager``, else the writer when it is one
    (the traced wrapper stands for it), else DCP's own ``DefaultStager``."""
    stager = kwargs.get("async_stager")
    if stager is None and AsyncStager is not None and isinstance(traced, AsyncStager):
        stager = traced.writer
    return type(stager).__name__ if stager is not None else "DefaultStager"


def _tensor_bytes(tree) -> int | None:
    """The bytes of the tensors in a state dict (a DTensor's: this rank's shard), or None
    where a ``Stateful`` holds some (DCP asks it for its state; ckptprof does not)."""
    import torch

    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        sizes = [_tensor_bytes(v) for v in tree]
        return None if None in sizes else sum(sizes)
    if isinstance(tree, torch.Tensor):
        local = tree.to_local() if hasattr(tree, "to_local") else tree
        return local.numel() * local.element_size()
    return None if hasattr(tree, "state_dict") else 0


__all__ = ["BackgroundSave", "end_background_saves", "traced_async_save"]
