"""The Hugging Face ``Trainer``'s patch table and the wrappers it places: ``train()``
for one call, within it the Trainer's loaders and savers, the batch fetch after a
resume, and the DeepSpeed engine build; step ends and the metrics to ``report_to``.

Why apart from :mod:`ckptprof.integrations.transformers` (the callback users add): this
is how the Trainer is traced, the callback only when. What a resume reads is
:mod:`~ckptprof.integrations.hf_restore`'s, what a save writes
:mod:`~ckptprof.integrations.hf_save`'s.
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from typing import Any

from transformers import Trainer

from ckptprof.errors import CkptprofError
from ckptprof.integrations.hf_folders import checkpoint_folder, checkpoints_in, weight_files
from ckptprof.integrations.hf_restore import Resume
from ckptprof.integrations.hf_save import SaveGroups
from ckptprof.integrations.instrumentor import Instrumentor
from ckptprof.integrations.patching import Target, argument, is_ours, replace_argument
from ckptprof.phases import Attr, Phase

_SHARED_OPTIONS = ("verify", "strict", "state_dir")


class TransformersInstrumentor(Instrumentor):
    """Tracing of one Hugging Face ``Trainer`` (see
    :mod:`ckptprof.integrations.transformers`)."""

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
        self._resume = Resume(self.session, self.files)
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
            try:
                self._start()
                requested = argument(args, kwargs, "resume_from_checkpoint", 0)
                if requested not in (None, False):
                    deepspeed = self._uses_deepspeed(self.trainer)
                    chosen = self._resume.begin(self.trainer, requested, deepspeed)
                    if chosen is not requested:  # the newest checkpoint's save was cut short
                        args, kwargs = replace_argument(
                            args, kwargs, "resume_from_checkpoint", 0, chosen
                        )
                with contextlib.ExitStack() as scope:
                    self.apply(self.call_targets, self.trainer, scope)
                    scope.callback(self._close_deepspeed)
                    return original(*args, **kwargs)
            except BaseException as exc:
                self._resume.awaiting_first_step = False
                self.session.end_restore(exc)
                raise
            finally:
                if self.session.restore_op is not None:  # no step ran after the resume
                    self._resume.awaiting_first_step = False
                    self.session.end_restore()
                self.uninstrument()  # the Trainer is left exactly as it was found

        return train

    def _start(self) -> None:
        """The telemetry and the interruption watch. A bad option is the user's to fix
        (a CkptprofError, as at instrument time); any other failure (an exporter that
        cannot be built) is warned once and training goes on, untraced."""
        try:
            self.session.start()
            self._start_interruptions()
        except CkptprofError:
            raise
        except Exception as exc:  # noqa: BLE001 - never hurt the training job
            self.session.warn_once("start", exc)

    def _start_interruptions(self) -> None:
        self.stop_requested = False
        self.watch_interruptions(self._records_dir, self.save, self._request_stop)

    def _records_dir(self) -> str | None:
        return self.trainer.args.output_dir if self.trainer is not None else None

    def _request_stop(self) -> None:
        self.stop_requested = True

    # ------------------------------------------------------------------ restore
    def _loader(self, files, inner):
        """A loader whose ``files(trainer)`` are fetched first and whose ``inner(trainer)``
        methods are reshard."""

        def make(original):
            def load(*args, **kwargs):
                op = self.session.restore_op
                if op is None:
                    return original(*args, **kwargs)
                trainer = self.trainer
                self._resume.fetch(op, files(trainer))
                try:
                    targets = [(obj, name, Phase.RESHARD) for obj, name in inner(trainer)]
                    return self.split(
                        op, Phase.DESERIALIZE, original, *args, inner=targets, **kwargs
                    )
                finally:
                    self._resume.awaiting_first_step = True

            return load

        return make

    def _traced_load_model(self, original):
        weights = self._loader(
            lambda t: weight_files(self._resume.listing), lambda t: [(t.model, "load_state_dict")]
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
                    self._resume.skipped_batches = skipped
            return result

        return _init_training_state

    def _traced_batches(self, original):
        def get_batch_samples(*args, **kwargs):
            resume = self._resume
            if not resume.awaiting_first_step or resume.first_batch is not None:
                return original(*args, **kwargs)
            start = time.time_ns()
            try:  # a fast-forward over skipped batches happens inside this first fetch
                return original(*args, **kwargs)
            finally:
                resume.first_batch = (start, time.time_ns())

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
        if self._resume.awaiting_first_step:
            self._resume.awaiting_first_step = False
            self._resume.first_step_done(self.trainer, step)
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

    # ------------------------------------------------------------------ save
    def save(self) -> str:
        """Save a checkpoint of the current step now, traced; returns its folder."""
        trainer = self.trainer
        if trainer is None:
            raise RuntimeError("CkptProfCallback.save() needs instrument(trainer) first.")
        folder = checkpoint_folder(trainer)
        inside_train = self.session.started
        try:
            self.session.start()
        except Exception as exc:  # noqa: BLE001 - the save happens, untraced
            self.session.warn_once("start", exc)
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
            folder = checkpoint_folder(trainer, trial)
            run_dir = os.path.dirname(folder)
            before = checkpoints_in(run_dir)
            attrs = {
                Attr.PATH: folder,
                Attr.STEP: trainer.state.global_step,
                Attr.WORLD_SIZE: trainer.args.world_size,
            }
            self.files.forget_rank_record(folder)  # a save cut short leaves no record
            with self.session.saving(attrs) as op:
                groups = SaveGroups(self, trainer, op, folder)
                with groups.wrapped():
                    result = original(*args, **kwargs)
                if op is not None:
                    try:
                        groups.finish(run_dir, before)
                    except Exception as exc:  # noqa: BLE001
                        self.session.warn_once("save", exc)
                    self.files.commit_folder(folder, groups.written, op, trainer.state.global_step)
            return result

        return save_checkpoint


def _reporting_integrations() -> tuple[type, ...]:
    """The callback classes ``report_to`` installs (transformers' own table of them)."""
    try:
        from transformers.integrations import INTEGRATION_TO_CALLBACK
    except ImportError:  # a transformers without the table: no integration is known
        return ()
    return tuple(INTEGRATION_TO_CALLBACK.values())


__all__ = ["TransformersInstrumentor"]
