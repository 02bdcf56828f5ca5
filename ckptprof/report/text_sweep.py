"""One results file (a synthetic sweep) as text: provenance, spec, the environment's
highlights, the ceiling, reliability, the sweep table with its notes, the job's ranks."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ckptprof.phases import Phase
from ckptprof.report.breakdown import Breakdown, Sweep, SweepRow
from ckptprof.report.medians import phase_order
from ckptprof.report.text_format import (
    INDENT,
    hint_lines,
    phase_names,
    runs_table,
    skew_lines,
    table,
    verify_lines,
    wrap,
)
from ckptprof.report.text_job import job_lines
from ckptprof.units import fmt_bytes, fmt_gbps, fmt_s, terminal_width

_SHORT_PHASE = {Phase.DESERIALIZE.value: "deser", Phase.FIRST_STEP.value: "1st_step"}
_SHORTER_PHASE = {**_SHORT_PHASE, Phase.FIRST_STEP.value: "step"}


def _pack(items: Sequence[str], first: str, rest: str, max_lines: int) -> list[str]:
    """Comma-separated phrases, never split inside one; "…" when out of lines."""
    lines: list[str] = []
    current = first
    for index, item in enumerate(items):
        last = index == len(items) - 1
        piece = item + ("" if last else ",")
        fresh = current in (first, rest)
        if not fresh and len(current) + 1 + len(piece) > terminal_width():
            if len(lines) + 1 == max_lines:
                return [*lines, current + " …"]
            lines.append(current)
            current = rest
            fresh = True
        current += piece if fresh else " " + piece
    return [*lines, current]


def ceiling_cell(row: SweepRow) -> str:
    """A sweep row's fetch as a share of the storage ceiling: "fused" or "lazy" where
    fetch is no storage read of its own, "100%+" where the measure was above it."""
    if row.ceiling_mark in ("fused", "lazy"):
        return row.ceiling_mark
    if row.fraction_of_ceiling is None:
        return "-"
    return f"{row.fraction_of_ceiling:.0%}" + ("+" if row.ceiling_mark == "capped" else "")


def sweep_notes(sweep: Sweep) -> list[str]:
    """One sentence per fused or lazy phase of the sweep, one for fetches measured above
    the ceiling (shown capped), and one for a first step estimated beside the RTO."""
    notes: dict[str, None] = {}
    for row in sweep.rows:
        for r in row.breakdown.phases:
            if r.fused:
                unbounded = row.ceiling_mark == "fused" and Phase.FETCH.value in r.fused_phases
                notes[
                    f"{r.phase} is fused: one interval for {r.fused}"
                    + ("; no fraction of the ceiling" if unbounded else "")
                ] = None
            if r.lazy:
                notes[
                    f"{r.phase} is lazy: the loader reads pages on demand (mmap), so its "
                    "interval only warms the cache and some reads happen later, inside "
                    "deserialize; no fraction of the ceiling"
                ] = None
    capped = [row for row in sweep.rows if row.ceiling_mark == "capped"]
    if capped:
        cells = ", ".join(
            f"{row.breakdown.label} {row.fraction_above_ceiling:.0%}" for row in capped
        )
        notes[
            f"100%+: fetch measured above the storage ceiling ({cells}), shown capped: the "
            "ceiling is an estimate, or some reads came from the page cache"
        ] = None
    estimated = [r.breakdown for r in sweep.rows if r.breakdown.first_step_estimate_s]
    if estimated:
        seconds = statistics.median(b.first_step_estimate_s for b in estimated)
        tokens = estimated[0].first_step_tokens
        shape = f" for a step of {tokens:,} tokens" if tokens else ""
        notes[
            "RTO ends with the state restored: the first training step could not run here, "
            f"so it is estimated beside it (≈{fmt_s(seconds)} s{shape}, extrapolated from "
            "1- and 2-layer steps), not in it; --first-step-s takes the step time measured "
            "in the real job"
        ] = None
    return list(notes)


_VERSION_FIRST = ("python", "torch", "lightning", "pytorch-lightning", "transformers", "deepspeed")
_VERSION_SKIP = ("ckptprof",)  # already in the header


def _env_get(env: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        for key, value in env.items():
            if key == name or key.endswith("." + name) or key.endswith("_" + name):
                return value
    return None


def env_highlights(env: Mapping[str, Any]) -> list[str]:
    """The few environment facts a reader compares runs by, as short phrases.

    Reads the keys of ``ckptprof.env.capture`` (``storage.*``, ``version.<pkg>``,
    ``cpu.count``, ``memory.total_bytes``, ``os.kernel``) and tolerates others.
    """
    picks: list[str] = []
    kind = _env_get(env, "storage.kind", "storage_kind")
    uri = _env_get(env, "storage.uri", "storage_uri")
    if kind or uri:
        where = f" at {_short(uri, 40)}" if uri else ""
        picks.append(f"storage {kind or '?'}{where}")
    fs = _env_get(env, "storage.fs_type", "fs_type", "fstype")
    mount = _env_get(env, "storage.mount_options", "mount_options")
    if fs or mount:
        opts = f" ({_short(mount, 40)})" if mount else ""
        picks.append(f"fs {fs or '?'}{opts}")
    cpus = _env_get(env, "cpu.count", "cpu_count")
    if isinstance(cpus, int) and not isinstance(cpus, bool):
        picks.append(f"{cpus} CPUs")
    memory = _env_get(env, "memory.total_bytes", "memory_bytes")
    if isinstance(memory, int) and not isinstance(memory, bool):
        picks.append(f"{fmt_bytes(memory)} RAM")
    kernel = _env_get(env, "os.kernel", "kernel")
    if kernel:
        picks.append(f"kernel {_short(kernel, 20)}")
    cloud = _env_get(env, "cloud.provider")
    if cloud:
        picks.append(f"cloud {cloud}")
    versions: dict[str, Any] = {}
    for key, value in env.items():
        low = key.lower()
        if low.startswith("version."):
            versions[key[len("version.") :]] = value
        elif low.endswith((".version", "_version")):
            versions[key.rsplit(".", 1)[0] if "." in key else key[: -len("_version")]] = value
    ordered = [n for n in _VERSION_FIRST if n in versions]
    ordered += [n for n in versions if n not in ordered]
    picks += [f"{n} {_short(versions[n], 16)}" for n in ordered if n not in _VERSION_SKIP]
    return picks


def _short(value: Any, limit: int) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ceiling_line(sweep: Sweep) -> str | None:
    c = sweep.ceiling
    if c is None:
        return None
    parts = [f"read {fmt_gbps(c.read_gbps)} GB/s" + (f" ({c.source})" if c.source else "")]
    if c.request_latency_s is not None:
        parts.append(f"request latency {c.request_latency_s * 1000:.1f} ms")
    if c.lower_bound_fetch_s is not None:
        size = f" for {fmt_bytes(c.nbytes)}" if c.nbytes else ""
        parts.append(f"lower-bound fetch {fmt_s(c.lower_bound_fetch_s)} s{size}")
    if c.littles_law_inflight is not None:
        part = f" of {fmt_bytes(c.part_size)}" if c.part_size else ""
        parts.append(f"Little's Law: {c.littles_law_inflight:.1f} requests{part} in flight")
    return "ceiling: " + "; ".join(parts)


def _headline(spread: tuple[float, float, float], b: Breakdown, short: bool) -> str:
    """A row's median with its spread: "±–" (or "n=1") for one run, which has none."""
    median, low, high = spread
    if b.repeats < 2:
        return f"{fmt_s(median)} " + ("±–" if short else "(n=1)")
    if short:
        off = max(high - median, median - low) / median if median else 0.0
        return f"{fmt_s(median)} ±{off:.0%}"
    return f"{fmt_s(median)} ({fmt_s(low)}-{fmt_s(high)})"


def _sweep_table(sweep: Sweep) -> list[str]:
    names = phase_order("restore", {r.phase for row in sweep.rows for r in row.breakdown.phases})
    any_emulated = False

    def build(level: int) -> list[str]:
        """0: everything; 1: short phase names; 2: also the headline's range as ±% of it;
        3: "n", "c" and "step" for "runs", "conc" and "1st_step" (said under the table).
        The headline: the time to state where a first step ran here (the storage's part;
        the step and the RTO beside it), else the RTO. Its spread and the run count stay
        at every width: a median without them cannot be told from noise."""
        nonlocal any_emulated
        short = level >= 2
        shorter = _SHORTER_PHASE if level >= 3 else _SHORT_PHASE
        labels = [shorter.get(n, n) if level else n for n in names]
        first = ["strategy"] if strategies else []
        head = "to state" if to_state else "RTO s"
        head += " (±)" if short else " (min-max)"
        headers = [*first, "cache", *(["c", "n"] if level >= 3 else ["conc", "runs"]), head]
        headers += labels
        headers += ["RTO s"] if to_state else []
        headers += ["fetch GB/s", "ceil"] + (["peak GB"] if peaks else [])
        rows = []
        for row in sweep.rows:
            b = row.breakdown
            spread = b.state_s if to_state and b.state_s else None
            cells = [
                *([b.strategy or "-"] if strategies else []),
                str(b.cache or "-"),
                "-" if b.concurrency is None else str(b.concurrency),
                str(b.repeats),
                _headline(spread or (b.wall_median_s, b.wall_min_s, b.wall_max_s), b, short),
            ]
            for name in names:
                phase = b.phase(name)
                mark = "*" if phase is not None and phase.emulated else ""
                any_emulated = any_emulated or bool(mark)
                cells.append(fmt_s(phase.busy_s) + mark if phase else "-")
            cells += [fmt_s(b.wall_median_s)] if to_state else []
            cells += [fmt_gbps(row.fetch_gbps), ceiling_cell(row)]
            if peaks:
                peak = b.peak_rss_bytes
                cells.append("-" if not peak else f"{peak / 1e9:.2f}")
            rows.append(cells)
        lead = ("l" if strategies else "") + "lrrl"
        return table(headers, rows, lead + "r" * (len(names) + 2 + int(peaks) + int(to_state)))

    strategies = len({row.breakdown.strategy for row in sweep.rows}) > 1
    to_state = "first_step" in names and any(r.breakdown.state_s for r in sweep.rows)
    peaks = any(row.breakdown.peak_rss_bytes for row in sweep.rows)
    for level in range(4):
        lines = build(level)
        if max(len(x) for x in lines) <= terminal_width():
            break
    if level >= 3:
        step = "; step: first_step" if Phase.FIRST_STEP.value in names else ""
        lines.append(f"{INDENT}c: concurrency (requests in flight); n: runs{step}")
    lines.append(f"{INDENT}fetch GB/s: the fetch phase's bytes over its own time, not the RTO's")
    if any_emulated:
        lines.append(f"{INDENT}* emulated: an estimate, not a measurement")
    if to_state:
        lines += wrap(
            "to state: list -> reshard, what the storage and the loader control (the RTO less "
            "the first step, which is this machine's compute unless given with --first-step-s)",
            INDENT,
            INDENT * 2,
        )
    for note in sweep_notes(sweep):
        lines += wrap(note, INDENT, INDENT * 2)
    return lines


def _reliability_line(rel: dict) -> str:
    """Success rate and retries (a restore's third measure, beside its time and
    throughput), when there is news."""
    failures = rel.get("failures") or []
    requests = rel.get("requests") or {}
    retries, errors = requests.get("retries", 0), requests.get("errors", 0)
    if not (failures or retries or errors or rel.get("partial")):
        return ""
    parts = []
    if rel.get("partial"):
        parts.append("PARTIAL: the sweep was interrupted")
    if "success_rate" in rel:
        parts.append(f"success rate {rel['success_rate']:.0%} ({len(failures)} runs failed)")
    if requests:
        parts.append(
            f"storage: {requests.get('requests', 0)} requests, {retries} retries, "
            f"{errors} failed attempts"
        )
    if failures:
        parts.append(f"first failure: {failures[0].get('error', '?')}")
    return "reliability: " + "; ".join(parts)


def render_sweep(sweep: Sweep, by: str = "phase") -> list[str]:
    """One results file: provenance, spec, environment, ceiling, sweep table, hints."""
    made = ", ".join(
        p
        for p in (
            f"ckptprof {sweep.version}" if sweep.version else "",
            f"created {sweep.created}" if sweep.created else "",
        )
        if p
    )
    lines = wrap(f"results: {sweep.path}" + (f" ({made})" if made else ""), "", INDENT * 2)
    for title, mapping in (("spec", sweep.spec), ("options", sweep.options)):
        text = " ".join(
            f"{k}={v}" for k, v in mapping.items() if isinstance(v, (str, int, float)) and v != ""
        )
        if text:
            lines += wrap(f"{title}: {text}", INDENT, INDENT * 3)
    env = env_highlights(sweep.environment)
    if env:
        lines += _pack(env, f"{INDENT}env: ", INDENT * 3, max_lines=2)
    ceiling = _ceiling_line(sweep)
    if ceiling:
        lines += wrap(ceiling, INDENT, INDENT * 3)
    reliability = _reliability_line(sweep.reliability)
    if reliability:
        lines += wrap(reliability, INDENT, INDENT * 3)
    if by == "run":
        lines += runs_table(sweep.operations, phase_order("restore", phase_names(sweep.operations)))
    elif sweep.rows:
        lines += _sweep_table(sweep)
    else:
        lines.append(f"{INDENT}no runs recorded")
    lines += job_lines(sweep.job)
    lines += skew_lines(sweep.skews)
    lines += verify_lines(sweep.verify_coverage)
    lines += hint_lines(sweep.hints)
    return lines
