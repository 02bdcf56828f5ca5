"""What a synthetic restore sweep records: one :class:`RunRecord` per run, the medians per
setting, and ``results.json`` / ``results.csv`` (written atomically) for the report.

The RTO of a run is the wall time of its ``ckpt.restore`` span. When the first training
step could not run here it is *not* in that time: its estimate is kept beside it
(``first_step_estimate_s``), never inside the headline; a step time the user measured in
the real job (``--first-step-s``) is part of the RTO and marked as theirs.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from ckptprof.atomic import atomic_write
from ckptprof.phases import RESTORE_PHASES, Attr
from ckptprof.results_schema import (
    RESULTS_SCHEMA_VERSION,
    STEP_ESTIMATE,
    STEP_SKIPPED,
    fraction_of_ceiling,
    stalled,
    summarize,
    time_to_state_s,
)


@dataclass
class RunRecord:
    strategy: str
    cache: str
    concurrency: int
    repeat: int
    wall_s: float
    bytes: int  # the checkpoint's bytes
    resident_fraction: float | None
    cache_method: str
    trace_id: str
    phases: dict[str, dict] = field(default_factory=dict)
    retries: int = 0
    errors: int = 0
    read_bytes: int = 0  # bytes read from storage (read amplification: / bytes)
    state_bytes: int = 0  # the restored state's bytes
    peak_rss_bytes: int = 0
    start_rss_bytes: int = 0
    window_bytes: int = 0
    first_step: str = STEP_SKIPPED
    first_step_estimate_s: float | None = None
    first_step_tokens: int | None = None  # the step's tokens, run or estimated
    device_peak_bytes: int | None = None  # CUDA memory allocated at the peak (GPU state)
    device_reserved_peak_bytes: int | None = None  # what the caching allocator held
    slowest_request_s: float = 0.0  # the longest single storage request of the run
    slowest_request: str = ""  # what it read
    # one rank of a distributed job (the slowest rank, in a job's record)
    rank: int | None = None
    node: int | None = None
    host: str | None = None
    ranks: int = 1  # a job's record: how many ranks it stands for
    start_s: float | None = None  # when its root began, seconds since the epoch (rank skew)

    @property
    def time_to_state_s(self) -> float:
        return time_to_state_s(self.wall_s, self.phases)

    def to_dict(self) -> dict:
        """The fields, and the time to state the report and compare rank by."""
        return {**vars(self), "time_to_state_s": self.time_to_state_s}


_FIELDS = {f.name for f in fields(RunRecord)}


def phases_of(summary) -> dict[str, dict]:
    """Per phase of a finished operation: busy time, bytes, files, GB/s, peak memory."""
    phases = {}
    for name, stats in summary.phases.items():
        entry = {"busy_s": stats.busy_s, "bytes": stats.nbytes, "files": len(stats.files)}
        if stats.nbytes and stats.busy_s:
            entry["gbps"] = stats.nbytes / stats.busy_s / 1e9
        peak = stats.attributes.get(Attr.MEMORY_PEAK_RSS_BYTES)
        if peak is not None:
            entry["peak_rss_bytes"] = peak
        of = stats.attributes.get(Attr.VERIFY_OF_BYTES)
        if of is not None:
            entry["of_bytes"] = of
        fused = stats.attributes.get(Attr.FUSED)
        if fused:  # ran as one interval with the phases it names (the report says so)
            entry["fused"] = str(fused)
        if stats.attributes.get(Attr.FETCH_LAZY):  # pages read on demand, some later
            entry["lazy"] = True
        prefix = Attr.phase_prefix(name)
        details = {k.removeprefix(prefix): v for k, v in stats.attributes.items()
                   if k.startswith(prefix) and isinstance(v, (int, float))
                   and not isinstance(v, bool)}  # fmt: skip
        if details:
            entry["details"] = details
        if stats.attributes.get(Attr.FIRST_STEP_FIRST_IN_PROCESS):
            entry["first_in_process"] = True  # the step paid its process's one-time set-up
        if stats.attributes.get(Attr.EMULATED):
            entry["emulated"] = True
            entry["emulation_reason"] = stats.attributes.get(Attr.EMULATION_REASON, "")
        phases[name] = entry
    return phases


def from_dict(entry: dict) -> RunRecord:
    """A record back from :meth:`RunRecord.to_dict` (gathered from another rank)."""
    return RunRecord(**{k: v for k, v in entry.items() if k in _FIELDS})


def job_runs(rank_runs: list[RunRecord]) -> list[RunRecord]:
    """One record per run of a distributed job: its slowest rank's (the job's RTO, the
    MLPerf rule), with the bytes every rank read and held, and the largest peak."""
    from dataclasses import replace

    groups: dict[tuple, list[RunRecord]] = {}
    for r in rank_runs:
        groups.setdefault((r.strategy, r.cache, r.concurrency, r.repeat), []).append(r)
    out = []
    for items in groups.values():
        slowest = max(items, key=lambda r: (r.wall_s, -(r.rank or 0)))
        phases = {}  # the slowest rank's times; the bytes of every rank
        for name, entry in slowest.phases.items():
            entry = dict(entry)
            for key in ("bytes", "of_bytes", "files"):
                if key in entry:
                    entry[key] = sum(r.phases.get(name, {}).get(key) or 0 for r in items)
            if entry.get("bytes") and entry.get("busy_s"):  # the job's rate through this phase
                entry["gbps"] = entry["bytes"] / entry["busy_s"] / 1e9
            phases[name] = entry
        out.append(
            replace(
                slowest,
                phases=phases,
                read_bytes=sum(r.read_bytes for r in items),
                state_bytes=sum(r.state_bytes for r in items),
                peak_rss_bytes=max(r.peak_rss_bytes for r in items),
                retries=sum(r.retries for r in items),
                errors=sum(r.errors for r in items),
                ranks=len(items),
            )
        )
    return out


def job_summary(rank_runs: list[RunRecord], checkpoint_bytes: int) -> dict:
    """Across the ranks of a job: per rank and per node what was read and how long it
    took (medians over runs), the spread, the straggler, aggregate GB/s and read
    amplification (bytes all ranks read ÷ the checkpoint's)."""
    med = statistics.median
    runs = job_runs(rank_runs)
    by_run: dict[tuple, list[RunRecord]] = {}
    for r in rank_runs:
        by_run.setdefault((r.strategy, r.cache, r.concurrency, r.repeat), []).append(r)
    per_rank: dict[int, list[RunRecord]] = {}
    for r in rank_runs:
        per_rank.setdefault(r.rank or 0, []).append(r)
    ranks = [
        {
            "rank": rank,
            "node": items[0].node,
            "host": items[0].host,
            "read_bytes": med(r.read_bytes for r in items),
            "wall_s": med(r.wall_s for r in items),
            "fetch_s": med(r.phases.get("fetch", {}).get("busy_s", 0.0) for r in items),
        }
        for rank, items in sorted(per_rank.items())
    ]
    per_node: dict[int, list[dict]] = {}
    for row in ranks:
        per_node.setdefault(row["node"] or 0, []).append(row)
    nodes = [
        {
            "node": node,
            "host": rows[0]["host"],
            "ranks": len(rows),
            "read_bytes": sum(row["read_bytes"] for row in rows),
            "wall_s": max(row["wall_s"] for row in rows),
        }
        for node, rows in sorted(per_node.items())
    ]
    slowest = max(ranks, key=lambda row: (row["wall_s"], -row["rank"]))
    fastest = min(ranks, key=lambda row: (row["wall_s"], row["rank"]))
    read = med(r.read_bytes for r in runs)
    return {
        "world_size": len(ranks),
        "nodes": len(nodes),
        "rto_rule": "the slowest rank's wall time",
        "checkpoint_bytes": checkpoint_bytes,
        "read_bytes_all_ranks": read,
        "read_amplification": read / checkpoint_bytes if checkpoint_bytes else None,
        "aggregate_gbps": med(r.read_bytes / r.wall_s / 1e9 for r in runs if r.wall_s > 0),
        "spread_s": med(
            max(r.wall_s for r in items) - min(r.wall_s for r in items) for items in by_run.values()
        ),
        "slowest_rank": slowest["rank"],
        "slowest_rank_s": slowest["wall_s"],
        "fastest_rank": fastest["rank"],
        "fastest_rank_s": fastest["wall_s"],
        "slowest_node": max(nodes, key=lambda n: n["wall_s"])["node"],
        "per_rank": ranks,
        "per_node": nodes,
    }


CSV_COLUMNS = (
    "strategy",
    "cache",
    "concurrency",
    "repeat",
    "time_to_state_s",
    "rto_s",
    *[f"{p.value}_s" for p in RESTORE_PHASES],
    "bytes",
    "read_bytes",
    "state_bytes",
    "peak_rss_bytes",
    "fetch_gbps",
    "resident_fraction",
    "cache_method",
    "first_step",
    "first_step_estimate_s",
    "first_step_tokens",
    "retries",
    "errors",
    "trace_id",
)


def write_results(out_dir: Path, payload: dict, runs: list[RunRecord]) -> tuple[Path, Path]:
    """results.json and results.csv, each written to a temp name and renamed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = out_dir / "results.json", out_dir / "results.csv"
    atomic_write(json_path, json.dumps(payload, indent=2, default=str))
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(CSV_COLUMNS)
    for r in runs:
        writer.writerow(
            [
                r.strategy,
                r.cache,
                r.concurrency,
                r.repeat,
                f"{r.time_to_state_s:.6f}",
                f"{r.wall_s:.6f}",
                *[
                    f"{r.phases[p.value]['busy_s']:.6f}" if p.value in r.phases else ""
                    for p in RESTORE_PHASES
                ],
                r.bytes,
                r.read_bytes,
                r.state_bytes,
                r.peak_rss_bytes,
                f"{r.phases.get('fetch', {}).get('gbps', 0):.4f}",
                "" if r.resident_fraction is None else f"{r.resident_fraction:.4f}",
                r.cache_method,
                r.first_step,
                "" if r.first_step_estimate_s is None else f"{r.first_step_estimate_s:.6f}",
                "" if r.first_step_tokens is None else r.first_step_tokens,
                r.retries,
                r.errors,
                r.trace_id,
            ]
        )
    atomic_write(csv_path, buf.getvalue())
    return json_path, csv_path


def payload(
    subject,
    runs: list[RunRecord],
    failures: list[dict],
    options,
    ceiling,
    telemetry,
    partial: bool = False,
    rank_runs: list[RunRecord] | None = None,
) -> dict:
    """results.json: the spec, options, environment, ceiling, runs and their medians, of
    the :class:`~ckptprof.synth.subject.RestoreSubject` restored. For
    a distributed job (``rank_runs``: every rank's records), ``runs`` are the job's (its
    slowest rank per run), ``rank_runs`` every rank's, and ``job`` the spread across them."""
    from ckptprof import __version__
    from ckptprof.env import capture
    from ckptprof.synth.device import DEVICE, device_attributes

    runs = job_runs(rank_runs) if rank_runs else runs
    stats = subject.storage.stats
    attempted = len(runs) + len(failures)
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "ckptprof_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "location": subject.storage.uri,
        "spec": subject.spec.to_dict(),
        "options": {
            "verify": options.verify,
            "world_size": subject.world_size,
            "ranks": sorted({r.rank for r in rank_runs}) if rank_runs else list(subject.ranks),
            "processes": "one per rank (torch.distributed)" if rank_runs else "one",
            "strategies": list(options.strategies),
            "memory_budget": subject.memory_budget,
            "part_size": options.part_size,
            "repeat": options.repeat,
            "caches": list(options.caches),
            "concurrency": list(options.concurrency),
            "device": device_attributes(subject.device)[DEVICE],
        },
        "environment": capture(
            {**subject.storage.describe(), "fetch.part_size": str(options.part_size)}
        ),
        "ceiling": ceiling.to_dict(),
        "state_bytes": runs[0].state_bytes if rank_runs and runs else subject.state.nbytes,
        "read_files": len(subject.files),
        "runs": [r.to_dict() for r in runs],
        "summary": summarize([r.to_dict() for r in runs], ceiling.read_gbps),
        "success_rate": len(runs) / attempted if attempted else 0.0,
        "failures": failures,
        "requests": {
            "requests": stats.requests,
            "retries": stats.retries,
            "errors": stats.errors,
        },
        "trace_file": str(telemetry.trace_file) if telemetry.trace_file else None,
        "partial": partial,
        **(
            {
                "rank_runs": [r.to_dict() for r in rank_runs],
                "job": job_summary(rank_runs, subject.manifest.total_bytes),
            }
            if rank_runs
            else {}
        ),
    }


def run_line(run: RunRecord, ceiling) -> str:
    """One finished run, as the sweep prints it."""
    fetch = run.phases.get("fetch", {})
    fraction = fraction_of_ceiling(fetch.get("gbps"), ceiling.read_gbps, run.cache)
    frac = "" if fraction is None else f" ({fraction:.0%} of ceiling)"
    resident = "" if run.resident_fraction is None else f" resident={run.resident_fraction:.1%}"
    phases = " ".join(f"{k}={v['busy_s']:.3f}" for k, v in run.phases.items())
    step = (
        f" (+ first_step ~{run.first_step_estimate_s:.3f}s estimated)"
        if run.first_step == STEP_ESTIMATE and run.first_step_estimate_s
        else ""
    )
    line = (
        f"{run.strategy:9} {run.cache:4} x{run.concurrency:<3} #{run.repeat} "
        f"RTO {run.wall_s:.3f}s{step} fetch {fetch.get('gbps', 0):.2f} GB/s{frac}{resident} "
        f"peak RSS {run.peak_rss_bytes / 1e9:.2f} GB | {phases}"
    )
    if stalled(run.slowest_request_s, run.wall_s):
        line += (f" | STALL: one request took {run.slowest_request_s:.1f} s "
                 f"({run.slowest_request})")  # fmt: skip
    return line


__all__ = ["RunRecord", "payload", "phases_of", "run_line", "write_results"]
