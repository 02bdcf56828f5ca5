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

from dataclasses import dataclass
from pathlib import Path
from statistics import median

from ckptprof.env import capture
from ckptprof.errors import CkptprofError
from ckptprof.manifest import Manifest, entry_for_bytes
from ckptprof.phases import Attr
from ckptprof.storage import open_storage
from ckptprof.storage.base import DEFAULT_PART_SIZE
from ckptprof.synth.ceiling import WriteCeiling, probe_write
from ckptprof.synth.fill import RandomFiller
from ckptprof.synth.generate import claim_location, entry_of, publish_manifest
from ckptprof.synth.layouts import get_layout
from ckptprof.synth.plan import CheckpointPlan, SynthSpec
from ckptprof.synth.savers import SaveContext, check_strategy, save
from ckptprof.units import fmt_bytes

MEMORY_HEADROOM = 0.85


@dataclass
class SaveOptions:
    repeat: int = 3
    fsync: bool = True
    force: bool = False
    strategy: str = "framework"
    concurrency: int = 8  # parts in flight (parallel; the write probe's too)
    part_size: int = DEFAULT_PART_SIZE
    ceiling_gbps: float | None = None  # given: no write probe
    progress: bool | None = None


@dataclass
class SaveRecord:
    """One timed save."""

    repeat: int
    wall_s: float
    bytes: int
    phases: dict[str, float]  # busy seconds per phase
    fsync: bool
    trace_id: str
    strategy: str = "framework"
    background_s: float | None = None  # async: the background write, after the blocking part

    @property
    def gbps(self) -> float:
        return self.bytes / self.wall_s / 1e9 if self.wall_s else 0.0


@dataclass
class SaveResult:
    """Every timed save of one ``synth save``, with the write ceiling they are set against."""

    records: list[SaveRecord]
    ceiling: WriteCeiling
    environment: dict

    @property
    def median_s(self) -> float:
        return median(r.wall_s for r in self.records)

    @property
    def median_gbps(self) -> float:
        return self.records[0].bytes / self.median_s / 1e9 if self.median_s else 0.0

    @property
    def of_ceiling(self) -> float | None:
        gbps = self.ceiling.write_gbps
        return self.median_gbps / gbps if gbps else None


def check(location: str, spec: SynthSpec, options: SaveOptions) -> None:
    """Refuse up front what this save cannot do (one line, with the fix)."""
    check_strategy(options.strategy, spec.layout, location.startswith("s3://"))
    if options.repeat < 1:
        raise CkptprofError(f"--repeat {options.repeat} must be at least 1.")


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


def _check_memory(plan: CheckpointPlan) -> None:
    """The state is held in memory, as a job holds it: refuse before building it when it
    cannot fit."""
    import psutil

    available = psutil.virtual_memory().available
    if plan.payload_bytes > available * MEMORY_HEADROOM:
        raise CkptprofError(
            f"the training state to save ({fmt_bytes(plan.payload_bytes)}) does not fit in "
            f"the {fmt_bytes(available)} of memory available; use a smaller --scale or more "
            "--ranks."
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
    location: str, spec: SynthSpec, options: SaveOptions, tracer, echo=print
) -> SaveResult:
    """Build the state, then save it ``repeat`` times into ``location`` (each save
    replaces the last: they are ours); the last one stays, with its manifest."""
    check(location, spec, options)
    layout = get_layout(spec.layout)
    plan = layout.plan(spec)
    _check_memory(plan)
    storage = open_storage(location)
    claim_location(storage, plan, options.force)
    ceiling = _ceiling(storage, plan, options)
    echo(ceiling.describe())
    echo(f"building the state in memory: {fmt_bytes(plan.payload_bytes)} (not timed)")
    tensors = build_state(plan, spec.seed)
    records = []
    attrs = {
        Attr.FORMAT: layout.format,
        Attr.LAYOUT: layout.name,
        Attr.MODEL: spec.model,
        Attr.STORAGE_KIND: storage.kind,
        Attr.STORAGE_URI: storage.uri,
        Attr.STRATEGY: options.strategy,
        Attr.SAVE_FSYNC: options.fsync,
        Attr.SAVE_CEILING_GBPS: round(ceiling.write_gbps, 4),
        Attr.CONCURRENCY: options.concurrency,
    }
    for repeat in range(options.repeat):
        with tracer.save({**attrs, Attr.REPEAT: repeat}) as op:
            ctx = SaveContext(
                storage=storage, plan=plan, tensors=tensors, op=op, fsync=options.fsync,
                concurrency=options.concurrency, part_size=options.part_size, tracer=tracer,
            )  # fmt: skip
            written = save(options.strategy, ctx)
        summary = op.summary
        span = op.span_context
        record = SaveRecord(
            repeat=repeat,
            wall_s=summary.wall_s,
            bytes=written.nbytes,
            phases={name: stats.busy_s for name, stats in summary.phases.items()},
            fsync=options.fsync,
            trace_id=format(span.trace_id, "032x") if span else "",
            strategy=options.strategy,
            background_s=written.background_s,
        )
        records.append(record)
        echo(save_line(record))
    publish_manifest(storage, Manifest(_entries(storage, plan, tensors), spec=spec.to_dict()))
    environment = capture({**storage.describe(), "save.part_size": str(options.part_size)})
    return SaveResult(records, ceiling, environment)


def _ceiling(storage, plan: CheckpointPlan, options: SaveOptions) -> WriteCeiling:
    if options.ceiling_gbps:
        return WriteCeiling(options.ceiling_gbps, "given (--ceiling-gbps)", 0)
    size = sum(f.payload_bytes for f in plan.files) or 1
    return probe_write(storage, size, options.part_size, options.concurrency, options.fsync)


def write_results(out: Path, spec: SynthSpec, options: SaveOptions, result: SaveResult) -> Path:
    """``save.json``: the spec, options, environment, write ceiling, every save and the
    medians (what a result needs to be compared and repeated)."""
    import dataclasses
    import json

    from ckptprof.atomic import atomic_write

    doc = {
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
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "save.json", json.dumps(doc, indent=2, default=str))
    return out / "save.json"


def _entries(storage, plan: CheckpointPlan, tensors: dict) -> dict:
    """The manifest's entries (size, digests) of what the last save wrote (untimed): read
    back from a file system; from the same serialization on an object store."""
    if not storage.object_store:
        root = Path(storage.uri)
        return {f.path: entry_of(root / f.path) for f in plan.files}
    layout = get_layout(plan.spec.layout)
    return {
        f.path: entry_for_bytes(b"".join(layout.serialize_file(plan, f, tensors)))
        for f in plan.files
    }


def save_line(record: SaveRecord) -> str:
    parts = ", ".join(f"{name} {seconds:.3f} s" for name, seconds in record.phases.items())
    synced = "" if record.fsync else " (no fsync: the bytes may be only in the page cache)"
    background = (
        f"; then {record.background_s:.3f} s in the background"
        if record.background_s is not None
        else ""
    )
    blocking = " blocking" if record.background_s is not None else ""
    return (
        f"save #{record.repeat}: {record.wall_s:.3f} s{blocking}, {record.gbps:.2f} GB/s "
        f"({fmt_bytes(record.bytes)}; {parts}){background}{synced}"
    )


__all__ = ["SaveOptions", "SaveRecord", "SaveResult", "build_state", "run_save", "write_results"]
