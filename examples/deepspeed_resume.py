"""Train a small model with DeepSpeed on CPU, save, "crash", resume in a new process, report.

    python examples/deepspeed_resume.py --dir /tmp/ds-demo                   # ZeRO-2, 1 process
    python examples/deepspeed_resume.py --dir /tmp/ds-demo --stage 3 --nproc 2
    python examples/deepspeed_resume.py --dir /tmp/ds-demo --nproc 2 --resume-nproc 1 \\
        --universal convert      # saved by 2 ranks, resumed by 1 through a universal checkpoint

The only ckptprof line in the training code is ``ckptprof.integrations.deepspeed.instrument
(engine)``. DeepSpeed on CPU uses gloo; this script also tells DeepSpeed not to JIT-compile
its shared-memory all-reduce op (inference only; 30-110 s of compile on first use).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch


def single_process_env() -> None:
    """The variables torchrun would set, so one plain process can initialize DeepSpeed."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def make_engine(
    stage: int, hidden: int, layers: int, decoupled: bool = False, config_extra: dict | None = None
):
    import deepspeed
    import deepspeed.ops

    # skip the JIT build of DeepSpeed's shm all-reduce op: training never uses it
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    model = torch.nn.Sequential(torch.nn.Linear(16, hidden), *blocks, torch.nn.Linear(hidden, 4))
    world = int(os.environ["WORLD_SIZE"])
    zero: dict = {"stage": stage}
    if stage == 3:
        zero["memory_efficient_linear"] = False  # else DeepSpeed replaces F.linear globally
    config = {
        "train_batch_size": 2 * world,
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    if decoupled:  # DeepSpeed's writer process; the commit happens at the next step
        config["checkpoint"] = {
            "writer": {"type": "python", "decoupled": True, "data_parallel": "replica"}
        }
        os.environ.setdefault("CROSS_SIZE", "1")  # set by the deepspeed launcher otherwise
        os.environ.setdefault("CROSS_RANK", "0")
    config.update(config_extra or {})  # e.g. a monitor: {"csv_monitor": {...}}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def train(engine, steps: int, delay: float = 0.0, every: int = 5, save_dir: str = "") -> None:
    g = torch.Generator().manual_seed(engine.global_rank)
    while engine.global_steps < steps:
        x = torch.randn(2, 16, generator=g)
        loss = torch.nn.functional.mse_loss(engine(x), x[:, :4])
        engine.backward(loss)
        engine.step()
        if save_dir and engine.global_steps % every == 0:
            engine.save_checkpoint(save_dir)
        time.sleep(delay)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("deepspeed-demo"))
    ap.add_argument("--phase", choices=["all", "train", "resume"], default="all")
    ap.add_argument("--stage", type=int, default=2, choices=[0, 1, 2, 3])
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=1, help="processes for training (torchrun)")
    ap.add_argument("--resume-nproc", type=int, default=None, help="processes for the resume")
    ap.add_argument("--universal", choices=["convert"], default=None)
    ap.add_argument("--steps", type=int, default=None, help="train to this step (10, resume 12)")
    ap.add_argument("--verify", default="size", choices=["full", "size", "none"])
    ap.add_argument(
        "--strict", action="store_true", help="refuse a resume whose files do not match"
    )
    ap.add_argument("--interruptions", action="store_true", help="save on SIGTERM/SIGUSR1, exit")
    ap.add_argument("--step-delay", type=float, default=0.0, help="seconds added to each step")
    ap.add_argument(
        "--decoupled", action="store_true", help="save with DeepSpeed's decoupled writer"
    )
    args = ap.parse_args()
    if args.phase == "all":
        flags = [
            "--dir", str(args.dir), "--stage", str(args.stage), "--hidden", str(args.hidden),
            "--layers", str(args.layers), "--verify", args.verify,
        ]  # fmt: skip
        if args.universal:
            flags += ["--universal", args.universal]
        for phase, nproc in (("train", args.nproc), ("resume", args.resume_nproc or args.nproc)):
            launcher = [sys.executable]
            if nproc > 1:
                launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
            subprocess.run([*launcher, __file__, *flags, "--phase", phase], check=True)
        subprocess.run(
            [sys.executable, "-m", "ckptprof", "report", str(args.dir / "traces")], check=True
        )
        return 0

    single_process_env()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from ckptprof.integrations.deepspeed import instrument

    engine = make_engine(args.stage, args.hidden, args.layers, args.decoupled)
    save_dir = str(args.dir / "checkpoints")
    ckptprof = instrument(  # the one line
        engine,
        trace_dir=args.dir / "traces",
        verify=args.verify,
        strict=args.strict,
        universal=args.universal,
        save_dir=save_dir,
        interruptions=args.interruptions,
    )
    if args.phase == "resume":
        engine.load_checkpoint(save_dir)
    train(engine, args.steps or (10 if args.phase == "train" else 12), args.step_delay, 5, save_dir)
    engine.destroy()  # commits the decoupled writer's last save, ends its process (traced)
    ckptprof.uninstrument()  # destroy() took ckptprof off already: nothing left to undo
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
