"""One traced ``Trainer._save_checkpoint``, group by group: the model, the optimizer and
scheduler, the scaler, the RNG state and the trainer state are each timed as ``write``
(less the ``state_dict()`` calls: ``serialize``), the files each group wrote are noted
(this rank's, by name or as the saving rank), a push to the Hub (``push_to_hub``) is
``push``, and the rotation that follows (``save_total_limit``) is ``rotate``.

Why apart from the instrumentor: the Trainer writes its files in methods of its own, one
per group, so the bookkeeping of one save is a piece of its own (:class:`SaveGroups`),
made anew for every save.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import TYPE_CHECKING

from ckptprof.integrations.hf_folders import checkpoints_in, weights_format
from ckptprof.phases import Attr, Phase

if TYPE_CHECKING:
    from transformers import Trainer

    from ckptprof.integrations.instrumentor import Instrumentor

ROTATE = "rotate"
PUSH = "push"  # Trainer._push_from_checkpoint: the checkpoint's upload to the Hub
_RANK_IN_NAME = re.compile(r"(?:rng_state_|rank)(\d+)")


class SaveGroups:
    """Times each file group of one ``_save_checkpoint`` and notes the files it wrote.

    Args:
        owner: the instrumentor (its patcher, session and files).
        trainer: the Trainer saving.
        op: the save's operation (None: not traced; nothing is wrapped).
        folder: the ``checkpoint-N`` folder it writes.
    """

    GROUPS = {
        "save_model": "model",
        "_save_optimizer_and_scheduler": "optimizer",
        "_save_scaler": "scaler",
        "_save_rng_state": "rng",
    }

    def __init__(self, owner: Instrumentor, trainer: Trainer, op, folder: str) -> None:
        self.owner = owner
        self.trainer = trainer
        self.op = op
        self.folder = folder
        self.written: set[str] = set()
        self.last_end_ns: int | None = None

    def wrapped(self) -> contextlib.ExitStack:
        """Each group's method wrapped (on the Trainer and its state) until it closes."""
        trainer = self.trainer
        stack = contextlib.ExitStack()
        if self.op is None:
            return stack
        patcher = self.owner.patcher
        # never the scheduler: LRScheduler.state_dict() pickles its own __dict__, where a
        # wrapper would land in the checkpoint
        serialize = [
            (getattr(trainer, "model", None), "state_dict"),
            (getattr(trainer, "optimizer", None), "state_dict"),
        ]
        engine = getattr(trainer, "deepspeed", None)  # its save traces itself
        exclude = [(engine, "save_checkpoint")] if engine is not None else []
        for method, group in self.GROUPS.items():
            timed = self._timed(group, serialize, exclude)
            stack.enter_context(
                patcher.scoped(trainer, method, timed, label=method, phase=f"{group} write")
            )
        if callable(getattr(trainer, "_push_from_checkpoint", None)):
            stack.enter_context(
                patcher.scoped(
                    trainer,
                    "_push_from_checkpoint",
                    self._pushed,
                    label="_push_from_checkpoint",
                    phase=PUSH,
                )  # fmt: skip
            )
        state = getattr(trainer, "state", None)
        if state is not None:
            timed = self._timed("state", [], [])
            label = "state.save_to_json"
            stack.enter_context(
                patcher.scoped(state, "save_to_json", timed, label=label, phase="state write")
            )
        return stack

    def _timed(self, group: str, serialize, exclude):
        def make(original):
            def run(*args, **kwargs):
                op = self.op
                try:
                    before = self._snapshot()
                except Exception:  # noqa: BLE001 - bookkeeping, not the save
                    before = {}
                start = time.time_ns()
                try:
                    return self.owner.split(
                        op,
                        Phase.WRITE,
                        original,
                        *args,
                        inner=[(obj, name, Phase.SERIALIZE) for obj, name in serialize]
                        + [(obj, name, None) for obj, name in exclude],
                        **kwargs,
                    )
                finally:
                    end = self.last_end_ns = time.time_ns()
                    try:
                        self._note_files(group, before, start, end)
                    except Exception as exc:  # noqa: BLE001 - bookkeeping, not the save
                        self.owner.session.warn_once("save files", exc)

            return run

        return make

    def _pushed(self, original):
        """``push``: the Hub upload between the last group and the rotation (timed as
        the rotation before), its own interval."""

        def run(*args, **kwargs):
            start = time.time_ns()
            try:
                return original(*args, **kwargs)
            finally:
                end = self.last_end_ns = time.time_ns()
                try:
                    self.op.add_interval(PUSH, start, end)
                except Exception as exc:  # noqa: BLE001 - bookkeeping, not the save
                    self.owner.session.warn_once("push", exc)

        return run

    def _snapshot(self) -> dict[str, tuple]:
        """Every file's identity and times (what a write changes), by name."""
        try:
            return {e.name: _identity(e.stat()) for e in os.scandir(self.folder) if e.is_file()}
        except FileNotFoundError:
            return {}

    def _note_files(self, group: str, before: dict, start_ns: int, end_ns: int) -> None:
        """Files this rank wrote in the group: new or changed since it started (not by
        mtime alone: file times come from a coarse clock), and this rank's by name
        (``rng_state_<R>.pth``, ``rank<R>``) or, for shared files, the saving rank's."""
        rank = self.owner.session.rank
        nbytes = 0
        for name, identity in self._snapshot().items():
            if before.get(name) == identity or name in self.written:
                continue
            owner = _RANK_IN_NAME.search(name)
            if int(owner.group(1)) == rank if owner else self.trainer.args.should_save:
                self.written.add(name)
                nbytes += identity[-1]
        if nbytes:
            self.op.add_bytes(Phase.WRITE, nbytes)
            self.op.set_phase_attributes(
                Phase.WRITE,
                **{
                    Attr.phase_key(Phase.WRITE, f"{group}_s"): round((end_ns - start_ns) / 1e9, 6),
                    Attr.phase_key(Phase.WRITE, f"{group}_bytes"): nbytes,
                },
            )

    def finish(self, run_dir: str, before: set[str]) -> None:
        """``rotate``: what ``_save_checkpoint`` did after the last group (deleting old
        checkpoints for ``save_total_limit``, and their records); the format, file count."""
        trainer = self.trainer
        removed = before - checkpoints_in(run_dir)
        limit = trainer.args.save_total_limit
        if trainer.args.should_save:
            for name in removed:
                self.owner.files.forget_folder(os.path.join(run_dir, name))
        if limit and self.last_end_ns is not None and trainer.args.should_save:
            self.op.add_interval(ROTATE, self.last_end_ns, time.time_ns())
            self.op.set_phase_attributes(
                ROTATE, **{Attr.ROTATE_LIMIT: limit, Attr.ROTATE_REMOVED: len(removed)}
            )
        self.op.set_phase_attributes(Phase.WRITE, **{Attr.FILES: len(self.written)})
        self.op.set_attributes({Attr.FORMAT: weights_format(self.written)})


def _identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    """What changes when a file is written: inode, mtime, ctime and size (last)."""
    return stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size


__all__ = ["PUSH", "ROTATE", "SaveGroups"]
