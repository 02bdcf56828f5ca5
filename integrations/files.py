"""list / fetch / verify / commit of the checkpoint files a framework reads and writes itself.

* ``fetch`` brings a file into the page cache just before the framework's own loader
  opens it (``sendfile`` to ``/dev/null``: no copy into user memory; pages already cached
  are not read again, and ``ckpt.cache.resident_fraction`` says how many were). The
  loader that follows — always the framework's own, called unchanged — is
  ``deserialize``, whether it maps the file (safetensors) or reads it (``torch.load``).
* ``verify`` checks each file against the manifest the save recorded or, without one,
  against the format's own integrity data (:mod:`ckptprof.integrity`); the span says
  which method ran. A problem is a warning naming the file and the framework goes on —
  ckptprof never refuses a resume the framework would perform — unless the user asked
  for ``strict`` verification.
* ``commit`` records what a save wrote (sizes, or xxh3 with ``verify="full"``, hashed
  while streaming) in ckptprof's state location (:mod:`ckptprof.state`), never in the
  checkpoint directory unless the user chose ``state_dir="beside"``; the record (its
  format, building and reading) is :mod:`~ckptprof.integrations.save_records`.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ckptprof import integrity
from ckptprof.errors import CkptprofError, VerifyError
from ckptprof.integrations.save_records import (
    FILE_RECORD_SUFFIX,
    FOLDER_RECORD,
    Recorded,
    SaveRecord,
    folder_records,
    hash_file,
    link_to_saves,
    merge,
    new_record,
    read_record,
)
from ckptprof.phases import Attr, Phase
from ckptprof.state import StateStore
from ckptprof.tracing.recorder import Operation

log = logging.getLogger("ckptprof")

VERIFY_MODES = ("full", "size", "none")


@dataclass
class FolderListing:
    """What the list phase found in a checkpoint folder the framework reads itself."""

    folder: str
    sizes: dict[str, int]
    recorded: dict[str, Recorded] | None
    resident_pages: int = 0
    total_pages: int = 0
    checked: set[str] = field(default_factory=set)


@dataclass
class _Tally:
    """What verify did within one operation: the methods that ran, the problems found."""

    methods: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)


class CheckpointFiles:
    """The file side of one adapter (see the module docstring).

    Args:
        session: the adapter's :class:`~ckptprof.integrations.session.TracingSession`.
        framework_name: how warnings name the loader ("Lightning", "the Trainer" …).
        verify: ``size``, ``full`` or ``none``.
        strict: refuse the resume (raise :class:`VerifyError`) on a verify problem.
        state: where records live.
    """

    def __init__(
        self, session, framework_name: str, verify: str, strict: bool, state: StateStore
    ) -> None:
        if verify not in VERIFY_MODES:
            raise CkptprofError(f"verify={verify!r} is not valid; expected one of {VERIFY_MODES}.")
        self.session = session
        self.framework_name = framework_name
        self.verify = verify
        self.strict = bool(strict)
        self.state = state
        self._tallies: weakref.WeakKeyDictionary[Operation, _Tally] = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------ single files
    def prefetch_file(self, path: str, op: Operation) -> None:
        """list + fetch + verify of one checkpoint file its loader will read next."""
        parent, name = os.path.split(os.path.abspath(path))
        with op.phase(Phase.LIST):
            size = os.path.getsize(path)
            record = read_record(self.state, parent, name + FILE_RECORD_SUFFIX)
        recorded = record.files.get(name) if record is not None else None
        link_to_saves(op, [record] if record is not None else [])
        op.set_attributes({Attr.CHECKPOINT_BYTES: size})
        self._fetch(path, size, op)
        self._check(path, size, recorded, op)

    def commit_file(self, path: str, op: Operation | None, step: int | None = None) -> None:
        """After a save of one file: record its size (and hash) in the state location."""
        parent, name = os.path.split(os.path.abspath(path))
        self._commit(parent, name + FILE_RECORD_SUFFIX, parent, [name], op, step)

    def move_file_record(self, source: str, target: str) -> None:
        """The file was renamed into place (an emergency save): so is its record."""
        try:
            s_parent, s_name = os.path.split(os.path.abspath(source))
            t_parent, t_name = os.path.split(os.path.abspath(target))
            raw = self.state.read(s_parent, s_name + FILE_RECORD_SUFFIX)
            if raw is None:
                return
            record = SaveRecord.from_json(raw)
            record.files = dict.fromkeys([t_name], *record.files.values())
            self.state.write(t_parent, t_name + FILE_RECORD_SUFFIX, record.to_json())
            self.state.delete(s_parent, s_name + FILE_RECORD_SUFFIX)
        except Exception as exc:  # noqa: BLE001
            self.session.warn_once("move_record", exc)

    def forget_file(self, path: str) -> None:
        """The framework removed a checkpoint file: remove its record too."""
        parent, name = os.path.split(os.path.abspath(str(path)))
        try:
            self.state.delete(parent, name + FILE_RECORD_SUFFIX)
        except Exception as exc:  # noqa: BLE001
            self.session.warn_once("forget_file", exc)

    # ------------------------------------------------------------------ folders
    def check_folder(self, folder: str, op: Operation) -> None:
        """list + verify of a folder its loader reads by itself (a DCP checkpoint, say):
        the files there, and the format's own data about them."""
        with op.phase(Phase.LIST):
            sizes = [e.stat().st_size for e in os.scandir(folder) if e.is_file()]
        op.set_phase_attributes(Phase.LIST, **{Attr.FILES: len(sizes), Attr.BYTES: sum(sizes)})
        self._check(folder, sum(sizes), None, op)

    def list_folder(self, folder: str, op: Operation) -> FolderListing | None:
        """Names, sizes and records; None when there is no such folder (the framework
        then reports that in its own words)."""
        with op.phase(Phase.LIST):
            if not os.path.isdir(folder):
                return None
            sizes = {}
            for entry in os.scandir(folder):
                try:
                    if entry.is_file():
                        sizes[entry.name] = entry.stat().st_size
                except OSError:
                    continue  # a dangling link or a file removed while listing
            records = folder_records(self.state, folder)
        link_to_saves(op, records)
        op.set_attributes({Attr.CHECKPOINT_BYTES: sum(sizes.values())})
        return FolderListing(folder, sizes, merge(records))

    def missing(self, listing: FolderListing | None, expected: set[str] | None = None) -> list[str]:
        """Files the save recorded that the folder lacks (``expected`` narrows the check)."""
        if listing is None or listing.recorded is None:
            return []
        names = set(listing.recorded) if expected is None else set(listing.recorded) & expected
        return sorted(names - set(listing.sizes))

    def report_missing(self, listing: FolderListing, names: Iterable[str], op: Operation) -> None:
        for name in names:
            self.problem(
                os.path.join(listing.folder, name),
                "missing, but the save wrote it (ckptprof's record)",
                op,
            )

    def fetch_from_folder(
        self,
        listing: FolderListing | None,
        names: Iterable[str],
        op: Operation,
        torch_save: Container[str] = (),
    ) -> None:
        """fetch + verify (once per file) of ``names`` (those present), ahead of the
        framework's own load; ``torch_save``: those it reads with ``torch.load`` (only the
        framework knows), verified as ``torch.save`` files."""
        if listing is None:
            return
        for name in names:
            if name not in listing.sizes:
                continue
            path = os.path.join(listing.folder, name)
            resident, total = self._fetch(path, listing.sizes[name], op)
            listing.resident_pages += resident
            listing.total_pages += total
            if listing.total_pages:
                fraction = listing.resident_pages / listing.total_pages
                cache = "hot" if fraction > 0.95 else "cold" if fraction < 0.05 else "mixed"
                op.set_phase_attributes(
                    Phase.FETCH,
                    **{Attr.CACHE_RESIDENT_FRACTION: round(fraction, 4), Attr.CACHE: cache},
                )
            if name not in listing.checked:
                listing.checked.add(name)
                recorded = (listing.recorded or {}).get(name)
                self._check(path, listing.sizes[name], recorded, op, name in torch_save)

    def read_folder_records(self, folder: str) -> dict[str, Recorded] | None:
        """Every rank's record of the last save into ``folder``, merged (None: none)."""
        return merge(folder_records(self.state, folder))

    def commit_folder(
        self, folder: str, names: Iterable[str], op: Operation | None, step: int | None = None
    ) -> None:
        """After a save into a folder: this rank's record of the files it wrote."""
        parent, name = os.path.split(os.path.abspath(folder))
        record = f"{name}/{FOLDER_RECORD.format(rank=self.session.rank)}"
        self._commit(parent, record, folder, names, op, step)

    def forget_rank_record(self, folder: str) -> None:
        """Before a save into ``folder``: drop this rank's old record, so a save cut short
        leaves none (an incomplete checkpoint must not look complete)."""
        parent, name = os.path.split(os.path.abspath(folder))
        try:
            self.state.delete(parent, f"{name}/{FOLDER_RECORD.format(rank=self.session.rank)}")
        except Exception as exc:  # noqa: BLE001
            self.session.warn_once("forget_rank_record", exc)

    def forget_folder(self, folder: str) -> None:
        """The framework deleted a checkpoint folder (rotation): remove its records."""
        parent, name = os.path.split(os.path.abspath(folder))
        try:
            for record_name in self.state.names(parent, name):
                self.state.delete(parent, record_name)
        except Exception as exc:  # noqa: BLE001
            self.session.warn_once("forget_folder", exc)

    # ------------------------------------------------------------------ verify
    def problem(self, path: str, text: str, op: Operation | None) -> None:
        """A verify finding: on the span, in the log; raised only when ``strict``."""
        message = f"{path}: {text}"
        if op is not None:
            tally = self._tally(op)
            tally.problems.append(message)
            op.set_phase_attributes(
                Phase.VERIFY,
                **{
                    Attr.VERIFY_PROBLEMS: len(tally.problems),
                    Attr.VERIFY_PROBLEM: tally.problems[0],
                },
            )
        if self.strict:
            raise VerifyError(
                f"{message}; resume from another checkpoint (strict verification is on)."
            )
        log.warning(
            "ckptprof: %s; %s loads it as usual (pass strict=True to refuse such a resume)",
            message,
            self.framework_name,
        )

    def _check(
        self,
        path: str,
        size: int,
        recorded: Recorded | None,
        op: Operation,
        torch_save: bool = False,
    ) -> None:
        problem = None
        with op.phase(Phase.VERIFY) as stats:
            stats.attributes[Attr.VERIFY_MODE] = self.verify
            if self.verify == "none":
                method = "none"
            elif recorded is not None:
                method, problem = self._against_record(path, size, recorded)
                if method == "record xxh3":
                    op.add_bytes(Phase.VERIFY, size)
            else:
                found = integrity.check(path, self.verify == "full", torch_save)
                method, problem = found.method, found.problem
                if found.checked_bytes:
                    op.add_bytes(Phase.VERIFY, found.checked_bytes)
            methods = self._tally(op).methods
            methods.add(method)
            stats.attributes[Attr.VERIFY_METHOD] = ", ".join(sorted(methods))
        if problem is not None:
            self.problem(path, problem, op)

    def _against_record(self, path: str, size: int, recorded: Recorded) -> tuple[str, str | None]:
        if size != recorded.size:
            return "record size", (
                f"{size} bytes, but the save wrote {recorded.size} (truncated or replaced)"
            )
        if self.verify != "full" or not recorded.xxh3:
            return "record size", None
        got = hash_file(path)
        if got != recorded.xxh3:
            return "record xxh3", (
                f"xxh3 {got} does not match the {recorded.xxh3} the save wrote: the file is corrupt"
            )
        return "record xxh3", None

    # ------------------------------------------------------------------ internals
    def _tally(self, op: Operation) -> _Tally:
        tally = self._tallies.get(op)
        if tally is None:
            tally = self._tallies[op] = _Tally()
        return tally

    def _fetch(self, path: str, size: int, op: Operation) -> tuple[int, int]:
        from ckptprof.storage.pagecache import resident_pages, warm_file

        start = time.time_ns()
        with op.phase(Phase.FETCH):
            resident, total = resident_pages(Path(path))
            if resident < total:
                warm_file(Path(path))
        op.add_file(Phase.FETCH, path, size, (time.time_ns() - start) / 1e9, start)
        return resident, total

    def _commit(
        self,
        parent: str,
        record_name: str,
        folder: str,
        names: Iterable[str],
        op: Operation | None,
        step: int | None,
    ) -> None:
        if self.verify == "none":
            return
        from ckptprof.integrations.session import phase_or_nothing

        try:
            with phase_or_nothing(op, Phase.COMMIT):
                record = new_record(self.session, self.verify, folder, names, op, step)
                self.state.write(parent, record_name, record.to_json())
        except Exception as exc:  # noqa: BLE001 - a record is ckptprof's, never the job's problem
            self.session.warn_once("commit", exc)


__all__ = ["CheckpointFiles", "FolderListing", "VERIFY_MODES"]
