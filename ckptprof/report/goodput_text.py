"""The goodput as a person or a script reads it: the table of each process's buckets and
the job's, and its JSON (the numbers are report/goodput.py's)."""

from __future__ import annotations

from ckptprof.report.goodput import BUCKETS, LABELS, Goodput


def render_goodput(g: Goodput) -> str:
    """The table a person reads: per process and for the job, and the goodput share."""
    from ckptprof.units import fmt_pct

    names = [f"process {i + 1}" for i in range(len(g.lifetimes))]
    headers = ["bucket", *names, "job", "share"] + (["cost"] if g.price_per_hour else [])
    rows = []
    for bucket in BUCKETS:
        cells = []
        for i, lt in enumerate(g.lifetimes):
            value = g.downtimes_s[i] if bucket == "downtime" and i < len(g.downtimes_s) else None
            value = lt.buckets.get(bucket, 0.0) if bucket != "downtime" else (value or 0.0)
            cells.append(f"{value:.2f}")
        share = g.total[bucket] / g.wall_s if g.wall_s else 0.0
        row = [LABELS[bucket], *cells, f"{g.total[bucket]:.2f}", fmt_pct(share)]
        if g.price_per_hour:
            row.append(f"{g.cost(bucket):.4f}")
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells) -> str:
        first = str(cells[0]).ljust(widths[0])
        return "  " + "  ".join(
            [first] + [str(c).rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        )

    job = f"job {g.job} ({len(g.lifetimes)} process(es))" if g.job else (
        f"a job of {len(g.lifetimes)} process(es)"
    )  # fmt: skip
    out = [
        f"goodput of {job}, {g.wall_s:.2f} s of wall time "
        f"(seconds; downtime in the column of the process it follows):",
        line(headers),
        *[line(r) for r in rows],
        f"  goodput: {fmt_pct(g.goodput)} of the job's wall time trained the model",
    ]
    for i, lt in enumerate(g.lifetimes):
        facts = [f"pid {lt.pid}" if lt.pid else "", f"{lt.wall_s:.2f} s"]
        if lt.first_step is not None:
            facts.append(f"steps {lt.first_step}->{lt.last_step}")
        if lt.resumed_from is not None:
            facts.append(f"resumed from step {lt.resumed_from}")
        if lt.lost_steps:
            facts.append(f"{lt.lost_steps} steps after its last usable save lost")
        if lt.unseen_s:
            facts.append(
                f"its last {lt.unseen_s:.2f} s (steps to {lt.last_step}) from the next "
                "process's interruption record: killed before it wrote its end"
            )
        if lt.restore_phases:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in lt.restore_phases.items())
            facts.append(f"restore by phase: {parts}")
        out.append(f"  process {i + 1}: " + "; ".join(f for f in facts if f))
    if any(lt.overrun_s > 0.01 for lt in g.lifetimes):
        out.append("  note: a process's buckets exceed its wall time (clocks of its spans overlap)")
    if g.price_per_hour:
        lost = g.wall_s - g.total["productive"]
        out.append(
            f"  at {g.price_per_hour:g}/hour: {g.wall_s / 3600 * g.price_per_hour:.4f} in all, "
            f"{lost / 3600 * g.price_per_hour:.4f} not training"
        )
    return "\n".join(out) + "\n"


def goodput_json(g: Goodput) -> dict:
    import dataclasses

    return {
        "job": g.job,
        "wall_s": g.wall_s,
        "goodput": g.goodput,
        "total": g.total,
        "downtimes_s": g.downtimes_s,
        "price_per_hour": g.price_per_hour,
        "cost": {b: g.cost(b) for b in BUCKETS} if g.price_per_hour else None,
        "lifetimes": [{**dataclasses.asdict(lt), "wall_s": lt.wall_s} for lt in g.lifetimes],
    }


__all__ = ["goodput_json", "render_goodput"]
