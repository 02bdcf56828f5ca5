"""A prediction as people read it (every assumption beside the number it feeds), as
JSON, and as a picture of time against nodes."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ckptprof.predict.measured import Measured
from ckptprof.predict.model import (
    Cost,
    Estimate,
    Given,
    Interval,
    JobPlan,
    Limits,
    predict_restore,
    predict_save,
)
from ckptprof.units import fmt_bytes


@dataclass(frozen=True)
class Prediction:
    plan: JobPlan
    measured: Measured
    limits: Limits
    restore: Estimate
    save: Estimate | None
    interval: Interval | None = None
    price_per_hour: float | None = None  # of one node


#: a save's moving part as measured: the writer serializes, writes and syncs in one
WRITE = "write (serialize, write, fsync)"


def _given(name: str, given: Given | None) -> str:
    return f"  {name}: {given.value:g} ({given.source})" if given else f"  {name}: not given"


def _costs(name: str, costs: dict[str, Cost]) -> list[str]:
    """Each phase's fixed, per-byte and per-file parts on one rank, with their source."""
    return [f"  {name} {phase}: {cost.describe()} ({cost.source})" for phase, cost in costs.items()]


def _estimate_lines(estimate: Estimate, verb: str) -> list[str]:
    cpu = "".join(f" + {name} {s:.2f} s" for name, s in estimate.cpu.items())
    lines = [
        f"{verb}: {estimate.total_s:.1f} s (transfer {estimate.transfer_s:.2f} s{cpu}); "
        f"binds: {estimate.limit_name}",
        f"  bytes: {fmt_bytes(estimate.rank_bytes)} on the busiest rank, "
        f"{fmt_bytes(estimate.job_bytes)} for the job, {estimate.requests:,} requests",
        f"  {'limit':<26} {'seconds':>10}  source",
    ]
    for bound in sorted(estimate.bounds, key=lambda b: -b.seconds):
        lines.append(f"  {bound.name:<26} {bound.seconds:>10.2f}  {bound.why}")
    nxt = estimate.runner_up
    if nxt is not None and nxt.seconds > 0:
        lines.append(
            f"  the next limit, {nxt.name}, is {estimate.binding.seconds / nxt.seconds:.2f}x "
            "further from binding"
        )
    return lines


def _node_notes(p: Prediction) -> list[str]:
    """The node's bandwidth the runs measured, where it is below the limit assumed for
    the job's nodes: said, never silently replaced (a node like the one measured is
    bound by it: --node-gbps)."""
    node = p.limits.node_gbps
    if node is None or not node.source.startswith("assumed"):
        return []
    notes = []
    for what, found in (("read", p.measured.read_ceiling), ("write", p.measured.write_ceiling)):
        if found is not None and found.value < node.value:
            notes.append(
                f"  note: the runs' node {what} at {found.value:.2f} GB/s ({found.source}), "
                f"below the {node.value:g} GB/s assumed: a job on nodes like it is bound "
                f"by it; give --node-gbps {found.value:.2f} to predict that"
            )
    return notes


def render_text(p: Prediction) -> str:
    plan, costs = p.plan, p.measured.costs
    lines = [
        f"planned job: {plan.model} ({plan.params / 1e9:.1f} B parameters), {plan.nodes} nodes "
        f"x {plan.ranks_per_node} ranks = {plan.world} ranks, {plan.sharding}"
        + (", Adam" if plan.optimizer else ", no optimizer state")
        + (" with fp32 master weights" if plan.master_weights else ""),
        f"state: {fmt_bytes(plan.total_bytes)} (weights {fmt_bytes(plan.weight_bytes)}, "
        f"optimizer {fmt_bytes(plan.optimizer_bytes)}); {plan.files_per_rank} file(s) per rank",
        "assumptions (each number's source):",
        *_costs("a rank's restore:", {"fetch": costs.read, **costs.cpu}),
        *_costs("a rank's save:", {WRITE: costs.write, **costs.save_cpu} if costs.write else {}),
        _given("the storage's aggregate GB/s", p.limits.storage_gbps)
        + ("" if p.limits.storage_gbps else " (no aggregate limit: --storage-gbps)"),
        _given("the node's network GB/s", p.limits.node_gbps),
        *_node_notes(p),
    ]
    if p.measured.object_store:
        lines += [_given("GETs per second", p.limits.get_rate),
                  _given("PUTs per second", p.limits.put_rate)]  # fmt: skip
    lines.append("")
    lines += _estimate_lines(p.restore, "restore (time to state)")
    if p.save is not None:
        lines += [""] + _estimate_lines(p.save, "save (blocking: a synchronous save)")
    if p.interval is not None:
        i = p.interval
        shares = ", ".join(f"{name} {share:.1%}" for name, share in i.shares.items())
        lines += ["", f"the job is interrupted every {i.job_mtbi_s / 60:.1f} min on average; "
                  f"save every {i.interval_s / 60:.1f} min (Young/Daly): {shares}"]  # fmt: skip
    if p.price_per_hour is not None:
        node_s = p.price_per_hour * p.plan.nodes / 3600
        lines.append(f"cost at {p.price_per_hour:g}/node-hour: one restore "
                     f"{p.restore.total_s * node_s:.2f}"
                     + (f", one save {p.save.total_s * node_s:.2f}" if p.save else ""))  # fmt: skip
    lines.append("the CPU phases and other are added after the transfer (other takes off what "
                 "overlapped in the runs measured); `ckptprof predict --help` says how each "
                 "limit is found")  # fmt: skip
    return "\n".join(lines) + "\n"


def _estimate_json(estimate: Estimate) -> dict:
    return {
        "total_s": estimate.total_s,
        "transfer_s": estimate.transfer_s,
        "binds": estimate.limit_name,
        "rank_bytes": estimate.rank_bytes,
        "job_bytes": estimate.job_bytes,
        "requests": estimate.requests,
        "bounds": [
            {"limit": b.name, "seconds": b.seconds, "source": b.why} for b in estimate.bounds
        ],  # fmt: skip
        "cpu_s": estimate.cpu,
    }


def _costs_json(costs: dict[str, Cost]) -> dict:
    def given(g: Given | None) -> dict | None:
        return None if g is None else {"value": g.value, "source": g.source}

    return {
        phase: {"fixed_s": given(c.fixed_s), "per_byte_s": given(c.per_byte_s),
                "per_file_s": given(c.per_file_s)}
        for phase, c in costs.items()
    }  # fmt: skip


def render_json(p: Prediction) -> dict:
    doc = {
        "plan": {
            "model": p.plan.model,
            "params": p.plan.params,
            "nodes": p.plan.nodes,
            "ranks_per_node": p.plan.ranks_per_node,
            "sharding": p.plan.sharding,
            "state_bytes": p.plan.total_bytes,
        },  # fmt: skip
        "measured": list(p.measured.sources),
        "costs": {
            "restore": _costs_json({"fetch": p.measured.costs.read, **p.measured.costs.cpu}),
            "save": _costs_json({"write": p.measured.costs.write, **p.measured.costs.save_cpu})
            if p.measured.costs.write
            else None,
        },
        "restore": _estimate_json(p.restore),
        "save": _estimate_json(p.save) if p.save else None,
        "node_measured": {
            f"{what}_gbps": found and {"value": found.value, "source": found.source}
            for what, found in (
                ("read", p.measured.read_ceiling),
                ("write", p.measured.write_ceiling),
            )
        },  # fmt: skip
    }
    if p.interval is not None:
        i = p.interval
        doc["interval"] = {"job_mtbi_s": i.job_mtbi_s, "interval_s": i.interval_s,
                           "shares": i.shares}  # fmt: skip
    return doc


def scaling(p: Prediction) -> list[tuple[int, Estimate, Estimate | None]]:
    """The same job on 1, 2, 4 … nodes up to the planned count."""
    counts, n = [], 1
    while n < p.plan.nodes:
        counts.append(n)
        n *= 2
    counts.append(p.plan.nodes)
    out = []
    for nodes in counts:
        plan = replace(p.plan, nodes=nodes)
        save = predict_save(plan, p.measured.costs, p.limits) if p.save else None
        out.append((nodes, predict_restore(plan, p.measured.costs, p.limits), save))
    return out


def figure(p: Prediction):
    """Time against nodes, the binding limit named at each point."""
    from matplotlib.figure import Figure

    points = scaling(p)
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    nodes = [n for n, _, _ in points]
    series = [("restore (time to state)", [r for _, r, _ in points])]
    if p.save is not None:
        series.append(("save", [s for _, _, s in points]))
    for label, estimates in series:
        ax.plot(nodes, [e.total_s for e in estimates], marker="o", label=label)
        for n, e in zip(nodes, estimates, strict=True):
            ax.annotate(e.limit_name, (n, e.total_s), fontsize=7, rotation=20,
                        xytext=(3, 4), textcoords="offset points")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("nodes")
    ax.set_ylabel("seconds")
    ax.set_title(f"{p.plan.model}, {p.plan.ranks_per_node} ranks per node, {p.plan.sharding}")
    ax.legend()
    fig.tight_layout()
    return fig
