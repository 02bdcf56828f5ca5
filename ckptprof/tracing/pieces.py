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

from opentelemetry import trace

from ckptprof.phases import PIECE_SPAN, Attr

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


def emit_pieces(
    tracer: trace.Tracer, parent: trace.Span, phase: str, intervals: list[tuple[int, int]]
) -> None:
    """A ``ckpt.piece`` child of ``parent`` (the phase's span, open) per busy stretch of a
    phase that ran in pieces, and ``ckpt.pieces`` on the parent; nothing for one stretch."""
    pieces, found = busy_pieces(intervals)
    if len(pieces) < 2:
        return
    parent.set_attribute(Attr.PIECES, len(pieces))
    if found > len(pieces):
        parent.set_attributes({Attr.PIECES_CAPPED: True, Attr.PIECES_INTERVALS: found})
    context = trace.set_span_in_context(parent)
    for piece in pieces:
        attributes = {Attr.PIECE_OF: phase, Attr.BUSY_S: round(piece.busy_ns / 1e9, 6)}
        child = tracer.start_span(
            PIECE_SPAN, context=context, start_time=piece.start_ns, attributes=attributes
        )
        child.end(end_time=piece.end_ns)


__all__ = ["JOIN_GAP_NS", "MAX_PIECES", "Piece", "busy_pieces", "emit_pieces"]
