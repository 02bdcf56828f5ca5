"""Fast incompressible bytes for synthetic tensors (generation is not timed).

One random block is drawn once; every chunk written is that block plus a
per-chunk 64-bit stride, so no two chunks (nor any two 4 KiB pages) are equal.
Bit 14 of every 16-bit lane is cleared: the exponent's top bit for bf16/fp16
and a top exponent bit for fp32, which keeps every value finite (|x| < 2) so a
real training step on restored weights computes on numbers, not NaN/Inf. That
costs at most 1/16 of the entropy.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable

import numpy as np

CHUNK = 8 << 20
_STRIDE = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1
_FINITE_MASK = np.uint64(0xBFFFBFFFBFFFBFFF)


class RandomFiller:
    def __init__(self, seed: int = 0, chunk: int = CHUNK) -> None:
        rng = np.random.default_rng(seed)
        self._base = rng.integers(0, np.iinfo(np.uint64).max, size=chunk // 8, dtype=np.uint64)
        self._scratch = np.empty_like(self._base)
        self._counter = 0
        self.chunk = chunk
        self.on_chunk: Callable[[int], None] | None = None  # bytes written (progress)

    def next_chunk(self) -> memoryview:
        self._counter += 1
        np.add(self._base, np.uint64((_STRIDE * self._counter) & _MASK64), out=self._scratch)
        np.bitwise_and(self._scratch, _FINITE_MASK, out=self._scratch)
        return memoryview(self._scratch).cast("B")

    def fill_fd(self, fd: int, offset: int, nbytes: int, crc: bool = False) -> int:
        """pwrite ``nbytes`` of random data at ``offset``; returns their CRC-32 if asked."""
        value = 0
        done = 0
        while done < nbytes:
            chunk = self.next_chunk()[: min(self.chunk, nbytes - done)]
            written = 0
            while written < len(chunk):
                written += os.pwrite(fd, chunk[written:], offset + done + written)
            if crc:
                value = zlib.crc32(chunk, value)
            done += len(chunk)
            if self.on_chunk is not None:
                self.on_chunk(len(chunk))
        return value
