"""The record a save leaves of the files it wrote, and the reading of it on a restore.

Why apart from :mod:`~ckptprof.integrations.files`: the record is ckptprof's own format
(one JSON per file, ``<file>.ckptprof.json``, or per rank and folder,
``ckptprof-manifest.rank<R>.json``, kept in ckptprof's state location), built by every
save and read back by every restore, while ``files`` works on the checkpoint's own
files (fetch, verify) around the framework's loaders and savers.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ckptprof.integrations.health import BEFORE_SAVE
from ckptprof.memory import TRAINING_RSS, rss_bytes
from ckptprof.phases import Attr
from ckptprof.state import StateStore
from ckptprof.tracing.recorder import Operation

log = logging.getLogger("ckptprof")

FILE_RECORD_SUFFIX = ".ckptprof.json"
FOLDER_RECORD = "ckptprof-manifest.rank{rank}.json"
RECORD_VERSION = 2


@dataclass(frozen=True)
class Recorded:
    """What a save recorded about one file."""

    size: int
    xxh3: str = ""


@dataclass
class SaveRecord:
    """One rank's record of the files one save wrote (kept in the state location)."""

    files: dict[str, Recorded]
    verify: str
    run_id: str = ""
    rank: int = 0
    step: int | None = None
    saved_ns: int = field(default_factory=time.time_ns)
    #: the save's span (hex ids), so the restore of these files links back to it
    trace_id: str = ""
    span_id: str = ""
    #: median seconds per training step before the save (the after-resume baseline)
    step_median_s: float | None = None
    #: the process's resident memory while it trained (the resume's memory baseline)
    rss_bytes: int | None = None

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "tool": "ckptprof",
                "kind": "save-record",
                "version": RECORD_VERSION,
                "verify": self.verify,
                "run_id": self.run_id,
                "rank": self.rank,
                "step": self.step,
                "saved_ns": self.saved_ns,
                "trace_id": self.trace_id,
                "span_id": self.span_id,
                "step_median_s": self.step_median_s,
                "rss_bytes": self.rss_bytes,
                "files": {n: vars(e) for n, e in sorted(self.files.items())},
            },
            indent=1,
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> SaveRecord:
        data = json.loads(raw)
        if data.get("kind") != "save-record" or data.get("version") != RECORD_VERSION:
            raise ValueError(f"not a ckptprof save record (version {data.get('version')!r})")
        files = {
            str(name): Recorded(int(entry["size"]), str(entry.get("xxh3", "")))
            for name, entry in dict(data["files"]).items()
        }
        step = data.get("step")
        return cls(
            files,
            str(data["verify"]),
            str(data.get("run_id", "")),
            int(data.get("rank", 0)),
            None if step is None else int(step),
            int(data.get("saved_ns", 0)),
            str(data.get("trace_id", "")),
            str(data.get("span_id", "")),
            float(data["step_median_s"]) if data.get("step_median_s") is not None else None,
            int(data["rss_bytes"]) if data.get("rss_bytes") is not None else None,
        )


def merge(records: Iterable[SaveRecord]) -> dict[str, Recorded] | None:
    """The files of several ranks' records as one mapping (None: no record)."""
    merged: dict[str, Recorded] = {}
    found = False
    for record in records:
        found = True
        merged.update(record.files)
    return merged if found else None


def link_to_saves(op: Operation, records: Iterable[SaveRecord]) -> None:
    """Link a restore to the saves (one per rank) that wrote what it reads: a backend
    then shows save → restore as one story, across processes and days."""
    seen = set()
    paces, memory = [], []
    for record in records:
        if record.step_median_s:
            paces.append(record.step_median_s)
        if record.rss_bytes:
            memory.append(record.rss_bytes)
        if record.span_id and record.span_id not in seen:
            seen.add(record.span_id)
            op.link_to(record.trace_id, record.span_id, **{Attr.LINK: "saved_by"})
    if paces:  # what the steps after the resume are compared with
        op.set_attributes({BEFORE_SAVE: round(statistics.median(paces), 6)})
    if memory:  # and the memory it peaks at (one rank's: the records are per rank)
        op.set_attributes({TRAINING_RSS: max(memory)})


def hash_file(path: str) -> str:
    """xxh3-64 of a file, streamed (never the whole file in memory)."""
    import xxhash

    digest = xxhash.xxh3_64()
    with open(path, "rb", buffering=0) as handle:
        for chunk in iter(lambda: handle.read(8 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_record(state: StateStore, parent: str, name: str) -> SaveRecord | None:
    """The record ``name`` kept about ``parent`` (None: none, or unreadable)."""
    raw = state.read(parent, name)
    if raw is None:
        return None
    try:
        return SaveRecord.from_json(raw)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("ckptprof: ignoring unreadable record %s (%s)", name, exc)
        return None


def folder_records(state: StateStore, folder: str) -> list[SaveRecord]:
    """The ranks' records of the last save into ``folder``.

    Records of an older run into the same folder (other ranks of a larger job,
    say) are left out: only the run of the newest record counts.
    """
    parent, name = os.path.split(os.path.abspath(folder))
    records = []
    for record_name in state.names(parent, name):
        if not Path(record_name).name.startswith("ckptprof-manifest.rank"):
            continue
        raw = state.read(parent, record_name)
        try:
            records.append(SaveRecord.from_json(raw or b""))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ckptprof: ignoring unreadable record %s (%s)", record_name, exc)
    if not records:
        return []
    newest_run = max(records, key=lambda r: r.saved_ns).run_id
    return [record for record in records if record.run_id == newest_run]


def new_record(
    session, verify: str, folder: str, names: Iterable[str], op: Operation | None, step
) -> SaveRecord:
    """This rank's record of ``names`` in ``folder`` as the save left them: their sizes
    (and xxh3 with ``verify="full"``), the save's span, the pace and memory before it."""
    files = {}
    for name in sorted(set(names)):
        path = os.path.join(folder, name)
        digest = hash_file(path) if verify == "full" else ""
        files[name] = Recorded(os.path.getsize(path), digest)
    tracer = session.tracer
    context = op.span_context if op is not None else None
    return SaveRecord(
        files,
        verify,
        run_id=(tracer.run_id or "") if tracer is not None else "",
        rank=session.rank,
        step=step,
        trace_id=f"{context.trace_id:032x}" if context else "",
        span_id=f"{context.span_id:016x}" if context else "",
        step_median_s=session.steps.median(),
        rss_bytes=_resident(),
    )


def _resident() -> int | None:
    try:
        return rss_bytes()
    except OSError:  # no /proc: the record goes without
        return None


__all__ = [
    "FILE_RECORD_SUFFIX",
    "FOLDER_RECORD",
    "Recorded",
    "SaveRecord",
    "folder_records",
    "hash_file",
    "link_to_saves",
    "merge",
    "new_record",
    "read_record",
]
