"""Plain-text tables for a terminal (as wide as it is, 60-160 columns), built by hand."""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ckptprof.manifest import SAMPLE_BLOCK, SAMPLE_BLOCKS
from ckptprof.phases import FUSED_SEPARATOR, Phase, fused_detail
from ckptprof.report.aggregate import (
    Breakdown,
    OperationGroup,
    OperationRow,
    Report,
    Sweep,
    VerifyCoverage,
    aggregate,
    phase_order,
)
from ckptprof.report.breakdown import PhaseRow, SweepRow
from ckptprof.report.cut_short import cut_short_lines
from ckptprof.report.hints import Hint
from ckptprof.report.load import ReportData
from ckptprof.report.outside import outside_phrase
from ckptprof.report.skew import skew_rows, skew_sentence
from ckptprof.units import UNITS_NOTE, fmt_bytes, fmt_gbps, fmt_pct, fmt_s, terminal_width

INDENT = "  "
_SHORT_PHASE = {Phase.DESERIALIZE.value: "deser", Phase.FIRST_STEP.value: "1st_step"}


# --------------------------------------------------------------------- formatting
def table(headers: Sequence[str], rows: Iterable[Sequence[str]], align: str) -> list[str]:
    """Fixed-width columns separated by two spaces; ``align`` has one l/r per column."""
    rows = [list(r) for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(c).ljust(w) if a == "l" else str(c).rjust(w)
            for c, w, a in zip(cells, widths, align, strict=False)
        ]
        return (INDENT + "  ".join(parts)).rstrip()

    return [line(headers)] + [line(r) for r in rows]


def _wrap(text: str, first: str, rest: str | None = None) -> list[str]:
    return textwrap.wrap(
        text,
        terminal_width(),
        initial_indent=first,
        subsequent_indent=rest if rest is not None else " " * len(first),
        break_on_hyphens=False,
        break_long_words=False,
    )


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


def _hint_lines(hints: Sequence[Hint]) -> list[str]:
    lines: list[str] = []
    for hint in hints:
        lines += _wrap(hint.message, f"{INDENT}hint: ")
    return lines


def _verify_lines(c: VerifyCoverage | None) -> list[str]:
    """What verify covered: ``sample`` passing is not ``full`` passing."""
    if c is None:
        return []
    of_total = f" of {fmt_bytes(c.total_bytes)}" if c.total_bytes else ""
    if c.mode == "full":
        text = f"every byte hashed (xxh3){of_total}"
    elif c.mode == "sample":
        share = f" ({c.checked_bytes / c.total_bytes:.1%})" if c.total_bytes else ""
        text = (
            f"{fmt_bytes(c.checked_bytes)}{of_total} hashed{share}: a file over "
            f"{fmt_bytes(SAMPLE_BLOCKS * SAMPLE_BLOCK)} only in {SAMPLE_BLOCKS} ranges of "
            f"{fmt_bytes(SAMPLE_BLOCK)}, so a corrupt byte outside them passes (--verify full "
            "checks every byte)"
        )
    elif c.mode == "size":
        text = "sizes only, no byte hashed: corruption that keeps the size passes"
    else:
        text = "nothing checked"
    return _wrap(f"verify {c.mode}: {text}", INDENT, INDENT * 2)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# --------------------------------------------------------------------- trace groups
def _overlap_lines(b: Breakdown, wall_word: str) -> list[str]:
    text = (
        f"sum of phases {fmt_s(b.phase_sum_s)} s vs wall (critical path) {fmt_s(b.wall_median_s)} s"
    )
    if b.overlapped:
        text += f": phases overlapped (by {fmt_s(b.phase_sum_s - b.wall_median_s)} s)"
    elif b.outside_phases_s:
        text += f": {outside_text(b, wall_word)}"
    return _wrap(text, INDENT, INDENT * 2)


def outside_text(b: Breakdown, wall_word: str) -> str:
    """ "0.596 s (54% of RTO) outside any phase: 0.310 s in foo (file:line), …", the
    functions where the training thread was sampled; "" when no time is outside."""
    if not b.outside_phases_s:
        return ""
    share = b.outside_phases_s / b.wall_median_s
    text = f"{fmt_s(b.outside_phases_s)} s ({share:.0%} of {wall_word}) outside any phase"
    named = outside_phrase(b.outside_named, b.outside_phases_s)
    return f"{text}: {named}" if named else text


def fused_label(r: PhaseRow) -> str:
    """The phases ``r`` ran fused with and the detail: "deserialize+reshard, dcp.load"."""
    joined = FUSED_SEPARATOR.join(r.fused_phases) or str(r.fused)
    detail = fused_detail(r.fused) if r.fused else None
    return f"{joined}, {detail}" if detail else joined


def phase_note(b: Breakdown, r: PhaseRow) -> str:
    """What to know about a phase's time beside the number: emulated, fused with others
    (one interval for several phases), lazy (a fetch whose reads continue later)."""
    notes = ["emulated"] if r.emulated else []
    into = [o.phase for o in b.phases if o is not r and r.phase in o.fused_phases]
    if r.fused:
        notes.append(f"(fused: {fused_label(r)})")
    elif into:
        notes.append(f"(fused into {', '.join(into)})")
    if r.lazy:
        notes.append("(lazy: pages read on demand, some inside deserialize)")
    return " ".join(notes)


def ceiling_cell(row: SweepRow) -> str:
    """A sweep row's fetch as a share of the storage ceiling: "fused" or "lazy" where
    fetch is no storage read of its own, "100%+" where the measure was above it."""
    if row.ceiling_mark in ("fused", "lazy"):
        return row.ceiling_mark
    if row.fraction_of_ceiling is None:
        return "-"
    return f"{row.fraction_of_ceiling:.0%}" + ("+" if row.ceiling_mark == "capped" else "")


def sweep_notes(sweep: Sweep) -> list[str]:
    """One sentence per fused or lazy phase of the sweep, and one for fetches measured
    above the ceiling (shown capped)."""
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
    return list(notes)


def _phase_table(b: Breakdown, wall_word: str) -> list[str]:
    rows = []
    for r in b.phases:
        rows.append(
            [
                r.phase,
                fmt_s(r.busy_s),
                fmt_pct(r.share),
                fmt_bytes(r.nbytes),
                fmt_gbps(r.gbps),
                "-" if r.files is None else str(r.files),
                phase_note(b, r),
            ]
        )
    headers = ["phase", "busy s", f"of {wall_word}", "bytes", "GB/s", "files", ""]
    return table(headers, rows, "lrrrrrl")


def render_group(group: OperationGroup, by: str = "phase") -> list[str]:
    """One trace group: header, counts, the phase table, overlap, ranks, hints."""
    noun = "restore" if group.kind == "restore" else "save"
    wall_word = "RTO" if group.kind == "restore" else "save time"
    config = " ".join(f"{k}={v}" for k, v in group.config.items())
    lines = _wrap(f"{noun}: {config}" if config else noun, "", INDENT * 2)
    b = group.breakdown
    facts = []
    if b is not None:
        state = ""
        if b.state_s is not None and b.phase(Phase.FIRST_STEP) is not None:
            median, low, high = b.state_s  # a synthetic restore: the storage's part first
            state = (f"time to state (list -> reshard) median {fmt_s(median)} s (min "
                     f"{fmt_s(low)}, max {fmt_s(high)}), the first step beside it: ")  # fmt: skip
        facts.append(
            f"{_plural(b.repeats, noun)}, {state}{wall_word} median {fmt_s(b.wall_median_s)} s "
            f"(min {fmt_s(b.wall_min_s)}, max {fmt_s(b.wall_max_s)})"
        )
    if group.failed:
        verb = "not counted" if b is not None else "nothing to summarise"
        why = f": {group.failure}" if group.failure else ""
        facts.append(f"{group.failed} failed, {verb}{why}")
    if group.retries or group.errors:
        facts.append(f"retries {group.retries}, errors {group.errors}")
    if group.of_write_ceiling is not None:
        share = group.of_write_ceiling
        above = ", above it: the short probe ran slower than the saves" if share > 1 else ""
        facts.append(
            f"{fmt_pct(min(share, 1.0))} of the write ceiling "
            f"({fmt_gbps(group.write_ceiling_gbps)} GB/s{above})"
        )
    lines += _wrap("; ".join(facts), INDENT)
    if b is None:
        return lines
    if by == "run":
        lines += _runs_table(group.operations, phase_order(group.kind, _names(group.operations)))
    elif b.phases:
        lines += _phase_table(b, wall_word)
        lines += _overlap_lines(b, wall_word)
    lines += _verify_lines(group.verify_coverage)
    if group.ranks is not None:
        rs = group.ranks
        host = f" on {rs.slowest_host}" if rs.slowest_host else ""
        text = (
            f"slowest rank {rs.slowest_rank}{host}: {wall_word} {fmt_s(rs.slowest_wall_s)} s; "
            f"fastest rank {rs.fastest_rank}: {fmt_s(rs.fastest_wall_s)} s ({rs.ranks} ranks"
        )
        text += "; the table shows the slowest)" if by != "run" else ")"
        lines += _wrap(text, INDENT)
    lines += _skew_lines(group.skews)
    if group.reads is not None and (group.reads.ranks > 1 or group.reads.amplification > 1.05):
        r = group.reads
        lines += _wrap(
            f"read by {_plural(r.ranks, 'rank')}: {fmt_bytes(r.read_bytes)} for a "
            f"{fmt_bytes(r.checkpoint_bytes)} checkpoint (read amplification "
            f"{r.amplification:.2f}x)",
            INDENT,
        )
    if group.memory is not None:
        lines += _wrap(
            f"memory: the resume peaked at {fmt_bytes(group.memory.peak_rss_bytes)} resident; "
            f"{fmt_bytes(group.memory.training_rss_bytes)} while training (at the save)",
            INDENT,
        )
    if group.after_resume is not None:
        ar = group.after_resume
        text = f"after the resume: median step {fmt_s(ar.step_median_s)} s over {ar.steps} steps"
        if ar.before_save_step_median_s:
            text += (
                f" vs {fmt_s(ar.before_save_step_median_s)} s before the save ({ar.slowdown:.2f}x)"
            )
        lines += _wrap(text, INDENT)
    lines += _hint_lines(group.hints)
    return lines


def _names(operations: Iterable[OperationRow]) -> set[str]:
    return {name for op in operations for name in op.phases}


def _runs_table(operations: Sequence[OperationRow], names: Sequence[str]) -> list[str]:
    """``--by run``: each operation as measured, no medians."""
    show_rank = any(op.rank is not None for op in operations)
    show_cell = any(op.concurrency is not None for op in operations)
    headers = ["start"] if any(op.start for op in operations) else []
    if show_cell:
        headers += ["cache", "conc"]
    headers += ["rep"] + (["rank"] if show_rank else []) + ["wall s"] + list(names) + [""]
    rows = []
    for op in operations:
        row = [op.start[11:23] if op.start else "-"] if headers[0] == "start" else []
        if show_cell:
            row += [str(op.cache or "-"), "-" if op.concurrency is None else str(op.concurrency)]
        row += ["-" if op.repeat is None else str(op.repeat)]
        row += (["-" if op.rank is None else str(op.rank)] if show_rank else []) + [
            fmt_s(op.wall_s)
        ]
        row += [fmt_s(op.phases.get(n)) for n in names] + ["FAILED" if op.failed else ""]
        rows.append(row)
    align = "".join("l" if h in ("start", "cache") else "r" for h in headers[:-1]) + "l"
    return table(headers, rows, align)


# --------------------------------------------------------------------- results sweeps
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


def _sweep_table(sweep: Sweep) -> list[str]:
    names = phase_order("restore", {r.phase for row in sweep.rows for r in row.breakdown.phases})
    any_emulated = False

    def build(level: int) -> list[str]:
        """0: everything; 1: short phase names; 2: also no headline range; 3: no run count.
        The headline: the time to state where a first step ran here (the storage's part;
        the step and the RTO beside it), else the RTO."""
        nonlocal any_emulated
        short, uncounted = level >= 2, level >= 3
        labels = [_SHORT_PHASE.get(n, n) if level else n for n in names]
        first = ["strategy"] if strategies else []
        counts = [] if uncounted else ["runs"]
        head = "to state" if to_state else "RTO s"
        head += "" if short else " (min-max)"
        headers = [*first, "cache", "conc", *counts, head, *labels]
        headers += ["RTO s"] if to_state else []
        headers += ["GB/s", "ceil"] + (["peak GB"] if peaks else [])
        rows = []
        for row in sweep.rows:
            b = row.breakdown
            spread = b.state_s if to_state and b.state_s else None
            median, low, high = spread or (b.wall_median_s, b.wall_min_s, b.wall_max_s)
            headline = fmt_s(median) + ("" if short else f" ({fmt_s(low)}-{fmt_s(high)})")
            cells = [
                *([b.strategy or "-"] if strategies else []),
                str(b.cache or "-"),
                "-" if b.concurrency is None else str(b.concurrency),
                *([] if uncounted else [str(b.repeats)]),
                headline,
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
        lead = ("l" if strategies else "") + "lr" + ("r" if not uncounted else "") + "l"
        return table(headers, rows, lead + "r" * (len(names) + 2 + int(peaks) + int(to_state)))

    strategies = len({row.breakdown.strategy for row in sweep.rows}) > 1
    to_state = "first_step" in names and any(r.breakdown.state_s for r in sweep.rows)
    peaks = any(row.breakdown.peak_rss_bytes for row in sweep.rows)
    for level in range(4):
        lines = build(level)
        if max(len(x) for x in lines) <= terminal_width():
            break
    if any_emulated:
        lines.append(f"{INDENT}* emulated: an estimate, not a measurement")
    if to_state:
        lines += _wrap(
            "to state: list -> reshard, what the storage and the loader control (the RTO less "
            "the first step, which is this machine's compute unless given with --first-step-s)",
            INDENT,
            INDENT * 2,
        )
    for note in sweep_notes(sweep):
        lines += _wrap(note, INDENT, INDENT * 2)
    estimates = [r.breakdown.first_step_estimate_s for r in sweep.rows]
    estimates = [e for e in estimates if e]
    if estimates:
        lines += _wrap(
            f"RTO ends with the state restored: the first training step could not run here, "
            f"so it is estimated beside it (≈{fmt_s(statistics.median(estimates))} s, "
            "extrapolated from 1- and 2-layer steps), not in it; --first-step-s takes the "
            "step time measured in the real job.",
            INDENT,
            INDENT * 2,
        )
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
    lines = _wrap(f"results: {sweep.path}" + (f" ({made})" if made else ""), "", INDENT * 2)
    for title, mapping in (("spec", sweep.spec), ("options", sweep.options)):
        text = " ".join(
            f"{k}={v}" for k, v in mapping.items() if isinstance(v, (str, int, float)) and v != ""
        )
        if text:
            lines += _wrap(f"{title}: {text}", INDENT, INDENT * 3)
    env = env_highlights(sweep.environment)
    if env:
        lines += _pack(env, f"{INDENT}env: ", INDENT * 3, max_lines=2)
    ceiling = _ceiling_line(sweep)
    if ceiling:
        lines += _wrap(ceiling, INDENT, INDENT * 3)
    reliability = _reliability_line(sweep.reliability)
    if reliability:
        lines += _wrap(reliability, INDENT, INDENT * 3)
    if by == "run":
        lines += _runs_table(sweep.operations, phase_order("restore", _names(sweep.operations)))
    elif sweep.rows:
        lines += _sweep_table(sweep)
    else:
        lines.append(f"{INDENT}no runs recorded")
    lines += _job_lines(sweep.job)
    lines += _skew_lines(sweep.skews)
    lines += _verify_lines(sweep.verify_coverage)
    lines += _hint_lines(sweep.hints)
    return lines


def _skew_lines(skews) -> list[str]:
    """When each rank began and was done (report/skew.py), the worst operation's."""
    sentence = skew_sentence(skews)
    if sentence is None:
        return []
    return _wrap(sentence, INDENT, INDENT * 3) + [INDENT * 2 + row for row in skew_rows(skews)]


JOB_RANK_ROWS = 16  # ranks listed one per row; beyond, the slowest and fastest


def _job_lines(job: dict) -> list[str]:
    """A distributed job: the RTO rule, the spread, bytes read and per rank / per node."""
    rows = [r for r in job.get("per_rank") or [] if isinstance(r, dict)]
    if not rows:
        return []
    nodes = [n for n in job.get("per_node") or [] if isinstance(n, dict)]
    amp = job.get("read_amplification")
    head = (
        f"job: {_plural(len(rows), 'rank')} on {_plural(len(nodes) or 1, 'node')}, one process "
        f"each; RTO = the slowest rank's (rank {job.get('slowest_rank')}, "
        f"{_num(job.get('slowest_rank_s'))} s; fastest rank {job.get('fastest_rank')}, "
        f"{_num(job.get('fastest_rank_s'))} s; spread {_num(job.get('spread_s'))} s per run)"
    )
    lines = _wrap(head, INDENT, INDENT * 3)
    read = (
        f"read by all ranks {fmt_bytes(job.get('read_bytes_all_ranks'))} for a "
        f"{fmt_bytes(job.get('checkpoint_bytes'))} checkpoint"
        + (f" (read amplification {amp:.2f}×)" if isinstance(amp, (int, float)) else "")
        + f"; aggregate {_num(job.get('aggregate_gbps'), 2)} GB/s"
    )
    lines += _wrap(read, INDENT * 2, INDENT * 3)
    shown = rows
    if len(rows) > JOB_RANK_ROWS:
        by_time = sorted(rows, key=lambda r: r.get("wall_s") or 0)
        shown = by_time[:2] + by_time[-(JOB_RANK_ROWS - 2) :]
    columns = f"{'rank':>5} {'node':>5}  {'read':>10} {'RTO s':>7} {'fetch s':>8}  host"
    lines.append(f"{INDENT * 2}{columns}")
    for r in sorted(shown, key=lambda r: r.get("rank") or 0):
        lines.append(
            f"{INDENT * 2}{r.get('rank', '?'):>5} {r.get('node', '?'):>5}  "
            f"{fmt_bytes(r.get('read_bytes')):>10} {_num(r.get('wall_s')):>7} "
            f"{_num(r.get('fetch_s')):>8}  {r.get('host') or ''}"
        )
    if len(shown) < len(rows):
        lines.append(f"{INDENT * 2}… {len(rows) - len(shown)} more ranks in results.json (job)")
    if len(nodes) > 1:
        for n in nodes:
            lines.append(
                f"{INDENT * 2}node {n.get('node')} ({n.get('host')}): {n.get('ranks')} ranks, "
                f"{fmt_bytes(n.get('read_bytes'))}, slowest {_num(n.get('wall_s'))} s"
            )
    return lines


def _num(value, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "?"


# --------------------------------------------------------------------- entry
def render_save_restore(pairs) -> list[str]:
    """Each checkpoint's save beside its restore: GB/s both ways and their ratio."""
    lines = ["save vs restore of the same checkpoint (write/read as MLPerf Storage reports it):"]
    for p in pairs:
        what = "blocking part of the async save" if p.blocking_only else "save"
        ratio = f"{p.ratio:.2f}" if p.ratio is not None else "-"
        lines.append(f"  {p.location} ({p.strategy or 'save'}, median of {p.saves})")
        lines.append(
            f"    {what} {fmt_s(p.save_s)} s, {fmt_gbps(p.save_gbps)} GB/s; restore "
            f"({p.restore_label}) {fmt_s(p.restore_s)} s, {fmt_gbps(p.restore_gbps)} GB/s; "
            f"write/read ratio {ratio}"
        )
    return lines


def render_intervals(intervals) -> list[str]:
    """The checkpoint interval each save's cost asks for at the given MTBI (Young/Daly)."""
    mtbi = intervals[0].mtbi_s
    lines = [
        f"checkpoint interval for a mean time between interruptions of {_duration(mtbi)} "
        "(Young/Daly: sqrt(2 x save x MTBI)):"
    ]
    for i in intervals:
        restore = f", restores {fmt_pct(i.restore_share)}" if i.restore_share is not None else ""
        lines.append(
            f"  {i.location}: save {fmt_s(i.save_s)} s -> every {_duration(i.interval_s)}; "
            f"saving takes {fmt_pct(i.save_share)} of the time, work lost to interruptions "
            f"{fmt_pct(i.lost_share)}{restore} (total {fmt_pct(i.overhead_share)})"
        )
    return lines


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def render_text(report: Report | ReportData, by: str = "phase") -> str:
    """The whole report: results sweeps first, then trace groups, blank-line separated.

    Args:
        report: from :func:`ckptprof.report.aggregate` (or straight from ``load``,
            which is then aggregated here).
        by: ``phase`` for medians per phase, ``run`` for one row per operation.
    """
    if isinstance(report, ReportData):
        report = aggregate(report)
    blocks = [render_sweep(s, by) for s in report.sweeps]
    blocks += [render_group(g, by) for g in report.groups]
    if report.save_restore:
        blocks.append(render_save_restore(report.save_restore))
    if report.intervals:
        blocks.append(render_intervals(report.intervals))
    if report.cut_short:
        blocks.append(cut_short_lines(report.cut_short))
    blocks.append([UNITS_NOTE])  # said once, for every number above
    return "\n\n".join("\n".join(block) for block in blocks) + "\n"
