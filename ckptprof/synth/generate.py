"""``ckptprof synth generate``: write a realistic checkpoint to a storage.

Generation is not timed. Each file is written under a temporary name and
published atomically; the manifest goes last, so a checkpoint interrupted
half-way never looks complete.
"""

from __future__ import annotations

from dataclasses import dataclass

from tqdm import tqdm

from ckptprof.errors import CkptprofError
from ckptprof.manifest import MANIFEST_NAME, Manifest, entry_for_bytes
from ckptprof.storage import open_storage
from ckptprof.synth.fill import RandomFiller
from ckptprof.synth.layouts import get_layout
from ckptprof.synth.plan import CheckpointPlan, SynthSpec

# torch.save/zip/pickle headers and the small files on top of the tensor payload
FORMAT_OVERHEAD = 1.01
SMALL_FILE_ALLOWANCE = 16 << 20
SPACE_HEADROOM = 256 << 20


@dataclass
class GenerateResult:
    location: str
    plan: CheckpointPlan
    manifest: Manifest | None

    @property
    def total_bytes(self) -> int:
        return self.manifest.total_bytes if self.manifest else estimated_bytes(self.plan)


def estimated_bytes(plan: CheckpointPlan) -> int:
    return int(plan.payload_bytes * FORMAT_OVERHEAD) + SMALL_FILE_ALLOWANCE


def plan_checkpoint(spec: SynthSpec) -> CheckpointPlan:
    return get_layout(spec.layout).plan(spec)


def generate(
    location: str, spec: SynthSpec, *, force: bool = False, progress: bool | None = None
) -> GenerateResult:
    layout = get_layout(spec.layout)
    plan = layout.plan(spec)
    storage = open_storage(location)

    existing = _existing(storage)
    if existing and not force:
        raise CkptprofError(
            f"{storage.uri} is not empty ({len(existing)} files); choose an empty location "
            "or pass --force to replace a checkpoint ckptprof generated there."
        )
    if existing:
        existing = _replaceable(storage, existing)
    needed = estimated_bytes(plan) + SPACE_HEADROOM
    free = storage.free_bytes()
    if free is not None and free < needed:
        raise CkptprofError(
            f"{storage.uri}: needs about {needed / 2**30:.2f} GiB but only "
            f"{free / 2**30:.2f} GiB is free; free space or use a smaller --scale."
        )
    if free is None:
        _check_staging_space(plan)
    if existing:
        _remove(storage, existing)

    filler = RandomFiller(spec.seed)
    entries = {}
    bar = tqdm(
        total=plan.payload_bytes,
        unit="B",
        unit_scale=True,
        desc="generate",
        disable=None if progress is None else not progress,
    )
    try:
        for file in plan.files:
            with storage.staging_file(file.path) as tmp:
                layout.write_file(plan, file, tmp, filler)
                entries[file.path] = _entry_of(tmp)
            bar.update(file.payload_bytes)
    finally:
        bar.close()
    manifest = Manifest(entries, spec=spec.to_dict())
    storage.write_bytes(MANIFEST_NAME, manifest.to_json())
    return GenerateResult(storage.uri, plan, manifest)


def _check_staging_space(plan: CheckpointPlan) -> None:
    """Object stores get each file staged in $TMPDIR first: the largest must fit there."""
    import shutil
    import tempfile

    tmp = tempfile.gettempdir()
    largest = max((f.payload_bytes for f in plan.files), default=0)
    need = int(largest * FORMAT_OVERHEAD) + SPACE_HEADROOM
    free = shutil.disk_usage(tmp).free
    if free < need:
        raise CkptprofError(
            f"{tmp}: each file is staged here before upload and the largest needs about "
            f"{need / 2**30:.2f} GiB, but {free / 2**30:.2f} GiB is free; set TMPDIR to a "
            "larger disk or use more --ranks/--files."
        )


def _entry_of(path):
    import mmap

    with open(path, "rb") as handle:
        size = handle.seek(0, 2)
        if size == 0:
            return entry_for_bytes(b"")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return entry_for_bytes(view)


def _existing(storage) -> list[str]:
    try:
        return [i.path for i in storage.list()]
    except FileNotFoundError:
        return []


def _replaceable(storage, existing: list[str]) -> list[str]:
    """What --force may delete: a previous ckptprof checkpoint's own files, nothing else."""
    if MANIFEST_NAME not in existing:
        raise CkptprofError(
            f"{storage.uri} holds {len(existing)} files but no {MANIFEST_NAME}: it is not a "
            "ckptprof checkpoint, so --force will not delete it; choose an empty location."
        )
    try:
        previous = Manifest.from_json(storage.read_bytes(MANIFEST_NAME), MANIFEST_NAME)
    except CkptprofError:
        raise CkptprofError(
            f"{storage.uri}/{MANIFEST_NAME} is unreadable, so --force cannot tell which files "
            "are ckptprof's; choose an empty location."
        ) from None
    foreign = sorted(set(existing) - set(previous.files) - {MANIFEST_NAME})
    if foreign:
        raise CkptprofError(
            f"{storage.uri} holds files the previous checkpoint did not write (e.g. "
            f"{foreign[0]}); --force only replaces a ckptprof checkpoint; choose an empty location."
        )
    return [MANIFEST_NAME, *previous.files]


def _remove(storage, paths: list[str]) -> None:
    """Clear a previous checkpoint, manifest first so nothing half-replaced looks complete."""
    for rel in sorted(paths, key=lambda p: p != MANIFEST_NAME):
        storage.delete(rel)
