"""``--format json``: the aggregated report for scripts, not the raw spans."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ckptprof.report.aggregate import Report
from ckptprof.report.cut_short import cut_short_json


def to_dict(report: Report) -> dict[str, Any]:
    """Plain dicts and lists; phase sums, overlap, each fused phase's ``fused_phases``
    (the phases its one interval stands for), the save/restore ratios and the
    checkpoint intervals' shares are computed fields."""
    out = dataclasses.asdict(report)
    out["cut_short"] = cut_short_json(report.cut_short)
    breakdowns = [g.breakdown for g in report.groups] + [
        row.breakdown for s in report.sweeps for row in s.rows
    ]
    dicts = [g["breakdown"] for g in out["groups"]] + [
        row["breakdown"] for s in out["sweeps"] for row in s["rows"]
    ]
    for b, d in zip(breakdowns, dicts, strict=True):
        if b is not None:
            d["phase_sum_s"] = b.phase_sum_s
            d["overlapped"] = b.overlapped
            d["outside_phases_s"] = b.outside_phases_s
            for row, phase in zip(b.phases, d["phases"], strict=True):
                if row.fused:
                    phase["fused_phases"] = list(row.fused_phases)
    for pair, d in zip(report.save_restore, out["save_restore"], strict=True):
        d.update(save_gbps=pair.save_gbps, restore_gbps=pair.restore_gbps, ratio=pair.ratio)
    for interval, d in zip(report.intervals, out["intervals"], strict=True):
        d.update(
            interval_s=interval.interval_s,
            save_share=interval.save_share,
            lost_share=interval.lost_share,
            restore_share=interval.restore_share,
            overhead_share=interval.overhead_share,
        )
    return out


def render_json(report: Report) -> str:
    """The report as indented JSON (stable key order as the dataclasses define it)."""
    return json.dumps(to_dict(report), indent=2, default=str) + "\n"
