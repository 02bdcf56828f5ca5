"""S3's multipart upload rules, checked before any byte moves.

S3 (and the stores that follow it) takes every part but the last of at least 5 MiB and
at most 5 GiB, at most 10,000 parts per upload, and at most 5 GiB in one PUT. A part
size that breaks them is accepted by every ``UploadPart`` and refused only by
``CompleteMultipartUpload`` (``EntityTooSmall``), after the whole upload has run; so
every place that starts an upload checks the part size against the object's size first,
and says the smallest part size that works.
"""

from __future__ import annotations

from ckptprof.errors import CkptprofError
from ckptprof.units import fmt_bytes

MIN_PART_BYTES = 5 << 20
MAX_PART_BYTES = 5 << 30
MAX_PARTS = 10_000
MAX_PUT_BYTES = 5 << 30
_MIB = 1 << 20


def smallest_part_size(size: int) -> int:
    """The smallest part size (whole MiB) that uploads ``size`` bytes within S3's rules."""
    need = max(MIN_PART_BYTES, -(-size // MAX_PARTS))
    return -(-need // _MIB) * _MIB


def part_size_for(size: int, preferred: int) -> int:
    """``preferred``, or the smallest part size S3 takes for ``size`` bytes when that is
    larger (for an upload whose parts no option sets: a generated file's)."""
    return max(preferred, smallest_part_size(size))


def problem(size: int, part_size: int) -> str | None:
    """What S3 would refuse about ``size`` bytes uploaded in ``part_size`` parts (one PUT
    when it fits in one part), or None."""
    if size <= part_size:
        return None if size <= MAX_PUT_BYTES else "is over the 5 GiB one PUT takes"
    if part_size < MIN_PART_BYTES:
        return "needs parts of at least 5 MiB (every part but the last)"
    if part_size > MAX_PART_BYTES:
        return "needs parts of at most 5 GiB"
    parts = -(-size // part_size)
    if parts > MAX_PARTS:
        return f"would take {parts:,} parts, over the 10,000 one upload takes"
    return None


def check_part_size(size: int, part_size: int, where: str) -> None:
    """Refuse, in one line naming ``--part-size`` and the fix, a part size S3 would refuse
    for the ``size`` bytes of ``where`` (for a save: its largest file)."""
    found = problem(size, part_size)
    if found is None:
        return
    smallest = smallest_part_size(size)
    given = option_size(part_size)
    if smallest > MAX_PART_BYTES:
        raise CkptprofError(
            f"--part-size {given}: {where} ({fmt_bytes(size)}) {found} on S3, and is too large "
            "for any part size (10,000 parts of 5 GiB); split it: more --files or --ranks."
        )
    raise CkptprofError(
        f"--part-size {given}: {where} ({fmt_bytes(size)}) {found} on S3; use --part-size "
        f"{option_size(smallest)} or more."
    )


def option_size(nbytes: int) -> str:
    """A byte count as ``--part-size`` takes it: ``4K``, ``16M``, ``1G``, or plain bytes."""
    for suffix, unit in (("G", 1 << 30), ("M", _MIB), ("K", 1 << 10)):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)


__all__ = [
    "MAX_PARTS",
    "MIN_PART_BYTES",
    "check_part_size",
    "part_size_for",
    "problem",
    "smallest_part_size",
]
