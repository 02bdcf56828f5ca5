"""PyTorch Lightning: ``Trainer(callbacks=[CkptProf()])`` traces every save and resume.

Where each phase is measured (Lightning 2.x), through the public ``Strategy`` methods
every strategy implements (the patch table below):

* resume: ``strategy.load_checkpoint`` is the ``ckpt.restore`` root. For a local file,
  ``list`` is its stat and the record its save left, ``fetch`` brings it into the page
  cache, ``verify`` checks it (the record, or the zip's own directory), and the strategy's
  own loader — called unchanged, so Lightning's errors stay Lightning's — is
  ``deserialize``. A directory or a URL (strategies that read shards themselves, remote
  storage) is read by the loader alone: one ``deserialize`` interval marked
  ``ckpt.fused`` (fetch+deserialize) — except a sharded checkpoint read through
  ``torch.distributed.checkpoint`` (ModelParallel, FSDP ``sharded``): while the loader
  runs, ``dcp.load`` is routed through the traced reader (integrations/dcp.py), whose
  list / verify / fetch / reshard / deserialize join this restore (the same for
  ``dcp.save`` inside the strategy's write). ``reshard`` is also
  ``strategy.load_model_state_dict`` and ``load_optimizer_state_dict``; ``first_step``
  runs from there to the end of the first optimizer step (the first
  ``on_train_batch_end`` with ``global_step`` advanced: with ``accumulate_grad_batches``
  it spans every micro-batch of that step).
* save: ``trainer.save_checkpoint`` is the ``ckpt.save`` root; ``serialize`` is building
  the checkpoint dict (until the strategy writes), ``write`` is
  ``strategy.save_checkpoint``, ``commit`` records the file in ckptprof's state
  location. With ``AsyncCheckpointIO`` the root's ``write`` is the blocking part (tensor
  clones, queueing, ``ckpt.write.async``) and the background write is its own
  ``ckpt.save`` (``ckpt.save.background``) linked to it.

Only the attached trainer's objects are patched (instance attributes), from ``setup``
to ``teardown`` or ``on_exception``, whichever ends the run.
"""

from __future__ import annotations

import os
import time
from typing import Any

from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from ckptprof.atomic import move_into_place
from ckptprof.errors import VerifyError
from ckptprof.integrations.dcp import routed
from ckptprof.integrations.instrumentor import GuestCallback, Instrumentor
from ckptprof.integrations.lightning_async import WRITES_WAIT_S, AsyncWrites
from ckptprof.integrations.patching import Target, argument
from ckptprof.integrations.session import timed
from ckptprof.phases import Attr, Phase, fused_value


def _overrides(strategy, name: str) -> bool:
    """Whether ``strategy`` replaces Lightning's base ``Strategy.<name>``."""
    from lightning.pytorch.strategies import Strategy

    return getattr(type(strategy), name, None) is not getattr(Strategy, name)


def _checkpoint_dir(trainer) -> str:
    """Where ``ckpt_path="last"`` looks: the ModelCheckpoint's folder, else the default."""
    callback = getattr(trainer, "checkpoint_callback", None)
    dirpath = getattr(callback, "dirpath", None)
    return str(dirpath or os.path.join(trainer.default_root_dir, "checkpoints"))


class LightningInstrumentor(Instrumentor):
    """Tracing of one Lightning ``Trainer`` (see the module docstring)."""

    framework = "lightning"
    distribution = "lightning"
    known_versions = "2.2 to 2.6 (tested with 2.6.6)"
    loader_name = "Lightning"
    targets = (
        Target("", "save_checkpoint", "_traced_save", "the save", ("filepath",)),
        Target("strategy", "save_checkpoint", "_traced_write", "write", ("checkpoint", "filepath")),
        Target("strategy", "remove_checkpoint", "_traced_remove", "record cleanup", ("filepath",)),
        Target("strategy", "load_checkpoint", "_traced_load", "the restore", ("checkpoint_path",)),
        Target("strategy", "load_model_state_dict", "_traced_reshard", "reshard", ("checkpoint",)),
        Target(
            "strategy", "load_optimizer_state_dict", "_traced_reshard", "reshard", ("checkpoint",)
        ),
    )

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._save_start_ns: int | None = None
        self._async = AsyncWrites(self)  # an AsyncCheckpointIO's background writes
        self._first_batch: tuple[int, int] | None = None  # after a resume: up to its fetch
        self._step_at_batch_start: int | None = None  # trainer.global_step as a batch began

    @property
    def trainer(self):
        return self.root

    # ------------------------------------------------------------------ restore
    def _restore_attrs(self, path) -> dict[str, Any]:
        trainer = self.trainer
        return {
            Attr.FORMAT: "torch",
            Attr.PATH: str(path),
            Attr.WORLD_SIZE: trainer.world_size,
            Attr.STORAGE_KIND: "s3" if str(path).startswith("s3://") else "posix",
            Attr.STRATEGY: type(trainer.strategy).__name__,
        }

    def _traced_load(self, original):
        def load_checkpoint(*args, **kwargs):
            path = argument(args, kwargs, "checkpoint_path", 0)
            session = self.session
            op = session.begin_restore(self._restore_attrs(path))
            if op is None:
                return original(*args, **kwargs)
            try:
                self._before_load(str(path), op)
                start = time.time_ns()
                try:
                    with routed(session, self.patcher):  # a sharded (DCP) checkpoint's phases
                        result = original(*args, **kwargs)
                finally:  # the loader's time, less what DCP's phases took inside it
                    self._loaded(op, start, time.time_ns())
            except BaseException as exc:
                session.end_restore(exc)
                raise
            return result

        return load_checkpoint

    def _loaded(self, op, start: int, end: int) -> None:
        """The loader's ``deserialize`` time, who it was, and whether its reads are inside
        it; on the framework's exit paths too, so it never raises."""
        try:
            op.add_interval_around(Phase.DESERIALIZE, start, end)
            loader = self._loader()
            attributes: dict[str, Any] = {Attr.LOADER: loader}
            if Phase.FETCH.value not in op.phase_stats():  # the loader read it all itself
                attributes[Attr.FUSED] = fused_value((Phase.FETCH, Phase.DESERIALIZE), loader)
            op.set_phase_attributes(Phase.DESERIALIZE, **attributes)
        except Exception as exc:  # noqa: BLE001 - ckptprof's own trouble, never the job's
            self.session.warn_once("load", exc)

    def _loader(self) -> str:
        """Who read the checkpoint: the strategy itself, or its CheckpointIO."""
        strategy = self.trainer.strategy
        if _overrides(strategy, "load_checkpoint"):
            return f"{type(strategy).__name__}.load_checkpoint"
        return f"{type(vars(strategy).get('_checkpoint_io')).__name__}.load_checkpoint"

    def _before_load(self, path: str, op) -> None:
        """list/fetch/verify of a local file; a directory or URL is read by the loader."""
        try:
            if "://" not in path and os.path.isfile(path):
                self.files.prefetch_file(path, op)
                return
            if "://" not in path and os.path.isdir(path):
                self.files.check_folder(path, op)
        except VerifyError:
            raise  # strict verification refused it, naming the file
        except Exception as exc:  # noqa: BLE001 - ckptprof's own trouble, never the job's
            self.session.warn_once("load", exc)

    def _traced_reshard(self, original):
        def load_state(*args, **kwargs):
            op = self.session.restore_op
            checkpoint = argument(args, kwargs, "checkpoint", 0)
            step = checkpoint.get("global_step") if isinstance(checkpoint, dict) else None
            if op is not None and isinstance(step, int):
                op.set_attributes({Attr.RESTORED_STEP: step})
            return timed(op, Phase.RESHARD, original, *args, **kwargs)

        return load_state

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Into every logger of the Trainer (TensorBoard, CSV, W&B, MLflow …), which log
        on global rank zero; nothing goes through ``LightningModule.log``, so monitored
        values and ``callback_metrics`` stay the job's own."""
        trainer = self.trainer
        for logger in trainer.loggers if trainer is not None else ():
            logger.log_metrics(metrics, step=step)

    def batch_fetched(self, batch_idx: int) -> None:
        """The first batch after a resume reached the step (``on_train_batch_start``):
        from the last load until now is the loop's start-up and that batch's fetch."""
        op = self.session.restore_op
        if op is not None and self._first_batch is None:
            now = time.time_ns()
            self._first_batch = (op.latest_end_before(now), now)
            op.set_phase_attributes(
                Phase.FIRST_STEP,
                **{Attr.FIRST_STEP_BATCH_IDX: batch_idx, Attr.FIRST_STEP_BATCH_INCLUDES:
                   "the fit loop's start-up (Lightning shows no fetch start)"},
            )  # fmt: skip

    def batch_started(self, trainer, batch_idx: int) -> None:
        self._step_at_batch_start = trainer.global_step
        if self.session.restore_op is not None:
            self.batch_fetched(batch_idx)

    def evaluation_started(self, trainer) -> None:
        """``validate``/``test``/``predict(ckpt_path=…)``: no training step follows the
        load, so the restore ends at the state restored (left open, it timed the whole
        evaluation and its watchdog named a long one a stalled restore). ``fit``'s own
        validation is left alone: the first training step ends its restore."""
        if self.session.restore_op is not None and trainer.state.fn != "fit":
            self.session.end_restore()

    def batch_ended(self, trainer) -> None:
        """A batch ended: a step ended only when an optimizer step ran in it (with
        ``accumulate_grad_batches`` > 1 most batches only add gradients); then the step
        is timed, the first after a resume ends the restore, and a notice is acted on."""
        started, self._step_at_batch_start = self._step_at_batch_start, None
        step = trainer.global_step
        if started is not None and step == started:
            return  # gradients accumulated, no optimizer step yet
        self.session.step_ended(step)
        if self.session.restore_op is not None:
            self.first_step_done()
        if self.interruptions is not None:
            self.interruptions.step_end(step)

    def first_step_done(self) -> None:
        trainer = self.trainer
        batch, self._first_batch = self._first_batch, None
        self.session.first_step_done(
            trainer.global_step, announce=trainer.is_global_zero, batch=batch
        )

    # ------------------------------------------------------------------ save
    def _traced_save(self, original):
        def save_checkpoint(*args, **kwargs):
            trainer = self.trainer
            attrs = {
                Attr.FORMAT: "torch",
                Attr.PATH: str(argument(args, kwargs, "filepath", 0)),
                Attr.STEP: trainer.global_step,
                Attr.WORLD_SIZE: trainer.world_size,
            }
            outer = self._save_start_ns  # a save inside a save (a hook's, SIGUSR1's)
            try:
                with self.session.saving(attrs):
                    self._save_start_ns = time.time_ns()
                    return original(*args, **kwargs)
            finally:
                self._save_start_ns = outer

        return save_checkpoint

    def _traced_write(self, original):
        def save_checkpoint(*args, **kwargs):
            op, started = self.session.save_op, self._save_start_ns
            if op is None:
                return original(*args, **kwargs)
            path = str(argument(args, kwargs, "filepath", 1))
            if started is not None:  # building the dict, until the strategy writes
                op.add_interval(Phase.SERIALIZE, started, time.time_ns())
            queued = self._async.layer()
            if queued:
                op.set_phase_attributes(Phase.WRITE, **{Attr.WRITE_ASYNC: True})
                self._async.queued(path, op.span_context)
            start = time.time_ns()
            try:
                with routed(self.session, self.patcher):  # a sharded (DCP) save's phases
                    result = original(*args, **kwargs)
            finally:  # the strategy's write, less what DCP's phases took inside it
                op.add_interval_around(Phase.WRITE, start, time.time_ns())
            if not queued and self.trainer.strategy.is_global_zero and os.path.isfile(path):
                op.add_bytes(Phase.WRITE, os.path.getsize(path))
                self.files.commit_file(path, op, self.trainer.global_step)
            return result

        return save_checkpoint

    def _traced_remove(self, original):
        def remove_checkpoint(*args, **kwargs):
            result = original(*args, **kwargs)
            if self.trainer.strategy.is_global_zero:
                self.files.forget_file(str(argument(args, kwargs, "filepath", 0)))
            return result

        return remove_checkpoint

    # ------------------------------------------------------------------ interruptions
    def emergency_save(self) -> str:
        """``<checkpoint dir>/last.ckpt`` (a file, or a sharded strategy's folder), written
        beside and moved into place: a save cut short by the deadline leaves the previous
        ``last.ckpt`` the one resumed."""
        trainer = self.trainer
        final = os.path.join(_checkpoint_dir(trainer), "last.ckpt")
        partial = final + ".partial"
        trainer.save_checkpoint(partial)
        notice = self.interruptions.watcher.notice if self.interruptions is not None else None
        left = notice.seconds_left if notice is not None else None
        self._async.written(partial, WRITES_WAIT_S if left is None else max(left, 0.0))
        if trainer.is_global_zero:
            move_into_place(partial, final)  # a sharded save is a folder
            self.files.move_file_record(partial, final)
        return final

    def uninstrument(self) -> None:
        self._async.drain()  # before the patches go: Lightning waits for them after this
        super().uninstrument()

    def instrument(self, root) -> LightningInstrumentor:
        self.session.rank = root.global_rank
        super().instrument(root)
        if self.instrumented:  # the resume can link to an interrupted run; notices later
            self.watch_interruptions(
                self._records_dir, self.emergency_save, self._stop_training, start=False
            )
        return self

    def watch(self) -> None:
        """Start watching for Spot/preemption notices (when ``interruptions`` asked)."""
        if self.interruptions is not None:
            self.interruptions.start()

    def _records_dir(self) -> str | None:
        return _checkpoint_dir(self.trainer) if self.trainer is not None else None

    def _stop_training(self) -> None:
        if self.trainer is not None:
            self.trainer.should_stop = True


class CkptProf(GuestCallback, Callback):
    """Trace checkpoint saves and resumes of a Lightning ``Trainer``.

    Args:
        trace_dir: where the JSON-lines trace goes (default ``$CKPTPROF_TRACE_DIR`` or
            ``./ckptprof-traces``); OTLP follows the standard ``OTEL_*`` variables.
        verify: ``size`` (default), ``full`` (xxh3 of every saved byte, one extra read per
            save) or ``none``; resumes check against what the save recorded.
        tracer_provider: record into this OpenTelemetry provider instead.
        interruptions: ``True`` (or a dict of
            :class:`~ckptprof.interrupt.guard.InterruptionGuard` options) to
            save ``last.ckpt`` atomically on a Spot/preemption notice and link the next
            resume to it.
        strict: refuse a resume whose file does not match what its save recorded
            (default: a warning naming the file, and Lightning loads as usual).
        state_dir: where ckptprof keeps its records (default ``$CKPTPROF_STATE_DIR`` or
            ``~/.local/state/ckptprof``; a shared path or ``s3://`` for jobs resumed on
            another machine; ``"beside"`` for records next to the checkpoints).
        log_metrics: log the RTO and per-phase seconds of each resume (and each save's)
            to the Trainer's loggers; ``False`` turns it off.

    Example::

        trainer = Trainer(callbacks=[CkptProf()])
        trainer.fit(model, ckpt_path="last")
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
        self._instrumentor = LightningInstrumentor(**self._options)

    def save(self, filepath: str) -> None:
        """Save a checkpoint now, traced (for emergency saves from outside the loop)."""
        trainer = self._instrumentor.trainer
        if trainer is None:
            raise RuntimeError(
                "`CkptProf.save()` needs the callback attached to a running Trainer."
            )
        trainer.save_checkpoint(filepath)

    # ------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer, pl_module, stage: str) -> None:
        self._instrumentor.instrument(trainer)

    @override
    def on_train_start(self, trainer, pl_module) -> None:
        # after Lightning installed its own SIGTERM handling, so ckptprof's sits on top
        # and is the one taken off again
        self._instrumentor.watch()

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._instrumentor.batch_started(trainer, batch_idx)

    @override
    def on_validation_start(self, trainer, pl_module) -> None:
        self._instrumentor.evaluation_started(trainer)

    on_test_start = on_predict_start = on_validation_start  # an evaluation from a checkpoint

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._instrumentor.batch_ended(trainer)

    @override
    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # Lightning's own SIGTERM handling ends fit at the batch boundary with an
        # exception, before the next on_train_batch_end: save there. Then leave, as
        # Lightning calls no teardown hook after an exception.
        guard = self._instrumentor.interruptions
        if guard is not None and guard.notice is not None:
            guard.step_end(trainer.global_step)
        self._instrumentor.uninstrument()

    @override
    def on_train_end(self, trainer, pl_module) -> None:
        self._instrumentor.session.training_ended(trainer.global_step)  # loggers still open

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._instrumentor.uninstrument()


__all__ = ["CkptProf", "LightningInstrumentor"]
