"""``ckptprof synth generate``: write a realistic checkpoint to a storage.

Generation is not timed. Each file is written under a temporary name and
published atomically; the manifest goes last, so a checkpoint interrupted
half-way never looks complete.

A location that holds anything is left alone unless ``--force`` is given, and
``--force`` deletes only what ckptprof wrote there: the files of a previous
manifest, or of an interrupted generation (:data:`GENERATING_NAME` lists them,
written before the first file and removed after the manifest). Every path comes
from a checked manifest and stays inside the location.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ckptprof.atomic import PARTIAL_SUFFIX
from ckptprof.errors import CkptprofError, StorageError
from ckptprof.manifest import (
    GENERATING_NAME,
    GENERATING_SCHEMA,
    MANIFEST_NAME,
    Manifest,
    entry_for_bytes,
    read_json,
)
from ckptprof.progress import bar as progress_bar
from ckptprof.storage import open_storage
from ckptprof.storage.base import ObjectInfo, Storage
from ckptprof.synth.fill import RandomFiller
from ckptprof.synth.layouts import Layout, get_layout
from ckptprof.synth.plan import CheckpointPlan, FilePlan, SynthSpec
from ckptprof.units import fmt_bytes

BLOCK = 4096  # allocation unit: every file takes whole blocks
SMALL_FILE_BYTES = 8 << 10  # config, RNG state, `latest`…: each under this (measured)
SMALL_FILE_ALLOWANCE = 16 << 20  # the few big ones: tokenizer.json at full scale, indexes
#: beyond the files' own blocks: folders, the manifest and the generation record (the
#: files are written one at a time under a temp name, so nothing is held twice)
SPACE_HEADROOM = 4 << 20
INODE_HEADROOM = 64  # folders, temp names, the manifest


@dataclass
class GenerateResult:
    location: str
    plan: CheckpointPlan
    manifest: Manifest | None

    @property
    def total_bytes(self) -> int:
        return self.manifest.total_bytes if self.manifest else estimated_bytes(self.plan)


def estimated_file_bytes(layout: Layout, file: FilePlan, block: int = BLOCK) -> int:
    """Disk space one file will take: payload, the layout's overhead, whole blocks."""
    raw = file.payload_bytes + layout.overhead(file) if file.pieces else SMALL_FILE_BYTES
    return -(-raw // block) * block


def estimated_bytes(plan: CheckpointPlan, block: int = BLOCK) -> int:
    """Disk space the whole checkpoint will take (an upper estimate)."""
    layout = get_layout(plan.spec.layout)
    files = sum(estimated_file_bytes(layout, f, block) for f in plan.files)
    return files + SMALL_FILE_ALLOWANCE


def plan_checkpoint(spec: SynthSpec) -> CheckpointPlan:
    return get_layout(spec.layout).plan(spec)


def generate(
    location: str,
    spec: SynthSpec,
    *,
    force: bool = False,
    progress: bool | None = None,
    echo: Callable[[str], None] = print,
) -> GenerateResult:
    layout = get_layout(spec.layout)
    plan = layout.plan(spec)
    storage = open_storage(location)
    with storage.claim():  # a second writer of this location is refused at once
        claim_location(storage, plan, force, echo)

        filler = RandomFiller(spec.seed)
        entries = {}
        bar = progress_bar(plan.payload_bytes, "generate", progress, leave=True)
        filler.on_chunk = bar.update  # the bar moves within a large file, chunk by chunk
        written = 0
        placed: dict = {}
        try:
            for file in plan.files:
                entries[file.path] = _write_one(storage, layout, plan, file, filler, placed)
                written += file.payload_bytes
                bar.update(max(0, written - bar.n))
        finally:
            bar.close()
        manifest = Manifest(entries, spec=spec.to_dict())
        publish_manifest(storage, manifest)
        return GenerateResult(storage.uri, plan, manifest)


def claim_location(
    storage: Storage, plan: CheckpointPlan, force: bool, echo: Callable[[str], None] = print
) -> None:
    """Make the location ready for ``plan``'s files: refuse what is not ours (``force``
    replaces only a ckptprof checkpoint), check space and every path first, record the
    files about to be written (:data:`GENERATING_NAME`), then clear the previous ones
    (with ``force``, also the uploads a killed save left open there, said in one line)."""
    existing = _existing(storage)
    owned = _owned(storage, existing, force)
    replaced = [i for i in existing if i.path in owned]
    _check_space(storage, plan, replaced)
    planned = [f.path for f in plan.files]
    removing = {i.path for i in replaced}
    for path in [*planned, MANIFEST_NAME, GENERATING_NAME]:  # all before deleting anything
        storage.check_writable(path, removing)
    storage.write_bytes(GENERATING_NAME, _generating_record(sorted(owned | set(planned))))
    _remove(storage, [i.path for i in replaced])
    if force:
        _abort_uploads(storage, echo)


def _abort_uploads(storage: Storage, echo: Callable[[str], None]) -> None:
    aborted = storage.abort_uploads()
    if aborted:
        plural = "s" if aborted > 1 else ""
        echo(
            f"{storage.uri}: aborted {aborted} unfinished multipart upload{plural} left there "
            "by a save or generation that did not finish."
        )


def publish_manifest(storage: Storage, manifest: Manifest) -> None:
    """The manifest last, then the generation record goes: now the checkpoint is complete."""
    storage.write_bytes(MANIFEST_NAME, manifest.to_json())
    storage.delete(GENERATING_NAME)


def write_generated(
    layout: Layout, plan: CheckpointPlan, file: FilePlan, dest: Path, filler, placed: dict
) -> None:
    """Write ``file`` to the local path ``dest`` as its framework would, with random tensor
    bytes (the archive is built around fake tensors, so none is held in memory); add where
    its pieces landed to ``placed`` for the indexes written after it."""
    from ckptprof.synth.codecs import get_codec
    from ckptprof.synth.codecs.torch_archive import fake_tensor

    if not file.pieces:
        dest.write_bytes(layout.small_bytes(plan, file, placed))
        return
    fakes = {p: fake_tensor(p.piece_shape, p.dtype) for p in file.pieces}
    landed = get_codec(layout.codec(file)).generate(dest, layout.archive(plan, file, fakes), filler)
    placed.update({piece: (file.path, *where) for piece, where in landed.items()})


def _write_one(storage: Storage, layout: Layout, plan, file: FilePlan, filler, placed: dict):
    """Write and publish one file; returns its manifest entry."""
    with storage.staging_file(file.path) as tmp:
        try:
            write_generated(layout, plan, file, tmp, filler, placed)
        except RuntimeError as exc:  # torch.save's writer reports a failed write this way
            raise StorageError(
                f"{storage.uri}/{file.path}: could not be written ({str(exc).splitlines()[0]}); "
                "check free space and permissions there."
            ) from None
        return entry_of(tmp)


# ------------------------------------------------------------------ what is there


def _existing(storage: Storage) -> list[ObjectInfo]:
    """Everything at the location; nothing only when the location itself does not exist
    (any other missing file is an error, never a reason to think it is empty)."""
    try:
        return storage.list()
    except FileNotFoundError:
        if storage.location_exists():
            raise
        return []


def _owned(storage: Storage, existing: list[ObjectInfo], force: bool) -> set[str]:
    """The paths ckptprof wrote here and may replace; refuses anything else.

    Without ``force`` any existing file is a refusal; with it, every file must be one
    a previous manifest or an interrupted generation's record names (or their temp
    files), so nothing ckptprof did not write is ever deleted.
    """
    if not existing:
        return set()
    paths = {i.path for i in existing}
    owned = _previous_files(storage, paths)
    if not force:
        hint = (
            "pass --force to replace the ckptprof checkpoint there"
            if owned
            else "choose an empty location (--force only replaces a ckptprof checkpoint)"
        )
        raise CkptprofError(f"{storage.uri} is not empty ({len(paths)} files); {hint}.")
    if not owned:
        raise CkptprofError(
            f"{storage.uri} holds {len(paths)} files but no {MANIFEST_NAME}: it is not a "
            "ckptprof checkpoint, so --force will not delete it; choose an empty location."
        )
    foreign = sorted(p for p in paths if not _is_ours(p, owned))
    if foreign:
        raise CkptprofError(
            f"{storage.uri} holds files the previous checkpoint did not write (e.g. "
            f"{foreign[0]}); --force only replaces a ckptprof checkpoint; choose an empty location."
        )
    return {p for p in paths if p in owned or _is_ours(p, owned)}


def _previous_files(storage: Storage, present: set[str]) -> set[str]:
    """Files a previous ckptprof run claimed here (with its own records), or empty."""
    owned: set[str] = set()
    try:
        if MANIFEST_NAME in present:
            where = f"{storage.uri}/{MANIFEST_NAME}"
            previous = Manifest.from_json(storage.read_bytes(MANIFEST_NAME), where)
            owned |= {MANIFEST_NAME, *previous.files}
        if GENERATING_NAME in present:
            where = f"{storage.uri}/{GENERATING_NAME}"
            raw = storage.read_bytes(GENERATING_NAME)
            record = read_json(raw, where, GENERATING_SCHEMA, "ckptprof generation record")
            owned |= {GENERATING_NAME, *record["files"]}
    except CkptprofError as exc:
        raise CkptprofError(
            f"{exc} So ckptprof cannot tell which files there are its own and will not "
            "replace any; choose an empty location."
        ) from None
    return owned


def _is_ours(path: str, owned: set[str]) -> bool:
    """A path ckptprof wrote: named by its records, or the temp file of one (a write
    killed before its rename: ``NAME.<pid>.partial``)."""
    if path in owned:
        return True
    stem, pid, suffix = (path.rsplit(".", 2) + ["", ""])[:3]
    return f".{suffix}" == PARTIAL_SUFFIX and pid.isdigit() and stem in owned


def _generating_record(paths: list[str]) -> bytes:
    return json.dumps({"tool": "ckptprof", "files": paths}, indent=1).encode()


def _remove(storage: Storage, paths: list[str]) -> None:
    """Clear a previous checkpoint, manifest first so nothing half-replaced looks complete
    (the generation record stays: it still names every file)."""
    for rel in sorted(paths, key=lambda p: p != MANIFEST_NAME):
        if rel != GENERATING_NAME:
            storage.delete(rel)


# ------------------------------------------------------------------ space


def _check_space(storage: Storage, plan: CheckpointPlan, replaced: list[ObjectInfo]) -> None:
    """Refuse before writing when the bytes or the files (inodes) cannot fit."""
    free = storage.free_bytes()
    if free is None:
        _check_staging_space(plan)
    else:
        needed = estimated_bytes(plan) + SPACE_HEADROOM
        free += sum(i.size for i in replaced)
        if free < needed:
            raise CkptprofError(
                f"{storage.uri}: the checkpoint takes about {fmt_bytes(needed)} on disk but "
                f"only {fmt_bytes(free)} is free; free space or use a smaller --scale."
            )
    inodes = storage.free_inodes()
    if inodes is not None:
        inodes += len(replaced)
        needed_files = len(plan.files) + INODE_HEADROOM
        if inodes < needed_files:
            raise CkptprofError(
                f"{storage.uri}: the checkpoint has {len(plan.files)} files but the filesystem "
                f"can create only {inodes} more (free inodes); free some, or use fewer --files."
            )


def _check_staging_space(plan: CheckpointPlan) -> None:
    """Object stores get each file staged in $TMPDIR first: the largest must fit there."""
    import shutil
    import tempfile

    tmp = tempfile.gettempdir()
    layout = get_layout(plan.spec.layout)
    largest = max((estimated_file_bytes(layout, f) for f in plan.files), default=0)
    need = largest + SPACE_HEADROOM
    free = shutil.disk_usage(tmp).free
    if free < need:
        raise CkptprofError(
            f"{tmp}: each file is staged here before upload and the largest needs about "
            f"{fmt_bytes(need)}, but {fmt_bytes(free)} is free; set TMPDIR to a "
            "larger disk or use more --ranks/--files."
        )


def entry_of(path):
    """A written file's manifest entry (size and digests)."""
    import mmap

    with open(path, "rb") as handle:
        size = handle.seek(0, 2)
        if size == 0:
            return entry_for_bytes(b"")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return entry_for_bytes(view)
