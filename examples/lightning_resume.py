"""Train a tiny Lightning model on CPU, save, "crash", resume in a fresh process, report.

    python examples/lightning_resume.py --dir /tmp/lit-demo          # whole story
    python examples/lightning_resume.py --dir /tmp/lit-demo --phase train   # first run only
    python examples/lightning_resume.py --dir /tmp/lit-demo --phase resume  # second run only

The only ckptprof line in the training code is ``callbacks=[CkptProf(...)]``.
Flags make the model bigger (``--hidden``, ``--layers``) to see the phases grow.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from ckptprof.integrations.lightning import CkptProf


class TinyModel(L.LightningModule):
    def __init__(self, hidden: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()
        blocks = []
        for _ in range(layers):
            blocks += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, hidden), *blocks, torch.nn.Linear(hidden, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def data(n: int = 256) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=16)


def make_trainer(
    root: Path,
    max_steps: int,
    callbacks: list,
    devices: int = 1,
    checkpoint_dir: Path | None = None,
    **kwargs,
) -> L.Trainer:
    """A quiet CPU trainer; checkpoints every 5 steps (and ``last``) into ``checkpoint_dir``."""
    if checkpoint_dir is not None:
        callbacks = [
            ModelCheckpoint(dirpath=checkpoint_dir, every_n_train_steps=5, save_last=True),
            *callbacks,
        ]
    return L.Trainer(
        default_root_dir=root,
        accelerator="cpu",
        devices=devices,
        strategy=kwargs.pop("strategy", "ddp" if devices > 1 else "auto"),
        max_steps=max_steps,
        logger=kwargs.pop("logger", False),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=checkpoint_dir is not None,
        callbacks=callbacks,
        **kwargs,
    )


class SlowSteps(L.Callback):
    """Stands in for a bigger model: each batch takes ``delay`` seconds longer."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def on_train_batch_end(self, *args, **kwargs) -> None:
        time.sleep(self.delay)


def trainer(
    directory: Path,
    max_steps: int,
    devices: int = 1,
    interruptions: bool = False,
    step_delay: float = 0.0,
) -> L.Trainer:
    ckptprof = CkptProf(trace_dir=directory / "traces", interruptions=interruptions)  # the line
    callbacks = [ckptprof] + ([SlowSteps(step_delay)] if step_delay else [])
    return make_trainer(directory, max_steps, callbacks, devices, directory / "checkpoints")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("lightning-demo"))
    ap.add_argument("--phase", choices=["all", "train", "resume"], default="all")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--devices", type=int, default=1, help="CPU processes (DDP with gloo when > 1)")
    ap.add_argument("--steps", type=int, default=None, help="train to this step (10, resume 15)")
    ap.add_argument(
        "--interruptions",
        action="store_true",
        help="on SIGTERM/SIGUSR1 (or $CKPTPROF_NOTICE_SOURCES) save last.ckpt; link the resume",
    )
    ap.add_argument("--step-delay", type=float, default=0.0, help="seconds added to each step")
    args = ap.parse_args()
    if args.phase == "all":
        base = [
            sys.executable,
            __file__,
            "--dir",
            str(args.dir),
            "--hidden",
            str(args.hidden),
            "--layers",
            str(args.layers),
            "--devices",
            str(args.devices),
        ]
        subprocess.run([*base, "--phase", "train"], check=True)
        subprocess.run([*base, "--phase", "resume"], check=True)
        subprocess.run(
            [sys.executable, "-m", "ckptprof", "report", str(args.dir / "traces")], check=True
        )
        return 0
    model = TinyModel(args.hidden, args.layers)
    steps = args.steps or (10 if args.phase == "train" else 15)
    job = trainer(args.dir, steps, args.devices, args.interruptions, args.step_delay)
    job.fit(model, data(), ckpt_path="last" if args.phase == "resume" else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
