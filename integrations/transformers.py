"""Hugging Face ``Trainer``: ``Trainer(callbacks=[CkptProfCallback()])`` traces every
``_save_checkpoint`` and every ``train(resume_from_checkpoint=...)``.

Why the callback also patches the Trainer: ``TrainerCallback`` events carry the model,
optimizer and scheduler but never the Trainer, and ``train()`` loads the checkpoint
*before* the first event (``on_train_begin``). So the callback, when the Trainer built
with it fires ``on_init_end``, finds that Trainer on the call stack and wraps its
``train`` method on the instance. A callback added later with ``add_callback`` cannot do
that; call :func:`instrument` (one line, the documented alternative) instead.

The Trainer has no public hooks around its loaders and savers, so the ones it calls in
``train()`` are wrapped for that call only (:attr:`TransformersInstrumentor.call_targets`,
checked against their signatures; a changed one is one warning and goes untraced):

* ``list``: resolving ``resume_from_checkpoint=True`` (``get_last_checkpoint``), listing
  ``checkpoint-N`` and reading the records its save left in ckptprof's state location.
* ``fetch`` + ``verify``: each file is brought into the page cache (pages already cached
  are not read again; ``ckpt.cache.resident_fraction`` says how many were) and checked
  (against the record, or its format's own integrity data) just before the Trainer's
  own loader opens it: weights (``model.safetensors``, ``pytorch_model.bin`` or the
  shards of an index), then ``optimizer.pt`` + ``scheduler.pt``, ``scaler.pt``,
  ``rng_state[_R].pth``, and ``trainer_state.json``.
* ``deserialize``: the Trainer's loaders minus the time in ``load_state_dict``, which is
  ``reshard``.
* ``first_step``: from the last load to the end of the first optimizer step
  (``on_step_end``); it includes the data loader's skip of already-seen batches.
* save: ``ckpt.save`` around ``_save_checkpoint``; ``serialize`` is the ``state_dict()``
  calls, ``write`` the rest of each group (model, optimizer + scheduler, scaler, rng,
  trainer state; per-group seconds and bytes as ``ckpt.write.<group>_s/_bytes``),
  ``rotate`` deleting old checkpoints (``save_total_limit``), ``commit`` this rank's
  record of the files it wrote.

Everything lives for one ``train()`` call: when it returns or raises, the ``train``
wrapper, the telemetry threads and the trace file are gone, so the Trainer is as it was
(it pickles and deep-copies as before) and one left behind (a hyper-parameter search
builds hundreds) holds no thread and no open file. A later ``train()`` of the same
Trainer is traced after another :func:`instrument`. The callback is deliberately not an
``ExportableState``, so the Trainer never re-creates it on resume.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import time
import weakref
from typing import Any

from transformers import Trainer, TrainerCallback

from ckptprof.errors import VerifyError
from ckptprof.integrations.files import FolderListing
from ckptprof.integrations.instrumentor import GuestCallback, Instrumentor
from ckptprof.integrations.patching import Target, argument, is_ours, replace_argument
from ckptprof.phases import Attr, Phase

log = logging.getLogger("ckptprof")

TRAINER_STATE = "trainer_state.json"
_RANK_IN_NAME = re.compile(r"(?:rng_state_|rank)(\d+)")
_WEIGHTS = re.compile(r"^(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)(\.index\.json)?$")
ROTATE = "rotate"


class TransformersInstrumentor(Instrumentor):
    """Tracing of one Hugging Face ``Trainer`` (see the module docstring)."""

    framework = "transformers"
    distribution = "transformers"
    known_versions = "4.40 to 5.x (tested with 5.24)"
    loader_name = "the Trainer"
    starts_telemetry = False  # only inside train()
    targets = (Target("", "train", "_traced_train", "every save and resume"),)
    call_targets = (
        Target(
            "",
            "_load_from_checkpoint",
            "_traced_load_model",
            "fetch and deserialize of the weights",
            ("resume_from_checkpoint",),
        ),
        Target(
            "",
            "_load_optimizer_and_scheduler",
            "_traced_load_optimizer",
            "fetch and deserialize of the optimizer",
            ("checkpoint",),
        ),
        Target("", "_load_scaler", "_traced_load_scaler", "the scaler load", ("checkpoint",)),
        Target("", "_load_rng_state", "_traced_load_rng", "the RNG state load", ("checkpoint",)),
        Target("", "_init_training_state", "_traced_load_state", "the trainer-state load"),
        Target(
            "",
            "get_batch_samples",
            "_traced_batches",
            "the first batch after a resume (first_step's split)",
        ),
        Target("", "_save_checkpoint", "_traced_save", "the save", ("model", "trial")),
        Target(
            "accelerator",
            "prepare",
            "_traced_prepare",
            "the DeepSpeed engine build",
            when="_uses_deepspeed",
        ),
    )

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._options = options
        self._listing: FolderListing | None = None
        self._awaiting_first_step = False
        self._first_batch: tuple[int, int] | None = None  # (start, end) ns of its fetch
        self._skipped_batches: int | None = None  # the Trainer's data fast-forward
        self.stop_requested = False
        self._deepspeed = None  # the engine's tracing on the Trainer's DeepSpeed path
        self._trainer: weakref.ref[Trainer] | None = None

    @property
    def trainer(self) -> Trainer | None:
        """The Trainer traced (or last traced: ``save()`` still works after ``train()``)."""
        return self._trainer() if self._trainer is not None else None

    def instrument(self, root: Trainer) -> TransformersInstrumentor:
        self.session.rank = root.args.process_index
        self._trainer = weakref.ref(root)
        return super().instrument(root)

    def _uses_deepspeed(self, trainer) -> bool:
        return bool(getattr(trainer, "is_deepspeed_enabled", False))

    # ------------------------------------------------------------------ train()
    def _traced_train(self, original):
        def train(*args, **kwargs):
            self.session.start()
            self._start_interruptions()
            try:
                requested = argument(args, kwargs, "resume_from_checkpoint", 0)
                if requested not in (None, False):
                    chosen = self._begin_restore(requested)
                    if chosen is not requested:  # the newest checkpoint's save was cut short
                        args, kwargs = replace_argument(
                            args, kwargs, "resume_from_checkpoint", 0, chosen
                        )
                with contextlib.ExitStack() as scope:
                    self.apply(self.call_targets, self.trainer, scope)
                    scope.callback(self._close_deepspeed)
                    return original(*args, **kwargs)
            except BaseException as exc:
                self._awaiting_first_step = False
                self.session.end_restore(exc)
                raise
            finally:
                if self.session.restore_op is not None:  # no step ran after the resume
                    self._awaiting_first_step = False
                    self.session.end_restore()
                self.uninstrument()  # the Trainer is left exactly as it was found

        return train

    def _start_interruptions(self) -> None:
        self.stop_requested = False
        self.watch_interruptions(self._records_dir, self.save, self._request_stop)

    def _records_dir(self) -> str | None:
        return self.trainer.args.output_dir if self.trainer is not None else None

    def _request_stop(self) -> None:
        self.stop_requested = True

    # ------------------------------------------------------------------ restore
    def _begin_restore(self, requested):
        """``list``: resolve ``True`` to the last ``checkpoint-N`` (as the Trainer would)
        and list it; returns what ``train`` is then given: ``requested`` itself, unless
        the interruption record says the newest checkpoint's save was cut short."""
        from transformers.trainer_utils import get_last_checkpoint

        trainer = self.trainer
        self._first_batch = self._skipped_batches = None
        op = self.session.begin_restore(
            {
                Attr.PATH: str(requested),
                Attr.WORLD_SIZE: trainer.args.world_size,
                Attr.STORAGE_KIND: "posix",
                Attr.STRATEGY: _strategy(trainer),
            }
        )
        if op is None:
            return requested
        folder = last = requested
        if requested is True:
            with op.phase(Phase.LIST):
                output_dir = trainer.args.output_dir
                last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
                folder = self._last_complete(last)
            if folder is None:
                return requested  # the Trainer raises its own "No valid checkpoint found"
            op.set_attributes({Attr.PATH: str(folder)})
        self._listing = self._guarded(self._list, str(folder), op)
        if self._listing is not None:
            fmt = "deepspeed" if self._uses_deepspeed(trainer) else _weights_format(self._listing)
            op.set_attributes({Attr.FORMAT: fmt})
            self._fetch(op, [TRAINER_STATE])
        return requested if folder == last else folder

    def _list(self, folder: str, op) -> FolderListing | None:
        """List the folder; files the save wrote that are gone are verify findings — except
        weights converted to another form the Trainer also loads (sharded ↔ single)."""
        listing = self.files.list_folder(folder, op)
        missing = self.files.missing(listing)
        if listing is not None and missing:
            if _weight_files(listing):
                converted = [n for n in missing if _WEIGHTS.match(n)]
                if converted:
                    op.set_phase_attributes(
                        Phase.VERIFY, **{Attr.VERIFY_WEIGHTS_CONVERTED: ", ".join(converted)}
                    )
                missing = [n for n in missing if n not in converted]
            self.files.report_missing(listing, missing, op)
        return listing

    def _last_complete(self, folder: str | None) -> str | None:
        """The newest ``checkpoint-N``, unless the interruption record says its save was
        cut short (no record of its files, and the emergency save of that step never
        finished): then the newest one whose save did finish."""
        from ckptprof.interrupt.record import SAVED, read_record

        if folder is None or self.files.read_folder_records(folder) is not None:
            return folder
        parent = os.path.dirname(folder)
        record = read_record(self.files.state.location(parent))
        step = folder.rsplit("-", 1)[-1]
        if record is None or record.outcome == SAVED or str(record.step) != step:
            return folder  # nothing says it is incomplete: the Trainer's choice stands
        finished = [
            p
            for p in _checkpoints_in(parent)
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

    def _fetch(self, op, names) -> None:
        self._guarded(self.files.fetch_from_folder, self._listing, names, op)

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

    def _loader(self, files, inner):
        """A loader whose ``files(trainer)`` are fetched first and whose ``inner(trainer)``
        methods are reshard."""

        def make(original):
            def load(*args, **kwargs):
                op = self.session.restore_op
                if op is None:
                    return original(*args, **kwargs)
                trainer = self.trainer
                self._fetch(op, files(trainer))
                try:
                    targets = [(obj, name, Phase.RESHARD) for obj, name in inner(trainer)]
                    return self.split(
                        op, Phase.DESERIALIZE, original, *args, inner=targets, **kwargs
                    )
                finally:
                    self._awaiting_first_step = True

            return load

        return make

    def _traced_load_model(self, original):
        weights = self._loader(
            lambda t: _weight_files(self._listing), lambda t: [(t.model, "load_state_dict")]
        )
        return weights(original)

    def _traced_load_optimizer(self, original):
        optimizer = self._loader(
            lambda t: ["optimizer.pt", "optimizer.bin", "scheduler.pt"],
            lambda t: [(t.optimizer, "load_state_dict")],
        )
        return optimizer(original)

    def _traced_load_scaler(self, original):
        return self._loader(lambda t: ["scaler.pt"], lambda t: [])(original)

    def _traced_load_rng(self, original):
        rng = self._loader(
            lambda t: ["rng_state.pth", f"rng_state_{t.args.process_index}.pth"], lambda t: []
        )
        return rng(original)

    def _traced_load_state(self, original):
        load = self._loader(lambda t: [], lambda t: [])(original)

        def _init_training_state(*args, **kwargs):
            result = load(*args, **kwargs)
            # (epochs_trained, steps_trained_in_current_epoch): the batches the Trainer
            # will skip to resume the data where the checkpoint left it
            if self.session.restore_op is not None and isinstance(result, tuple):
                skipped = result[1] if len(result) == 2 else None
                if isinstance(skipped, int):
                    self._skipped_batches = skipped
            return result

        return _init_training_state

    def _traced_batches(self, original):
        def get_batch_samples(*args, **kwargs):
            if not self._awaiting_first_step or self._first_batch is not None:
                return original(*args, **kwargs)
            start = time.time_ns()
            try:  # a fast-forward over skipped batches happens inside this first fetch
                return original(*args, **kwargs)
            finally:
                self._first_batch = (start, time.time_ns())

        return get_batch_samples

    def _traced_prepare(self, original):
        def prepare(*args, **kwargs):
            op = self.session.restore_op
            start = time.time_ns()
            result = original(*args, **kwargs)
            if op is not None:  # building the ZeRO engine partitions what the load fills
                op.add_interval(Phase.RESHARD, start, time.time_ns())
                op.set_phase_attributes(
                    Phase.RESHARD, **{Attr.RESHARD_INCLUDES: "accelerate.prepare (DeepSpeed)"}
                )
            wrapped = getattr(self.trainer.accelerator, "deepspeed_engine_wrapped", None)
            engine = getattr(wrapped, "engine", None)
            if engine is not None and self._deepspeed is None:
                try:
                    from ckptprof.integrations.deepspeed import DeepSpeedInstrumentor

                    shared = {k: v for k, v in self._options.items() if k in _SHARED_OPTIONS}
                    self._deepspeed = DeepSpeedInstrumentor(session=self.session, **shared)
                    self._deepspeed.instrument(engine)
                except Exception as exc:  # noqa: BLE001
                    self.session.warn_once("deepspeed", exc)
            return result

        return prepare

    def _close_deepspeed(self) -> None:
        deepspeed, self._deepspeed = self._deepspeed, None
        if deepspeed is not None:
            deepspeed.uninstrument()

    def step_end(self, step: int, control) -> None:
        self.session.step_ended(step)
        if self._awaiting_first_step:
            self._awaiting_first_step = False
            self._finish_restore(step)
        guard = self.interruptions
        if guard is not None:
            guard.step_end(step)
            if self.stop_requested:
                control.should_training_stop = True

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """To the reporting integrations behind ``report_to`` (TensorBoard, W&B, MLflow …)
        by their ``on_log``, and to no other callback: the user's own callbacks receive
        exactly the events the Trainer issues. Nothing goes into ``state.log_history``
        (the next checkpoint's ``trainer_state.json`` is unchanged) nor to the console."""
        trainer = self.trainer
        if trainer is None:
            return
        for callback in list(trainer.callback_handler.callbacks):
            if isinstance(callback, _reporting_integrations()):
                callback.on_log(trainer.args, trainer.state, trainer.control, logs=dict(metrics))

    def _finish_restore(self, step: int) -> None:
        op = self.session.restore_op
        if op is None:
            return
        restored = str(op.attributes.get(Attr.PATH, "")).rsplit("-", 1)[-1]
        extra = {Attr.RESTORED_STEP: int(restored)} if restored.isdigit() else {}  # checkpoint-N
        trainer = self.trainer
        announce = trainer is not None and trainer.is_world_process_zero()
        batch, self._first_batch = self._first_batch, None
        skipped, self._skipped_batches = self._skipped_batches, None
        self.session.first_step_done(
            step, announce=announce, batch=batch, skipped_batches=skipped, **extra
        )

    # ------------------------------------------------------------------ save
    def save(self) -> str:
        """Save a checkpoint of the current step now, traced; returns its folder."""
        trainer = self.trainer
        if trainer is None:
            raise RuntimeError("CkptProfCallback.save() needs instrument(trainer) first.")
        folder = _checkpoint_folder(trainer)
        inside_train = self.session.started
        self.session.start()
        try:
            with contextlib.ExitStack() as scope:
                # inside train() the save is traced already: a second layer would trace it
                # twice and leave the outer save unfinished
                if not is_ours(vars(trainer).get("_save_checkpoint")):
                    save_target = [t for t in self.call_targets if t.name == "_save_checkpoint"]
                    self.apply(save_target, trainer, scope)
                trainer._save_checkpoint(trainer.model_wrapped, trial=None)
        finally:
            if not inside_train:
                self.session.close()
        return folder

    def _traced_save(self, original):
        def save_checkpoint(*args, **kwargs):
            trainer = self.trainer
            trial = argument(args, kwargs, "trial", 1)
            folder = _checkpoint_folder(trainer, trial)
            run_dir = os.path.dirname(folder)
            before = _checkpoints_in(run_dir)
            attrs = {
                Attr.PATH: folder,
                Attr.STEP: trainer.state.global_step,
                Attr.WORLD_SIZE: trainer.args.world_size,
            }
            self.files.forget_rank_record(folder)  # a save cut short leaves no record
            with self.session.saving(attrs) as op:
                groups = _SaveGroups(self, op, folder)
                with groups.wrapped(trainer):
                    result = original(*args, **kwargs)
                if op is not None:
                    try:
                        groups.finish(run_dir, before)
                    except Exception as exc:  # noqa: BLE001
                        self.session.warn_once("save", exc)
                    self.files.commit_folder(folder, groups.written, op, trainer.state.global_step)
            return result

        return save_checkpoint


_SHARED_OPTIONS = ("verify", "strict", "state_dir")


class _SaveGroups:
    """Times each file group of one ``_save_checkpoint`` and notes the files it wrote."""

    GROUPS = {
        "save_model": "model",
        "_save_optimizer_and_scheduler": "optimizer",
        "_save_scaler": "scaler",
        "_save_rng_state": "rng",
    }

    def __init__(self, owner: TransformersInstrumentor, op, folder: str) -> None:
        self.owner = owner
        self.op = op
        self.folder = folder
        self.written: set[str] = set()
        self.last_end_ns: int | None = None

    def wrapped(self, trainer: Trainer):
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
        trainer = self.owner.trainer
        rank = self.owner.session.rank
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
                    Attr.phase_key(Phase.WRITE, f"{group}_s"): round((end_ns - start_ns) / 1e9, 6),
                    Attr.phase_key(Phase.WRITE, f"{group}_bytes"): nbytes,
                },
            )

    def finish(self, run_dir: str, before: set[str]) -> None:
        """``rotate``: what ``_save_checkpoint`` did after the last group (deleting old
        checkpoints for ``save_total_limit``, and their records); the format, file count."""
        trainer = self.owner.trainer
        removed = before - _checkpoints_in(run_dir)
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
        self.op.set_attributes({Attr.FORMAT: _weights_format(self.written)})


def _reporting_integrations() -> tuple[type, ...]:
    """The callback classes ``report_to`` installs (transformers' own table of them)."""
    try:
        from transformers.integrations import INTEGRATION_TO_CALLBACK
    except ImportError:  # a transformers without the table: no integration is known
        return ()
    return tuple(INTEGRATION_TO_CALLBACK.values())


class CkptProfCallback(GuestCallback, TrainerCallback):
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
        strict: refuse a resume whose files do not match what the save recorded (default:
            a warning naming the file, and the Trainer loads as usual).
        state_dir: where ckptprof keeps its records (default ``$CKPTPROF_STATE_DIR`` or
            ``~/.local/state/ckptprof``; a shared path or ``s3://`` for jobs resumed on
            another machine; ``"beside"`` for records next to the checkpoints).
        log_metrics: log the RTO and per-phase seconds of each resume (and each save's)
            to ``report_to`` (TensorBoard, W&B, MLflow) via ``on_log``; ``False`` turns it off.

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
        strict: bool = False,
        state_dir=None,
        log_metrics: bool = True,
    ) -> None:
        self._options = {
            "trace_dir": trace_dir,
            "verify": verify,
            "tracer_provider": tracer_provider,
            "interruptions": interruptions,
            "strict": strict,
            "state_dir": state_dir,
            "log_metrics": log_metrics,
        }
        self._instrumentor = TransformersInstrumentor(**self._options)

    @property
    def trainer(self) -> Trainer | None:
        """The Trainer this callback traces (None until attached)."""
        return self._instrumentor.trainer

    # ------------------------------------------------------------------ events
    def on_init_end(self, args, state, control, **kwargs):
        if not self._instrumentor.instrumented:
            trainer = _calling_trainer(self)
            if trainer is not None:
                self.attach(trainer)

    def on_train_begin(self, args, state, control, **kwargs):
        if self._instrumentor.instrumented:
            return
        trainer = _calling_trainer(self)
        if trainer is None:
            return
        if trainer is self.trainer:
            log.info(
                "ckptprof: a later train() of a Trainer whose first train() was traced is not "
                "traced; call ckptprof.integrations.transformers.instrument(trainer) before it."
            )
            return
        self.attach(trainer)
        log.warning(
            "ckptprof: CkptProfCallback was added after the Trainer was built, so this run's "
            "resume is not traced; pass it in Trainer(callbacks=[...]) or call "
            "ckptprof.integrations.transformers.instrument(trainer)."
        )

    def on_step_end(self, args, state, control, **kwargs):
        self._instrumentor.step_end(state.global_step, control)

    def on_save(self, args, state, control, **kwargs):
        # a notice that arrived during the Trainer's own save is handled right after it
        guard = self._instrumentor.interruptions
        if guard is not None and guard.notice is not None:
            self._instrumentor.step_end(state.global_step, control)

    # ------------------------------------------------------------------ wiring
    def attach(self, trainer: Trainer) -> None:
        """Wrap ``trainer.train`` (on the instance) so its next call is traced; the
        wrapper removes itself when that call returns."""
        self._instrumentor.instrument(trainer)

    def detach(self) -> None:
        """Undo every wrapper; nothing of ckptprof stays on the Trainer."""
        self._instrumentor.uninstrument()

    def save(self) -> str:
        """Save a checkpoint of the current step now, traced; returns its folder.

        For emergency saves from outside the training loop (a signal handler, a Spot
        notice): the same ``_save_checkpoint`` the Trainer runs on ``save_steps``.
        """
        return self._instrumentor.save()


# ---------------------------------------------------------------------- helpers
def instrument(trainer: Trainer, **options: Any) -> CkptProfCallback:
    """Trace ``trainer``'s saves and resumes (for Trainers built without the callback).

    ``options`` are :class:`CkptProfCallback`'s. Returns the callback (already added).
    """
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, CkptProfCallback):
            callback.attach(trainer)  # a no-op while attached
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
                return [index]  # the Trainer reports a broken index itself
            return [index, *shards]
    return []


def _weights_format(names) -> str:
    names = getattr(names, "sizes", names)
    if "model.safetensors" in names or "model.safetensors.index.json" in names:
        return "safetensors"
    return "torch"


def _strategy(trainer: Trainer) -> str:
    if getattr(trainer, "is_deepspeed_enabled", False):
        return "deepspeed"
    if getattr(trainer, "is_fsdp_enabled", False):
        return "fsdp"
    return str(trainer.args.parallel_mode).rsplit(".", 1)[-1].lower()


__all__ = ["CkptProfCallback", "TransformersInstrumentor", "instrument", "uninstrument"]
