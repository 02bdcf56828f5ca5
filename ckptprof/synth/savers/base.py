"""What every ``synth save`` writer works with, and the rule each one states about what
it can write (its layouts, whether it writes to an object store), read by the one check
``synth save`` runs before any work."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from ckptprof.errors import CkptprofError, StorageError
from ckptprof.storage.base import Storage
from ckptprof.synth.plan import CheckpointPlan

if TYPE_CHECKING:
    from ckptprof.synth.layouts.base import Layout
    from ckptprof.synth.plan import FilePlan
    from ckptprof.tracing.recorder import Operation
    from ckptprof.tracing.tracer import CheckpointTracer


@dataclass(frozen=True, kw_only=True)
class SaveContext:
    """What one timed save works with."""

    storage: Storage
    plan: CheckpointPlan
    tensors: dict  # {Piece: tensor}: the state being saved
    op: Operation  # the save's
    fsync: bool
    concurrency: int
    part_size: int
    tracer: CheckpointTracer  # for the background half of an async save
    #: what a job keeps from one save to the next (an async save's staging buffers)
    kept: dict = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return Path(self.storage.uri)


@dataclass
class Written:
    """What a save wrote: bytes, and for an async save its background half."""

    nbytes: int
    background_s: float | None = None


class Saver(ABC):
    """One way to write a save, timed phase by phase on the save's operation."""

    name: ClassVar[str]
    #: the layouts it writes (None: every layout but those in ``refused_layouts``)
    layouts: ClassVar[frozenset[str] | None] = None
    #: layout → why not, and what to use instead (one line)
    refused_layouts: ClassVar[dict[str, str]] = {}
    #: whether it writes to an object store (a multipart upload per file)
    object_store: ClassVar[bool] = False

    def check(self, layout: str, object_store: bool) -> None:
        """Refuse a layout or storage this writer cannot do (one line, with the fix)."""
        if layout in self.refused_layouts:
            raise CkptprofError(f"--strategy {self.name}: {self.refused_layouts[layout]}")
        if self.layouts is not None and layout not in self.layouts:
            raise CkptprofError(self.layout_refusal(layout))
        if object_store and not self.object_store:
            raise CkptprofError(
                f"--strategy {self.name} writes to a local or mounted path; on S3 use "
                "--strategy parallel (a multipart upload per file)."
            )

    def layout_refusal(self, layout: str) -> str:
        return f"--strategy {self.name} does not write --layout {layout}."

    @abstractmethod
    def save(self, ctx: SaveContext) -> Written:
        """Write ``ctx.tensors`` to ``ctx.storage``, each phase timed on ``ctx.op``."""


def write_with_framework(
    layout: Layout, plan: CheckpointPlan, file: FilePlan, dest: Path, tensors: dict
) -> None:
    """Write ``file`` from real tensors through its codec's own writer (``torch.save``,
    safetensors' ``save_file``), as a job saves."""
    from ckptprof.synth.codecs import get_codec

    if not file.pieces:
        dest.write_bytes(layout.small_bytes(plan, file, {}))
        return
    get_codec(layout.codec(file)).save(dest, layout.archive(plan, file, tensors))


def serialized(layout: Layout, plan: CheckpointPlan, file: FilePlan, tensors: dict) -> list:
    """``file``'s bytes as its framework lays them out, as segments in order (the small
    parts, and views of the tensors' memory for their bytes: nothing copied), for
    ckptprof's own parallel writer."""
    from ckptprof.synth.codecs import get_codec

    if not file.pieces:
        return [layout.small_bytes(plan, file, {})]
    own = [tensors[p] for p in file.pieces]
    return get_codec(layout.codec(file)).serialize(layout.archive(plan, file, tensors), own)


def streamed(
    layout: Layout, plan: CheckpointPlan, file: FilePlan, tensors: dict
) -> tuple[int, Callable[[Callable], None]] | None:
    """``file``'s exact size and ``make(emit)``, which hands its segments to ``emit`` as
    they are made, where its codec can tell the size first: a large file is then written
    while the rest of it is still being serialized. None: :func:`serialized` it whole."""
    from ckptprof.synth.codecs import get_codec

    if not file.pieces:
        return None
    codec = get_codec(layout.codec(file))
    obj = layout.archive(plan, file, tensors)
    size = codec.serialized_size(obj)
    if size is None:
        return None
    own = [tensors[p] for p in file.pieces]
    return size, lambda emit: codec.serialize_into(obj, own, emit)


class named:
    """A failed write is one line naming the file and the fix (torch.save reports ENOSPC
    as a RuntimeError, DCP wraps its writers' errors)."""

    def __init__(self, where) -> None:
        self.where = where

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if not _write_failure(exc):
            return False
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        where = getattr(exc, "filename", None) or self.where  # the file, where it is known
        raise StorageError(
            f"{where}: could not be written ({first[:200]}); check free space and "
            "permissions there."
        ) from None


def _write_failure(exc: BaseException | None) -> bool:
    """A writer's I/O failure (not ours, not a bug in the caller's code)."""
    if exc is None or isinstance(exc, CkptprofError):
        return False
    return isinstance(exc, (OSError, RuntimeError)) or type(exc).__name__ == "CheckpointException"


def size_of(path: Path) -> int:
    return path.stat().st_size


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
