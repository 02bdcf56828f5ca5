"""DeepSpeed: ``instrument(engine)`` after ``deepspeed.initialize`` traces every
``engine.save_checkpoint`` and ``engine.load_checkpoint``, ZeRO stages 0-3, per rank.

Where each phase is measured (DeepSpeed 0.19, tested with 0.19.8; the patch table below):

* ``list``: reading ``latest`` (or ``latest_universal``) to resolve the tag, listing
  ``<dir>/<tag>`` and its records in ckptprof's state location, and counting the ZeRO
  partitions to detect a data-parallel world-size change (``ckpt.saved_world_size``).
* ``fetch`` / ``deserialize``: before every ``checkpoint_engine.load`` (DeepSpeed's own
  checkpoint-engine interface), the file is brought into the page cache (``fetch``) and
  checked once (``verify``); the engine's own load, called unchanged, is ``deserialize``.
  DeepSpeed reads the model states twice per load (once to check the MP world size);
  both reads are real cost and are shown (``ckpt.fetch.repeated_reads`` /
  ``…repeated_bytes``). Universal checkpoints' per-parameter files, which DeepSpeed
  reads with its own ``torch.load``, are fetched into the page cache first, so their
  reading shows as fetch and the rest as reshard.
* ``reshard``: ``load_module_state_dict``, the non-ZeRO ``optimizer.load_state_dict`` and
  ``_load_zero_checkpoint`` (ZeRO re-partition) minus their file reads.
* ``universal_convert`` (its own span, when ``universal="convert"`` and the world size
  changed): DeepSpeed's ``ds_to_universal`` on rank 0, in process.
* ``first_step``: until the first ``engine.step()`` that advances ``global_steps`` (a
  ``PipelineEngine``'s ``train_batch``). A restore no training follows ends without it:
  an engine without an optimizer at the load, an evaluation (a first forward in eval mode
  with gradients off, or ``eval_batch``) at that first forward.
* save: ``write`` is each ``checkpoint_engine.save`` (per file, bytes), ``serialize`` the
  rest of ``_save_checkpoint`` / ``_save_zero_checkpoint`` (building the state dicts),
  ``commit`` DeepSpeed's ``checkpoint_engine.commit`` plus this rank's record of the files
  it wrote. ``latest``, tag validation and the barriers are the rest of the ``ckpt.save``
  span. With the decoupled writer, ``write`` is the blocking part (``ckpt.write.async``)
  and DeepSpeed's commit (waiting for the writer process; at the next step, or in
  ``engine.destroy()``) is a background ``ckpt.save`` linked to it, one per save it
  covers. A save still uncommitted when :func:`uninstrument` runs gets its background
  span ended as an error, and no record.

Nothing global: only the engine and its ``checkpoint_engine``/``optimizer`` instances are
patched. ``engine.destroy()``, :func:`uninstrument` or the interpreter's exit undo it all
(patches, signal handlers, threads, the trace file); until then a signal ckptprof noted
is handed on at the next step, or after a few steps' time when no step comes.

This module is the engine's patch table and the timing around it; what a load finds on
disk (the tag, the listing, a world-size change, the universal conversion) is
:mod:`~ckptprof.integrations.ds_load`'s.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from ckptprof.errors import CkptprofError
from ckptprof.integrations.ds_decoupled import DecoupledSaves
from ckptprof.integrations.ds_load import LoadFiles, file_size, loading_universal
from ckptprof.integrations.instrumentor import Instrumentor
from ckptprof.integrations.patching import Target, argument, replace_argument
from ckptprof.integrations.session import timed
from ckptprof.phases import Attr, Phase

_ATTACHED = "_ckptprof_instrumentation"


class DeepSpeedInstrumentor(Instrumentor):
    """Tracing of one DeepSpeed engine (see the module docstring); made by :func:`instrument`.

    Args:
        universal: ``"convert"`` to convert a checkpoint saved with another data-parallel
            world size to a universal one (timed) and load that.
        save_dir: where :meth:`save` (and emergency saves) write.
        **options: :class:`~ckptprof.integrations.instrumentor.Instrumentor`'s.
    """

    framework = "deepspeed"
    distribution = "deepspeed"
    known_versions = "0.14 to 0.19 (tested with 0.19.8)"
    loader_name = "DeepSpeed"
    targets = (
        Target("", "load_checkpoint", "_traced_load", "the restore", ("load_dir", "tag")),
        Target(
            "", "_load_checkpoint", "_traced_inner_load", "deserialize vs reshard", ("load_dir",)
        ),
        Target("", "_load_zero_checkpoint", "_traced_zero_load", "the ZeRO reshard", ("load_dir",)),
        Target("", "save_checkpoint", "_traced_save", "the save", ("save_dir", "tag")),
        Target("", "_save_checkpoint", "_traced_serialize", "serialize", ("save_dir", "tag")),
        Target("", "_save_zero_checkpoint", "_traced_serialize", "serialize", ("save_path", "tag")),
        Target(
            "",
            "_commit_decoupled_checkpoint",
            "_traced_decoupled_commit",
            "the background commit",
            when="_decoupled",
        ),
        Target(
            "checkpoint_engine", "load", "_traced_file_load", "fetch and deserialize", ("path",)
        ),
        Target("checkpoint_engine", "save", "_traced_file_save", "write", ("state_dict", "path")),
        Target("checkpoint_engine", "commit", "_traced_commit", "commit"),
        Target("", "step", "_traced_step", "first_step", when="_owns_steps"),
        Target("", "train_batch", "_traced_step", "first_step (pipeline)", when="_pipeline"),
        Target("", "forward", "_traced_forward", "an evaluation-only restore", when="_owns_steps"),
        Target("", "eval_batch", "_traced_forward", "an evaluation-only restore", when="_pipeline"),
        Target("", "destroy", "_traced_destroy", "the cleanup at engine.destroy()"),
    )

    def __init__(
        self, *, universal: str | None = None, save_dir: str | None = None, **options: Any
    ) -> None:
        if universal not in (None, "convert"):
            raise CkptprofError(f"universal={universal!r} is not valid; use None or 'convert'.")
        super().__init__(**options)
        self.universal = universal
        self.save_dir = save_dir
        # inside another adapter (the HF Trainer's DeepSpeed path) its operations are ours
        self._nested = not self._live.owns_session
        self._load = LoadFiles(self.files, self.session, self._nested)
        # the engine's step after a load (not the checkpoint's after a module-only one):
        # the first step is the one that advances past it
        self._loaded_at: int | None = None
        self._first_forward = False  # a restore's first forward is still to come
        self._ticked_at: int | None = None  # the global step last timed
        self._written: list[str] = []
        # decoupled saves waiting for DeepSpeed's commit (one commit covers all queued)
        self._decoupled_saves = DecoupledSaves(self)

    @property
    def engine(self):
        return self.root

    def instrument(self, root) -> DeepSpeedInstrumentor:
        if not self._nested:
            self.session.rank = root.global_rank
        super().instrument(root)
        if self.instrumented:
            vars(root)[_ATTACHED] = self
            if not self._nested:
                self.watch_interruptions(self._records_dir, self.save)
        return self

    def uninstrument(self) -> None:
        engine = self.engine
        if engine is not None and vars(engine).get(_ATTACHED) is self:
            del vars(engine)[_ATTACHED]
        self._decoupled_saves.abandon()
        super().uninstrument()

    def _decoupled(self, engine) -> bool:
        return bool(engine.checkpoint_engine.is_decoupled())

    def _owns_steps(self, engine) -> bool:
        return not self._nested  # else the host adapter ends restores and watches notices

    def _pipeline(self, engine) -> bool:
        """A ``PipelineEngine``: its ``step()`` only raises; ``train_batch`` is its step
        (``_exec_optimizer_step`` → ``_take_model_step``, which advances ``global_steps``)
        and ``eval_batch`` its evaluation."""
        from deepspeed.runtime.pipe.engine import PipelineEngine

        return self._owns_steps(engine) and isinstance(engine, PipelineEngine)

    def _records_dir(self) -> str | None:
        return self.save_dir

    def _traced_destroy(self, original):
        """The engine's end of life: ckptprof leaves with it (an engine is never garbage
        collected while DeepSpeed's hooks hold it, so this and :func:`uninstrument` are
        the ways its tracing ends before the interpreter exits)."""

        def destroy(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            finally:
                self.uninstrument()

        return destroy

    # ------------------------------------------------------------------ saving from outside
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Into DeepSpeed's own monitors (``tensorboard``, ``wandb``, ``csv_monitor`` in
        the config), when the job enabled one; they write on rank zero."""
        monitor = getattr(self.engine, "monitor", None)
        if monitor is not None and monitor.enabled:
            monitor.write_events([(name, value, step) for name, value in metrics.items()])

    def save(self, save_dir: str | None = None) -> str:
        """Save now through ``engine.save_checkpoint`` (traced); returns ``<dir>/<tag>``.

        For emergency saves; every rank must call it, as DeepSpeed requires.
        """
        save_dir = save_dir or self.save_dir
        if save_dir is None:
            raise RuntimeError("no save_dir: pass instrument(engine, save_dir=...) or save(dir)")
        engine = self.engine
        engine.save_checkpoint(save_dir)
        if engine.checkpoint_engine.is_decoupled():  # an emergency cannot wait for a step
            engine._commit_decoupled_checkpoint()
        return os.path.join(save_dir, f"global_step{engine.global_steps}")

    # ------------------------------------------------------------------ restore
    def _traced_load(self, original):
        def load_checkpoint(*args, **kwargs):
            engine, session = self.engine, self.session
            load_dir = str(argument(args, kwargs, "load_dir", 0))
            tag = argument(args, kwargs, "tag", 1)
            nested = self._nested and session.restore_op is not None
            op = session.restore_op if nested else session.begin_restore(
                {
                    Attr.FORMAT: "deepspeed",
                    Attr.PATH: load_dir,
                    Attr.WORLD_SIZE: engine.world_size,
                    Attr.STORAGE_KIND: "posix",
                    Attr.STRATEGY: f"zero{engine.zero_optimization_stage()}",
                }
            )  # fmt: skip
            self._load.reads = {}
            universal = contextlib.nullcontext()
            try:
                convert = self.universal == "convert"
                if op is not None:
                    converted = self._load.list(engine, op, load_dir, tag, convert)
                elif convert:  # untraced here, yet in the conversion's collectives all the same
                    converted = self._load.convert(engine, None, load_dir, None)
                else:
                    converted = None
                if converted is not None:  # load the universal copy, just this once
                    args, kwargs = replace_argument(args, kwargs, "tag", 1, converted)
                    universal = loading_universal(engine)
                with universal:
                    result = original(*args, **kwargs)
            except BaseException as exc:
                if not nested:
                    session.end_restore(exc)
                raise
            if op is not None and not nested:
                if result == (None, None):  # DeepSpeed found no checkpoint and said so
                    session.discard_restore()
                else:
                    self._loaded_at = engine.global_steps
                    self._first_forward = True
                    module_only = argument(args, kwargs, "load_module_only", 5, False)
                    step = _checkpoint_step(engine, result[1], module_only)
                    if step is not None:
                        op.set_attributes({Attr.RESTORED_STEP: step})
                    if not _can_step(engine):  # no optimizer: no training step can follow
                        self._end_without_step()
            return result

        return load_checkpoint

    def _traced_file_load(self, original):
        def load(*args, **kwargs):
            op = self.session.restore_op
            if op is None:
                return original(*args, **kwargs)
            self._load.before_read(op, str(argument(args, kwargs, "path", 0)))
            return timed(op, Phase.DESERIALIZE, original, *args, **kwargs)

        return load

    def _traced_inner_load(self, original):
        def _load_checkpoint(*args, **kwargs):
            op = self.session.restore_op
            engine = self.engine
            inner = [
                (engine.checkpoint_engine, "load", None),
                (engine, "load_module_state_dict", Phase.RESHARD),
            ]
            if not engine.zero_optimization():
                inner.append((engine.optimizer, "load_state_dict", Phase.RESHARD))
            return self.split(op, Phase.DESERIALIZE, original, *args, inner=inner, **kwargs)

        return _load_checkpoint

    def _traced_zero_load(self, original):
        def _load_zero_checkpoint(*args, **kwargs):
            op = self.session.restore_op
            inner = [(self.engine.checkpoint_engine, "load", None)]
            return self.split(op, Phase.RESHARD, original, *args, inner=inner, **kwargs)

        return _load_zero_checkpoint

    def _end_without_step(self) -> None:
        """The restore ends at the state restored, without ``first_step``."""
        self._loaded_at = None
        self._first_forward = False
        self.session.end_restore()

    def _traced_forward(self, original):
        """An evaluation-only restore (``load_checkpoint`` then inference or evaluation, no
        ``step``) ends at its first forward (or ``eval_batch``): left open, it would time
        the whole evaluation, keep its memory sampler and watchdog running and name a long
        evaluation a stalled restore.

        The rule: the first forward after the load runs with the module in eval mode and
        gradients off (``engine.eval()`` under ``torch.no_grad()``/``inference_mode``), or
        is ``eval_batch``. A training resume's first forward is in train mode with
        gradients on (``step`` needs them), so its restore still ends at the first step;
        only a loop that evaluates before its first training batch has its restore end
        there (then ``first_step`` is not measured)."""

        pipeline_eval = getattr(original, "__name__", "") == "eval_batch"

        def forward(*args, **kwargs):
            if self._first_forward and self.session.restore_op is not None:
                import torch

                self._first_forward = False  # only the first forward after the load decides
                evaluating = not self.engine.module.training and not torch.is_grad_enabled()
                if pipeline_eval or evaluating:
                    self._end_without_step()
            return original(*args, **kwargs)

        return forward

    def _traced_step(self, original):
        """``step()``, or a ``PipelineEngine``'s ``train_batch`` (its step): each wraps
        exactly one ``_take_model_step`` per optimizer step, so a step is counted once."""

        def step(*args, **kwargs):
            result = original(*args, **kwargs)
            engine, session = self.engine, self.session
            if not self._nested and engine.global_steps != self._ticked_at:
                self._ticked_at = engine.global_steps  # an optimizer step, not a micro-step
                session.step_ended(engine.global_steps)
            loaded_at = self._loaded_at
            advanced = loaded_at is not None and engine.global_steps > loaded_at
            if session.restore_op is not None and advanced:
                self._loaded_at = None
                self._first_forward = False
                session.first_step_done(engine.global_steps, announce=engine.global_rank == 0)
            if self.interruptions is not None:
                self.interruptions.step_end(engine.global_steps)
            return result

        return step

    # ------------------------------------------------------------------ save
    def _traced_save(self, original):
        def save_checkpoint(*args, **kwargs):
            engine, session = self.engine, self.session
            save_dir = str(argument(args, kwargs, "save_dir", 0))
            tag = argument(args, kwargs, "tag", 1)
            self.save_dir = save_dir
            resolved = tag if tag is not None else f"global_step{engine.global_steps}"
            folder = os.path.join(save_dir, str(resolved))
            attrs = {
                Attr.FORMAT: "deepspeed",
                Attr.PATH: folder,
                Attr.STEP: engine.global_steps,
                Attr.WORLD_SIZE: engine.world_size,
                Attr.STRATEGY: f"zero{engine.zero_optimization_stage()}",
            }
            nested = self._nested and session.save_op is not None  # inside the host's save
            self._written = []
            self.files.forget_rank_record(folder)  # a save cut short leaves no record
            with contextlib.nullcontext(session.save_op) if nested else session.saving(attrs) as op:
                result = original(*args, **kwargs)
                names = [os.path.basename(p) for p in self._written if os.path.dirname(p) == folder]
                if op is not None and engine.checkpoint_engine.is_decoupled():
                    # files are still being written by DeepSpeed's writer process; the commit
                    # (and this rank's record) happen at the next optimizer step, or at
                    # engine.destroy() (checkpoint_engine.cleanup)
                    op.set_phase_attributes(Phase.WRITE, **{Attr.WRITE_ASYNC: True})
                    self._decoupled_saves.queue(folder, names, op.span_context, engine.global_steps)
                elif op is not None:
                    self.files.commit_folder(folder, names, op, engine.global_steps)
            return result

        return save_checkpoint

    def _traced_decoupled_commit(self, original):
        """A decoupled save's second half, at the next step: waiting for the writer process
        and DeepSpeed's commit, as a background ``ckpt.save`` linked to the one that
        queued the files (``ckpt.save.background``)."""

        def commit_decoupled_checkpoint(*args, **kwargs):
            return self._decoupled_saves.commit(original, *args, **kwargs)

        return commit_decoupled_checkpoint

    def _traced_serialize(self, original):
        def build_and_write(*args, **kwargs):
            inner = [(self.engine.checkpoint_engine, "save", None)]
            return self.split(
                self.session.save_op, Phase.SERIALIZE, original, *args, inner=inner, **kwargs
            )

        return build_and_write

    def _traced_file_save(self, original):
        def save(*args, **kwargs):
            op = self.session.save_op
            path = argument(args, kwargs, "path", 1)
            start = time.time_ns()
            try:
                return original(*args, **kwargs)
            finally:
                if op is not None and path is not None:
                    end = time.time_ns()
                    op.add_interval(Phase.WRITE, start, end)
                    op.add_file(
                        Phase.WRITE, str(path), file_size(str(path)), (end - start) / 1e9, start
                    )
                    self._written.append(str(path))

        return save

    def _traced_commit(self, original):
        def commit(*args, **kwargs):
            if self._decoupled_saves.pending and self.session.save_op is None:
                # a decoupled commit outside step(): checkpoint_engine.cleanup() at destroy
                return self._decoupled_saves.commit(original, *args, **kwargs)
            return timed(self.session.save_op, Phase.COMMIT, original, *args, **kwargs)

        return commit


def _checkpoint_step(engine, client_state, module_only: bool) -> int | None:
    """The step the checkpoint was saved at. A full load sets ``global_steps`` from it; a
    module-only load keeps the engine's own and hands the saved one back in the client
    state, without which it is unknown (None: no attribute rather than a wrong one)."""
    if not module_only:
        return engine.global_steps
    step = client_state.get("global_steps") if isinstance(client_state, dict) else None
    return step if isinstance(step, int) else None


def _can_step(engine) -> bool:
    """Whether the engine can take an optimizer step (``step`` asserts an optimizer)."""
    from deepspeed.runtime.utils import DummyOptim

    optimizer = getattr(engine, "optimizer", None)
    return optimizer is not None and not isinstance(optimizer, DummyOptim)


def instrument(engine, **options: Any) -> DeepSpeedInstrumentor:
    """Trace ``engine``'s ``save_checkpoint`` / ``load_checkpoint`` (once per engine).

    Options: ``trace_dir``, ``verify`` (``size``/``full``/``none``), ``strict``,
    ``state_dir``, ``tracer_provider``, ``universal='convert'`` (convert a checkpoint saved
    with another data-parallel world size to a universal one, timed, and load that),
    ``save_dir`` (for :meth:`~DeepSpeedInstrumentor.save`), ``interruptions``
    (``True`` or guard options: save on a Spot/preemption notice) and ``log_metrics``
    (default True: RTO and phase seconds into the config's ``tensorboard`` /
    ``wandb`` / ``csv_monitor`` when one is enabled).
    """
    existing = vars(engine).get(_ATTACHED)
    if existing is not None:
        return existing
    return DeepSpeedInstrumentor(**options).instrument(engine)


def uninstrument(engine) -> None:
    """Remove everything ckptprof placed on ``engine``."""
    existing = vars(engine).get(_ATTACHED)
    if existing is not None:
        existing.uninstrument()


__all__ = ["DeepSpeedInstrumentor", "instrument", "uninstrument"]
