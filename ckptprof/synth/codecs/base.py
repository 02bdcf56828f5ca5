"""A codec: one file encoding's bytes ↔ the object its framework saves.

A layout says which codec each of its files is in and what object goes into it
(:meth:`~ckptprof.synth.layouts.base.Layout.archive`); the codec turns that object into
bytes three ways (random bytes for generation, the framework's own writer, segments for
ckptprof's parallel writer) and back (fetched bytes, or a path with the framework's own
loader). Nothing here knows a layout, so a new layout reuses the codecs it is written in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckptprof.io.buffers import HostBuffer
    from ckptprof.synth.fill import RandomFiller


class Codec(ABC):
    name: str

    @abstractmethod
    def generate(self, dest: Path, obj: Any, filler: RandomFiller) -> dict:
        """Write ``obj`` (fake tensors inside) to ``dest`` with random tensor bytes, in the
        format's own layout, as the framework's writer lays it out. Returns where each of ``obj``'s
        items landed, ``{key: (offset, length)}``, for formats that index items by offset
        (empty where the file indexes itself)."""

    def save(self, dest: Path, obj: Any) -> None:
        """Write ``obj`` (real tensors) through the framework's own writer, as a job does."""
        raise NotImplementedError(f"{self.name} files have no writer of their own here")

    def serialize(self, obj: Any, tensors: list) -> list:
        """``obj``'s bytes as the framework lays them out, as segments in order: small parts
        as bytes, ``tensors``' bytes as views of their memory (nothing copied)."""
        raise NotImplementedError(f"{self.name} files are not serialized by ckptprof")

    def serialized_size(self, obj: Any) -> int | None:
        """The bytes :meth:`serialize` makes of ``obj``, known before it makes them, where
        the codec can tell (its segments can then be written as they come); None where
        it cannot."""
        return None

    def serialize_into(self, obj: Any, tensors: list, emit: Callable[[Any], object]) -> None:
        """:meth:`serialize`, each segment handed to ``emit`` as soon as it is final."""
        for segment in self.serialize(obj, tensors):
            emit(segment)

    def read(self, buffer: HostBuffer) -> Any:
        """The object from fetched bytes, its tensors views of them (with a
        :class:`~ckptprof.io.sparse.SparseFile`, only the index is read)."""
        raise NotImplementedError(f"{self.name} files are not read by ckptprof")

    def load(self, path: str) -> Any:
        """The object loaded from ``path`` by the framework's own loader."""
        raise NotImplementedError(f"{self.name} files have no loader of their own here")

    def index_hints(self, sparse) -> list[tuple[int, int]]:
        """Ranges of the file its loader reads to index it, fetched together first."""
        return []
