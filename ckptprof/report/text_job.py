"""A distributed job's part of a results file as text: the RTO rule (the slowest rank's),
the spread, the bytes read, one row per rank (or the slowest and fastest) and per node."""

from __future__ import annotations

from ckptprof.report.text_format import INDENT, plural, wrap
from ckptprof.units import fmt_bytes

JOB_RANK_ROWS = 16  # ranks listed one per row; beyond, the slowest and fastest


def job_lines(job: dict) -> list[str]:
    """A distributed job: the RTO rule, the spread, bytes read and per rank / per node."""
    rows = [r for r in job.get("per_rank") or [] if isinstance(r, dict)]
    if not rows:
        return []
    nodes = [n for n in job.get("per_node") or [] if isinstance(n, dict)]
    amp = job.get("read_amplification")
    head = (
        f"job: {plural(len(rows), 'rank')} on {plural(len(nodes) or 1, 'node')}, one process "
        f"each; RTO = the slowest rank's (rank {job.get('slowest_rank')}, "
        f"{_num(job.get('slowest_rank_s'))} s; fastest rank {job.get('fastest_rank')}, "
        f"{_num(job.get('fastest_rank_s'))} s; spread {_num(job.get('spread_s'))} s per run)"
    )
    lines = wrap(head, INDENT, INDENT * 3)
    read = (
        f"read by all ranks {fmt_bytes(job.get('read_bytes_all_ranks'))} for a "
        f"{fmt_bytes(job.get('checkpoint_bytes'))} checkpoint"
        + (f" (read amplification {amp:.2f}×)" if isinstance(amp, (int, float)) else "")
        + f"; aggregate {_num(job.get('aggregate_gbps'), 2)} GB/s"
    )
    lines += wrap(read, INDENT * 2, INDENT * 3)
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
