"""The numbers a report is made of: what :mod:`ckptprof.report.aggregate` computes from
trace operations and results files, what :mod:`ckptprof.report.hints` reads to give its
advice, and what the text, JSON, HTML and plot renderers print. Plain data, no rules:
aggregate fills these in and attaches hints; hints only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckptprof.phases import Phase, fused_phases
from ckptprof.report.outside import NamedTime
from ckptprof.report.records import CutShort, RecordedCeiling

if TYPE_CHECKING:
    from ckptprof.report.checkpoint_cost import CheckpointInterval, SaveRestore
    from ckptprof.report.skew import Skew

# Sum of phases above wall by more than this fraction means the phases overlapped;
# below it by more than this, time was spent outside every phase.
OVERLAP_TOLERANCE = 0.02


@dataclass(frozen=True)
class Hint:
    """One piece of advice; ``code`` is stable (for tests and scripts), ``message`` is prose."""

    code: str
    message: str
    severity: float = 0.0
    where: str = ""


@dataclass
class PhaseRow:
    """Medians of one phase over the operations of a group (where the phase ran)."""

    phase: str
    busy_s: float
    share: float | None
    nbytes: int | None
    files: int | None
    gbps: float | None
    emulated: bool = False
    emulation_reason: str | None = None
    of_bytes: int | None = None  # verify: the bytes of the files it checked
    #: medians of the phase's own ``ckpt.<phase>.*`` numbers (first_step: batch_s, …)
    details: dict[str, float] = field(default_factory=dict)
    #: the phases that ran as this one interval (an ``Attr.FUSED`` value, as recorded)
    fused: str | None = None
    #: fetch: the loader reads pages on demand (``Attr.FETCH_LAZY``): some reads come later
    lazy: bool = False

    @property
    def fused_phases(self) -> tuple[str, ...]:
        """The phases :attr:`fused` names (``("deserialize", "reshard")``); () if none."""
        return fused_phases(self.fused) if self.fused else ()


@dataclass
class Breakdown:
    """Where the time of a set of like operations went; what tables and hints read."""

    label: str
    kind: str
    repeats: int
    wall_median_s: float
    wall_min_s: float
    wall_max_s: float
    phases: list[PhaseRow]
    cache: str | None = None
    concurrency: int | None = None
    resident_fraction: float | None = None
    cache_method: str | None = None
    strategy: str | None = None
    peak_rss_bytes: int | None = None
    read_bytes: int | None = None
    #: an estimated first step, kept beside the RTO (never inside it)
    first_step_estimate_s: float | None = None
    #: the tokens of the step run or estimated (a synthetic run's)
    first_step_tokens: int | None = None
    #: a synthetic run: its first step is this machine's compute, not a job's
    synthetic: bool = False
    #: its first step is the time the user gave (--first-step-s), not a step run here
    first_step_given: bool = False
    #: time to state (list -> reshard: the RTO less the first step), median, min, max
    state_s: tuple[float, float, float] | None = None
    #: the functions the time outside every phase was spent in (traced operations whose
    #: training thread was sampled; mean seconds per operation, the largest first)
    outside_named: list[NamedTime] = field(default_factory=list)

    def phase(self, name: str | Phase) -> PhaseRow | None:
        key = name.value if isinstance(name, Phase) else name
        return next((row for row in self.phases if row.phase == key), None)

    @property
    def phase_sum_s(self) -> float:
        return sum(row.busy_s for row in self.phases)

    @property
    def overlapped(self) -> bool:
        return self.phase_sum_s > self.wall_median_s * (1 + OVERLAP_TOLERANCE)

    @property
    def outside_phases_s(self) -> float:
        """Wall time no phase accounts for (0 unless clearly above the tolerance)."""
        gap = self.wall_median_s - self.phase_sum_s
        return gap if gap > self.wall_median_s * OVERLAP_TOLERANCE else 0.0


@dataclass
class RankSpread:
    """The ranks of a distributed restore: the slowest one sets the RTO."""

    ranks: int
    slowest_rank: int
    slowest_wall_s: float
    fastest_rank: int
    fastest_wall_s: float
    slowest_host: str | None = None


@dataclass
class OperationRow:
    """One operation as measured, for ``--by run``."""

    wall_s: float
    phases: dict[str, float]
    cache: str | None = None
    concurrency: int | None = None
    repeat: int | None = None
    rank: int | None = None
    start: str | None = None
    failed: bool = False


@dataclass
class VerifyCoverage:
    """What a verify phase checked, so a pass is read as no more than it is."""

    mode: str  # full | sample | size | none
    checked_bytes: int | None  # bytes hashed (None: not recorded)
    total_bytes: int | None  # bytes of the files checked (older records: bytes fetched)


@dataclass
class OperationGroup:
    """Trace operations of one kind and configuration."""

    kind: str
    config: dict[str, Any]
    breakdown: Breakdown | None
    operations: list[OperationRow]
    ranks: RankSpread | None = None
    failed: int = 0
    failure: str | None = None
    retries: int = 0
    errors: int = 0
    hints: list[Hint] = field(default_factory=list)
    verify_coverage: VerifyCoverage | None = None
    after_resume: AfterResume | None = None
    reads: Reads | None = None
    memory: ResumeMemory | None = None
    #: a synthetic save's probed write ceiling (median over its saves), GB/s
    write_ceiling_gbps: float | None = None
    #: what the saves wrote (median bytes), to set against that ceiling
    written_bytes: int | None = None
    #: each multi-rank operation's rank skew (report/skew.py)
    skews: list[Skew] = field(default_factory=list)

    @property
    def of_write_ceiling(self) -> float | None:
        """The median save's GB/s as a share of the write ceiling."""
        b = self.breakdown
        if not (self.write_ceiling_gbps and self.written_bytes and b and b.wall_median_s):
            return None
        return self.written_bytes / b.wall_median_s / 1e9 / self.write_ceiling_gbps


@dataclass
class Reads:
    """What the ranks of a restore read against what the checkpoint holds (medians)."""

    ranks: int
    read_bytes: int  # by all ranks together
    checkpoint_bytes: int

    @property
    def amplification(self) -> float:
        return self.read_bytes / self.checkpoint_bytes if self.checkpoint_bytes else 0.0


@dataclass
class ResumeMemory:
    """The resume's peak resident memory against the saving process's while it trained."""

    peak_rss_bytes: int
    training_rss_bytes: int


@dataclass
class AfterResume:
    """The steps after the group's resumes against the steps before their saves."""

    resumes: int
    steps: int
    step_median_s: float
    before_save_step_median_s: float | None
    slowdown: float | None


@dataclass
class SweepRow:
    """One cache state × concurrency cell of a results sweep."""

    breakdown: Breakdown
    fetch_gbps: float | None
    fraction_of_ceiling: float | None  # at most 1.0 (see fraction_above_ceiling)
    #: "fused" or "lazy": fetch is no storage read of its own, so no fraction is computed;
    #: "capped": the fraction measured was above 1 and is shown as 100%
    ceiling_mark: str | None = None
    fraction_above_ceiling: float | None = None  # the fraction measured, where capped


@dataclass
class Sweep:
    """A results.json: the ceiling, the environment and the sweep table."""

    path: str
    version: str | None
    created: str | None
    spec: dict[str, Any]
    environment: dict[str, Any]
    ceiling: RecordedCeiling | None
    rows: list[SweepRow]
    operations: list[OperationRow]
    options: dict[str, Any] = field(default_factory=dict)
    reliability: dict[str, Any] = field(default_factory=dict)
    hints: list[Hint] = field(default_factory=list)
    verify_coverage: VerifyCoverage | None = None
    job: dict[str, Any] = field(default_factory=dict)  # a distributed job's ranks
    skews: list[Skew] = field(default_factory=list)  # each run's rank skew (report/skew.py)


@dataclass
class Report:
    """Everything ``render_text``, ``render_json`` and ``write_plot`` need."""

    groups: list[OperationGroup]
    sweeps: list[Sweep]
    warnings: list[str] = field(default_factory=list)
    #: checkpoints both saved and restored in what was read: write/read side by side
    save_restore: list[SaveRestore] = field(default_factory=list)
    #: with a mean time between interruptions: each save's Young/Daly interval
    intervals: list[CheckpointInterval] = field(default_factory=list)
    #: saves and restores the process ended inside (their in-progress records)
    cut_short: list[CutShort] = field(default_factory=list)
