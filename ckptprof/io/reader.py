"""A seekable, read-only file object over bytes that are somewhere else.

The codecs' own loaders (``zipfile``, ``torch.load``'s archive reader) take a file
object; ckptprof hands them bytes in memory, bytes fetched on demand, or a range of an
open file. Each of those is :class:`RangeReader` with its own :meth:`~RangeReader.read_at`.
"""

from __future__ import annotations

import io


class RangeReader(io.RawIOBase):
    """``size`` bytes read through :meth:`read_at`; seek and tell are the base's."""

    def __init__(self, size: int) -> None:
        self._size, self._pos = size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        bases = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}
        if whence not in bases:
            raise ValueError(f"invalid whence ({whence})")
        if bases[whence] + pos < 0:
            raise ValueError(f"negative seek position {bases[whence] + pos}")
        self._pos = bases[whence] + pos
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buf) -> int:
        view = memoryview(buf).cast("B")  # bytes, whatever the buffer's items
        n = max(0, min(len(view), self._size - self._pos))
        got = self.read_at(self._pos, view[:n]) if n else 0
        self._pos += got
        return got

    def read_at(self, offset: int, into: memoryview) -> int:
        """Fill ``into`` with the bytes at ``offset``; how many it filled."""
        raise NotImplementedError
