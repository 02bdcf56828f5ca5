"""PyTorch Lightning: ``Trainer(callbacks=[CkptProf()])`` traces every save and resume.

Where each phase is measured (Lightning 2.x):

* resume: ``strategy.checkpoint_io.load_checkpoint`` is wrapped on the trainer's own
  CheckpointIO instance. For the default ``TorchCheckpointIO`` on a local path, ``list``
  is the stat and manifest read, ``verify`` checks against the manifest written at save,
  and ``torch.load`` runs as ``pl_load`` runs it, on a file whose every read is timed:
  reads are ``fetch``, the time between them ``deserialize`` (no extra copy of the bytes).
  An ``s3://`` path is fetched by ckptprof's S3 backend (ranged GETs into memory) and then
  loaded. A custom CheckpointIO or another URL is timed as a whole (``deserialize``,
  marked ``ckpt.fused_fetch``).
  ``reshard`` covers applying model state (until callbacks'
  ``on_load_checkpoint``) and ``restore_training_state`` (optimizers, schedulers, loops)
  until ``resume_end``; ``first_step`` runs until the first ``on_train_batch_end``.
* save: ``trainer.save_checkpoint`` is the ``ckpt.save`` root; ``serialize`` is
  ``dump_checkpoint`` (building the dict), ``write`` is ``checkpoint_io.save_checkpoint``,
  ``commit`` writes the manifest beside the file. With ``AsyncCheckpointIO`` the root's
  ``write`` is the blocking part (tensor clones, queueing, ``ckpt.write.async``) and the
  background write is its own ``ckpt.save`` (``ckpt.save.background``) linked to it.
  Removing an old checkpoint removes its manifest too.

Only the attached trainer's objects are patched (instance attributes, never classes),
and :meth:`CkptProf.teardown` undoes them. Lightning's ``ckpt_path="last"`` lookup runs
before callbacks are set up, so it is not part of ``list``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from ckptprof.integrations.base import Instrumentation, TracedAdapter, manifest_path, timed
from ckptprof.phases import Attr, Phase

log = logging.getLogger("ckptprof")


def _overrides(strategy, name: str) -> bool:
    """Whether ``strategy`` replaces Lightning's base ``Strategy.<name>``."""
    from lightning.pytorch.strategies import Strategy

    return getattr(type(strategy), name, None) is not getattr(Strategy, name)


def _checkpoint_dir(trainer) -> str:
    """Where ``ckpt_path="last"`` looks: the ModelCheckpoint's folder, else the default."""
    callback = getattr(trainer, "checkpoint_callback", None)
    dirpath = getattr(callback, "dirpath", None)
    return str(dirpath or os.path.join(trainer.default_root_dir, "checkpoints"))


def _KEEP_ON_CPU(storage, location):  # noqa: N802 - TorchCheckpointIO's default map_location
    return storage


class CkptProf(Callback, TracedAdapter):
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
    ) -> None:
        self._inst = Instrumentation(
            "lightning", trace_dir=trace_dir, verify=verify, tracer_provider=tracer_provider
        )
        self._interruptions = interruptions
        self._trainer = None
        self._awaiting_first_step = False

    # ------------------------------------------------------------------ saving from outside
    def save(self, filepath: str) -> None:
        """Save a checkpoint now, traced (for emergency saves from outside the loop)."""
        if self._trainer is None:
            raise RuntimeError(
                "`CkptProf.save()` needs the callback attached to a running Trainer."
            )
        self._trainer.save_checkpoint(filepath)

    def _emergency_save(self) -> str:
        """``<checkpoint dir>/last.ckpt``, written beside and renamed into place: a save cut
        short by the deadline leaves the previous ``last.ckpt`` the one resumed."""
        final = os.path.join(_checkpoint_dir(self._trainer), "last.ckpt")
        partial = final + ".partial"
        self._trainer.save_checkpoint(partial)
        if self._trainer.is_global_zero:
            os.replace(partial, final)
            self._inst.remove_manifest(partial)
            self._inst.write_manifest(final, None)
        return final

    # ------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer, pl_module, stage: str) -> None:
        if self._trainer is trainer and self._inst.attached:
            return
        try:
            self._trainer = trainer
            self._inst.rank = trainer.global_rank
            self._inst.start()  # telemetry now, not inside the first restore
            self._attach(trainer)
        except Exception as exc:  # noqa: BLE001
            self._inst.warn_once("setup", exc)
        self._inst.watch_interruptions(
            self._interruptions,
            location=lambda: _checkpoint_dir(trainer),
            save=self._emergency_save,
            stop=lambda: setattr(trainer, "should_stop", True),
        )

    @override
    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        op = self._inst.restore_op
        if op is not None and isinstance(checkpoint.get("global_step"), int):
            op.set_attributes({Attr.RESTORED_STEP: checkpoint["global_step"]})
        if op is not None and self._load_end_ns is not None:
            import time

            op.add_interval(Phase.RESHARD, self._load_end_ns, time.time_ns())
            self._load_end_ns = None

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._awaiting_first_step:
            self._first_step_done(trainer)
        if self._inst.interruptions is not None:
            self._inst.interruptions.step_end(trainer.global_step)

    @override
    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # Lightning's own SIGTERM handler ends fit at the batch boundary with an exception,
        # before the next on_train_batch_end: save there
        guard = self._inst.interruptions
        if guard is not None and guard.notice is not None:
            guard.step_end(trainer.global_step)

    def _first_step_done(self, trainer) -> None:
        self._awaiting_first_step = False
        since = self._resume_end_ns  # restore_training_state and resume_end are done
        self._inst.first_step_done(trainer.global_step, since, announce=trainer.is_global_zero)

    @override
    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._inst.close()

    # ------------------------------------------------------------------ wiring
    _load_end_ns: int | None = None
    _resume_end_ns: int | None = None
    _strategy_loading = False

    def _attach(self, trainer) -> None:
        inst = self._inst
        io = trainer.strategy.checkpoint_io
        connector = trainer._checkpoint_connector
        # AsyncCheckpointIO returns from save at once and writes on a worker thread
        async_io = type(io).__name__ == "AsyncCheckpointIO" and io.checkpoint_io is not None
        base_io = io.checkpoint_io if async_io else io
        plain_torch_io = type(base_io).__name__ == "TorchCheckpointIO"
        submitted: dict[str, Any] = {}  # path -> span context of the save that queued it

        def restore_attrs(path) -> dict:
            return {
                Attr.FORMAT: "torch",
                Attr.PATH: str(path),
                Attr.WORLD_SIZE: trainer.world_size,
                Attr.STORAGE_KIND: "s3" if str(path).startswith("s3://") else "posix",
                "ckpt.strategy": type(trainer.strategy).__name__,
            }

        def wrap_load(original):
            def load_checkpoint(path, map_location=_KEEP_ON_CPU, weights_only=None, **kwargs):
                import time

                nested = self._strategy_loading and inst.restore_op is not None
                op = inst.restore_op if nested else inst.begin_restore(restore_attrs(path))
                try:
                    if plain_torch_io and op is not None and "://" not in str(path):
                        result = inst.load_file(
                            str(path),
                            op,
                            lambda f: torch.load(
                                f, map_location=map_location, weights_only=weights_only
                            ),
                        )
                    elif plain_torch_io and op is not None and str(path).startswith("s3://"):
                        # ckptprof's S3 backend: ranged GETs into memory, then torch.load
                        buffer = inst.read_file(str(path), op)
                        try:
                            with op.phase(Phase.DESERIALIZE):
                                result = torch.load(
                                    buffer.reader(),
                                    map_location=map_location,
                                    weights_only=weights_only,
                                )
                        finally:
                            buffer.close()
                    else:
                        if op is not None:
                            op.set_phase_attributes(Phase.DESERIALIZE, **{"ckpt.fused_fetch": True})
                        result = timed(
                            op,
                            Phase.DESERIALIZE,
                            original,
                            path,
                            map_location=map_location,
                            weights_only=weights_only,
                            **kwargs,
                        )
                except BaseException as exc:
                    if not nested:
                        inst.end_restore(exc)
                    raise
                self._load_end_ns = time.time_ns()
                return result

            return load_checkpoint

        def wrap_restore_training_state(original):
            def restore_training_state(*args, **kwargs):
                return timed(inst.restore_op, Phase.RESHARD, original, *args, **kwargs)

            return restore_training_state

        def wrap_resume_end(original):
            def resume_end(*args, **kwargs):
                import time

                result = original(*args, **kwargs)
                if inst.restore_op is not None:
                    self._resume_end_ns = time.time_ns()
                    self._awaiting_first_step = True
                return result

            return resume_end

        def wrap_save_checkpoint(original):
            def save_checkpoint(filepath, *args, **kwargs):
                attrs = {
                    Attr.FORMAT: "torch",
                    Attr.PATH: str(filepath),
                    Attr.STEP: trainer.global_step,
                    Attr.WORLD_SIZE: trainer.world_size,
                }
                with inst.saving(attrs):
                    return original(filepath, *args, **kwargs)

            return save_checkpoint

        def wrap_dump(original):
            def dump_checkpoint(*args, **kwargs):
                return timed(inst.save_op, Phase.SERIALIZE, original, *args, **kwargs)

            return dump_checkpoint

        def wrap_io_save(original):
            def io_save_checkpoint(checkpoint, path, *args, **kwargs):
                op = inst.save_op
                if async_io:  # blocking part only (tensor clones + queueing)
                    if op is not None:
                        op.set_phase_attributes(Phase.WRITE, **{"ckpt.write.async": True})
                        submitted[str(path)] = op.span_context
                    return timed(op, Phase.WRITE, original, checkpoint, path, *args, **kwargs)
                result = timed(op, Phase.WRITE, original, checkpoint, path, *args, **kwargs)
                if op is not None:
                    with contextlib.suppress(OSError):  # a remote path has no local size
                        op.add_bytes(Phase.WRITE, os.path.getsize(path))
                inst.write_manifest(str(path), op)
                return result

            return io_save_checkpoint

        def wrap_background_save(original):
            def background_save_checkpoint(checkpoint, path, *args, **kwargs):
                queued_by = submitted.pop(str(path), None)
                attrs = {Attr.FORMAT: "torch", Attr.PATH: str(path)}
                op = inst.begin_background_save(attrs, queued_by)
                try:
                    result = timed(op, Phase.WRITE, original, checkpoint, path, *args, **kwargs)
                except BaseException as exc:
                    if op is not None:
                        op.finish(exc)
                    raise
                if op is not None:
                    with contextlib.suppress(OSError):
                        op.add_bytes(Phase.WRITE, os.path.getsize(path))
                inst.write_manifest(str(path), op)
                if op is not None:
                    op.finish()
                return result

            return background_save_checkpoint

        def wrap_io_remove(original):
            def remove_checkpoint(path, *args, **kwargs):
                result = original(path, *args, **kwargs)
                inst.remove_manifest(str(path))
                return result

            return remove_checkpoint

        def wrap_strategy_load(original):
            def load_checkpoint(path, *args, **kwargs):
                import time

                op = inst.begin_restore(restore_attrs(path))
                if op is not None:
                    op.set_phase_attributes(
                        Phase.DESERIALIZE,
                        **{
                            "ckpt.fused_fetch": True,
                            "ckpt.loader": f"{strategy_name}.load_checkpoint",
                        },
                    )
                self._strategy_loading = True
                try:
                    # the strategy's own reading and loading; a CheckpointIO it calls is
                    # traced in detail by the wrapper above and left out of this interval
                    result = inst.split(
                        op, Phase.DESERIALIZE, original, path, *args,
                        inner=[(io, "load_checkpoint", None)], **kwargs,
                    )  # fmt: skip
                except BaseException as exc:
                    inst.end_restore(exc)
                    raise
                finally:
                    self._strategy_loading = False
                self._load_end_ns = time.time_ns()
                return result

            return load_checkpoint

        def wrap_strategy_save(original):
            def save_checkpoint(checkpoint, filepath, *args, **kwargs):
                op = inst.save_op
                result = inst.split(
                    op, Phase.WRITE, original, checkpoint, filepath, *args,
                    inner=[(io, "save_checkpoint", None)], **kwargs,
                )  # fmt: skip
                if (
                    op is not None
                    and os.path.isfile(filepath)
                    and not os.path.exists(manifest_path(str(filepath)))
                ):
                    op.add_bytes(Phase.WRITE, os.path.getsize(filepath))
                    inst.write_manifest(str(filepath), op)
                return result

            return save_checkpoint

        strategy = trainer.strategy
        strategy_name = type(strategy).__name__
        # DeepSpeed, FSDP, ModelParallel read and write checkpoints themselves (after setup)
        if _overrides(strategy, "load_checkpoint"):
            inst.patch(strategy, "load_checkpoint", wrap_strategy_load)
        if _overrides(strategy, "save_checkpoint"):
            inst.patch(strategy, "save_checkpoint", wrap_strategy_save)
        inst.patch(io, "load_checkpoint", wrap_load)
        inst.patch(io, "save_checkpoint", wrap_io_save)
        inst.patch(io, "remove_checkpoint", wrap_io_remove)
        if async_io:
            inst.patch(base_io, "save_checkpoint", wrap_background_save)
        inst.patch(connector, "restore_training_state", wrap_restore_training_state)
        inst.patch(connector, "resume_end", wrap_resume_end)
        inst.patch(connector, "dump_checkpoint", wrap_dump)
        inst.patch(trainer, "save_checkpoint", wrap_save_checkpoint)
