"""Resume overhead of the Lightning callback: the same checkpoint, with and without
``CkptProf``, alternating, many runs; prints the ratio of median resume times.

A resume here is ``trainer.fit(model, ckpt_path=…)`` timed from the call to the end of
the first training batch (a neutral timing callback in both variants, so fit's teardown
is not counted), in the same process, with the file hot in the page cache for both (the
storage is not what is measured). Target: ≤ 1% overhead.

    .venv/bin/python benchmarks/lightning_overhead.py --hidden 2048 --layers 6 --runs 8
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from lightning_resume import TinyModel, data, make_trainer  # noqa: E402

from ckptprof.integrations.lightning import CkptProf  # noqa: E402


class FirstBatchClock(L.Callback):
    """Records when the first training batch after the resume ends."""

    def __init__(self) -> None:
        self.first_batch_end: float | None = None

    def on_train_batch_end(self, *args, **kwargs) -> None:
        if self.first_batch_end is None:
            self.first_batch_end = time.perf_counter()


def trainer(root: Path, steps: int, callbacks) -> L.Trainer:
    return make_trainer(root, steps, callbacks)  # no checkpointing: only the resume is timed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--runs", type=int, default=8)
    args = ap.parse_args()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    root = Path(tempfile.mkdtemp(prefix="ckptprof-litbench-"))
    model = TinyModel(args.hidden, args.layers)
    t = trainer(root, 1, [])
    t.fit(model, data())
    ckpt = root / "model.ckpt"
    t.save_checkpoint(ckpt)
    size = ckpt.stat().st_size
    times: dict[str, list[float]] = {"without": [], "with": []}
    for run in range(args.runs + 1):  # the first round warms up and is not counted
        order = ["without", "with"] if run % 2 else ["with", "without"]
        for variant in order:
            ckpt.read_bytes()  # hot for both
            callbacks = [CkptProf(trace_dir=root / "traces")] if variant == "with" else []
            t0 = time.perf_counter()
            trainer(root, 2, callbacks).fit(
                TinyModel(args.hidden, args.layers), data(), ckpt_path=str(ckpt)
            )
            if run:
                times[variant].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"checkpoint {size / 1e6:.1f} MB (hidden {args.hidden}, {args.layers} layers, AdamW), "
        f"{args.runs} runs each, alternating; torch {torch.__version__}, lightning {L.__version__}"
    )
    for k, v in times.items():
        print(
            f"  {k:8} median {med[k]:.3f} s (min {min(v):.3f}, max {max(v):.3f}): "
            + " ".join(f"{x:.3f}" for x in v)
        )
    overhead = med["with"] / med["without"] - 1
    verdict = "target met" if overhead <= 0.01 else "above target"
    print(f"overhead of CkptProf on resume: {overhead:+.1%} ({verdict}: <= 1%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
