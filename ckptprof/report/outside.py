"""The time of a save or restore outside every phase, named: what the stack sampler
(:mod:`ckptprof.tracing.sampling`) found on top of the operation's thread there, as
``ckpt.outside.*`` on each root span, over the operations of a group.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptprof.phases import Attr
from ckptprof.units import fmt_s

#: the functions a group keeps, the largest first
KEPT = 5
#: a report's line names at most this many, each at least this share of the outside time
SAID, SAID_SHARE = 3, 0.05


@dataclass(frozen=True)
class NamedTime:
    """A function and the seconds outside every phase it was found in (per operation)."""

    function: str  # "name (file:line)"
    seconds: float


def named_outside(roots: Sequence[Mapping[str, Any]]) -> list[NamedTime]:
    """The functions of the operations' ``roots`` (their attributes), each with its mean
    seconds over the operations that were sampled; [] when none was."""
    sampled = [a for a in roots if a.get(Attr.OUTSIDE_S) is not None]
    totals: dict[str, float] = defaultdict(float)
    for attrs in sampled:
        names = attrs.get(Attr.OUTSIDE_FUNCTIONS) or []
        seconds = attrs.get(Attr.OUTSIDE_FUNCTION_S) or []
        for name, value in zip(names, seconds, strict=False):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                totals[str(name)] += float(value)
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:KEPT]
    return [NamedTime(name, total / len(sampled)) for name, total in ranked]


def outside_phrase(named: Sequence[NamedTime], outside_s: float) -> str:
    """ "0.287 s in clear_device_cache (accelerate/utils/memory.py:34), 0.010 s in …":
    the largest functions of ``outside_s``; "" when none is a share worth saying."""
    said = [t for t in named if t.seconds >= outside_s * SAID_SHARE][:SAID]
    return ", ".join(f"{fmt_s(t.seconds)} s in {t.function}" for t in said)


__all__ = ["NamedTime", "named_outside", "outside_phrase"]
