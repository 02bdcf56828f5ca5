"""Train a tiny Llama with the Hugging Face Trainer on CPU, save, "crash", resume, report.

    python examples/hf_trainer_resume.py --dir /tmp/hf-demo                 # whole story
    python examples/hf_trainer_resume.py --dir /tmp/hf-demo --phase train   # first run only
    python examples/hf_trainer_resume.py --dir /tmp/hf-demo --phase resume  # second run only
    python examples/hf_trainer_resume.py --dir /tmp/hf-demo --nproc 2       # 2 processes (gloo)

The model is built from a ``LlamaConfig`` (nothing is downloaded) and the data lives in
memory. The only ckptprof line in the training code is ``callbacks=[CkptProfCallback()]``.
``--hidden``/``--layers`` make the model bigger; ``--max-shard-size 200KB`` makes the
Trainer write sharded safetensors with an index, as large models do.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from ckptprof.integrations.transformers import CkptProfCallback


class TokenDataset(torch.utils.data.Dataset):
    """Fixed random token sequences; labels = inputs (causal LM)."""

    def __init__(self, n: int = 64, length: int = 32, vocab: int = 256) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class SlowSteps(TrainerCallback):
    """Stands in for a bigger model: each step takes ``delay`` seconds longer."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.delay)


def tiny_llama(hidden: int = 64, layers: int = 2, vocab: int = 256) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def make_trainer(
    directory: Path,
    max_steps: int,
    callbacks: list,
    hidden: int = 64,
    layers: int = 2,
    max_shard_size: str | None = None,
    **arguments,
) -> Trainer:
    """A quiet CPU Trainer that checkpoints every 5 steps into ``directory/checkpoints``."""
    model = tiny_llama(hidden, layers)
    if max_shard_size:  # what large models get by default: shards + index json
        model.save_pretrained = functools.partial(
            model.save_pretrained, max_shard_size=max_shard_size
        )
    defaults = dict(
        output_dir=str(directory / "checkpoints"),
        use_cpu=True,
        max_steps=max_steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=5,
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    dataset = arguments.pop("train_dataset", None) or TokenDataset()
    args = TrainingArguments(**{**defaults, **arguments})
    return Trainer(model=model, args=args, train_dataset=dataset, callbacks=callbacks)


def deepspeed_arguments(stage: int) -> dict:
    """TrainingArguments for DeepSpeed ZeRO on CPU (one process without torchrun too)."""
    import socket

    import deepspeed.ops

    # skip the JIT build of DeepSpeed's shm all-reduce op: training never uses it
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port
        )
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    return {"deepspeed": config, "optim": "adamw_torch"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("hf-demo"))
    ap.add_argument("--phase", choices=["all", "train", "resume"], default="all")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--max-shard-size", default=None, help="e.g. 200KB: sharded safetensors")
    ap.add_argument("--nproc", type=int, default=1, help="CPU processes (torchrun, gloo)")
    ap.add_argument("--verify", default="size", choices=["full", "size", "none"])
    ap.add_argument("--steps", type=int, default=None, help="train to this step (10, resume 15)")
    ap.add_argument(
        "--interruptions",
        action="store_true",
        help="on SIGTERM/SIGUSR1 (or $CKPTPROF_NOTICE_SOURCES) save, then exit; link the resume",
    )
    ap.add_argument("--step-delay", type=float, default=0.0, help="seconds added to each step")
    ap.add_argument(
        "--deepspeed-stage", type=int, default=None, help="train through DeepSpeed ZeRO (CPU)"
    )
    args = ap.parse_args()
    if args.phase == "all":
        launcher = [sys.executable]
        if args.nproc > 1:
            launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc)]
        flags = [
            "--dir", str(args.dir), "--hidden", str(args.hidden), "--layers", str(args.layers),
            "--verify", args.verify,
        ]  # fmt: skip
        if args.max_shard_size:
            flags += ["--max-shard-size", args.max_shard_size]
        if args.deepspeed_stage is not None:
            flags += ["--deepspeed-stage", str(args.deepspeed_stage)]
        for phase in ("train", "resume"):
            subprocess.run([*launcher, __file__, *flags, "--phase", phase], check=True)
        subprocess.run(
            [sys.executable, "-m", "ckptprof", "report", str(args.dir / "traces")], check=True
        )
        return 0
    callback = CkptProfCallback(  # the one line
        trace_dir=args.dir / "traces", verify=args.verify, interruptions=args.interruptions
    )
    callbacks = [callback] + ([SlowSteps(args.step_delay)] if args.step_delay else [])
    extra = {} if args.deepspeed_stage is None else deepspeed_arguments(args.deepspeed_stage)
    trainer = make_trainer(
        args.dir,
        max_steps=args.steps or (10 if args.phase == "train" else 15),
        callbacks=callbacks,
        hidden=args.hidden,
        layers=args.layers,
        max_shard_size=args.max_shard_size,
        **extra,
    )
    trainer.train(resume_from_checkpoint=args.phase == "resume")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
