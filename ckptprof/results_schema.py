"""The shape of ``results.json`` and the arithmetic on it, in one place: the synthetic
restore writes its ``summary`` with :func:`summarize` and the report reads files through
:data:`RESULTS_SCHEMA` (and summarizes a file that lacks a summary the same way), so the
medians and the fraction of the ceiling have one definition.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ckptprof import schema
from ckptprof.phases import RESTORE_PHASES, Phase, fused_phases

RESULTS_NAME = "results.json"
#: bumped when a field changes meaning; a reader refuses a newer one it cannot read (a file
#: without it is from before it was written: version 1)
RESULTS_SCHEMA_VERSION = 1
#: a run's ``first_step``: where the first step's time came from
STEP_REAL, STEP_ESTIMATE, STEP_USER, STEP_SKIPPED = "measured", "estimated", "user", "skipped"

_COUNT = schema.integer(0)
_SECONDS = schema.number(minimum=0)
_PHASE = schema.record(
    {
        "busy_s": _SECONDS,
        "bytes": schema.optional(_COUNT),
        "files": schema.optional(_COUNT),
        "gbps": schema.optional(_SECONDS),
        "emulated": schema.boolean(),
        "emulation_reason": schema.optional(schema.text()),
        "fused": schema.optional(schema.text()),  # an Attr.FUSED value
        "lazy": schema.boolean(),  # fetch: Attr.FETCH_LAZY
        "first_in_process": schema.boolean(),  # first_step: Attr.FIRST_STEP_FIRST_IN_PROCESS
    },
    required=("busy_s",),
)
_RUN = schema.record(
    {
        "strategy": schema.optional(schema.text()),
        "peak_rss_bytes": schema.optional(_COUNT),
        "read_bytes": schema.optional(_COUNT),
        "first_step": schema.optional(schema.text()),
        "first_step_estimate_s": schema.optional(_SECONDS),
        "first_step_tokens": schema.optional(schema.integer(1)),
        "cache": schema.optional(schema.text()),
        "concurrency": schema.optional(schema.integer(1)),
        "repeat": schema.optional(_COUNT),
        "wall_s": _SECONDS,
        "time_to_state_s": schema.optional(_SECONDS),  # wall_s less its first step
        "bytes": schema.optional(_COUNT),
        "resident_fraction": schema.optional(schema.number(0, 1)),
        "cache_method": schema.optional(schema.text()),
        "trace_id": schema.optional(schema.text()),
        "phases": schema.mapping(schema.text(), _PHASE),
        "retries": _COUNT,
        "errors": _COUNT,
        "rank": schema.optional(_COUNT),  # a distributed job's rank (rank_runs)
        "start_s": schema.optional(_SECONDS),  # when it began, seconds since the epoch
    },
    required=("wall_s",),
)
_SPREAD = schema.record(
    {k: _SECONDS for k in ("min", "median", "max", "min_s", "median_s", "max_s")}
)
_SUMMARY = schema.record(
    {
        "cache": schema.optional(schema.text()),
        "concurrency": schema.optional(schema.integer(1)),
        "repeats": _COUNT,
        "rto_s": _SPREAD,
        "time_to_state_s": _SPREAD,
        "phases": schema.mapping(schema.text(), _SPREAD),
        "fetch_gbps_median": _SECONDS,
        "fraction_of_ceiling": _SECONDS,
    }
)
_CEILING = schema.record(
    {
        "read_gbps": schema.optional(_SECONDS),
        "source": schema.optional(schema.text()),
        "request_latency_s": schema.optional(_SECONDS),
        "part_size": schema.optional(schema.integer(1)),
        "littles_law_inflight": schema.optional(_SECONDS),
        "lower_bound_fetch_s": schema.optional(_SECONDS),
        "bytes": schema.optional(_COUNT),
    }
)
#: what a results.json written by ``ckptprof synth restore`` holds (unknown keys allowed)
RESULTS_SCHEMA = schema.record(
    {
        "schema_version": schema.integer(1, RESULTS_SCHEMA_VERSION),
        "ckptprof_version": schema.text(),
        "created": schema.text(),
        "spec": schema.record({}),
        "options": schema.record({}),
        "environment": schema.record({}),
        "ceiling": schema.optional(_CEILING),
        "runs": schema.items(_RUN),
        "rank_runs": schema.items(_RUN),  # a distributed job: every rank's runs
        "summary": schema.items(_SUMMARY),
        "success_rate": schema.number(0, 1),
        "failures": schema.items(schema.record({"error": schema.text()})),
        "requests": schema.record(dict.fromkeys(("requests", "retries", "errors"), _COUNT)),
        "partial": schema.boolean(),
        "job": schema.record(
            {
                "world_size": _COUNT,
                "nodes": _COUNT,
                "read_amplification": schema.optional(_SECONDS),
                "per_rank": schema.items(schema.record({})),
                "per_node": schema.items(schema.record({})),
            }
        ),
    },
    required=("runs",),
)


def spread(values: Iterable[float]) -> dict[str, float]:
    """min, median and max of the repeats (what the report's ranges and hints read)."""
    present = sorted(values)
    return {"min": present[0], "median": statistics.median(present), "max": present[-1]}


def time_to_state_s(wall_s: float, phases: Mapping[str, Any]) -> float:
    """A restore's time to state, list -> reshard: its RTO less its first step (what the
    storage and the loader control; the step is the model's). ``phases`` as a run of
    results.json holds them."""
    step = phases.get(Phase.FIRST_STEP.value)
    return wall_s - (step["busy_s"] if isinstance(step, Mapping) else 0.0)


#: a single request this long, and this share of the RTO, is a stall worth naming
STALL_MIN_S = 2.0
STALL_SHARE = 0.25


def stalled(request_s: float | None, wall_s: float) -> bool:
    """Whether one request's wait is a stall: seconds long and a large part of the RTO
    (one rule for the sweep's run lines and the report's hint)."""
    return bool(request_s) and request_s >= STALL_MIN_S and request_s >= STALL_SHARE * wall_s


def fraction_of_ceiling(gbps: float | None, ceiling_gbps: float | None, cache: Any) -> float | None:
    """Fetch GB/s as a share of the storage ceiling, for cold reads only: a hot or mixed
    read comes (partly) from the page cache, which the storage ceiling does not bound."""
    if gbps is None or not ceiling_gbps or cache != "cold":
        return None
    return gbps / ceiling_gbps


def fetch_unbounded(phases: Mapping[str, Any]) -> str | None:
    """Why a fetch's GB/s is no storage read to hold against the ceiling: ``"fused"`` where
    fetch ran as one interval with other phases (it, or another phase, carries
    ``Attr.FUSED`` naming fetch), ``"lazy"`` where the loader reads pages on demand (mmap:
    the fetch interval only warms the cache, some reads happen later inside deserialize);
    None where its fraction of the ceiling means what it says. ``phases``: phase name →
    its entry as results.json holds it (``fused``, ``lazy``)."""
    entries = [e for e in phases.values() if isinstance(e, Mapping)]
    fetch = phases.get(Phase.FETCH.value)
    if any(Phase.FETCH.value in fused_phases(e["fused"]) for e in entries if e.get("fused")):
        return "fused"
    if isinstance(fetch, Mapping) and fetch.get("fused"):
        return "fused"
    if isinstance(fetch, Mapping) and fetch.get("lazy"):
        return "lazy"
    return None


def summarize(runs: Sequence[Mapping[str, Any]], ceiling_gbps: float | None) -> list[dict]:
    """``summary`` of results.json: per strategy × cache state × concurrency, the RTO, the
    time to state and each phase's min/median/max, the median fetch GB/s and its fraction
    of the ceiling. ``runs`` are the run entries as results.json holds them."""
    cells: dict[tuple, list[Mapping[str, Any]]] = {}
    for run in runs:
        if isinstance(run, Mapping) and isinstance(run.get("wall_s"), (int, float)):
            key = (run.get("strategy"), run.get("cache"), run.get("concurrency"))
            cells.setdefault(key, []).append(run)
    out = []
    for (strategy, cache, concurrency), items in cells.items():
        phases = {}
        for phase in RESTORE_PHASES:
            values = [
                r["phases"][phase.value]["busy_s"]
                for r in items
                if phase.value in (r.get("phases") or {})
            ]
            if values:
                phases[phase.value] = {f"{k}_s": v for k, v in spread(values).items()}
        entry: dict[str, Any] = {
            "strategy": strategy,
            "cache": cache,
            "concurrency": concurrency,
            "repeats": len(items),
            "rto_s": spread(r["wall_s"] for r in items),
            "time_to_state_s": spread(
                time_to_state_s(r["wall_s"], r.get("phases") or {}) for r in items
            ),
            "phases": phases,
            "peak_rss_bytes": max((r.get("peak_rss_bytes") or 0 for r in items), default=0),
            "read_bytes": statistics.median(r.get("read_bytes") or 0 for r in items),
            "first_step": items[0].get("first_step"),
        }
        estimates = [r["first_step_estimate_s"] for r in items if r.get("first_step_estimate_s")]
        if estimates:
            entry["first_step_estimate_s"] = statistics.median(estimates)
        if items[0].get("first_step_tokens"):  # one step shape per sweep
            entry["first_step_tokens"] = items[0]["first_step_tokens"]
        gbps = [
            r["phases"]["fetch"]["gbps"]
            for r in items
            if "gbps" in ((r.get("phases") or {}).get("fetch") or {})
        ]
        if gbps:
            entry["fetch_gbps_median"] = statistics.median(gbps)
            fraction = fraction_of_ceiling(entry["fetch_gbps_median"], ceiling_gbps, cache)
            if any(fetch_unbounded(r.get("phases") or {}) for r in items):
                fraction = None  # no storage read of its own: nothing to hold to the ceiling
            if fraction is not None:
                entry["fraction_of_ceiling"] = fraction
        out.append(entry)
    return out


__all__ = [
    "RESULTS_NAME",
    "RESULTS_SCHEMA",
    "RESULTS_SCHEMA_VERSION",
    "STEP_ESTIMATE",
    "STEP_REAL",
    "STEP_SKIPPED",
    "STEP_USER",
    "fetch_unbounded",
    "fraction_of_ceiling",
    "spread",
    "summarize",
]
