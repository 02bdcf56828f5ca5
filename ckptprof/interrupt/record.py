"""The interruption record: what the interrupted process knew, for the one that resumes.

Written atomically (``ckptprof-interruption.json``) in ckptprof's state location for the
checkpoint directory (:mod:`ckptprof.state`: a local folder, a shared mount or an ``s3://``
prefix; beside the checkpoints only when asked) when a notice arrives and again when the
emergency save ends, so a process killed mid-save still leaves the notice behind. The
resuming process reads it, links its restore to the interrupted trace and works out
downtime and steps lost.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ckptprof.phases import Attr
from ckptprof.storage.registry import is_path

log = logging.getLogger("ckptprof")

RECORD_NAME = "ckptprof-interruption.json"
VERSION = 1

#: outcome of the emergency save
SAVED, MISSED, FAILED, PENDING, NOT_SAVED = "saved", "missed_deadline", "failed", "pending", "none"


@dataclass
class InterruptionRecord:
    run_id: str
    trace_id: str  # hex, of the notice span (the resumed restore links to it)
    span_id: str
    source: str
    notice_ns: int
    deadline_ns: int | None
    deadline_assumed: bool
    step: int  # last training step done when the notice arrived
    checkpoint: str | None = None  # what the emergency save wrote (None until it ends)
    checkpoint_step: int | None = None
    save_start_ns: int | None = None
    save_end_ns: int | None = None
    outcome: str = PENDING
    error: str | None = None
    framework: str = ""
    host: str = field(default_factory=lambda: os.uname().nodename)
    pid: int = field(default_factory=os.getpid)
    last_step_ns: int | None = None  # when the last step before the exit ended
    last_step: int | None = None
    version: int = VERSION

    @property
    def margin_s(self) -> float | None:
        """Deadline minus the end of the emergency save (negative: it was missed)."""
        if self.deadline_ns is None or self.save_end_ns is None:
            return None
        return (self.deadline_ns - self.save_end_ns) / 1e9

    def to_json(self) -> bytes:
        data = asdict(self)
        data["margin_s"] = self.margin_s
        return json.dumps(data, indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> InterruptionRecord:
        data = json.loads(raw)
        data.pop("margin_s", None)
        if data.get("version") != VERSION:
            raise ValueError(f"version {data.get('version')!r}, expected {VERSION}")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def write_record(location: str, record: InterruptionRecord) -> None:
    """Atomically write ``record`` into ``location`` (a folder or ``s3://bucket/prefix``)."""
    raw = record.to_json()
    if not is_path(location):
        from ckptprof.storage import open_storage

        open_storage(location).write_bytes(RECORD_NAME, raw)  # one PUT: atomic
        return
    from ckptprof.atomic import atomic_write
    from ckptprof.state import unwritable_state

    try:
        os.makedirs(location, exist_ok=True)
        atomic_write(os.path.join(location, RECORD_NAME), raw)
    except OSError as exc:
        raise unwritable_state(location, exc) from None


def read_record(location: str, run_id: str | None = None) -> InterruptionRecord | None:
    """The record in ``location``, or None (nothing there, unreadable, or another run's;
    the last two with a warning naming the file)."""
    where = f"{location.rstrip('/')}/{RECORD_NAME}"
    try:
        if not is_path(location):
            from ckptprof.storage import open_storage

            raw = open_storage(location).read_bytes(RECORD_NAME)
        else:
            with open(os.path.join(location, RECORD_NAME), "rb") as handle:
                raw = handle.read()
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - the resume must go on without it
        log.warning("ckptprof: ignoring interruption record %s: %s", where, exc)
        return None
    try:
        record = InterruptionRecord.from_json(raw)
    except Exception as exc:  # noqa: BLE001
        log.warning("ckptprof: ignoring corrupt interruption record %s (%s)", where, exc)
        return None
    if run_id is not None and record.run_id != run_id:
        log.warning(
            "ckptprof: ignoring interruption record %s: it is run %s's, this is run %s",
            where,
            record.run_id,
            run_id,
        )
        return None
    return record


def consume_record(location: str) -> None:
    """Retire the record once a resume has linked to it, so the next resume does not:
    renamed to ``….done`` (on S3: copied there, then deleted)."""
    done = f"{RECORD_NAME}.{time.strftime('%Y%m%dT%H%M%S')}.done"
    if not is_path(location):
        from ckptprof.storage import open_storage

        try:
            storage = open_storage(location)
            storage.write_bytes(done, storage.read_bytes(RECORD_NAME))
            storage.delete(RECORD_NAME)
        except Exception as exc:  # noqa: BLE001
            log.warning("ckptprof: could not retire interruption record in %s: %s", location, exc)
        return
    path = os.path.join(location, RECORD_NAME)
    try:
        os.replace(path, os.path.join(location, done))
    except OSError as exc:
        log.warning("ckptprof: could not retire interruption record %s: %s", path, exc)


def as_attributes(record: InterruptionRecord) -> dict[str, Any]:
    """The record's facts as ``ckpt.interruption.*`` span attributes."""
    attrs: dict[str, Any] = {
        Attr.INTERRUPTION_SOURCE: record.source,
        Attr.INTERRUPTION_RUN_ID: record.run_id,
        Attr.INTERRUPTION_OUTCOME: record.outcome,
        Attr.INTERRUPTION_STEP: record.step,
    }
    if record.margin_s is not None:
        attrs[Attr.INTERRUPTION_MARGIN_S] = round(record.margin_s, 3)
    if record.checkpoint_step is not None:
        attrs[Attr.INTERRUPTION_CHECKPOINT_STEP] = record.checkpoint_step
    # what the resumed run's report needs where the interrupted process left no span (it
    # was killed before its emergency save ended): the notice, its deadline, the last step
    attrs[Attr.INTERRUPTION_DEADLINE_ASSUMED] = bool(record.deadline_assumed)
    if record.deadline_ns is not None:
        deadline_s = (record.deadline_ns - record.notice_ns) / 1e9
        attrs[Attr.INTERRUPTION_DEADLINE_S] = round(deadline_s, 3)
    attrs[Attr.INTERRUPTION_NOTICE_AT] = iso_time(record.notice_ns)
    if record.last_step is not None:
        attrs[Attr.INTERRUPTION_LAST_STEP] = record.last_step
    if record.last_step_ns is not None:
        attrs[Attr.INTERRUPTION_LAST_STEP_AT] = iso_time(record.last_step_ns)
    return attrs


def iso_time(ns: int) -> str:
    """A time as the trace files write a span's (ISO, microseconds, ``Z``)."""
    from opentelemetry.sdk.util import ns_to_iso_str

    return ns_to_iso_str(ns)
