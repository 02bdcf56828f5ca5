"""Which bytes of which files a target rank must read, as pure data.

The checkpoint's own index (zip directory and pickle, safetensors header, ZeRO flat
partitions) says where every saved tensor region lies: a :class:`Source` is ``length``
bytes at ``offset`` of a file holding elements ``[elem_start, elem_end)`` (row-major) of
one tensor. Against the :class:`~ckptprof.synth.targets.TargetTensor` s of a rank,
:func:`plan_copies` finds the byte ranges to copy into each target, and
:func:`plan_reads` turns them into requests as the storage's policy plans them
(:mod:`ckptprof.io.requests`), so a rank reads what it needs and nothing else (plus the
gaps it is cheaper to read through than to skip). Planned without a disk; unit-tested as
data.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

from ckptprof.errors import CkptprofError
from ckptprof.io.requests import RequestPolicy, RequestSummary, cut, merge, subtract
from ckptprof.io.requests import needed as needed_bytes
from ckptprof.synth.presets import DTYPE_SIZE
from ckptprof.synth.targets import TargetTensor, TensorKey


@dataclass(frozen=True)
class Source:
    """``elem_end - elem_start`` elements of tensor ``key`` stored at ``offset`` of ``path``."""

    path: str
    offset: int
    key: TensorKey
    dtype: str
    elem_start: int
    elem_end: int


@dataclass(frozen=True)
class Copy:
    """``length`` bytes at ``offset`` of ``path`` go to byte ``target_offset`` of target
    tensor number ``target``."""

    path: str
    offset: int
    length: int
    target: int
    target_offset: int


@dataclass
class Read:
    """One ranged read, and the copies whose bytes it holds; ``resident`` when the bytes
    are in memory already (read while indexing the file), so no request is made; ``into``
    when the read lands directly in the state (no buffer, no copy): the places its bytes
    go, in order (one, or on an object store several: one request scattered into each
    tensor it covers)."""

    path: str
    offset: int
    length: int
    copies: list[Copy] = field(default_factory=list)
    resident: bool = False
    into: tuple[Copy, ...] = ()  # read straight into the state: these bytes are these copies

    @property
    def end(self) -> int:
        return self.offset + self.length


def flat_sources(
    path: str, offset: int, group: str, flat_start: int, flat_end: int, layout
) -> list[Source]:
    """The tensors inside one saved range ``[flat_start, flat_end)`` of a flattened group
    (ZeRO's fp32 partitions): ``layout`` lists ``(name, numel, dtype)`` in flat order."""
    out, position = [], 0
    for name, numel, dtype in layout:
        lo, hi = max(flat_start, position), min(flat_end, position + numel)
        if hi > lo:
            start = offset + (lo - flat_start) * DTYPE_SIZE[dtype]
            out.append(Source(path, start, (group, name), dtype, lo - position, hi - position))
        position += numel
    return out


def plan_copies(
    targets: list[TargetTensor], sources: list[Source], covered: dict[int, int] | None = None
) -> list[Copy]:
    """For every target, the source byte ranges that fill it; all of it, or an error.
    With ``covered`` (target index → elements filled so far), ``sources`` are some of
    the files: what they cover is added there and checked later (:func:`check_covered`)."""
    by_key: dict[TensorKey, list[Source]] = defaultdict(list)
    for source in sources:
        by_key[source.key].append(source)
    copies = []
    for index, target in enumerate(targets):
        size = DTYPE_SIZE[target.dtype]
        lo_t, hi_t = target.elem_start, target.elem_start + target.numel
        filled = 0
        for source in sorted(by_key.get(target.key, []), key=lambda s: s.elem_start):
            if source.dtype != target.dtype:
                raise CkptprofError(
                    f"{source.path}: {target.name} ({target.group}) is saved as {source.dtype}, "
                    f"the restore expects {target.dtype}; regenerate the checkpoint."
                )
            lo, hi = max(lo_t, source.elem_start), min(hi_t, source.elem_end)
            if hi <= lo:
                continue
            copies.append(
                Copy(
                    source.path,
                    source.offset + (lo - source.elem_start) * size,
                    (hi - lo) * size,
                    index,
                    (lo - lo_t) * size,
                )
            )
            filled += hi - lo
        if covered is not None:
            covered[index] = covered.get(index, 0) + filled
        else:
            check_covered([target], {0: filled})
    return copies


def check_covered(targets: list[TargetTensor], covered: dict[int, int]) -> None:
    """Every target filled whole (``covered``: target index → elements), or an error."""
    for index, target in enumerate(targets):
        filled = covered.get(index, 0)
        if filled != target.numel:
            raise CkptprofError(
                f"the checkpoint holds {filled} of the {target.numel} elements of "
                f"{target.name} ({target.group}) rank {target.rank} needs; a file is missing "
                "or was replaced, regenerate the checkpoint."
            )


def plan_reads(
    copies: list[Copy],
    policy: RequestPolicy,
    whole_files: dict[str, int] | None = None,
    have: dict[str, list[tuple[int, int]]] | None = None,
    direct: bool | set[str] = False,
    summary: RequestSummary | None = None,
) -> list[Read]:
    """The requests that bring every copy's bytes, in file order, as the storage's
    ``policy`` plans them (:mod:`ckptprof.io.requests`: gaps read through, requests of at
    most the part size).

    ``whole_files`` (path -> size) are read from first byte to last (a full-file hash
    needs every byte; small files are read whole as their framework reads them).
    ``have`` (path -> ``[start, end)`` ranges) are in memory already: they become
    resident reads, and no request reads them again. ``direct`` (True, or the paths it
    applies to): a request that lies inside one copy lands straight in its place in the
    state (no buffer, no copy after); where requests are cheap they are also cut where
    copies begin and end so that most of them do. ``summary`` counts the plan's shape.
    """
    needed: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for c in copies:
        needed[c.path].append((c.offset, c.offset + c.length))
    by_offset: dict[str, list[Copy]] = defaultdict(list)
    for c in sorted(copies, key=lambda c: (c.path, c.offset)):
        by_offset[c.path].append(c)
    whole_files = whole_files or {}
    reads: list[Read] = []
    for path in sorted(set(needed) | set(whole_files)):
        into_state = direct is True or (direct is not False and path in direct)
        cut_at_copies = into_state and policy.cheap_requests
        # a gap is worth reading through only into a buffer
        gap = 0 if cut_at_copies else policy.gap
        merged = [(0, whole_files[path])] if path in whole_files else merge(needed[path], gap)
        boundaries = (
            sorted({b for c in by_offset[path] for b in (c.offset, c.offset + c.length)})
            if cut_at_copies
            else []
        )
        held = sorted((have or {}).get(path, []))
        first = len(reads)
        for start, end in merged:
            if end == start:
                reads.append(Read(path, start, 0))
            for lo, hi, resident in subtract(start, end, held):
                if resident:
                    reads.append(Read(path, lo, hi - lo, resident=True))
                    continue
                for offset, length in cut(lo, hi, policy.part_size, boundaries):
                    read = Read(path, offset, length)
                    if into_state:
                        read.into = _covering(by_offset[path], offset, length)
                    reads.append(read)
        if summary is not None:
            mine = [r for r in reads[first:] if not r.resident]
            requested, count = sum(r.length for r in mine), sum(1 for r in mine if r.length)
            whole = whole_files.get(path)
            wanted = whole if whole is not None else needed_bytes(needed[path])
            summary.add(requested, wanted, count)
    _attach([r for r in reads if not r.into], copies)
    return reads


def _covering(copies: list[Copy], offset: int, length: int) -> tuple[Copy, ...]:
    """The parts of copies that together hold every byte of ``[offset, offset + length)``,
    in order; none where some byte belongs to no copy (it must land in a buffer)."""
    if not length:
        return ()
    starts = [c.offset for c in copies]
    i = max(0, bisect.bisect_right(starts, offset) - 1)
    cursor, end, parts = offset, offset + length, []
    while cursor < end:
        if i >= len(copies) or not copies[i].offset <= cursor < copies[i].offset + copies[i].length:
            return ()
        c = copies[i]
        stop = min(end, c.offset + c.length)
        parts.append(
            Copy(c.path, cursor, stop - cursor, c.target, c.target_offset + cursor - c.offset)
        )
        cursor = stop
        i += 1
    return tuple(parts)


def split_held(start: int, end: int, held: list[tuple[int, int]]):
    """``[start, end)`` cut into ``(lo, hi, resident)`` runs by the ``held`` ranges."""
    return subtract(start, end, sorted(held))


def _attach(reads: list[Read], copies: list[Copy]) -> None:
    """Give every copy to the reads that hold its bytes (split where a read ends)."""
    by_path: dict[str, list[Read]] = defaultdict(list)
    for read in reads:
        by_path[read.path].append(read)  # in offset order, not overlapping
    starts = {path: [r.offset for r in rs] for path, rs in by_path.items()}
    for c in copies:
        end = c.offset + c.length
        path_reads = by_path.get(c.path)
        if not path_reads:
            continue  # read straight into the state
        i = max(0, bisect.bisect_right(starts[c.path], c.offset) - 1)
        while i < len(path_reads) and path_reads[i].offset < end:
            read = path_reads[i]
            lo, hi = max(c.offset, read.offset), min(end, read.end)
            if hi > lo:
                read.copies.append(
                    Copy(c.path, lo, hi - lo, c.target, c.target_offset + lo - c.offset)
                )
            i += 1


def read_bytes(reads: list[Read]) -> int:
    """Bytes the reads request from storage (resident ones are in memory already)."""
    return sum(r.length for r in reads if not r.resident)


__all__ = [
    "Copy",
    "Read",
    "Source",
    "check_covered",
    "flat_sources",
    "plan_copies",
    "plan_reads",
    "read_bytes",
    "split_held",
]
