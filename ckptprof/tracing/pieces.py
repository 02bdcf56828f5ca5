"""A phase that ran in pieces, as its busy stretches.

A phase entered many times (a framework's resume fetches, verifies and deserializes file
after file) has a span from its first start to its last end, which a tracing UI draws as
one long bar although the phase was busy a fraction of it (its ``ckpt.busy_s``). Its busy
stretches become ``ckpt.piece`` children of that span, so each span's duration is time
the phase really took: the union of its intervals, stretches closer than
:data:`JOIN_GAP_NS` joined, at most :data:`MAX_PIECES` (past that, the closest are joined
and the phase span says so).
"""

from __future__ import annotations

from dataclasses import dataclass

#: busy stretches closer than this are one piece: a gap this small is the phase left and
#: entered again at once (the recorder's own bookkeeping between two blocks), not time
#: spent elsewhere, which keeps its own gap however short
JOIN_GAP_NS = 20_000
#: pieces per phase at most (a phase of thousands of stretches stays a readable trace)
MAX_PIECES = 64


@dataclass(frozen=True)
class Piece:
    """One busy stretch of a phase: from ``start_ns`` to ``end_ns``, busy ``busy_ns`` of
    it (less than the extent only where stretches were joined)."""

    start_ns: int
    end_ns: int
    busy_ns: int


def busy_pieces(
    intervals: list[tuple[int, int]], gap_ns: int = JOIN_GAP_NS, cap: int = MAX_PIECES
) -> tuple[list[Piece], int]:
    """The pieces of a phase's ``intervals``, and how many stretches there were before
    the cap joined the closest (overlapping intervals are one stretch: busy is a union)."""
    stretches: list[list[int]] = []
    for start, end in sorted(intervals):
        if stretches and start - stretches[-1][1] < gap_ns:
            last = stretches[-1]
            last[2] += max(end - max(start, last[1]), 0)
            last[1] = max(last[1], end)
        else:
            stretches.append([start, end, end - start])
    found = len(stretches)
    if found > cap:
        gaps = sorted(range(1, found), key=lambda i: stretches[i][0] - stretches[i - 1][1])
        joined = set(gaps[: found - cap])  # the closest neighbours join the piece before
        kept: list[list[int]] = []
        for index, stretch in enumerate(stretches):
            if index in joined:
                kept[-1][1] = stretch[1]
                kept[-1][2] += stretch[2]
            else:
                kept.append(list(stretch))
        stretches = kept
    return [Piece(s, e, busy) for s, e, busy in stretches], found


__all__ = ["JOIN_GAP_NS", "MAX_PIECES", "Piece", "busy_pieces"]
