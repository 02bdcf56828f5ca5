"""``ckptprof synth save``: the write side of checkpointing, timed on the target storage.

The training state is built in memory first (real tensors of the preset's shapes,
filled and touched, as a job's are after its steps), then saved through the layout's
own writer (``torch.save``, safetensors' ``save_file``) as one ``ckpt.save`` trace:

* ``write``: each file serialized and written by the writer (one interval: the writers
  serialize while they write, so it is marked fused with ``serialize``);
* ``fsync``: each file forced to the device (on by default: a write that only reached
  the page cache is not a checkpoint; ``--no-fsync`` leaves it out and says so);
* ``commit``: the files renamed into place, the folder synced, the manifest written.

Files are written under temporary names and the manifest goes last, so an interrupted
save never looks complete, and the result is a checkpoint ``synth restore`` reads
back: one storage gets a save and a restore figure from the same bytes. Local disks
and POSIX mounts, torch and safetensors layouts, the ``framework`` strategy (the
layout's own writer as a job calls it) so far.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from ckptprof.atomic import PARTIAL_SUFFIX
from ckptprof.errors import CkptprofError, StorageError
from ckptprof.manifest import Manifest
from ckptprof.phases import Attr, Phase, fused_value
from ckptprof.storage import open_storage
from ckptprof.synth.fill import RandomFiller
from ckptprof.synth.generate import claim_location, entry_of, publish_manifest
from ckptprof.synth.layouts import get_layout
from ckptprof.synth.plan import CheckpointPlan, SynthSpec
from ckptprof.synth.ranges import SAVE_STRATEGIES
from ckptprof.units import fmt_bytes

FSYNC = "fsync"  # the phase that forces written bytes to the device
MEMORY_HEADROOM = 0.85
SAVE_LAYOUTS = ("torch", "safetensors")


@dataclass
class SaveOptions:
    repeat: int = 3
    fsync: bool = True
    force: bool = False
    strategy: str = "framework"
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

    @property
    def gbps(self) -> float:
        return self.bytes / self.wall_s / 1e9 if self.wall_s else 0.0


def check(location: str, spec: SynthSpec, options: SaveOptions) -> None:
    """Refuse up front what this save cannot do (one line, with the fix)."""
    if spec.layout not in SAVE_LAYOUTS:
        raise CkptprofError(
            f"--layout {spec.layout}: `synth save` writes {' and '.join(SAVE_LAYOUTS)} "
            "checkpoints so far; choose one of them."
        )
    if options.strategy not in SAVE_STRATEGIES:
        raise CkptprofError(
            f"--strategy {options.strategy}: `synth save` has {', '.join(SAVE_STRATEGIES)} "
            "so far (the layout's own writer)."
        )
    if location.startswith("s3://"):
        raise CkptprofError(
            f"{location}: `synth save` writes to a local or mounted path so far; for S3, "
            "time the restore side (`synth generate` then `synth restore`)."
        )
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


def save_once(storage_root: Path, plan: CheckpointPlan, tensors: dict, op, fsync: bool) -> int:
    """One save of ``tensors`` into ``storage_root`` as ``plan`` lays it out, recorded on
    ``op``; returns the bytes written."""
    layout = get_layout(plan.spec.layout)
    written: list[tuple[Path, Path]] = []
    total = 0
    try:
        for file in plan.files:
            final = storage_root / file.path
            final.parent.mkdir(parents=True, exist_ok=True)
            partial = final.with_name(f"{final.name}.{os.getpid()}{PARTIAL_SUFFIX}")
            written.append((partial, final))
            total += _write_one(layout, plan, file, tensors, partial, final, op, fsync)
    except BaseException:
        for partial, _ in written:  # an unfinished save leaves none of its files behind
            partial.unlink(missing_ok=True)
        raise
    with op.phase(Phase.COMMIT):
        for partial, final in written:
            os.replace(partial, final)
        if fsync:
            for folder in sorted({final.parent for _, final in written}):
                _fsync(folder)
    op.set_attributes({Attr.SAVE_FSYNC: fsync, Attr.FILES: len(written)})
    return total


def _write_one(layout, plan, file, tensors, partial: Path, final: Path, op, fsync: bool) -> int:
    """One file through the layout's writer (``write``), then forced to the device."""
    fused = {Attr.FUSED: fused_value((Phase.SERIALIZE, Phase.WRITE), "the layout's writer")}
    with op.phase(Phase.WRITE, **fused):
        start = time.perf_counter()
        try:
            layout.save_file(plan, file, partial, tensors)
        except (OSError, RuntimeError) as exc:  # torch.save reports ENOSPC as RuntimeError
            raise StorageError(
                f"{final}: could not be written ({str(exc).splitlines()[0]}); check free "
                "space and permissions there."
            ) from None
    size = partial.stat().st_size
    op.add_file(Phase.WRITE, file.path, size, time.perf_counter() - start)  # + its bytes
    if fsync:
        with op.phase(FSYNC):
            _fsync(partial)
        op.add_bytes(FSYNC, size)
    return size


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_save(
    location: str, spec: SynthSpec, options: SaveOptions, tracer, echo=print
) -> list[SaveRecord]:
    """Build the state, then save it ``repeat`` times into ``location`` (each save
    replaces the last: they are ours); the last one stays, with its manifest."""
    check(location, spec, options)
    layout = get_layout(spec.layout)
    plan = layout.plan(spec)
    _check_memory(plan)
    storage = open_storage(location)
    claim_location(storage, plan, options.force)
    root = Path(storage.uri)
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
    }
    for repeat in range(options.repeat):
        with tracer.save({**attrs, Attr.REPEAT: repeat}) as op:
            nbytes = save_once(root, plan, tensors, op, options.fsync)
        summary = op.summary
        ctx = op.span_context
        record = SaveRecord(
            repeat=repeat,
            wall_s=summary.wall_s,
            bytes=nbytes,
            phases={name: stats.busy_s for name, stats in summary.phases.items()},
            fsync=options.fsync,
            trace_id=format(ctx.trace_id, "032x") if ctx else "",
        )
        records.append(record)
        echo(save_line(record))
    entries = {f.path: entry_of(root / f.path) for f in plan.files}  # untimed: for restore
    publish_manifest(storage, Manifest(entries, spec=spec.to_dict()))
    return records


def save_line(record: SaveRecord) -> str:
    parts = ", ".join(f"{name} {seconds:.3f} s" for name, seconds in record.phases.items())
    synced = "" if record.fsync else " (no fsync: the bytes may be only in the page cache)"
    return (
        f"save #{record.repeat}: {record.wall_s:.3f} s, {record.gbps:.2f} GB/s "
        f"({fmt_bytes(record.bytes)}; {parts}){synced}"
    )


__all__ = ["SaveOptions", "SaveRecord", "build_state", "run_save", "save_once"]
