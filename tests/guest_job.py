"""Real training jobs, run with or without ckptprof, and what each left behind.

    python tests/guest_job.py FRAMEWORK SCENARIOS --variant off|on|interruptions \\
        --work DIR --out OBSERVATIONS.json

``FRAMEWORK`` is lightning, transformers or deepspeed; ``SCENARIOS`` a comma-separated
list of this file's scenario names for it, run one after another in this process, each
in ``DIR/<scenario>``. After each one the job's observable state is recorded: its result
or exception (type and message), every file in its checkpoint directory (sha256), the
installed signal handlers, the live threads, the open file descriptors, the attributes
of the framework objects, and the warnings the frameworks gave. ``tests/test_guest.py``
runs every variant in a fresh process and the same ``DIR`` and requires the
observations to be identical: ckptprof is a guest.

The ckptprof variants add exactly the one line the README asks for; ``interruptions``
also turns on interruption tracing (SIGTERM and SIGUSR1 handlers). The trace files and
ckptprof's records go outside ``DIR`` (the current directory and
``$CKPTPROF_STATE_DIR``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import hashlib
import json
import logging
import os
import pickle
import re
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from unittest import mock

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

VARIANTS = ("off", "on", "interruptions")
SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")


# ---------------------------------------------------------------------- observation
def _handler_name(handler) -> str:
    if handler == signal.SIG_DFL:
        return "default"
    if handler == signal.SIG_IGN:
        return "ignore"
    if handler is None:
        return "none"
    return f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', handler)}"


def _fds() -> list[str]:
    """What this process has open, by kind and target (pipe/socket inodes left out)."""
    found = []
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor
        found.append(re.sub(r"\[\d+\]", "", target))
    return sorted(found)


def _files(directory: Path) -> dict[str, str]:
    out = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel.endswith("training_args.bin"):  # the Trainer pickles its logging_dir's time
            out[rel] = f"{path.stat().st_size} bytes"
            continue
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _shape(obj) -> dict[str, str]:
    """An object's own attributes: names and value types (values change run to run)."""
    return {name: type(value).__name__ for name, value in sorted(vars(obj).items())}


def _warning(caught: warnings.WarningMessage) -> str:
    return f"{caught.category.__name__}: {_normalize(str(caught.message))}"


def _normalize(text: str) -> str:
    return re.sub(r"0x[0-9a-f]+", "0x…", text)


class _FrameworkLog(logging.Handler):
    """The frameworks' own warnings and errors (ckptprof's are its own business)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not record.name.startswith("ckptprof"):
            self.messages.append(f"{record.levelname} {record.name}: {record.getMessage()}")


#: threads of the guest (ckptprof's own and OpenTelemetry's) that a closed run stops
GUEST_THREADS = ("ckptprof", "Otel")
ENDING_DEADLINE_S = 15.0  # more than any of ckptprof's bounded waits at shutdown


def _threads_once_ended() -> list[str]:
    """The live threads, once the guest's threads that are ending have ended.

    A run that is over may leave ckptprof's (or the SDK's) threads finishing what they
    were asked to stop (a bounded flush, a poller joined with a timeout): they are waited
    for, until only the job's own threads remain or the deadline passes (one still alive
    then was left behind, and shows). The job's threads are taken as they are.
    """
    deadline = time.monotonic() + ENDING_DEADLINE_S
    while time.monotonic() < deadline:
        ending = [t for t in threading.enumerate() if t.name.startswith(GUEST_THREADS)]
        if not ending:
            break
        ending[0].join(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
    return sorted(t.name for t in threading.enumerate())


def observe(name: str, work: Path, run) -> dict:
    """Run one scenario and record what it left behind (``ddp_train`` and ``ddp_resume``,
    two launches of two processes, share one directory)."""
    directory = work / ("ddp" if name.startswith("ddp_") else name)
    directory.mkdir(parents=True, exist_ok=True)  # DDP: every rank runs the scenario
    log = _FrameworkLog()
    logging.getLogger().addHandler(log)
    result, error = None, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result, objects = run(directory)
        except Exception as exc:  # noqa: BLE001 - recorded, compared across variants
            error, objects = [type(exc).__name__, _normalize(str(exc))], {}
    logging.getLogger().removeHandler(log)
    gc.collect()
    threads = _threads_once_ended()  # not a sleep: awaited, however busy the machine
    return {
        "result": result,
        "error": error,
        "files": _files(directory),
        "handlers": {s: _handler_name(signal.getsignal(getattr(signal, s))) for s in SIGNALS},
        "threads": threads,
        "fds": _fds(),
        "attributes": {label: _shape(obj) for label, obj in objects.items()},
        "warnings": sorted(
            {f"{w.category.__name__}: {_normalize(str(w.message))}" for w in caught}
        ),
        "log": sorted(set(map(_normalize, log.messages))),
    }


# ---------------------------------------------------------------------- Lightning
class Lightning:
    def __init__(self, variant: str) -> None:
        self.variant = variant

    def callbacks(self) -> list:
        if self.variant == "off":
            return []
        from ckptprof.integrations.lightning import CkptProf

        return [CkptProf(interruptions=self.variant == "interruptions")]  # the one line

    def trainer(self, directory: Path, steps: int, extra=(), **kwargs):
        from lightning_resume import make_trainer

        callbacks = [*self.callbacks(), *extra]
        return make_trainer(
            directory, steps, callbacks, checkpoint_dir=directory / "ckpt", **kwargs
        )

    @staticmethod
    def model(fail_at: int | None = None):
        import torch

        torch.manual_seed(0)
        return failing_model(fail_at)

    @staticmethod
    def weights(module) -> str:
        digest = hashlib.sha256()
        for key, value in sorted(module.state_dict().items()):
            digest.update(key.encode() + value.detach().numpy().tobytes())
        return digest.hexdigest()

    def objects(self, trainer) -> dict:
        strategy = trainer.strategy
        return {"trainer": trainer, "strategy": strategy, "io": strategy.checkpoint_io}

    def save_resume(self, directory: Path):
        from lightning_resume import data

        self.trainer(directory, 7).fit(self.model(), data())
        resumed = self.trainer(directory, 9)
        model = self.model()
        resumed.fit(model, data(), ckpt_path="last")
        result = {"step": resumed.global_step, "weights": self.weights(model)}
        return result, self.objects(resumed)

    def fit_raises(self, directory: Path):
        from lightning_resume import data

        trainer = self.trainer(directory, 20)
        trainer.fit(self.model(fail_at=7), data())

    def missing_path(self, directory: Path):
        from lightning_resume import data

        trainer = self.trainer(directory, 3)
        trainer.fit(self.model(), data(), ckpt_path=str(directory / "no-such.ckpt"))

    def user_layers(self, directory: Path):
        """The user (or another library) wraps what ckptprof wraps, after it did."""
        import lightning as L
        from lightning_resume import data

        class WrapAfterSetup(L.Callback):
            def setup(self, trainer, pl_module, stage):
                trainer.save_checkpoint = mock.Mock(wraps=trainer.save_checkpoint)
                strategy = trainer.strategy
                strategy.load_checkpoint = mock.Mock(wraps=strategy.load_checkpoint)

        self.trainer(directory, 6).fit(self.model(), data())
        trainer = self.trainer(directory, 8, extra=[WrapAfterSetup()])
        trainer.fit(self.model(), data(), ckpt_path="last")
        trainer.save_checkpoint(directory / "after.ckpt")  # the user's layer still works
        counts = {
            "save_checkpoint": trainer.save_checkpoint.call_count,
            "load_checkpoint": trainer.strategy.load_checkpoint.call_count,
        }
        return counts, self.objects(trainer)

    def mock_checkpoint_io(self, directory: Path):
        """A MagicMock as the CheckpointIO plugin: its methods must survive attach/detach."""
        from lightning.pytorch.plugins.io import TorchCheckpointIO
        from lightning_resume import data

        io = mock.MagicMock(spec=TorchCheckpointIO)
        trainer = self.trainer(directory, 6, plugins=[io])
        trainer.fit(self.model(), data())
        io.save_checkpoint({"after": True}, directory / "x.ckpt")
        return {"saves": io.save_checkpoint.call_count}, {"trainer": trainer}

    def deepcopy_callbacks(self, directory: Path):
        """Copying or pickling the callbacks (as tuners and spawn launchers do), during
        training and after it."""
        from lightning_resume import data

        copier = lightning_copier()
        trainer = self.trainer(directory, 4, extra=[copier])
        trainer.fit(self.model(), data())
        copier.copy(trainer.callbacks)
        return copier.copies, self.objects(trainer)

    def ddp_train(self, directory: Path):
        from lightning_resume import data

        trainer = self.trainer(directory, 7, devices=2)
        trainer.fit(self.model(), data())
        return {"step": trainer.global_step, "rank": trainer.global_rank}, {}

    def ddp_resume(self, directory: Path):
        from lightning_resume import data

        trainer = self.trainer(directory, 9, devices=2)
        model = self.model()
        trainer.fit(model, data(), ckpt_path="last")
        return {"step": trainer.global_step, "weights": self.weights(model)}, {}

    def fail(self, directory: Path) -> None:
        self.fit_raises(directory)


# ---------------------------------------------------------------------- Hugging Face
class Transformers:
    def __init__(self, variant: str) -> None:
        self.variant = variant

    def callbacks(self) -> list:
        if self.variant == "off":
            return []
        from ckptprof.integrations.transformers import CkptProfCallback

        return [CkptProfCallback(interruptions=self.variant == "interruptions")]  # the one line

    def trainer(self, directory: Path, steps: int, extra=(), **kwargs):
        from hf_trainer_resume import make_trainer

        return make_trainer(directory, steps, [*self.callbacks(), *extra], **kwargs)

    def objects(self, trainer) -> dict:
        return {"trainer": trainer, "state": trainer.state}

    @staticmethod
    def weights(trainer) -> str:
        return Lightning.weights(trainer.model)

    def save_resume(self, directory: Path):
        self.trainer(directory, 7).train()
        resumed = self.trainer(directory, 9)
        resumed.train(resume_from_checkpoint=True)
        result = {"step": resumed.state.global_step, "weights": self.weights(resumed)}
        return result, self.objects(resumed)

    def train_raises(self, directory: Path):
        from transformers import TrainerCallback

        class Boom(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == 6:
                    raise RuntimeError("the training loop failed at step 6")

        self.trainer(directory, 20, extra=[Boom()]).train()

    def missing_path(self, directory: Path):
        self.trainer(directory, 3).train(resume_from_checkpoint=str(directory / "no-such"))

    def converted_weights(self, directory: Path):
        """The user turns model.safetensors into shards + index between save and resume."""
        from safetensors.torch import load_file, save_file

        self.trainer(directory, 5).train()
        folder = directory / "checkpoints" / "checkpoint-5"
        tensors = load_file(folder / "model.safetensors")
        names = sorted(tensors)
        shards = {
            "model-00001-of-00002.safetensors": names[: len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2 :],
        }
        for shard, keys in shards.items():
            save_file({k: tensors[k] for k in keys}, folder / shard, metadata={"format": "pt"})
        weight_map = {k: shard for shard, keys in shards.items() for k in keys}
        index = {"metadata": {}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        (folder / "model.safetensors").unlink()
        resumed = self.trainer(directory, 6)
        resumed.train(resume_from_checkpoint=True)
        return {"step": resumed.state.global_step, "weights": self.weights(resumed)}, {}

    def deepcopy_callbacks(self, directory: Path):
        """Copying or pickling the callbacks during training and after it."""
        from transformers import TrainerCallback

        copies = []

        def copy_all(callbacks) -> None:
            others = [c for c in callbacks if not isinstance(c, Copier)]
            copy.deepcopy(others)
            pickle.loads(pickle.dumps(others))
            copies.append("copied and pickled")

        class Copier(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == 2:
                    copy_all(trainer.callback_handler.callbacks)

        trainer = self.trainer(directory, 3, extra=[Copier()])
        trainer.train()
        copy_all(trainer.callback_handler.callbacks)
        return copies, self.objects(trainer)

    def many_trainers(self, directory: Path):
        """A hyper-parameter search builds many Trainers in one process."""
        steps = []
        for i in range(5):
            trainer = self.trainer(directory / f"trial-{i}", 2, save_steps=100)
            trainer.train()
            steps.append(trainer.state.global_step)
            del trainer
        return steps, {}

    def ddp_train(self, directory: Path):
        trainer = self.trainer(directory, 7)
        trainer.train()
        return {"step": trainer.state.global_step}, {}

    def ddp_resume(self, directory: Path):
        trainer = self.trainer(directory, 9)
        trainer.train(resume_from_checkpoint=True)
        return {"step": trainer.state.global_step, "weights": self.weights(trainer)}, {}

    def fail(self, directory: Path) -> None:
        self.train_raises(directory)


# ---------------------------------------------------------------------- DeepSpeed
class DeepSpeed:
    def __init__(self, variant: str) -> None:
        self.variant = variant

    def engine(self, directory: Path):
        from deepspeed_resume import make_engine, single_process_env

        single_process_env()
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        engine = make_engine(2, 32, 1)
        if self.variant != "off":
            from ckptprof.integrations.deepspeed import instrument

            interruptions = self.variant == "interruptions"
            save_dir = str(directory / "checkpoints")
            instrument(engine, save_dir=save_dir, interruptions=interruptions)  # the one line
        return engine

    @staticmethod
    def steps(engine, until: int, save_dir: str = "", fail_at: int | None = None) -> None:
        from deepspeed_resume import train

        if fail_at is not None:
            train(engine, fail_at, save_dir=save_dir)
            raise RuntimeError(f"the training loop failed after step {fail_at}")
        train(engine, until, save_dir=save_dir)

    @staticmethod
    def weights(engine) -> str:
        return Lightning.weights(engine.module)

    @staticmethod
    def destroyed(engine) -> dict:
        """The job ends its engine (``engine.destroy()``), then what the engine holds."""
        engine.destroy()
        shape = {"engine": _shape(engine), "checkpoint_engine": _shape(engine.checkpoint_engine)}
        shape["config.load_universal_checkpoint"] = {
            "value": str(engine._config.load_universal_checkpoint)
        }
        return shape

    def save_resume(self, directory: Path):
        save_dir = str(directory / "checkpoints")
        first = self.engine(directory)
        self.steps(first, 7, save_dir)
        first.destroy()
        resumed = self.engine(directory)
        resumed.load_checkpoint(save_dir)
        self.steps(resumed, 9)
        result = {"step": resumed.global_steps, "weights": self.weights(resumed)}
        return {**result, "objects": self.destroyed(resumed)}, {}

    def step_raises(self, directory: Path):
        engine = self.engine(directory)
        try:
            self.steps(engine, 20, str(directory / "checkpoints"), fail_at=6)
        finally:
            engine.destroy()

    def missing_path(self, directory: Path):
        engine = self.engine(directory)
        result = engine.load_checkpoint(str(directory / "no-such"))
        return {"loaded": repr(result), "objects": self.destroyed(engine)}, {}

    def ddp_train(self, directory: Path):
        engine = self.engine(directory)
        self.steps(engine, 7, str(directory / "checkpoints"))
        engine.destroy()
        return {"step": engine.global_steps}, {}

    def ddp_resume(self, directory: Path):
        engine = self.engine(directory)
        held_back_before_the_load()
        engine.load_checkpoint(str(directory / "checkpoints"))
        self.steps(engine, 9)
        result = {"step": engine.global_steps, "weights": self.weights(engine)}
        engine.destroy()
        return result, {}

    def fail(self, directory: Path) -> None:
        """The loop fails and the job goes on without ending its engine."""
        engine = self.engine(directory)
        self.steps(engine, 20, str(directory / "checkpoints"), fail_at=6)


_FAILING_MODEL = None


def failing_model(fail_at: int | None):
    """The examples' TinyModel, whose training step raises at batch ``fail_at``; its class
    is a module global, so pickled callbacks that refer to the model still pickle."""
    global _FAILING_MODEL
    if _FAILING_MODEL is None:
        from lightning_resume import TinyModel

        class FailingModel(TinyModel):
            fail_at: int | None = None

            def training_step(self, batch, batch_idx):
                if batch_idx == self.fail_at:
                    raise RuntimeError(f"training_step failed at batch {batch_idx}")
                return super().training_step(batch, batch_idx)

        FailingModel.__qualname__ = "FailingModel"
        globals()["FailingModel"] = _FAILING_MODEL = FailingModel
    model = _FAILING_MODEL()
    model.fail_at = fail_at
    return model


def lightning_copier():
    """A Lightning callback that deep-copies and pickles the trainer's other callbacks."""
    import lightning as L

    class Copier(L.Callback):
        def __init__(self) -> None:
            self.copies: list[str] = []

        def copy(self, callbacks) -> None:
            others = [c for c in callbacks if c is not self]
            copy.deepcopy(others)
            pickle.loads(pickle.dumps(others))
            self.copies.append("copied and pickled")

        def on_train_batch_end(self, trainer, *args) -> None:
            if trainer.global_step == 2:
                self.copy(trainer.callbacks)

    return Copier()


FRAMEWORKS = {"lightning": Lightning, "transformers": Transformers, "deepspeed": DeepSpeed}


def held_back_before_the_load() -> None:
    """``CKPTPROF_TEST_LATE_LOAD=RANK:SECONDS``: the ranks leave a barrier together, then
    that rank begins its load that much later than the others (a rank arriving late at a
    resume, as at scale)."""
    rank, _, seconds = os.environ.get("CKPTPROF_TEST_LATE_LOAD", "").partition(":")
    if not rank:
        return
    import torch.distributed as dist

    dist.barrier()  # rank 0 prints its engine's settings after the last collective
    if int(rank) == dist.get_rank():
        time.sleep(float(seconds))


def sigterm_after_failure(job, work: Path) -> None:
    """Training fails; the job catches it and goes on; then the platform sends SIGTERM.
    The process must end as it would have without ckptprof (killed by the signal)."""
    with contextlib.suppress(Exception):
        job.fail(work / "sigterm")
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # a swallowed signal leaves the process running
        time.sleep(0.05)
    print("survived SIGTERM", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("framework", choices=sorted(FRAMEWORKS))
    parser.add_argument("scenarios", help="comma-separated scenario names")
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    job = FRAMEWORKS[args.framework](args.variant)
    observations = {}
    for name in args.scenarios.split(","):
        if name == "sigterm_after_failure":
            sigterm_after_failure(job, args.work)
            return 0
        observations[name] = observe(name, args.work, getattr(job, name))
    if int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))) == 0:
        args.out.write_text(json.dumps(observations, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
