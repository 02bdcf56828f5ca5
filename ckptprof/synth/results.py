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
from dataclasses import dataclass, field
from pathlib import Path

from ckptprof.atomic import atomic_write
from ckptprof.phases import RESTORE_PHASES, Attr

#: where the first step's time came from
STEP_REAL, STEP_ESTIMATE, STEP_USER, STEP_SKIPPED = "measured", "estimated", "user", "skipped"


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
    device_peak_bytes: int | None = None  # CUDA memory allocated at the peak (GPU state)

    def to_dict(self) -> dict:
        return dict(vars(self))


def phases_of(summary) -> dict[str, dict]:
    """Per phase of a finished operation: busy time, bytes, files, GB/s, peak memory."""
    phases = {}
    for name, stats in summary.phases.items():
        entry = {"busy_s": stats.busy_s, "bytes": stats.nbytes, "files": len(stats.files)}
        if stats.nbytes and stats.busy_s:
            entry["gbps"] = stats.nbytes / stats.busy_s / 1e9
        peak = stats.attributes.get("ckpt.memory.peak_rss_bytes")
        if peak is not None:
            entry["peak_rss_bytes"] = peak
        of = stats.attributes.get(Attr.VERIFY_OF_BYTES)
        if of is not None:
            entry["of_bytes"] = of
        if stats.attributes.get(Attr.EMULATED):
            entry["emulated"] = True
            entry["emulation_reason"] = stats.attributes.get(Attr.EMULATION_REASON, "")
        phases[name] = entry
    return phases


def summarize(runs: list[RunRecord], ceiling) -> list[dict]:
    """Medians (and min/max) per strategy, cache state and concurrency."""
    groups: dict[tuple[str, str, int], list[RunRecord]] = {}
    for run in runs:
        groups.setdefault((run.strategy, run.cache, run.concurrency), []).append(run)
    out = []
    for (strategy, cache, conc), items in groups.items():
        walls = [r.wall_s for r in items]
        phases = {}
        for phase in RESTORE_PHASES:
            values = [r.phases[phase.value]["busy_s"] for r in items if phase.value in r.phases]
            if values:
                phases[phase.value] = {
                    "min_s": min(values),
                    "median_s": statistics.median(values),
                    "max_s": max(values),
                }
        gbps = [r.phases["fetch"]["gbps"] for r in items if "gbps" in r.phases.get("fetch", {})]
        entry = {
            "strategy": strategy,
            "cache": cache,
            "concurrency": conc,
            "repeats": len(items),
            "rto_s": {"min": min(walls), "median": statistics.median(walls), "max": max(walls)},
            "phases": phases,
            "peak_rss_bytes": max(r.peak_rss_bytes for r in items),
            "read_bytes": statistics.median(r.read_bytes for r in items),
            "first_step": items[0].first_step,
        }
        estimates = [r.first_step_estimate_s for r in items if r.first_step_estimate_s]
        if estimates:
            entry["first_step_estimate_s"] = statistics.median(estimates)
        if gbps:
            entry["fetch_gbps_median"] = statistics.median(gbps)
            if ceiling and ceiling.read_gbps and cache == "cold":
                entry["fraction_of_ceiling"] = entry["fetch_gbps_median"] / ceiling.read_gbps
        out.append(entry)
    return out


CSV_COLUMNS = (
    "strategy",
    "cache",
    "concurrency",
    "repeat",
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
                r.retries,
                r.errors,
                r.trace_id,
            ]
        )
    atomic_write(csv_path, buf.getvalue())
    return json_path, csv_path


def payload(runner, options, ceiling, telemetry, partial: bool = False) -> dict:
    """results.json: the spec, options, environment, ceiling, runs and their medians."""
    from ckptprof import __version__
    from ckptprof.env import capture
    from ckptprof.synth.device import DEVICE, device_attributes

    runs, failures, stats = runner.runs, runner.failures, runner.storage.stats
    attempted = len(runs) + len(failures)
    return {
        "ckptprof_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "location": runner.storage.uri,
        "spec": runner.spec.to_dict(),
        "options": {
            "verify": options.verify,
            "world_size": runner.world_size,
            "ranks": runner.ranks,
            "strategies": list(options.strategies),
            "memory_budget": runner.memory_budget,
            "part_size": options.part_size,
            "repeat": options.repeat,
            "caches": list(options.caches),
            "concurrency": list(options.concurrency),
            "device": device_attributes(runner.device)[DEVICE],
        },
        "environment": capture(
            {**runner.storage.describe(), "fetch.part_size": str(options.part_size)}
        ),
        "ceiling": ceiling.to_dict(),
        "state_bytes": runner.state.nbytes,
        "read_files": len(runner.files),
        "runs": [r.to_dict() for r in runs],
        "summary": summarize(runs, ceiling),
        "success_rate": len(runs) / attempted if attempted else 0.0,
        "failures": failures,
        "requests": {
            "requests": stats.requests,
            "retries": stats.retries,
            "errors": stats.errors,
        },
        "trace_file": str(telemetry.trace_file),
        "partial": partial,
    }


def run_line(run: RunRecord, ceiling) -> str:
    """One finished run, as the sweep prints it."""
    fetch = run.phases.get("fetch", {})
    frac = ""
    if fetch.get("gbps") and ceiling.read_gbps and run.cache == "cold":
        frac = f" ({fetch['gbps'] / ceiling.read_gbps:.0%} of ceiling)"
    resident = "" if run.resident_fraction is None else f" resident={run.resident_fraction:.1%}"
    phases = " ".join(f"{k}={v['busy_s']:.3f}" for k, v in run.phases.items())
    step = (
        f" (+ first_step ~{run.first_step_estimate_s:.3f}s estimated)"
        if run.first_step == STEP_ESTIMATE and run.first_step_estimate_s
        else ""
    )
    return (
        f"{run.strategy:9} {run.cache:4} x{run.concurrency:<3} #{run.repeat} "
        f"RTO {run.wall_s:.3f}s{step} fetch {fetch.get('gbps', 0):.2f} GB/s{frac}{resident} "
        f"peak RSS {run.peak_rss_bytes / 1e9:.2f} GB | {phases}"
    )


__all__ = ["RunRecord", "payload", "phases_of", "run_line", "summarize", "write_results"]
