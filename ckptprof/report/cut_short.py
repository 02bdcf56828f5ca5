"""Saves and restores cut short: the process ended inside them (killed, out of memory, a
reclaim past its grace), so their spans were never written and only their in-progress
records (``ckpt.progress``, docs/design.md §2) say how far they got. Every view that reads
traces (``report``, ``--goodput``, ``--interruptions``, ``compare``) shows them with these
lines rather than dropping them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ckptprof.phases import Attr
from ckptprof.report.records import CutShort
from ckptprof.units import fmt_bytes

HEADING = "cut short (the process ended inside; as its last in-progress record tells):"


def describe(cut: CutShort) -> str:
    """``restore cut short in fetch after 41.0 s: 12.30 GB of 30.10 GB (rank 0; …)``."""
    where = f"in {cut.open_phase}" if cut.open_phase else "between phases"
    amount = fmt_bytes(cut.nbytes) if cut.nbytes else "nothing moved yet"
    if cut.nbytes and cut.of_bytes:
        amount += f" of {fmt_bytes(cut.of_bytes)}"
    details = []
    rank = cut.attributes.get(Attr.RANK)
    if rank is not None:
        details.append(f"rank {rank}")
    if cut.waiting_on:
        details.append(f"{cut.in_flight} in flight, the oldest on {cut.waiting_on}")
    if cut.phases:
        details.append("so far " + ", ".join(f"{n} {s:.3f} s" for n, s in cut.phases.items()))
    if cut.stalled:
        details.append("it stalled: the stacks are in its record")
    said = f" ({'; '.join(details)})" if details else ""
    return f"{cut.kind} cut short {where} after {cut.elapsed_s:.1f} s: {amount}{said}"


def cut_short_lines(cuts: Iterable[CutShort]) -> list[str]:
    """The heading and one line per operation, in the order they were cut; none: []."""
    ordered = sorted(cuts, key=lambda c: (c.at is None, c.at))
    if not ordered:
        return []
    return [HEADING, *(f"  {describe(c)}" for c in ordered)]


def cut_short_json(cuts: Sequence[CutShort]) -> list[dict[str, Any]]:
    """For ``--format json``: each as numbers (its root attributes and stacks left out)."""
    return [
        {
            "kind": c.kind,
            "trace_id": c.trace_id,
            "elapsed_s": c.elapsed_s,
            "open_phase": c.open_phase,
            "phases": c.phases,
            "bytes": c.nbytes,
            "of_bytes": c.of_bytes,
            "in_flight": c.in_flight,
            "waiting_on": c.waiting_on,
            "stalled": c.stalled,
            "rank": c.attributes.get(Attr.RANK),
            "at": c.at.isoformat() if c.at else None,
            "line": describe(c),
        }
        for c in cuts
    ]


__all__ = ["cut_short_json", "cut_short_lines", "describe"]
