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

This module is what users touch (the callback, :func:`instrument`,
:func:`uninstrument`); the tracing itself is :mod:`~ckptprof.integrations.hf_instrumentor`'s
(the resume :mod:`~ckptprof.integrations.hf_restore`, the save
:mod:`~ckptprof.integrations.hf_save`, the folder layout
:mod:`~ckptprof.integrations.hf_folders`).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from transformers import Trainer, TrainerCallback

from ckptprof.integrations.hf_instrumentor import TransformersInstrumentor
from ckptprof.integrations.instrumentor import GuestCallback

log = logging.getLogger("ckptprof")


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


__all__ = ["CkptProfCallback", "TransformersInstrumentor", "instrument", "uninstrument"]
