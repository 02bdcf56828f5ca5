"""The records a report is read into: plain dataclasses, one per thing on disk.

Everything downstream (aggregation, hints, rendering) works on these, never on the
files, so it can be tested without files; :mod:`ckptprof.report.traces` and
:mod:`ckptprof.report.json_files` fill them in, :mod:`ckptprof.report.load` collects them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class PhaseSample:
    """One phase of one operation: a phase span, or a phase entry of a results run."""

    phase: str
    busy_s: float
    nbytes: int | None = None
    files: int | None = None
    gbps: float | None = None
    emulated: bool = False
    emulation_reason: str | None = None
    of_bytes: int | None = None  # verify: the bytes of the files it checked
    #: the phase's own numeric ``ckpt.<phase>.*`` attributes (first_step's split)
    details: Mapping[str, float] = field(default_factory=dict)
    fused: str | None = None  # Attr.FUSED: the phases that ran as this one interval
    lazy: bool = False  # Attr.FETCH_LAZY: pages read on demand, some after the fetch


@dataclass
class TraceOperation:
    """One ``ckpt.restore`` or ``ckpt.save`` root span with its phase children."""

    kind: str
    trace_id: str
    span_id: str
    wall_s: float
    start: datetime | None
    attributes: dict[str, Any]
    resource: dict[str, Any]
    phases: dict[str, PhaseSample] = field(default_factory=dict)
    failed: bool = False
    status_message: str | None = None
    source: str = ""

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attributes.get(key, default)


@dataclass
class CutShort:
    """A save or restore whose root span was never written (the process was killed, or
    is still in it), as its latest in-progress record (``ckpt.progress``) tells it."""

    kind: str
    trace_id: str
    span_id: str  # the root's, never written
    elapsed_s: float
    open_phase: str | None
    phases: dict[str, float]  # the phases begun, their busy seconds so far
    nbytes: int
    of_bytes: int | None  # what the whole operation moves, where the record says
    in_flight: int
    waiting_on: str | None
    reason: str  # of the latest record: phase, bytes, stall
    stalled: bool  # any of its records was a stall warning
    at: datetime | None  # the latest record's time
    attributes: dict[str, Any]
    source: str = ""


@dataclass(frozen=True)
class RecordedCeiling:
    """The runner's estimate of the best a fetch could do (docs/design.md §9), as read
    back from its results (the measuring side is :class:`ckptprof.synth.ceiling.Ceiling`)."""

    read_gbps: float | None
    source: str | None = None
    request_latency_s: float | None = None
    part_size: int | None = None
    littles_law_inflight: float | None = None
    lower_bound_fetch_s: float | None = None
    nbytes: int | None = None


@dataclass
class ResultsRun:
    """One timed restore of the synthetic runner (one entry of ``runs``)."""

    cache: str | None
    concurrency: int | None
    repeat: int | None
    wall_s: float
    nbytes: int | None
    resident_fraction: float | None
    cache_method: str | None
    trace_id: str | None
    phases: dict[str, PhaseSample]
    strategy: str | None = None
    peak_rss_bytes: int | None = None
    read_bytes: int | None = None
    first_step: str | None = None  # measured | estimated | user | skipped
    first_step_estimate_s: float | None = None
    first_step_tokens: int | None = None  # the step's tokens, run or estimated
    rank: int | None = None  # a distributed job's rank (``rank_runs``)
    host: str | None = None
    start_s: float | None = None  # when it began, seconds since the epoch


@dataclass
class ResultsFile:
    """A parsed ``results.json``; ``summary`` stays raw (the runner's own medians)."""

    path: str
    version: str | None
    created: str | None
    spec: dict[str, Any]
    environment: dict[str, Any]
    ceiling: RecordedCeiling | None
    runs: list[ResultsRun]
    summary: list[dict[str, Any]]
    options: dict[str, Any] = field(default_factory=dict)
    #: success_rate, failures, requests (requests/retries/errors) and partial, as written
    reliability: dict[str, Any] = field(default_factory=dict)
    #: a distributed job's spread across its ranks (``job`` of results.json), as written
    job: dict[str, Any] = field(default_factory=dict)
    #: every rank's runs of a distributed job (``runs`` holds each run's slowest rank)
    rank_runs: list[ResultsRun] = field(default_factory=list)


@dataclass
class ReportData:
    """Everything read from the PATHs given to ``ckptprof report``."""

    operations: list[TraceOperation] = field(default_factory=list)
    results: list[ResultsFile] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: saves and restores whose process ended inside them (their in-progress records)
    cut_short: list[CutShort] = field(default_factory=list)
