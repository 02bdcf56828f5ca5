"""A DCP ``StorageReader`` traced: its calls as the restore phases of one operation.

``read_metadata`` is ``list``; the planning calls are ``reshard``; inside ``read_data``
each item from ``resolve_tensor`` to ``commit_tensor`` (the copy into the state dict's
tensor) is ``reshard``, the reads of readers with a ``fs`` that has ``create_stream``
(``FileSystemReader``, the fsspec reader) are ``fetch``, and the rest (``torch.load`` of
each item's bytes) is ``deserialize``; where a reader's reads cannot be seen they stay
inside ``deserialize``, marked fused. The reader's ``fs`` is swapped only for one
``read_data`` and put back; every call is delegated and returns what it returns.

The DCP integration wraps a real job's reader with it, and the synthetic ``framework``
strategy wraps DCP's ``FileSystemReader`` with it, so both report the same split.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import time
from typing import Any

from torch.distributed.checkpoint import StorageReader

from ckptprof.phases import Attr, Phase
from ckptprof.tracing.recorder import phase_or_nothing
from ckptprof.tracing.summary import uncovered

log = logging.getLogger("ckptprof")


class _OpenOperation:
    """The ``call`` of a reader recording into an operation its caller opened and ends."""

    def __init__(self, op) -> None:
        self.op = op

    def begin(self, attributes: dict) -> None:
        pass

    def end(self, error: BaseException | None = None) -> None:
        pass

    def warn_once(self, key: str, exc: BaseException) -> None:
        log.warning("ckptprof: %s: %s", key, exc)


class _TimedStream:
    """A file stream whose reads are ``fetch`` intervals with their bytes."""

    def __init__(self, stream, record) -> None:
        self._stream, self._record = stream, record

    def read(self, size=-1):
        start = time.time_ns()
        data = self._stream.read(size)
        self._record(start, time.time_ns(), len(data))
        return data

    def readinto(self, buffer):
        start = time.time_ns()
        n = self._stream.readinto(buffer)
        self._record(start, time.time_ns(), n or 0)
        return n

    def __getattr__(self, name: str) -> Any:  # seek, tell, seekable, readable, close, …
        return getattr(self._stream, name)


class _TimedFileSystem:
    """A reader's ``fs`` for one ``read_data``: the same, with timed streams."""

    def __init__(self, fs, record) -> None:
        self._fs, self._record = fs, record

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        with self._fs.create_stream(path, mode) as stream:
            yield _TimedStream(stream, self._record) if "r" in mode else stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)


class _TimedPlanner:
    """The load planner of one ``read_data``: ``resolve_tensor`` → ``commit_tensor`` (the
    copy into the target tensor) and ``load_bytes`` are ``reshard``."""

    def __init__(self, planner, record) -> None:
        self._planner, self._record = planner, record
        self._open: dict[int, int] = {}  # thread -> start of its item's copy

    def resolve_tensor(self, read_item):
        self._open[threading.get_ident()] = time.time_ns()
        return self._planner.resolve_tensor(read_item)

    def commit_tensor(self, read_item, tensor):
        try:
            return self._planner.commit_tensor(read_item, tensor)
        finally:
            start = self._open.pop(threading.get_ident(), None)
            if start is not None:
                self._record(start, time.time_ns())

    def load_bytes(self, read_item, value):
        start = time.time_ns()
        try:
            return self._planner.load_bytes(read_item, value)
        finally:
            self._record(start, time.time_ns())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)


class TracedReader(StorageReader):
    """``reader``, its calls recorded as phases of the operation ``call`` gives (``call``:
    ``op``, ``begin(attributes)``, ``end(error)``, ``warn_once(key, exc)``)."""

    def __init__(self, reader: StorageReader, call, count_bytes: bool = True) -> None:
        self.reader = reader
        self._call = call
        self._count_bytes = count_bytes
        mirror_signatures(self, reader, ("read_metadata", "set_up_storage_reader"))

    def __reduce__(self):
        # Pickled (a process-based executor, a copy sent elsewhere), the wrapper is the
        # bare reader: its session (locks, threads) stays here, and the copy is untraced.
        return bare_storage, (self.reader,)

    @classmethod
    def into(cls, reader: StorageReader, op, count_bytes: bool = True) -> TracedReader:
        """``reader`` recorded into an operation already open (a synthetic restore);
        ``count_bytes=False`` where the fetch phase counted the files' bytes already (they
        were warmed into the page cache first: the reader's reads are its time only)."""
        return cls(reader, _OpenOperation(op), count_bytes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["reader"], name)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False  # DCP never picks a wrapper from a checkpoint id: it is handed one

    def reset(self, checkpoint_id=None) -> None:
        self._call.begin(storage_attributes(self.reader, checkpoint_id))
        return self.reader.reset(checkpoint_id)

    def read_metadata(self, *args, **kwargs):
        self._call.begin(storage_attributes(self.reader, None))
        with phase_or_nothing(self._call.op, Phase.LIST):
            metadata = self.reader.read_metadata(*args, **kwargs)
        self._verify(metadata)
        return metadata

    def _verify(self, metadata) -> None:
        """``verify``: a local folder's data files against the metadata just read (sizes,
        no extra read); a problem is a warning on the span — DCP's own error follows."""
        import os

        op, folder = self._call.op, getattr(self.reader, "path", None)
        if op is None or folder is None or not os.path.isdir(str(folder)):
            return
        try:
            from ckptprof.integrity import check_dcp

            with op.phase(Phase.VERIFY, **{Attr.VERIFY_METHOD: "dcp metadata"}) as stats:
                found = check_dcp(str(folder), getattr(metadata, "storage_data", None) or {})
                if found.problem is not None:
                    stats.attributes[Attr.VERIFY_PROBLEM] = found.problem
                    log.warning("ckptprof: dcp %s: %s", folder, found.problem)
        except Exception as exc:  # noqa: BLE001
            self._call.warn_once("dcp.verify", exc)

    def set_up_storage_reader(self, metadata, is_coordinator: bool, *args, **kwargs) -> None:
        with phase_or_nothing(self._call.op, Phase.RESHARD):
            return self.reader.set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)

    def prepare_local_plan(self, plan):
        with phase_or_nothing(self._call.op, Phase.RESHARD):
            return self.reader.prepare_local_plan(plan)

    def prepare_global_plan(self, plans):
        with phase_or_nothing(self._call.op, Phase.RESHARD):
            return self.reader.prepare_global_plan(plans)

    def read_data(self, plan, planner):
        op = self._call.op
        if op is None:
            return self.reader.read_data(plan, planner)
        fetched: list[tuple[int, int]] = []
        copies: list[tuple[int, int]] = []
        lock = threading.Lock()
        nbytes = [0]

        def fetch(start: int, end: int, n: int) -> None:
            with lock:
                fetched.append((start, end))
                nbytes[0] += n

        def copy(start: int, end: int) -> None:
            with lock:
                copies.append((start, end))

        fs = getattr(self.reader, "fs", None)
        swapped = fs is not None and hasattr(fs, "create_stream")
        start, error = time.time_ns(), None
        try:
            if swapped:
                self.reader.fs = _TimedFileSystem(fs, fetch)
            return self.reader.read_data(plan, _TimedPlanner(planner, copy))
        except BaseException as exc:
            error = exc
            raise
        finally:
            if swapped:
                self.reader.fs = fs  # the user's reader as it was
            self._record_read(op, start, fetched, copies, nbytes[0], swapped)
            self._call.end(error)

    def _record_read(self, op, start, fetched, copies, nbytes, timed_reads) -> None:
        try:
            end = time.time_ns()
            for interval in fetched:
                op.add_interval(Phase.FETCH, *interval)
            for interval in copies:
                op.add_interval(Phase.RESHARD, *interval)
            for gap in uncovered(start, end, sorted(fetched + copies)):
                op.add_interval(Phase.DESERIALIZE, *gap)
            if timed_reads:
                if self._count_bytes:
                    op.add_bytes(Phase.FETCH, nbytes)
            else:
                op.set_phase_attributes(
                    Phase.DESERIALIZE, **{Attr.FUSED: "fetch+deserialize (the reader's own)"}
                )
        except Exception as exc:  # noqa: BLE001 - a guest's bookkeeping never fails a load
            self._call.warn_once("dcp.read_data", exc)


def mirror_signatures(wrapper, inner, names) -> None:
    """DCP passes ``rank=`` / ``use_collectives=`` to ``read_metadata``,
    ``set_up_storage_reader`` and ``set_up_storage_writer`` only where
    ``inspect.signature(method).parameters`` has ``kwargs``. The wrapper's methods take
    ``**kwargs``; where ``inner``'s method has no ``kwargs`` (an older storage), the
    wrapper's is shadowed on the instance by one showing ``inner``'s signature, so DCP
    calls it exactly as it would call ``inner`` (and never forwards what ``inner`` would
    not have been given)."""
    for name in names:
        try:
            signature = inspect.signature(getattr(inner, name))
        except Exception:  # noqa: BLE001 - no signature to read: DCP's own check applies
            continue
        if "kwargs" not in signature.parameters:
            setattr(wrapper, name, _narrowed(getattr(wrapper, name), signature))


def _narrowed(traced, signature):
    def method(*args, **kwargs):
        return traced(*args, **kwargs)

    method.__name__ = method.__qualname__ = traced.__name__
    method.__signature__ = signature
    return method


def bare_storage(storage):
    """What a pickled traced reader or writer is unpickled as: the storage it wrapped."""
    return storage


def storage_attributes(storage, checkpoint_id) -> dict:
    """What a span says of the storage a DCP reader or writer reads or writes."""
    path = checkpoint_id if checkpoint_id is not None else getattr(storage, "path", None)
    attrs = {Attr.DCP_STORAGE: type(storage).__name__}
    if path is not None:
        attrs[Attr.PATH] = str(path)
    return attrs


__all__ = ["TracedReader", "bare_storage", "mirror_signatures", "storage_attributes"]
