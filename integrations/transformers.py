"""Hugging Face ``Trainer``: ``Trainer(callbacks=[CkptProfCallback()])`` traces every
``_save_checkpoint`` and every ``train(resume_from_checkpoint=...)``.

Why the callback also patches the Trainer: ``TrainerCallback`` events carry the model,
optimizer and scheduler but never the Trainer, and ``train()`` loads the checkpoint
*before* the first event (``on_train_begin``). So the callback, when the Trainer built
with it fires ``on_init_end``, finds that Trainer on the call stack and wraps its
``train`` method on the instance. A callback added later with ``add_callback`` cannot do
that; call :func:`instrument` (one line, the documented alternative) instead.

Where each phase is measured (Transformers 5.x, tested with 5.24; local folders):

* ``list``: resolving ``resume_from_checkpoint=True`` (``get_last_checkpoint``), listing
  ``checkpoint-N`` and reading the manifests the save wrote.
* ``fetch`` + ``verify``: each file is read into the page cache (pages already cached
  are not read again; ``ckpt.cache.resident_fraction`` says how many were) and checked
  against the manifest just before the Trainer's own loader opens it: model weights
  (``model.safetensors``, ``pytorch_model.bin`` or the shards of an index), then
  ``optimizer.pt`` + ``scheduler.pt``, ``scaler.pt``, ``rng_state[_R].pth``, and
  ``trainer_state.json``.
* ``deserialize``: the Trainer's loaders (``_load_from_checkpoint``,
  ``_load_optimizer_and_scheduler``, ``_load_rng_state``, the trainer-state part of
  ``_init_training_state``) minus the time in ``load_state_dict``, which is ``reshard``.
* ``first_step``: from the last load to the end of the first optimizer step
  (``on_step_end``); it includes the data loader's skip of already-seen batches.
* save: ``ckpt.save`` around ``_save_checkpoint``; ``serialize`` is the ``state_dict()``
  calls, ``write`` the rest of each group (model, optimizer + scheduler, scaler, rng,
  trainer state; per-group seconds and bytes as ``ckpt.write.<group>_s/_bytes``),
  ``rotate`` deleting old checkpoints (``save_total_limit``), ``commit`` the rank's
  manifest ``ckptprof-manifest.rank<R>.json`` inside the checkpoint folder.

Only the attached Trainer and the objects it owns are patched, on the instance; the
inner wrappers live for one ``train()`` call, and :func:`uninstrument` removes the
``train`` wrapper and the callback. The callback is deliberately not an
``ExportableState``, so the Trainer never re-creates it on resume.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from typing import Any

from transformers import Trainer, TrainerCallback

from ckptprof.errors import VerifyError
from ckptprof.integrations.base import (
    FolderCheckpoints,
    FolderListing,
    Instrumentation,
    TracedAdapter,
)
from ckptprof.phases import Attr, Phase

log = logging.getLogger("ckptprof")

TRAINER_STATE = "trainer_state.json"
_RANK_IN_NAME = re.compile(r"(?:rng_state_|rank)(\d+)")
ROTATE = "rotate"


class CkptProfCallback(TrainerCallback, TracedAdapter):
    """Trace checkpoint saves and resumes of the Hugging Face ``Trainer`` it is given to.

    Args:
        trace_dir: where the JSON-lines trace goes (default ``$CKPTPROF_TRACE_DIR`` or
            ``./ckptprof-traces``); OTLP follows the standard ``OTEL_*`` variables.
        verify: ``size`` (default), ``full`` (xxh3 of every saved byte, one extra read per
            save and per resume) or ``none``.
        tracer_provider: record into this OpenTelemetry provider instead.
        interruptions: ``True`` (or a dict of
            :class:`~ckptprof.interrupt.guard.InterruptionGuard` options:
            ``sources``, ``metadata_url``, ``signal_grace_s``, ``cost_per_hour_usd``) to save
            on a Spot/preemption notice and link the next resume to it.

    Example::

        trainer = Trainer(model, args, train_dataset=ds, callbacks=[CkptProfCallback()])
        trainer.train(resume_from_checkpoint=True)
    """

    def __init__(
        self,
        trace_dir=None,
        verify: str = "size",
        tracer_provider=None,
        interruptions: bool | dict = False,
    ) -> None:
        self._inst = Instrumentation(
            "transformers", trace_dir=trace_dir, verify=verify, tracer_provider=tracer_provider
        )
        self._interruptions = interruptions
        self._stop_requested = False
        self._folders = FolderCheckpoints(self._inst)
        self.trainer: Trainer | None = None
        self._listing: FolderListing | None = None
        self._awaiting_first_step = False
        self._deepspeed = None  # the engine's tracing on the Trainer's DeepSpeed path

    # ------------------------------------------------------------------ events
    def on_init_end(self, args, state, control, **kwargs):
        if self.trainer is None:
            trainer = _calling_trainer(self)
            if trainer is not None:
                self.attach(trainer)

    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer is None:
            trainer = _calling_trainer(self)
            if trainer is not None:
                self.attach(trainer)
                log.warning(
                    "ckptprof: CkptProfCallback was added after the Trainer was built, so "
                    "this run's resume is not traced; pass it in Trainer(callbacks=[...]) "
                    "or call ckptprof.integrations.transformers.instrument(trainer)."
                )

    def on_step_end(self, args, state, control, **kwargs):
        if self._awaiting_first_step:
            self._awaiting_first_step = False
            self._finish_restore(state.global_step)
        guard = self._inst.interruptions
        if guard is not None:
            guard.step_end(state.global_step)
            if self._stop_requested:
                control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        # a notice that arrived during the Trainer's own save is handled right after it
        guard = self._inst.interruptions
        if guard is not None and guard.notice is not None:
            self.on_step_end(args, state, control)

    # ------------------------------------------------------------------ wiring
    def attach(self, trainer: Trainer) -> None:
        """Wrap ``trainer.train`` (on the instance) so each call is traced."""
        try:
            self.trainer = trainer
            self._inst.rank = trainer.args.process_index
            self._inst.start()  # telemetry now, not inside the first restore
            self._inst.patch(trainer, "train", self._wrap_train)
        except Exception as exc:  # noqa: BLE001
            self._inst.warn_once("attach", exc)

    def detach(self) -> None:
        """Undo every wrapper and flush spans."""
        self._inst.close()
        self.trainer = None

    def save(self) -> str:
        """Save a checkpoint of the current step now, traced; returns its folder.

        For emergency saves from outside the training loop (a signal handler, a Spot
        notice): the same ``_save_checkpoint`` the Trainer runs on ``save_steps``.
        """
        trainer = self.trainer
        if trainer is None:
            raise RuntimeError("CkptProfCallback.save() needs instrument(trainer) first.")
        folder = _checkpoint_folder(trainer)
        with self._inst.temporarily(trainer, "_save_checkpoint", self._wrap_save_checkpoint):
            trainer._save_checkpoint(trainer.model_wrapped, trial=None)
        return folder

    def _wrap_train(self, original):
        def train(resume_from_checkpoint=None, *args, **kwargs):
            trainer = self.trainer
            self._start_interruptions(trainer)
            try:
                if resume_from_checkpoint not in (None, False):
                    resume_from_checkpoint = self._begin_restore(trainer, resume_from_checkpoint)
                with self._wrapped_for_training(trainer):
                    return original(resume_from_checkpoint, *args, **kwargs)
            except BaseException as exc:
                self._awaiting_first_step = False
                self._inst.end_restore(exc)
                raise
            finally:
                if self._inst.restore_op is not None:  # no step ran after the resume
                    self._awaiting_first_step = False
                    self._inst.end_restore()
                self._inst.stop_interruptions()
                if self._inst.telemetry is not None:
                    self._inst.telemetry.flush()

        return train

    def _start_interruptions(self, trainer: Trainer) -> None:
        self._stop_requested = False
        self._inst.watch_interruptions(
            self._interruptions,
            location=lambda: trainer.args.output_dir,
            save=self.save,
            stop=lambda: setattr(self, "_stop_requested", True),
        )

    def _begin_restore(self, trainer: Trainer, requested):
        """``list``: resolve ``True`` to the last ``checkpoint-N`` (as the Trainer would)
        and list it; returns what ``train`` is then given."""
        from transformers.trainer_utils import get_last_checkpoint

        op = self._inst.begin_restore(
            {
                Attr.PATH: str(requested),
                Attr.WORLD_SIZE: trainer.args.world_size,
                Attr.STORAGE_KIND: "posix",
                "ckpt.strategy": _strategy(trainer),
            }
        )
        if op is None:
            return requested
        folder = requested
        if requested is True:
            with op.phase(Phase.LIST):
                output_dir = trainer.args.output_dir
                folder = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
                folder = self._last_complete(folder)
            if folder is None:
                return requested  # the Trainer raises its own "No valid checkpoint found"
            op.set_attributes({Attr.PATH: str(folder)})
        self._listing = self._guarded(self._folders.list, str(folder), op)
        if self._listing is not None:
            deepspeed = getattr(trainer, "is_deepspeed_enabled", False)
            fmt = "deepspeed" if deepspeed else _weights_format(self._listing.sizes)
            op.set_attributes({Attr.FORMAT: fmt})
            self._fetch(op, [TRAINER_STATE])
        return folder

    def _last_complete(self, folder: str | None) -> str | None:
        """The newest ``checkpoint-N``, unless the interruption record says its save was
        cut short (no manifest, and the emergency save of that step never finished):
        then the newest one whose save did finish."""
        from ckptprof.interrupt.record import SAVED, read_record

        if folder is None or self._folders.read_manifest(folder) is not None:
            return folder
        parent = os.path.dirname(folder)
        record = read_record(parent)
        step = folder.rsplit("-", 1)[-1]
        if record is None or record.outcome == SAVED or str(record.step) != step:
            return folder  # nothing says it is incomplete: the Trainer's choice stands
        finished = [
            p
            for p in _checkpoints_in(parent)
            if p.rsplit("-", 1)[-1].isdigit()
            and self._folders.read_manifest(os.path.join(parent, p)) is not None
        ]
        if not finished:
            return folder
        best = max(finished, key=lambda name: int(name.rsplit("-", 1)[-1]))
        log.warning(
            "ckptprof: %s was being saved when the job was stopped (%s) and has no manifest; "
            "resuming from %s",
            folder,
            record.outcome,
            best,
        )
        return os.path.join(parent, best)

    def _fetch(self, op, names) -> None:
        self._guarded(self._folders.fetch, self._listing, names, op)

    def _guarded(self, fn, *args):
        """ckptprof's own file work: a failed check ends the restore and reaches the
        job (naming the file); anything else is ckptprof's problem, logged once."""
        try:
            return fn(*args)
        except VerifyError as exc:
            self._inst.end_restore(exc)
            raise
        except Exception as exc:  # noqa: BLE001
            self._inst.warn_once(fn.__name__, exc)
            return None

    def _wrapped_for_training(self, trainer: Trainer):
        """The Trainer's loaders and ``_save_checkpoint``, wrapped for one ``train()``."""
        import contextlib

        stack = contextlib.ExitStack()
        inst = self._inst
        wrappers = {
            "_load_from_checkpoint": self._wrap_load_model,
            "_load_optimizer_and_scheduler": self._wrap_load(
                lambda t, ckpt: ["optimizer.pt", "optimizer.bin", "scheduler.pt"],
                lambda t: [(t.optimizer, "load_state_dict")],
            ),
            "_load_scaler": self._wrap_load(lambda t, ckpt: ["scaler.pt"], lambda t: []),
            "_load_rng_state": self._wrap_load(
                lambda t, ckpt: ["rng_state.pth", f"rng_state_{t.args.process_index}.pth"],
                lambda t: [],
            ),
            "_init_training_state": self._wrap_load(lambda t, ckpt: [], lambda t: []),
            "_save_checkpoint": self._wrap_save_checkpoint,
        }
        for name, make in wrappers.items():
            stack.enter_context(inst.temporarily(trainer, name, make))
        if getattr(trainer, "is_deepspeed_enabled", False):
            # the engine exists once accelerate has prepared it: trace its own checkpoint
            # reads and writes inside this Trainer's operations
            stack.enter_context(
                inst.temporarily(trainer.accelerator, "prepare", self._wrap_prepare)
            )
            stack.callback(self._close_deepspeed)
        return stack

    def _wrap_prepare(self, original):
        def prepare(*args, **kwargs):
            op = self._inst.restore_op
            start = time.time_ns()
            result = original(*args, **kwargs)
            if op is not None:  # building the ZeRO engine partitions what the load fills
                op.add_interval(Phase.RESHARD, start, time.time_ns())
                op.set_phase_attributes(
                    Phase.RESHARD, **{"ckpt.reshard.includes": "accelerate.prepare (DeepSpeed)"}
                )
            wrapped = getattr(self.trainer.accelerator, "deepspeed_engine_wrapped", None)
            engine = getattr(wrapped, "engine", None)
            if engine is not None and self._deepspeed is None:
                try:
                    from ckptprof.integrations.deepspeed import DeepSpeedInstrumentation

                    self._deepspeed = DeepSpeedInstrumentation(engine, shared=self._inst).attach()
                except Exception as exc:  # noqa: BLE001
                    self._inst.warn_once("deepspeed", exc)
            return result

        return prepare

    def _close_deepspeed(self) -> None:
        deepspeed, self._deepspeed = self._deepspeed, None
        if deepspeed is not None:
            deepspeed.close()

    def _wrap_load_model(self, original):
        def load_from_checkpoint(resume_from_checkpoint, model=None):
            op = self._inst.restore_op
            if op is None:
                return original(resume_from_checkpoint, model)
            trainer = self.trainer
            self._fetch(op, _weight_files(self._listing))
            target = model if model is not None else trainer.model
            return self._deserialize(
                op, original, resume_from_checkpoint, model, inner=[(target, "load_state_dict")]
            )

        return load_from_checkpoint

    def _wrap_load(self, files, inner):
        """A loader whose ``files(trainer, checkpoint)`` are fetched first and whose
        ``inner(trainer)`` methods are reshard."""

        def make(original):
            def load(*args, **kwargs):
                op = self._inst.restore_op
                if op is None:
                    return original(*args, **kwargs)
                trainer = self.trainer
                self._fetch(op, files(trainer, args[0] if args else None))
                return self._deserialize(op, original, *args, inner=inner(trainer), **kwargs)

            return load

        return make

    def _deserialize(self, op, original, *args, inner, **kwargs):
        try:
            return self._inst.split(
                op,
                Phase.DESERIALIZE,
                original,
                *args,
                inner=[(obj, name, Phase.RESHARD) for obj, name in inner],
                **kwargs,
            )
        finally:
            self._awaiting_first_step = True

    def _finish_restore(self, step: int) -> None:
        op = self._inst.restore_op
        if op is None:
            return
        restored = str(op.attributes.get(Attr.PATH, "")).rsplit("-", 1)[-1]
        extra = {Attr.RESTORED_STEP: int(restored)} if restored.isdigit() else {}  # checkpoint-N
        trainer = self.trainer
        announce = trainer is not None and trainer.is_world_process_zero()
        self._inst.first_step_done(step, announce=announce, **extra)

    # ------------------------------------------------------------------ save
    def _wrap_save_checkpoint(self, original):
        def save_checkpoint(model, trial, *args, **kwargs):
            trainer = self.trainer
            inst = self._inst
            folder = _checkpoint_folder(trainer, trial)
            run_dir = os.path.dirname(folder)
            before = _checkpoints_in(run_dir)
            attrs = {
                Attr.PATH: folder,
                Attr.STEP: trainer.state.global_step,
                Attr.WORLD_SIZE: trainer.args.world_size,
            }
            with inst.saving(attrs) as op:
                groups = _SaveGroups(self, op, folder)
                with groups.wrapped(trainer):
                    result = original(model, trial, *args, **kwargs)
                if op is not None:
                    try:
                        groups.finish(run_dir, before)
                    except Exception as exc:  # noqa: BLE001
                        inst.warn_once("save", exc)
                    self._folders.commit(folder, groups.written, op)
            return result

        return save_checkpoint


class _SaveGroups:
    """Times each file group of one ``_save_checkpoint`` and notes the files it wrote."""

    GROUPS = {
        "save_model": "model",
        "_save_optimizer_and_scheduler": "optimizer",
        "_save_scaler": "scaler",
        "_save_rng_state": "rng",
    }

    def __init__(self, owner: CkptProfCallback, op, folder: str) -> None:
        self.owner = owner
        self.op = op
        self.folder = folder
        self.written: set[str] = set()
        self.last_end_ns: int | None = None

    def wrapped(self, trainer: Trainer):
        import contextlib

        stack = contextlib.ExitStack()
        if self.op is None:
            return stack
        inst = self.owner._inst
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
            stack.enter_context(inst.temporarily(trainer, method, timed))
        state = getattr(trainer, "state", None)
        if state is not None:
            timed = self._timed("state", [], [])
            stack.enter_context(inst.temporarily(state, "save_to_json", timed))
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
                    return self.owner._inst.split(
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
                        self.owner._inst.warn_once("save files", exc)

            return run

        return make

    def _snapshot(self) -> dict[str, tuple]:
        """Every file's identity and times (what a write changes), by name."""
        try:
            return {
                e.name: _identity(e.stat())
                for e in os.scandir(self.folder)
                if e.is_file() and not e.name.startswith("ckptprof-manifest")
            }
        except FileNotFoundError:
            return {}

    def _note_files(self, group: str, before: dict, start_ns: int, end_ns: int) -> None:
        """Files this rank wrote in the group: new or changed since it started (not by
        mtime alone: file times come from a coarse clock), and this rank's by name
        (``rng_state_<R>.pth``, ``rank<R>``) or, for shared files, the saving rank's."""
        trainer = self.owner.trainer
        rank = self.owner._inst.rank
        nbytes = 0
        for name, identity in self._snapshot().items():
            if before.get(name) == identity or name in self.written:
                continue
            owner = _RANK_IN_NAME.search(name)
            if int(owner.group(1)) == rank if owner else trainer.args.should_save:
                self.written.add(name)
                nbytes += identity[-1]
        if nbytes:
            self.op.add_bytes(Phase.WRITE, nbytes)
            self.op.set_phase_attributes(
                Phase.WRITE,
                **{
                    f"ckpt.write.{group}_s": round((end_ns - start_ns) / 1e9, 6),
                    f"ckpt.write.{group}_bytes": nbytes,
                },
            )

    def finish(self, run_dir: str, before: set[str]) -> None:
        """``rotate``: what ``_save_checkpoint`` did after the last group (deleting old
        checkpoints for ``save_total_limit``); plus the format and file count."""
        trainer = self.owner.trainer
        removed = before - _checkpoints_in(run_dir)
        limit = trainer.args.save_total_limit
        if limit and self.last_end_ns is not None and trainer.args.should_save:
            self.op.add_interval(ROTATE, self.last_end_ns, time.time_ns())
            self.op.set_phase_attributes(
                ROTATE, **{"ckpt.rotate.limit": limit, "ckpt.rotate.removed": len(removed)}
            )
        self.op.set_phase_attributes(Phase.WRITE, **{Attr.FILES: len(self.written)})
        self.op.set_attributes({Attr.FORMAT: _weights_format(self.written)})


# ---------------------------------------------------------------------- helpers
def instrument(trainer: Trainer, **options: Any) -> CkptProfCallback:
    """Trace ``trainer``'s saves and resumes (for Trainers built without the callback).

    ``options`` are :class:`CkptProfCallback`'s. Returns the callback (already added).
    """
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, CkptProfCallback):
            if callback.trainer is not trainer:
                callback.attach(trainer)
            return callback
    callback = CkptProfCallback(**options)
    trainer.add_callback(callback)
    callback.attach(trainer)
    return callback


def uninstrument(trainer: Trainer) -> None:
    """Remove ckptprof from ``trainer``: its callback and every wrapper."""
    for callback in list(trainer.callback_handler.callbacks):
        if isinstance(callback, CkptProfCallback):
            callback.detach()
            trainer.remove_callback(callback)


def _calling_trainer(callback: CkptProfCallback) -> Trainer | None:
    """The Trainer whose event is being delivered to ``callback`` (from the call stack)."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            handler = getattr(candidate, "callback_handler", None)
            if handler is not None and callback in handler.callbacks:
                return candidate
        frame = frame.f_back
    return None


def _checkpoint_folder(trainer: Trainer, trial=None) -> str:
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    run_dir = trainer._get_output_dir(trial=trial)
    return os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")


def _identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    """What changes when a file is written: inode, mtime, ctime and size (last)."""
    return stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size


def _checkpoints_in(run_dir: str) -> set[str]:
    try:
        return {e.name for e in os.scandir(run_dir) if e.name.startswith("checkpoint-")}
    except FileNotFoundError:
        return set()


def _weight_files(listing: FolderListing | None) -> list[str]:
    """The weight files ``_load_from_checkpoint`` reads, in the Trainer's preference order."""
    import json

    if listing is None:
        return []
    for single in ("model.safetensors", "pytorch_model.bin"):
        if single in listing.sizes:
            return [single]
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if index in listing.sizes:
            try:
                with open(os.path.join(listing.folder, index), encoding="utf-8") as handle:
                    shards = sorted(set(json.load(handle)["weight_map"].values()))
            except (OSError, ValueError, KeyError):
                return []  # the Trainer reports a broken index itself
            return [index, *shards]
    return []


def _weights_format(names) -> str:
    if "model.safetensors" in names or "model.safetensors.index.json" in names:
        return "safetensors"
    return "torch"


def _strategy(trainer: Trainer) -> str:
    if getattr(trainer, "is_deepspeed_enabled", False):
        return "deepspeed"
    if getattr(trainer, "is_fsdp_enabled", False):
        return "fsdp"
    return str(trainer.args.parallel_mode).rsplit(".", 1)[-1].lower()


__all__ = ["CkptProfCallback", "instrument", "uninstrument"]
