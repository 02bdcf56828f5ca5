"""torch.distributed.checkpoint (DCP), traced: wrappers for any ``StorageReader`` /
``StorageWriter``, and a one-line :func:`instrument` for code that calls ``dcp.load`` /
``dcp.save`` directly.

DCP's loads are the largest restores (FSDP, torchtitan, Lightning's and accelerate's
sharded paths) and, untraced, one fused interval. Wrapped, each rank's load is a
``ckpt.restore`` with:

* ``list``: ``read_metadata`` (the ``.metadata`` file);
* ``reshard``: the planning (which saved items fill which of this rank's tensors, with a
  world-size change) and, inside ``read_data``, each item from ``resolve_tensor`` to
  ``commit_tensor`` (the copy into the state dict's tensor);
* ``fetch``: the reads, per file, for readers that read through a ``fs`` with
  ``create_stream`` (``FileSystemReader`` and the fsspec reader); other readers' reads
  stay inside ``deserialize`` (``ckpt.fused`` says so);
* ``deserialize``: the rest of ``read_data`` (``torch.load`` of each item's bytes).

A save is a ``ckpt.save``: ``serialize`` (planning), ``write`` (``write_data``: DCP
serializes while it writes, ``ckpt.fused``) and ``commit`` (``finish``: the metadata).
An ``async_save`` (thread-based) is two linked ``ckpt.save`` operations, as every
asynchronous save is recorded: what blocks the training (``stage``) and the background
save (``ckpt.save.background``: those three phases), see ``integrations/dcp_async.py``.
The wrappers delegate every call to the wrapped object and return what it returns; the
reader's ``fs`` is swapped only for the duration of one ``read_data`` and put back.

    import torch.distributed.checkpoint as dcp
    from ckptprof.integrations.dcp import instrument
    instrument()                      # dcp.load / dcp.save / dcp.async_save are traced
    dcp.load(state_dict, checkpoint_id="ckpt/step-100")
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from torch.distributed.checkpoint import StorageReader, StorageWriter

try:
    from torch.distributed.checkpoint.staging import AsyncStager
except ImportError:  # a torch without async staging: no writer is one
    AsyncStager = None

from ckptprof.integrations.dcp_async import end_background_saves, traced_async_save
from ckptprof.integrations.patching import Patcher
from ckptprof.integrations.session import TracingSession
from ckptprof.phases import Attr, Phase
from ckptprof.tracing.dcp_reader import (
    TracedReader,
    bare_storage,
    mirror_signatures,
    storage_attributes,
)
from ckptprof.tracing.recorder import Operation, phase_or_nothing

FRAMEWORK = "dcp"
log = logging.getLogger("ckptprof")


class _Call:
    """One ``dcp.load`` / ``dcp.save``'s operation: begun by the first storage call and
    ended by the last; or, with ``join`` (a framework's own restore or save calling DCP,
    :func:`routed`), the framework's open operation, which its adapter ends."""

    def __init__(self, session: TracingSession, kind: str, join: bool = False) -> None:
        self.session, self.kind, self.join = session, kind, join
        self.op: Operation | None = None
        self.owned = False  # begun here: ended here too
        #: traced by instrument(): a failure ends with the error DCP raises to its caller
        #: (a CheckpointException), not with the storage call's own that DCP wraps
        self.caller_ends_failures = False

    def begin(self, attributes: dict) -> None:
        if self.op is not None and not self.op.finished:
            return
        session = self.session
        framework_op = session.restore_op if self.kind == "restore" else session.save_op
        if self.join and framework_op is not None and not framework_op.finished:
            framework_op.set_attributes({Attr.FORMAT: "dcp", Attr.DCP: True})
            self.op, self.owned = framework_op, False
            return
        begin = session.begin_restore if self.kind == "restore" else session.begin_save
        self.op = begin({Attr.FRAMEWORK: FRAMEWORK, Attr.FORMAT: "dcp", **attributes})
        self.owned = True

    def warn_once(self, key: str, exc: BaseException) -> None:
        self.session.warn_once(key, exc)

    def end(self, error: BaseException | None = None) -> None:
        if not self.owned or (error is not None and self.caller_ends_failures):
            return
        self.owned = False
        if self.kind == "restore":
            if self.session.restore_op is self.op:  # else a later restore has ended it
                self.session.end_restore(error)
        elif self.op is not None:  # this call's save (none if it failed to begin)
            self.session.end_save(error, self.op)
        self.op = None


class TracedStorageReader(TracedReader):
    """``reader``, traced as a ``ckpt.restore`` per load (see the module docstring)."""

    def __init__(
        self, reader: StorageReader, session: TracingSession | None = None, join: bool = False
    ) -> None:
        session = session or _default().session
        super().__init__(reader, _Call(session, "restore", join))
        self._session = session


class TracedStorageWriter(StorageWriter):
    """``writer``, traced as a ``ckpt.save`` per save (see the module docstring).

    Where ``writer`` is an ``AsyncStager`` (``FileSystemWriter`` is), the wrapper is one
    too (``stager=None``; ``stager=False``: never), its staging ``writer``'s own:
    ``dcp.async_save`` picks its stager by ``isinstance(storage_writer, AsyncStager)``."""

    def __new__(cls, writer: StorageWriter, *args, stager: bool | None = None, **kwargs):
        if stager is None:
            stager = AsyncStager is not None and isinstance(writer, AsyncStager)
        if stager and cls is TracedStorageWriter:
            cls = _TracedStagingWriter
        return super().__new__(cls)

    def __init__(
        self,
        writer: StorageWriter,
        session: TracingSession | None = None,
        join: bool = False,
        stager: bool | None = None,
    ) -> None:
        self.writer = writer
        self._session = session or _default().session
        self._call = _Call(self._session, "save", join)
        self._coordinator = True
        mirror_signatures(self, writer, ("set_up_storage_writer",))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["writer"], name)

    def __reduce__(self):
        # Pickled (the process-based async_save executor, a copy sent elsewhere), the
        # wrapper is the bare writer: its session (locks, threads) stays here, and the
        # save the copy makes is not traced.
        return bare_storage, (self.writer,)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False  # DCP never picks a wrapper from a checkpoint id: it is handed one

    def reset(self, checkpoint_id=None) -> None:
        self._call.begin(storage_attributes(self.writer, checkpoint_id))
        return self.writer.reset(checkpoint_id)

    def storage_meta(self):
        return self.writer.storage_meta()

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        self._call.begin(storage_attributes(self.writer, None))
        self._coordinator = is_coordinator  # only the coordinator's save ends in finish()
        with phase_or_nothing(self._call.op, Phase.SERIALIZE):
            return self.writer.set_up_storage_writer(is_coordinator, *args, **kwargs)

    def prepare_local_plan(self, plan):
        with phase_or_nothing(self._call.op, Phase.SERIALIZE):
            return self.writer.prepare_local_plan(plan)

    def prepare_global_plan(self, plans):
        with phase_or_nothing(self._call.op, Phase.SERIALIZE):
            return self.writer.prepare_global_plan(plans)

    def write_data(self, plan, planner):
        op = self._call.op
        if op is None:
            return self.writer.write_data(plan, planner)
        with op.phase(Phase.WRITE, **{Attr.FUSED: "serialize+write (write_data)"}):
            future = self.writer.write_data(plan, planner)
            results = future.wait() if hasattr(future, "wait") else None
        try:
            if results:
                stored = [getattr(r, "storage_data", None) for r in _flat(results)]
                op.add_bytes(Phase.WRITE, sum(getattr(s, "length", 0) or 0 for s in stored))
                files = {getattr(s, "relative_path", None) for s in stored} - {None}
                op.set_phase_attributes(Phase.WRITE, **{Attr.FILES: len(files)})
        except Exception as exc:  # noqa: BLE001
            self._session.warn_once("dcp.write_data", exc)
        if not self._coordinator:  # this rank's part of the save is written
            self._call.end()
        return future

    def finish(self, metadata, results) -> None:
        error = None
        try:
            with phase_or_nothing(self._call.op, Phase.COMMIT):
                return self.writer.finish(metadata, results)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._call.end(error)


if AsyncStager is not None:

    class _TracedStagingWriter(TracedStorageWriter, AsyncStager):
        """A traced ``AsyncStager`` writer: staging is the writer's own, delegated (not
        traced: ``dcp.async_save`` stages before the save's storage calls begin it)."""

        @property
        def _synchronize_after_execute(self) -> bool:
            return self.writer._synchronize_after_execute

        @_synchronize_after_execute.setter
        def _synchronize_after_execute(self, value: bool) -> None:
            self.writer._synchronize_after_execute = value

        @property
        def should_synchronize_after_execute(self) -> bool:
            return self.writer.should_synchronize_after_execute

        def stage(self, state_dict, *args, **kwargs):
            return self.writer.stage(state_dict, *args, **kwargs)

        def synchronize_staging(self, *args, **kwargs):
            return self.writer.synchronize_staging(*args, **kwargs)

        def close(self, *args, **kwargs):
            return self.writer.close(*args, **kwargs)


def _flat(results) -> list:
    """A rank's WriteResults (``write_data`` gives a list; lists of lists are flattened)."""
    out = []
    for r in results:
        out += _flat(r) if isinstance(r, list) else [r]
    return out


# ---------------------------------------------------------------------- instrument()
class DCPInstrumentor:
    """``dcp.load``, ``dcp.save`` and ``dcp.async_save`` traced in this process: their
    storage readers and writers wrapped (the default storage made from ``checkpoint_id``
    first, as DCP would): one operation per call."""

    def __init__(self, **session_options) -> None:
        self.session = TracingSession(FRAMEWORK, **session_options)
        self.patcher = Patcher(FRAMEWORK, "torch", "2.5 to 2.13")

    @property
    def instrumented(self) -> bool:
        return self.patcher.attached

    def instrument(self) -> DCPInstrumentor:
        import torch.distributed.checkpoint as dcp

        if self.instrumented:
            return self
        self.session.start()
        for name, kind in _ENTRY_POINTS:
            self.patcher.wrap(
                dcp, name,
                lambda original, kind=kind, name=name: _traced_entry(
                    original, kind, self.session, asynchronous=name == "async_save"
                ),
                label=f"torch.distributed.checkpoint.{name}", phase=f"dcp.{name}",
            )  # fmt: skip
        return self

    def uninstrument(self) -> None:
        self.patcher.unwrap_all()
        end_background_saves(self.session)  # recorded before the telemetry closes
        self.session.close()


def _traced_entry(
    original, kind: str, session: TracingSession, join: bool = False, asynchronous: bool = False
):
    """``dcp.load`` / ``dcp.save`` / ``dcp.async_save`` (``asynchronous``) with its storage
    wrapped (the default one made from ``checkpoint_id`` first, as DCP would) for
    ``session``; with ``join``, into the restore or save ``session`` already has open.
    The call's own operation ends with it on every path: with DCP's error, which is
    raised unchanged. An async save is two: what blocks, and the background save that
    ends when its upload future completes (:func:`traced_async_save`)."""
    option = "storage_reader" if kind == "reader" else "storage_writer"

    def call(state_dict, *args, **kwargs):
        storage = kwargs.get(option)
        if _process_based(kwargs.get("async_checkpointer_type")):
            # A process-based async_save is DCP's own, untraced: its save runs in DCP's
            # checkpoint process, which a writer reaches only pickled (without a session).
            return original(state_dict, *args, **kwargs)
        if isinstance(storage, (TracedStorageReader, TracedStorageWriter)):
            if asynchronous:  # a writer traced by its caller: still two saves, not one
                return traced_async_save(original, storage, state_dict, args, kwargs)
            return original(state_dict, *args, **kwargs)
        try:
            if storage is None:  # DCP's default storage, never its stager (DefaultStager)
                storage = _default_storage(kwargs.get("checkpoint_id"), kind)
                traced = (TracedStorageReader if kind == "reader" else _unstaged_writer)(
                    storage, session, join
                )
            else:
                traced = (TracedStorageReader if kind == "reader" else TracedStorageWriter)(
                    storage, session, join
                )
        except Exception as exc:  # noqa: BLE001 - DCP decides; we only stand aside
            session.warn_once(f"dcp.{kind}", exc)
            return original(state_dict, *args, **kwargs)
        if asynchronous:  # a blocking and a background save (integrations/dcp_async.py)
            return traced_async_save(original, traced, state_dict, args, kwargs)
        traced._call.caller_ends_failures = True
        try:
            result = original(state_dict, *args, **{**kwargs, option: traced})
        except BaseException as exc:  # DCP's error, raised unchanged; its operation ends
            _end(traced, exc)
            raise
        _end(traced, None)  # ended by its last storage call already, as a rule
        return result

    return call


def _unstaged_writer(storage, session, join):
    return TracedStorageWriter(storage, session, join, stager=False)


def _process_based(checkpointer_type) -> bool:
    return getattr(checkpointer_type, "value", checkpointer_type) == "process"


def _end(traced, error: BaseException | None) -> None:
    try:
        traced._call.caller_ends_failures = False
        traced._call.end(error)
    except Exception as exc:  # noqa: BLE001 - a guest's bookkeeping never fails a call
        traced._call.warn_once("dcp.end", exc)


_ENTRY_POINTS = (("load", "reader"), ("save", "writer"), ("async_save", "writer"))


@contextlib.contextmanager
def routed(session: TracingSession, patcher: Patcher) -> Iterator[None]:
    """While the block runs, ``dcp.load`` and ``dcp.save`` (looked up on the module at
    call time, as Lightning's sharded strategies do) record their phases into
    ``session``'s open restore or save: a framework's DCP path gets list / fetch /
    reshard / deserialize instead of one fused interval. Put back when the block ends."""
    import torch.distributed.checkpoint as dcp

    def joined(kind: str):
        return lambda original: _traced_entry(original, kind, session, join=True)

    with contextlib.ExitStack() as stack:
        for name, kind in _ENTRY_POINTS[:2]:
            label = f"torch.distributed.checkpoint.{name}"
            stack.enter_context(
                patcher.scoped(dcp, name, joined(kind), label=label, phase=f"dcp.{name}")
            )
        yield


def _default_storage(checkpoint_id, kind: str):
    """The reader or writer DCP would make for ``checkpoint_id``, made by DCP's own
    ``_storage_setup`` (a path: FileSystem*; an fsspec URL: Fsspec*, never a local folder
    named after the URL). Any failure (no such function in this torch, no checkpoint id)
    makes the caller run DCP untouched, which then decides as it would without ckptprof."""
    from torch.distributed.checkpoint._storage_utils import _storage_setup

    if checkpoint_id is None:
        raise ValueError("no checkpoint_id and no storage: DCP's own error applies")
    return _storage_setup(None, checkpoint_id, reader=kind == "reader")


_INSTANCE: DCPInstrumentor | None = None
_LOCK = threading.Lock()


def _default() -> DCPInstrumentor:
    global _INSTANCE
    with _LOCK:
        if _INSTANCE is None:
            _INSTANCE = DCPInstrumentor()
        return _INSTANCE


def instrument(**session_options) -> DCPInstrumentor:
    """Trace every ``dcp.load`` / ``dcp.save`` / ``dcp.async_save`` called through the
    ``torch.distributed.checkpoint`` module from now on (``trace_dir=``,
    ``tracer_provider=``, ``rank=`` as for the other adapters); idempotent."""
    global _INSTANCE
    with _LOCK:
        if _INSTANCE is None or (session_options and not _INSTANCE.instrumented):
            _INSTANCE = DCPInstrumentor(**session_options)
        instance = _INSTANCE
    return instance.instrument()


def uninstrument() -> None:
    """Put ``dcp.load`` / ``save`` / ``async_save`` back and close the telemetry."""
    if _INSTANCE is not None:
        _INSTANCE.uninstrument()


__all__ = [
    "DCPInstrumentor",
    "TracedStorageReader",
    "TracedStorageWriter",
    "instrument",
    "routed",
    "uninstrument",
]
