"""``ckptprof compare --format json``: the comparison for scripts, with a schema_version."""

from __future__ import annotations

import json
from dataclasses import asdict

from ckptprof.report.comparison import SAVE, Comparison, setting_order

SCHEMA_VERSION = 1


def render_json(c: Comparison) -> str:
    doc = {
        "schema_version": SCHEMA_VERSION,
        "base": c.sources[0],
        "sources": c.sources,
        "by": c.by,
        "ranked_by": c.metrics(),
        "limit": c.limit,
        "cost_per_hour": c.cost_per_hour,
        "instances": c.instances,
        "settings": {
            setting: [
                {
                    "source": e.source,
                    "kind": e.kind,
                    "ranked_by": e.metric,
                    "runs": len(e.values),
                    "median_s": e.median,
                    "min_s": min(e.values),
                    "max_s": max(e.values),
                    "rto_median_s": e.rto_median if e.kind != SAVE else None,
                    "rto_min_s": min(e.walls) if e.kind != SAVE else None,
                    "rto_max_s": max(e.walls) if e.kind != SAVE else None,
                    "time_to_state_median_s": e.tts_median,
                    "gbps": e.gbps,
                    "of_ceiling": e.of_ceiling,
                    "above_ceiling": e.above_ceiling,
                    "writer": e.writer,
                    "phases_median_s": {n: e.phase_median(n) for n in e.phases},
                    "cost": c.cost(e.rto_median),
                    "files": e.origins,
                }
                for e in sorted(c.entries[setting], key=lambda e: e.median)
            ]
            for setting in setting_order(c)  # as the text and the plot list them
        },
        "different_writers": c.writers,
        "findings": [asdict(f) for f in c.findings],
        "regressions": [asdict(f) for f in c.regressions],
        "not_judged": [
            {**asdict(u), "fails_gate": c.limit is not None and u.guarded} for u in c.not_judged()
        ],
        "gate_failure": c.gate_failure(),
        "checkpoints": {s: c.checkpoints_of(s) for s in c.sources},
    }
    return json.dumps(doc, indent=2) + "\n"


__all__ = ["SCHEMA_VERSION", "render_json"]
