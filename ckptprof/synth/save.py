"""``ckptprof synth save``: the write side of checkpointing, timed on the target storage.

The training state is built in memory first (real tensors of the preset's shapes,
filled and touched, as a job's are after its steps), then saved ``repeat`` times by a
strategy of :mod:`ckptprof.synth.savers` (the layout's own writer, ckptprof's parallel
writer, DCP's ``async_save``), each save one ``ckpt.save`` trace: ``serialize`` /
``write`` / ``fsync`` / ``commit`` (``stage`` and a linked background save for async).

Files are written under temporary names and the manifest goes last, so an interrupted
save never looks complete, and the result is a checkpoint ``synth restore`` reads
back: one storage gets a save and a restore figure from the same bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from statistics import median

from ckptprof.env import capture
from ckptprof.errors import CkptprofError
from ckptprof.io.writes import STAGING, staging_buffers, staging_shape
from ckptprof.manifest import Manifest, entry_for_segments
from ckptprof.phases import Attr
from ckptprof.save_schema import SAVE_NAME, SAVE_SCHEMA_VERSION
from ckptprof.storage import is_object_store, multipart, open_storage
from ckptprof.storage.base import DIRECT_ALIGN
from ckptprof.synth.ceiling import WriteCeiling, probe_budget, probe_write, probe_write_bytes
from ckptprof.synth.distributed import Job, job_context
from ckptprof.synth.fill import RandomFiller
from ckptprof.synth.generate import (
    claim_location,
    entry_of,
    estimated_file_bytes,
    publish_manifest,
)
from ckptprof.synth.layouts import get_layout
from ckptprof.synth.options import SaveOptions
from ckptprof.synth.plan import CheckpointPlan, SynthSpec
from ckptprof.synth.savers import SaveContext, check_strategy, save
from ckptprof.synth.savers.base import serialized
from ckptprof.threads import last_words
from ckptprof.units import fmt_bytes

MEMORY_HEADROOM = 0.85


@dataclass
class TimedSave:
    """One timed save."""

    repeat: int
    wall_s: float
    bytes: int
    phases: dict[str, float]  # busy seconds per phase
    fsync: bool
    trace_id: str
    strategy: str = "framework"
    background_s: float | None = None  # async: the background write, after the blocking part
    rank: int | None = None  # the rank that wrote it (a job's save: its slowest rank)
    ranks: int = 1  # ranks that saved at once (the record of a job's save: all of them)

    @property
    def durable_s(self) -> float:
        """Until the bytes are on the storage: an async save's blocking part and its
        background write together (what its GB/s is of; the blocking part alone is a copy
        into memory)."""
        return self.wall_s + (self.background_s or 0.0)

    @property
    def gbps(self) -> float:
        return self.bytes / self.durable_s / 1e9 if self.durable_s else 0.0


@dataclass
class SaveResult:
    """Every timed save of one ``synth save``, with the write ceiling they are set against."""

    records: list[TimedSave]
    ceiling: WriteCeiling
    environment: dict

    @property
    def median_s(self) -> float:
        return median(r.wall_s for r in self.records)

    @property
    def median_gbps(self) -> float:
        """The bytes over the median time to durable (an async save's background write
        included: its blocking part's GB/s would be a memory copy's)."""
        durable = median(r.durable_s for r in self.records)
        return self.records[0].bytes / durable / 1e9 if durable else 0.0

    @property
    def of_ceiling(self) -> float | None:
        gbps = self.ceiling.write_gbps
        return self.median_gbps / gbps if gbps else None


def check(location: str, spec: SynthSpec, options: SaveOptions, world: int | None = None) -> None:
    """Refuse up front what this save cannot do (one line, with the fix); ``world``: the
    processes of a launched job (None: one process), known before any rank starts."""
    check_strategy(options.strategy, spec.layout, is_object_store(location))
    if options.repeat < 1:
        raise CkptprofError(f"--repeat {options.repeat} must be at least 1.")
    if world is not None and spec.layout == "dcp":
        raise CkptprofError(
            "--layout dcp: a DCP save by several ranks needs sharded tensors (DTensor); "
            "save torch, safetensors or deepspeed across ranks, or DCP from one process."
        )
    if world is not None and spec.ranks != world:
        raise CkptprofError(
            f"--ranks {spec.ranks}: under the launcher each of the {world} ranks writes "
            f"its own files; use --ranks {world} (or leave it out)."
        )
    if options.direct_io:
        _check_direct_io(location, spec, options)
    if is_object_store(location):
        check_s3_parts(location, get_layout(spec.layout).plan(spec), options)


def _check_direct_io(location: str, spec: SynthSpec, options: SaveOptions) -> None:
    if spec.layout == "dcp":
        raise CkptprofError(
            "--direct-io is the parallel writer's, and DCP lays out its own files (dcp.save, "
            "through the page cache); drop --direct-io."
        )
    if is_object_store(location):
        raise CkptprofError(
            f"--direct-io applies to local or mounted paths only, not {location}; drop it."
        )
    if options.strategy != "parallel":
        raise CkptprofError(
            f"--direct-io is the parallel writer's (--strategy {options.strategy} writes as "
            "its framework does, through the page cache); add --strategy parallel, or drop "
            "--direct-io."
        )
    if options.part_size % DIRECT_ALIGN:
        raise CkptprofError(
            f"--part-size {options.part_size} must be a multiple of {DIRECT_ALIGN} with "
            "--direct-io."
        )


def check_s3_parts(location: str, plan: CheckpointPlan, options: SaveOptions) -> None:
    """On S3 each file, and the write probe, is a multipart upload in ``--part-size``
    parts: refuse a part size S3 would refuse (for the largest, the one that needs the
    largest parts) before anything is claimed, probed or uploaded."""
    layout = get_layout(plan.spec.layout)
    largest = max(plan.files, key=lambda f: estimated_file_bytes(layout, f))
    where = f"{location.rstrip('/')}/{largest.path}"
    multipart.check_part_size(estimated_file_bytes(layout, largest), options.part_size, where)
    if not options.ceiling_gbps:
        probe = probe_write_bytes(_payload(plan), options.part_size, object_store=True)
        multipart.check_part_size(probe, options.part_size, "the write probe")


def rank_plan(plan: CheckpointPlan, job: Job | None) -> CheckpointPlan:
    """The files this process writes: its rank's (files of no rank: rank 0's, as a job's
    main process writes the config and index)."""
    if job is None:
        return plan
    mine = tuple(f for f in plan.files if (f.rank if f.rank is not None else 0) == job.rank)
    return dataclasses.replace(plan, files=mine)


def build_state(plan: CheckpointPlan, seed: int = 0) -> dict:
    """Every data file's pieces as real tensors, filled and touched (untimed: a job's
    state exists before it saves)."""
    import torch

    filler = RandomFiller(seed)
    tensors = {}
    for file in plan.data_files:
        for piece in file.pieces:
            tensor = torch.empty(piece.piece_shape, dtype=getattr(torch, piece.dtype))
            _fill(filler, tensor)
            tensors[piece] = tensor
    return tensors


def _check_memory(plan: CheckpointPlan, options: SaveOptions, sharing: int = 1) -> None:
    """The state is held in memory, as a job holds it, and with --direct-io the writer's
    staging buffers beside it: refuse before building either when they cannot fit
    (``sharing``: the ranks of this node, each holding its own)."""
    import psutil

    available = psutil.virtual_memory().available // sharing
    if plan.payload_bytes > available * MEMORY_HEADROOM:
        raise CkptprofError(
            f"the training state to save ({fmt_bytes(plan.payload_bytes)}) does not fit in "
            f"the {fmt_bytes(available)} of memory available; use a smaller --scale or more "
            "--ranks."
        )
    if not options.direct_io:
        return
    count, size = staging_shape(options.concurrency, options.part_size)
    if plan.payload_bytes + count * size > available * MEMORY_HEADROOM:
        raise CkptprofError(
            f"--direct-io stages writes in {count} buffers of {fmt_bytes(size)} (--concurrency "
            f"{options.concurrency}, --part-size {fmt_bytes(options.part_size)}): "
            f"{fmt_bytes(count * size)} beside the {fmt_bytes(plan.payload_bytes)} training "
            f"state does not fit in the {fmt_bytes(available)} of memory available; lower "
            "--concurrency or --part-size, or drop --direct-io."
        )


def _fill(filler: RandomFiller, tensor) -> None:
    import torch

    if not tensor.numel():
        return
    view = memoryview(tensor.view(-1).view(torch.uint8).numpy())
    done = 0
    while done < len(view):
        chunk = filler.next_chunk()[: len(view) - done]
        view[done : done + len(chunk)] = chunk
        done += len(chunk)


def run_save(
    location: str,
    spec: SynthSpec,
    options: SaveOptions,
    tracer,
    echo=print,
    job: Job | None = None,
    keep_partial: Callable[[SaveResult], Path] | None = None,
) -> SaveResult:
    """Build the state, then save it ``repeat`` times into ``location`` (each save
    replaces the last: they are ours); the last one stays, with its manifest. As one
    rank of a ``job``: this rank's files, every rank saving at once; rank 0 claims the
    location, probes, gathers the records (the job's save time: its slowest rank's) and
    writes the manifest. Interrupted (Ctrl-C, SIGTERM, a failure) after some saves of one
    process, ``keep_partial`` is given those saves; the location keeps no manifest."""
    check(location, spec, options, job and job.world)
    layout = get_layout(spec.layout)
    plan = layout.plan(spec)
    mine = rank_plan(plan, job)
    _check_memory(mine, options, job.local_world if job else 1)
    storage = open_storage(location, direct_io=options.direct_io)
    lead = job is None or job.rank == 0
    with ExitStack() as held:  # the location is this save's until it returns
        if lead:
            held.enter_context(storage.claim())
            claim_location(storage, plan, options.force, echo)
            ceiling = _ceiling(storage, plan, options, echo)
        ceiling = job.broadcast(ceiling if lead else None) if job else ceiling
        echo(ceiling.describe())
        each = f", {job.world} ranks each holding its share" if job else ""
        echo(f"building the state in memory: {fmt_bytes(plan.payload_bytes)}{each} (not timed)")
        tensors = build_state(mine, spec.seed)
        records = []
        attrs = _save_attributes(layout, spec, storage, options, ceiling.write_gbps, job)
        kept: dict = {}  # what the job keeps between its saves
        if options.direct_io:  # the staging buffers a job has before it saves
            kept[STAGING] = staging_buffers(options.concurrency, options.part_size)

        def keep_measured() -> None:
            """What was measured before an interruption stays."""
            if records and job is None and keep_partial is not None:
                environment = capture(
                    {**storage.describe(), "save.part_size": str(options.part_size)}
                )
                kept_at = keep_partial(SaveResult(list(records), ceiling, environment))
                echo(f"partial results of {len(records)} saves: {kept_at}")

        try:  # each save appended to records as it ends: an interruption keeps those before it
            context = partial(
                SaveContext, storage=storage, plan=mine, tensors=tensors, fsync=options.fsync,
                concurrency=options.concurrency, part_size=options.part_size, tracer=tracer,
                kept=kept,
            )  # fmt: skip
            with last_words(keep_measured):  # a stop that cannot wait writes them too
                for repeat in range(options.repeat):
                    each = {**attrs, Attr.REPEAT: repeat}
                    records.append(_save_once(context, tracer, options, each, job))
                    if job is None:
                        echo(save_line(records[-1]))
        except BaseException:
            keep_measured()
            raise
        if options.direct_io and not storage.direct_io:
            echo(f"--direct-io: {storage.uri} refused O_DIRECT, so these saves wrote through "
                 "the page cache (ckpt.save.direct_io=false on their spans)")  # fmt: skip
        entries = _entries(storage, mine, tensors, options.strategy)
        if job is not None:
            gathered = job.gather((records, entries))
            if not lead:
                return SaveResult(records, ceiling, {})
            records = job_records([r for rank_records, _ in gathered for r in rank_records])
            entries = {path: e for _, rank_entries in gathered for path, e in rank_entries.items()}
            for record in records:
                echo(save_line(record))
        publish_manifest(storage, Manifest(entries, spec=spec.to_dict()))
        environment = capture({**storage.describe(), "save.part_size": str(options.part_size)})
        return SaveResult(records, ceiling, environment)


def _save_attributes(layout, spec: SynthSpec, storage, options: SaveOptions,
                     ceiling_gbps: float, job: Job | None) -> dict:  # fmt: skip
    """What every save span of this run carries."""
    attrs = {
        Attr.FORMAT: layout.format,
        Attr.LAYOUT: layout.name,
        Attr.MODEL: spec.model,
        Attr.STORAGE_KIND: storage.kind,
        Attr.STORAGE_URI: storage.uri,
        Attr.STRATEGY: options.strategy,
        Attr.SAVE_FSYNC: options.fsync,
        Attr.SAVE_CEILING_GBPS: round(ceiling_gbps, 4),
        Attr.CONCURRENCY: options.concurrency,
    }
    if job is not None:
        attrs.update({Attr.RANK: job.rank, Attr.WORLD_SIZE: job.world, **job.attributes()})
    return attrs


def _save_once(context: Callable[..., SaveContext], tracer, options: SaveOptions, attrs: dict,
               job: Job | None) -> TimedSave:  # fmt: skip
    """One traced save through the chosen saver (a job's ranks start it together: one
    trace, a span per rank), as its record. ``context(op=…)`` is what the saver works
    with."""
    parent = None
    if job is not None:
        job.barrier()  # the ranks of a job save at once, as a job's do
        parent = job_context(job)
    with tracer.save(attrs, parent=parent) as op:
        written = save(options.strategy, context(op=op))
    summary = op.summary
    span = op.span_context
    return TimedSave(
        repeat=attrs[Attr.REPEAT],
        wall_s=summary.wall_s,
        bytes=written.nbytes,
        phases={name: stats.busy_s for name, stats in summary.phases.items()},
        fsync=options.fsync,
        trace_id=format(span.trace_id, "032x") if span else "",
        strategy=options.strategy,
        background_s=written.background_s,
        rank=job.rank if job else None,
    )


def job_records(rank_records: list[TimedSave]) -> list[TimedSave]:
    """One record per save of the job: its slowest rank's time and phases (the job saves
    when its last rank has), every rank's bytes."""
    by_repeat: dict[int, list[TimedSave]] = {}
    for record in rank_records:
        by_repeat.setdefault(record.repeat, []).append(record)
    out = []
    for _, ranks in sorted(by_repeat.items()):
        slowest = max(ranks, key=lambda r: r.wall_s)
        out.append(
            dataclasses.replace(slowest, bytes=sum(r.bytes for r in ranks), ranks=len(ranks))
        )
    return out


def _ceiling(storage, plan: CheckpointPlan, options: SaveOptions, echo) -> WriteCeiling:
    """The write ceiling: given, or probed for at most a share of the bytes the saves
    write (``ceiling.probe_budget``)."""
    if options.ceiling_gbps:
        return WriteCeiling(options.ceiling_gbps, "given (--ceiling-gbps)", 0)
    size = _payload(plan)
    budget = probe_budget(size * options.repeat)
    return probe_write(storage, size, options.part_size, options.concurrency, options.fsync,
                       budget, echo)  # fmt: skip


def _payload(plan: CheckpointPlan) -> int:
    """The bytes a save of ``plan`` writes, as the write probe is sized (at least one)."""
    return sum(f.payload_bytes for f in plan.files) or 1


def write_results(
    out: Path, spec: SynthSpec, options: SaveOptions, result: SaveResult, partial: bool = False
) -> Path:
    """``save.json``: the spec, options, environment, write ceiling, every save and the
    medians (what a result needs to be compared and repeated); ``partial``: the saves an
    interruption left, marked so."""
    import dataclasses
    import json

    from ckptprof.atomic import atomic_write

    doc = {
        "schema_version": SAVE_SCHEMA_VERSION,
        "spec": spec.to_dict(),
        "options": dataclasses.asdict(options),
        "environment": result.environment,
        "ceiling": result.ceiling.to_dict(),
        "saves": [{**dataclasses.asdict(r), "gbps": r.gbps} for r in result.records],
        "summary": {
            "median_s": result.median_s,
            "median_gbps": result.median_gbps,
            "of_ceiling": result.of_ceiling,
        },
    }
    if partial:
        doc["partial"] = True
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / SAVE_NAME, json.dumps(doc, indent=2, default=str))
    return out / SAVE_NAME


def _entries(storage, plan: CheckpointPlan, tensors: dict, strategy: str) -> dict:
    """The manifest's entries (size, digests) of what the last save wrote (untimed). The
    parallel writer's: what it was given (the same serialization), so a restore's full
    verify checks what the storage returns against it; a framework's own writer's bytes
    are only known from the files, read back."""
    if strategy != "parallel":
        root = Path(storage.uri)
        return {f.path: entry_of(root / f.path) for f in plan.files}
    layout = get_layout(plan.spec.layout)
    return {f.path: entry_for_segments(serialized(layout, plan, f, tensors)) for f in plan.files}


def save_line(record: TimedSave) -> str:
    parts = ", ".join(f"{name} {seconds:.3f} s" for name, seconds in record.phases.items())
    synced = "" if record.fsync else " (no fsync: the bytes may be only in the page cache)"
    if record.background_s is not None:  # async: what blocked, then what went on behind
        return (
            f"save #{record.repeat}: {record.wall_s:.3f} s blocking ({fmt_bytes(record.bytes)}; "
            f"{parts}); then {record.background_s:.3f} s in the background: "
            f"{record.gbps:.2f} GB/s to the storage{synced}"
        )
    return (
        f"save #{record.repeat}: {record.wall_s:.3f} s, {record.gbps:.2f} GB/s "
        f"({fmt_bytes(record.bytes)}; {parts}){synced}"
    )


__all__ = ["TimedSave", "SaveResult", "build_state", "run_save", "write_results"]
