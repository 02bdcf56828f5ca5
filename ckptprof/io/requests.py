"""The request planner: which storage requests read a set of needed byte ranges.

Every read of a checkpoint goes through here, so the storage's cost model is applied in
one place. Needed ranges of one file are merged when the gap between them is cheaper to
read through than to skip (:attr:`RequestPolicy.gap`), then cut into requests of at most
the part size. On a local disk or a POSIX mount a request is cheap (the page cache and
readahead absorb it), so requests may also be cut where a tensor begins or ends and read
straight into the tensor. On an object store every request is a round trip, so ranges
are never cut below what the part size allows: a restore makes a few part-size GETs, not
one per tensor. The plan's shape (requests, bytes requested, bytes read beyond the needed
ranges) is put on the fetch span (:meth:`RequestSummary.attributes`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ckptprof.phases import Attr

#: gaps a local read reads through rather than skip (zip headers, padding)
LOCAL_GAP = 64 << 10
#: on an object store, a gap this size costs about one request's latency at one stream's
#: bandwidth (tens of ms at ~100 MB/s on S3), so it is read through
OBJECT_STORE_GAP = 4 << 20


@dataclass(frozen=True)
class RequestPolicy:
    """How ranges become requests on one storage."""

    part_size: int
    gap: int
    cheap_requests: bool  # a request may be cut at a boundary to land in place

    @classmethod
    def for_storage(cls, storage, part_size: int) -> RequestPolicy:
        """The policy a storage's request cost calls for (``storage.object_store``)."""
        if getattr(storage, "object_store", False):
            return cls(part_size, min(part_size, OBJECT_STORE_GAP), cheap_requests=False)
        return cls(part_size, LOCAL_GAP, cheap_requests=True)


@dataclass(frozen=True)
class Request:
    """``length`` bytes at ``offset`` of ``path``: one storage request."""

    path: str
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


def merge(ranges: Iterable[tuple[int, int]], gap: int = 0) -> list[tuple[int, int]]:
    """``[start, end)`` ranges sorted and merged where at most ``gap`` bytes lie between."""
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def cut(lo: int, hi: int, part_size: int, boundaries: list[int] = ()) -> Iterator[tuple[int, int]]:
    """``[lo, hi)`` as pieces of at most ``part_size``, also cut at sorted ``boundaries``."""
    start = bisect.bisect_right(boundaries, lo)
    stops = [b for b in boundaries[start : bisect.bisect_left(boundaries, hi)]] + [hi]
    cursor = lo
    for stop in stops:
        for offset in range(cursor, stop, part_size):
            yield offset, min(part_size, stop - offset)
        cursor = stop


def subtract(start: int, end: int, held: list[tuple[int, int]]) -> Iterator[tuple[int, int, bool]]:
    """``[start, end)`` cut into ``(lo, hi, held)`` runs by the sorted ``held`` ranges."""
    cursor = start
    for lo, hi in held:
        lo, hi = max(lo, start), min(hi, end)
        if hi <= lo or hi <= cursor:
            continue
        lo = max(lo, cursor)
        if lo > cursor:
            yield cursor, lo, False
        yield lo, hi, True
        cursor = hi
    if cursor < end:
        yield cursor, end, False


def whole_files(sizes: dict[str, int], part_size: int) -> list[Request]:
    """Every byte of each file, in requests of at most ``part_size``, in file order; an
    empty file is one empty request (it is still opened, as a loader would)."""
    out = []
    for path, size in sizes.items():
        if size == 0:
            out.append(Request(path, 0, 0))
        out += [Request(path, o, n) for o, n in cut(0, size, part_size)]
    return out


def group_atoms(
    path: str, atoms: list[tuple[int, int]], policy: RequestPolicy
) -> list[tuple[Request, list[tuple[int, int]]]]:
    """Ranges that must arrive whole (a DCP item: one ``torch.save`` archive), grouped into
    requests of up to the part size where they lie within ``policy.gap`` of each other;
    an atom larger than the part size is a request of its own. Each request comes with
    the atoms it holds. Where requests are cheap, every atom is its own request."""
    out: list[tuple[Request, list[tuple[int, int]]]] = []
    group: list[tuple[int, int]] = []
    for start, end in sorted(atoms):
        if group and (
            policy.cheap_requests
            or start > group[-1][1] + policy.gap
            or end - group[0][0] > policy.part_size
        ):
            out.append((Request(path, group[0][0], group[-1][1] - group[0][0]), group))
            group = []
        group.append((start, end))
    if group:
        out.append((Request(path, group[0][0], group[-1][1] - group[0][0]), group))
    return out


@dataclass
class RequestSummary:
    """The shape of a read plan: what the fetch span says about it."""

    requests: int = 0
    request_bytes: int = 0
    needed_bytes: int = 0

    def add(self, requested: int, needed: int, count: int = 1) -> None:
        self.requests += count
        self.request_bytes += requested
        self.needed_bytes += needed

    def attributes(self) -> dict:
        return {
            Attr.FETCH_REQUESTS: self.requests,
            Attr.FETCH_REQUEST_BYTES: self.request_bytes,
            Attr.FETCH_READ_BEYOND_BYTES: max(0, self.request_bytes - self.needed_bytes),
        }


def needed(ranges: Iterable[tuple[int, int]]) -> int:
    """Bytes the ``ranges`` cover (overlaps counted once)."""
    return sum(b - a for a, b in merge(ranges))


__all__ = [
    "LOCAL_GAP",
    "OBJECT_STORE_GAP",
    "Request",
    "RequestPolicy",
    "RequestSummary",
    "cut",
    "group_atoms",
    "merge",
    "needed",
    "subtract",
    "whole_files",
]
