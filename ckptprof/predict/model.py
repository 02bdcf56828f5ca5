"""The arithmetic of a checkpoint at scale: bytes per rank, the limits they meet, the
one that binds.

A save or a restore at scale moves each rank's bytes through a chain of limits: the
rank's own client (measured here, on the target storage, at the concurrency used), the
node's network, the storage's aggregate bandwidth and, on an object store, its request
rate. The slowest link sets the transfer time; the CPU phases (verify, deserialize,
reshard; serialize on a save, fused with its write) add their cost for the slowest rank's
bytes and files. Each rank's own costs are a fixed part plus a part per byte (plus one
per file) where two measured sizes separated them (``ckptprof/predict/fit.py``); every
number is measured, fitted, given, or a default that names its source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ckptprof.errors import CkptprofError

#: bytes per parameter: bf16 weights; Adam's two fp32 moments; fp32 master weights
WEIGHT_BYTES, ADAM_BYTES, MASTER_BYTES = 2, 8, 4
SHARDINGS = ("replicated", "zero1", "zero2", "zero3", "fsdp")


@dataclass(frozen=True)
class JobPlan:
    """The job being planned: its model's parameters, its ranks and how they shard."""

    model: str
    params: int
    nodes: int
    ranks_per_node: int
    sharding: str = "fsdp"
    optimizer: bool = True
    master_weights: bool = False
    files_per_rank: int = 1

    def __post_init__(self) -> None:
        if self.sharding not in SHARDINGS:
            raise CkptprofError(f"--sharding {self.sharding}: expected one of {SHARDINGS}")
        if self.world > self.params:
            raise CkptprofError(
                f"--nodes {self.nodes} x --ranks-per-node {self.ranks_per_node} = {self.world} "
                f"ranks: more than {self.model}'s {self.params} parameters to shard"
            )

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def weight_bytes(self) -> int:
        return self.params * WEIGHT_BYTES

    @property
    def optimizer_bytes(self) -> int:
        per_param = (ADAM_BYTES if self.optimizer else 0) + (
            MASTER_BYTES if self.master_weights else 0
        )
        return self.params * per_param

    @property
    def total_bytes(self) -> int:
        """One copy of the training state: what the checkpoint holds."""
        return self.weight_bytes + self.optimizer_bytes

    def save_bytes(self) -> tuple[int, int]:
        """(the busiest rank's bytes, the job's bytes) written by one save. Replicated:
        rank 0 writes it all; ZeRO-1/2: every rank its optimizer shard, rank 0 the
        weights too; ZeRO-3/FSDP: every rank its shard of everything."""
        if self.sharding == "replicated":
            return self.total_bytes, self.total_bytes
        if self.sharding in ("zero1", "zero2"):
            shard = math.ceil(self.optimizer_bytes / self.world)
            return self.weight_bytes + shard, self.total_bytes
        return math.ceil(self.total_bytes / self.world), self.total_bytes

    def restore_bytes(self) -> tuple[int, int]:
        """(each rank's bytes, the job's bytes) read by one restore: a rank reads what it
        holds (replicated: everything, so the job reads world copies)."""
        if self.sharding == "replicated":
            return self.total_bytes, self.total_bytes * self.world
        if self.sharding in ("zero1", "zero2"):
            rank = self.weight_bytes + math.ceil(self.optimizer_bytes / self.world)
            return rank, rank * self.world
        rank = math.ceil(self.total_bytes / self.world)
        return rank, self.total_bytes

    def writers(self) -> int:
        return 1 if self.sharding == "replicated" else self.world


@dataclass(frozen=True)
class Given:
    """A number the prediction uses and where it comes from (measured, given, default)."""

    value: float
    source: str


@dataclass(frozen=True)
class Limits:
    """What one node cannot measure: the storage's aggregate bandwidth (GB/s), the
    node's network (GB/s), an object store's request rates (per second) and the node's
    cores; None: no such limit (a node's own disk has no aggregate; a file system no
    request rate; a core for every rank)."""

    storage_gbps: Given | None = None
    node_gbps: Given | None = None
    get_rate: Given | None = None
    put_rate: Given | None = None
    cores: Given | None = None  # a node's CPU cores: its ranks' CPU phases share them


@dataclass(frozen=True)
class Cost:
    """One rank's seconds in one phase: a fixed part, a part per byte and one per file
    (None: not separated by the runs measured)."""

    per_byte_s: Given
    fixed_s: Given | None = None
    per_file_s: Given | None = None

    def seconds(self, nbytes: int, files: int = 1) -> float:
        fixed = self.fixed_s.value if self.fixed_s else 0.0
        per_file = self.per_file_s.value * files if self.per_file_s else 0.0
        return fixed + per_file + nbytes * self.per_byte_s.value

    @property
    def source(self) -> str:
        return self.per_byte_s.source

    def describe(self) -> str:
        parts = [f"{self.per_byte_s.value * 1e9:.3g} s/GB"]
        if self.fixed_s is not None:
            parts.insert(0, f"{self.fixed_s.value:.3g} s")
        if self.per_file_s is not None:
            parts.append(f"{self.per_file_s.value * 1e3:.3g} ms/file")
        return " + ".join(parts)


@dataclass(frozen=True)
class Costs:
    """What one rank was measured to do on the target storage: its fetch and its write
    (with its fsync) at the concurrency it used, its CPU phases, and the rest of its wall
    time (set-up, listing, the gaps between phases)."""

    read: Cost
    write: Cost | None
    part_size: int
    cpu: dict[str, Cost] = field(default_factory=dict)  # restore: verify ... reshard, other
    save_cpu: dict[str, Cost] = field(default_factory=dict)  # save: commit, other


@dataclass(frozen=True)
class Bound:
    """One limit a transfer meets: the seconds it alone would take."""

    name: str
    seconds: float
    why: str


@dataclass(frozen=True)
class Estimate:
    """A save's or a restore's predicted time: the transfer's bounds, the binding one,
    the CPU phases after it."""

    kind: str  # "save" or "restore"
    rank_bytes: int
    job_bytes: int
    requests: int
    bounds: tuple[Bound, ...]
    cpu: dict[str, float]

    @property
    def binding(self) -> Bound:
        return max(self.bounds, key=lambda b: b.seconds)

    @property
    def runner_up(self) -> Bound | None:
        rest = sorted(self.bounds, key=lambda b: b.seconds, reverse=True)[1:]
        return rest[0] if rest else None

    @property
    def transfer_s(self) -> float:
        return self.binding.seconds

    @property
    def total_s(self) -> float:
        """Transfer, then the CPU phases and the rest (which takes off what overlapped
        where it was measured to; never less than the transfer)."""
        return self.transfer_s + max(0.0, sum(self.cpu.values()))

    @property
    def limit_name(self) -> str:
        """What binds the whole: the transfer's limit, or a CPU phase longer than it."""
        cpu = max(self.cpu.items(), key=lambda kv: kv[1], default=None)
        if cpu is not None and cpu[1] > self.transfer_s:
            return f"the CPU phase {cpu[0]}"
        return self.binding.name


def _bounds(rank_bytes, job_bytes, node_bytes, requests, client: Cost, limits, rate, files):
    gb = 1e9
    found = [Bound("a rank's client", client.seconds(rank_bytes, files), client.source)]
    if limits.node_gbps is not None:
        found.append(Bound("the node's network", node_bytes / (limits.node_gbps.value * gb),
                           limits.node_gbps.source))  # fmt: skip
    if limits.storage_gbps is not None:
        found.append(
            Bound("the storage's aggregate", job_bytes / (limits.storage_gbps.value * gb),
                  limits.storage_gbps.source)
        )  # fmt: skip
    if rate is not None:
        found.append(Bound("the request rate", requests / rate.value, rate.source))
    return tuple(found)


def _requests(rank_bytes: int, ranks: int, plan: JobPlan, part_size: int) -> int:
    return ranks * (math.ceil(rank_bytes / part_size) + plan.files_per_rank)


def _cpu(costs: dict[str, Cost], rank_bytes: int, plan: JobPlan, limits: Limits) -> dict:
    """Each CPU phase's seconds on the busiest rank; a node's ranks beyond its cores wait
    for one (the phases were measured by one rank with the machine to itself)."""
    crowding = 1.0
    if limits.cores is not None:
        crowding = max(1.0, plan.ranks_per_node / limits.cores.value)
    return {
        name: cost.seconds(rank_bytes, plan.files_per_rank) * crowding
        for name, cost in costs.items()
    }


def predict_restore(plan: JobPlan, costs: Costs, limits: Limits) -> Estimate:
    rank_bytes, job_bytes = plan.restore_bytes()
    requests = _requests(rank_bytes, plan.world, plan, costs.part_size)
    bounds = _bounds(rank_bytes, job_bytes, rank_bytes * plan.ranks_per_node, requests,
                     costs.read, limits, limits.get_rate, plan.files_per_rank)  # fmt: skip
    cpu = _cpu(costs.cpu, rank_bytes, plan, limits)
    return Estimate("restore", rank_bytes, job_bytes, requests, bounds, cpu)


def predict_save(plan: JobPlan, costs: Costs, limits: Limits) -> Estimate:
    if costs.write is None:
        raise CkptprofError(
            "no save was measured: give a save.json (or its traces) from `ckptprof synth save` "
            "on the target storage"
        )
    rank_bytes, job_bytes = plan.save_bytes()
    writers = plan.writers()
    requests = _requests(math.ceil(job_bytes / writers), writers, plan, costs.part_size)
    node_bytes = rank_bytes * min(plan.ranks_per_node, writers)
    bounds = _bounds(rank_bytes, job_bytes, node_bytes, requests, costs.write, limits,
                     limits.put_rate, plan.files_per_rank)  # fmt: skip
    cpu = _cpu(costs.save_cpu, rank_bytes, plan, limits)
    return Estimate("save", rank_bytes, job_bytes, requests, bounds, cpu)


@dataclass(frozen=True)
class Interval:
    """Young/Daly for the whole job: interruptions come ``nodes`` times as often."""

    job_mtbi_s: float
    save_s: float
    restore_s: float

    @property
    def interval_s(self) -> float:
        return math.sqrt(2 * self.save_s * self.job_mtbi_s)

    @property
    def shares(self) -> dict[str, float]:
        """Of the job's time: saving, work redone after an interruption, restoring."""
        tau, m = self.interval_s, self.job_mtbi_s
        return {"saving": self.save_s / tau, "lost work": tau / (2 * m),
                "restoring": self.restore_s / m}  # fmt: skip


def interval(plan: JobPlan, save: Estimate, restore: Estimate, node_mtbi_s: float) -> Interval:
    job_mtbi = node_mtbi_s / plan.nodes
    if save.total_s * 2 >= job_mtbi:
        raise CkptprofError(
            f"--mtbi {node_mtbi_s:g} s per node is {job_mtbi:.0f} s for {plan.nodes} nodes, "
            f"less than two saves ({save.total_s:.1f} s each): no checkpoint interval helps; "
            "give the MTBI of one node"
        )
    return Interval(job_mtbi, save.total_s, restore.total_s)
