"""The checkpoint one ``Trainer.train(resume_from_checkpoint=...)`` resumes from: which
``checkpoint-N`` (the Trainer's choice, unless the interruption record says its save
was cut short), listed and checked against the save's records (``list``), each file
fetched and verified before the Trainer's loader that reads it, and what the first step
after it reports (the first batch's fetch, the batches the Trainer skipped).

Why apart from the instrumentor: this is the restore's record of the checkpoint, kept
for one ``train()`` (:class:`Resume`); the instrumentor only calls it from the wrappers
it places on the Trainer's loaders.
"""

from __future__ import annotations

import logging
import os
import re
from typing import TYPE_CHECKING

from ckptprof.errors import VerifyError
from ckptprof.integrations.files import CheckpointFiles, FolderListing
from ckptprof.integrations.hf_folders import (
    TRAINER_STATE,
    WEIGHTS,
    checkpoints_in,
    strategy,
    weight_files,
    weights_format,
)
from ckptprof.phases import Attr, Phase

if TYPE_CHECKING:
    from transformers import Trainer

    from ckptprof.integrations.session import TracingSession

log = logging.getLogger("ckptprof")
#: the files of a ``checkpoint-N`` the Trainer reads with ``torch.load`` (weights, optimizer,
#: scheduler, scaler, RNG states, training arguments)
TORCH_SAVE = re.compile(r"\.(bin|pt|pth)$")


class Resume:
    """The checkpoint of the Trainer's resumes (see the module docstring).

    Args:
        session: the instrumentor's session (its restore operation).
        files: its file side (list, fetch, verify).
    """

    def __init__(self, session: TracingSession, files: CheckpointFiles) -> None:
        self.session = session
        self.files = files
        self.listing: FolderListing | None = None
        self.awaiting_first_step = False
        self.first_batch: tuple[int, int] | None = None  # (start, end) ns of its fetch
        self.skipped_batches: int | None = None  # the Trainer's data fast-forward

    def begin(self, trainer: Trainer, requested, deepspeed: bool):
        """``list``: resolve ``True`` to the last ``checkpoint-N`` (as the Trainer would)
        and list it; returns what ``train`` is then given: ``requested`` itself, unless
        the interruption record says the newest checkpoint's save was cut short."""
        from transformers.trainer_utils import get_last_checkpoint

        self.first_batch = self.skipped_batches = None
        op = self.session.begin_restore(
            {
                Attr.PATH: str(requested),
                Attr.WORLD_SIZE: trainer.args.world_size,
                Attr.STORAGE_KIND: "posix",
                Attr.STRATEGY: strategy(trainer),
            }
        )
        if op is None:
            return requested
        folder = last = requested
        if requested is True:
            with op.phase(Phase.LIST):
                output_dir = trainer.args.output_dir
                last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
                try:
                    folder = self._last_complete(last, trainer.args.world_size)
                except Exception as exc:  # noqa: BLE001 - records unreadable (EIO on NFS):
                    self.session.warn_once("last_complete", exc)
                    folder = last  # the Trainer's own choice stands
            if folder is None:
                return requested  # the Trainer raises its own "No valid checkpoint found"
            op.set_attributes({Attr.PATH: str(folder)})
        self.listing = self._guarded(self._list, str(folder), op)
        if self.listing is not None:
            fmt = "deepspeed" if deepspeed else weights_format(self.listing)
            op.set_attributes({Attr.FORMAT: fmt})
            self.fetch(op, [TRAINER_STATE])
        return requested if folder == last else folder

    def _list(self, folder: str, op) -> FolderListing | None:
        """List the folder; files the save wrote that are gone are verify findings — except
        weights converted to another form the Trainer also loads (sharded ↔ single)."""
        listing = self.files.list_folder(folder, op)
        missing = self.files.missing(listing)
        if listing is not None and missing:
            if weight_files(listing):
                converted = [n for n in missing if WEIGHTS.match(n)]
                if converted:
                    op.set_phase_attributes(
                        Phase.VERIFY, **{Attr.VERIFY_WEIGHTS_CONVERTED: ", ".join(converted)}
                    )
                missing = [n for n in missing if n not in converted]
            self.files.report_missing(listing, missing, op)
        return listing

    def _last_complete(self, folder: str | None, world_size: int = 1) -> str | None:
        """The newest ``checkpoint-N``, unless the interruption record says its save was
        cut short (no record of its files, and the emergency save of that step never
        finished): then the newest one whose save did finish.

        Only a single-process job substitutes: the record is rank 0's, in a state location
        that may be node-local, so ranks could read different records and load different
        checkpoints; with more ranks the Trainer's choice stands, with a warning."""
        from ckptprof.interrupt.record import SAVED, read_record

        if folder is None or self.files.read_folder_records(folder) is not None:
            return folder
        parent = os.path.dirname(folder)
        record = read_record(self.files.state.location(parent))
        step = _step_of(folder)
        if record is None or record.outcome == SAVED or str(record.step) != step:
            return folder  # nothing says it is incomplete: the Trainer's choice stands
        if world_size > 1:
            log.warning(
                "ckptprof: %s may have been cut short when the job was stopped (%s); resuming "
                "from it as the Trainer chose (%d ranks: each would decide from its own node's "
                "records, and must load the same checkpoint)",
                folder,
                record.outcome,
                world_size,
            )
            return folder
        finished = [
            p
            for p in checkpoints_in(parent)
            if p.rsplit("-", 1)[-1].isdigit()
            and self.files.read_folder_records(os.path.join(parent, p)) is not None
        ]
        if not finished:
            return folder
        best = max(finished, key=lambda name: int(name.rsplit("-", 1)[-1]))
        log.warning(
            "ckptprof: %s was being saved when the job was stopped (%s) and has no record of "
            "its files; resuming from %s",
            folder,
            record.outcome,
            best,
        )
        return os.path.join(parent, best)

    def fetch(self, op, names) -> None:
        """fetch + verify of ``names`` from the checkpoint listed, before a loader; the
        Trainer reads its ``.bin``/``.pt``/``.pth`` files with ``torch.load``, so junk
        there is a verify problem, not a format without integrity data."""
        names = list(names)
        torch_save = {name for name in names if TORCH_SAVE.search(name)}
        self._guarded(self.files.fetch_from_folder, self.listing, names, op, torch_save)

    def _guarded(self, fn, *args):
        """ckptprof's own file work: a strict verify refusal ends the restore and reaches
        the job (naming the file); anything else is ckptprof's problem, logged once."""
        try:
            return fn(*args)
        except VerifyError as exc:
            self.session.end_restore(exc)
            raise
        except Exception as exc:  # noqa: BLE001
            self.session.warn_once(getattr(fn, "__name__", "files"), exc)
            return None

    def first_step_done(self, trainer: Trainer | None, step: int) -> None:
        """``first_step`` ends: the restore is over (with the batches the Trainer skipped
        and its first batch's fetch)."""
        op = self.session.restore_op
        if op is None:
            return
        restored = _step_of(str(op.attributes.get(Attr.PATH, "")))
        extra = {Attr.RESTORED_STEP: int(restored)} if restored.isdigit() else {}  # checkpoint-N
        announce = trainer is not None and trainer.is_world_process_zero()
        batch, self.first_batch = self.first_batch, None
        skipped, self.skipped_batches = self.skipped_batches, None
        self.session.first_step_done(
            step, announce=announce, batch=batch, skipped_batches=skipped, **extra
        )


def _step_of(path: str) -> str:
    """``N`` of ``…/checkpoint-N`` (a trailing slash or ``.`` parts included)."""
    return os.path.basename(os.path.normpath(path)).rsplit("-", 1)[-1] if path else ""


__all__ = ["Resume"]
