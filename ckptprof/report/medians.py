"""Medians over repeated operations, into the :class:`Breakdown` both a group of trace
operations (:mod:`ckptprof.report.groups`) and a row of a results sweep
(:mod:`ckptprof.report.sweep`) are shown as: one row per phase, in the canonical order.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from ckptprof.manifest import VERIFY_MODES
from ckptprof.phases import RESTORE_PHASES, SAVE_PHASES, Phase
from ckptprof.report.breakdown import Breakdown, PhaseRow, VerifyCoverage
from ckptprof.report.records import PhaseSample


def median_of(values: Iterable[float | None]) -> float | None:
    """The median of the values present; None where none is."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def spread(values: Iterable[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    found = sorted(values)
    return statistics.median(found), found[0], found[-1]


def median_int(values: Iterable[int | None]) -> int | None:
    value = median_of(values)
    return None if value is None else int(round(value))


def sort_value(value: Any) -> tuple[int, float, str]:
    """A sort key: numbers by value first, then anything else by its text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def phase_order(kind: str, names: Iterable[str]) -> list[str]:
    """Canonical order (docs/design.md §2) first, then other known phases, then the rest."""
    canonical = [p.value for p in (RESTORE_PHASES if kind == "restore" else SAVE_PHASES)]
    known = canonical + [p.value for p in Phase if p.value not in canonical]
    present = set(names)
    return [n for n in known if n in present] + sorted(present - set(known))


def phase_rows(
    kind: str, samples: Sequence[dict[str, PhaseSample]], wall_s: float
) -> list[PhaseRow]:
    """One row per phase present in any operation, with medians over those operations."""
    names = phase_order(kind, {name for phases in samples for name in phases})
    rows = []
    for name in names:
        found = [phases[name] for phases in samples if name in phases]
        busy = median_of(s.busy_s for s in found) or 0.0
        computed = [s.nbytes / s.busy_s / 1e9 for s in found if s.nbytes and s.busy_s > 0]
        gbps = median_of(computed) if computed else median_of(s.gbps for s in found)
        reasons = [s.emulation_reason for s in found if s.emulation_reason]
        fused = [s.fused for s in found if s.fused]
        rows.append(
            PhaseRow(
                phase=name,
                busy_s=busy,
                share=busy / wall_s if wall_s > 0 else None,
                nbytes=median_int(s.nbytes for s in found),
                files=median_int(s.files for s in found),
                gbps=gbps,
                emulated=any(s.emulated for s in found),
                emulation_reason=reasons[0] if reasons else None,
                of_bytes=median_int(s.of_bytes for s in found),
                details={
                    key: statistics.median(s.details[key] for s in found if key in s.details)
                    for key in sorted({k for s in found for k in s.details})
                },
                fused=max(set(fused), key=fused.count) if fused else None,
                lazy=any(s.lazy for s in found),
            )
        )
    return rows


def build_breakdown(
    label: str,
    kind: str,
    walls: Sequence[float],
    samples: Sequence[dict[str, PhaseSample]],
    cache: str | None,
    concurrency: int | None,
    residency: Iterable[float | None],
    cache_method: str | None,
) -> Breakdown:
    wall = statistics.median(walls)
    resident = [r for r in residency if r is not None]
    return Breakdown(
        label=label,
        kind=kind,
        repeats=len(walls),
        wall_median_s=wall,
        wall_min_s=min(walls),
        wall_max_s=max(walls),
        phases=phase_rows(kind, samples, wall),
        cache=cache,
        concurrency=concurrency,
        # the repeat least like its cache state: the most cached of cold ones, the least
        # of hot ones (a hot run half on the storage is not what its row says)
        resident_fraction=(min(resident) if cache == "hot" else max(resident))
        if resident
        else None,
        cache_method=cache_method,
    )


def verify_coverage(mode: Any, b: Breakdown | None) -> VerifyCoverage | None:
    """What the verify phase of ``b`` checked under ``mode`` (a manifest verify mode)."""
    if mode not in VERIFY_MODES or b is None:
        return None
    checked, fetched = b.phase(Phase.VERIFY), b.phase(Phase.FETCH)
    whole = checked.of_bytes if checked is not None else None
    if whole is None and fetched is not None:
        whole = fetched.nbytes
    return VerifyCoverage(mode, checked.nbytes or 0 if checked is not None else None, whole)
