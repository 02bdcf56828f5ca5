"""Two ranks (torchrun, gloo) stepping with an InterruptionGuard each; rank 1 gets a real
SIGUSR1 from itself at step 3. Each rank writes the steps it saved at to OUT/rank<R>.json.
With --give-up, rank 1 reaches its next step boundary only after the guard gave up
waiting for one (the signal handed on without a save); the ranks must stay in step.

    python -m torch.distributed.run --nproc-per-node 2 tests/agree_job.py OUT [--no-agree]
        [--give-up]
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch.distributed as dist

from ckptprof.integrations.session import TracingSession
from ckptprof.interrupt.guard import MIN_HANDOFF_S, InterruptionGuard


def main() -> int:
    out = Path(sys.argv[1])
    agree = "--no-agree" not in sys.argv
    give_up = "--give-up" in sys.argv
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    session = TracingSession("test", trace_dir=out / "traces")
    session.start()
    saved: list[int] = []
    step = 0

    def save() -> str:
        saved.append(step)
        return f"step-{step}"

    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # what the guard hands the signal on to
    guard = InterruptionGuard(
        session, lambda: str(out / "records"), save, sources=["sigusr1"],
        agree_across_ranks=agree,
    ).start()  # fmt: skip
    try:
        for step in range(1, 8):
            if rank == 1 and step == 3:
                os.kill(os.getpid(), signal.SIGUSR1)
                time.sleep(MIN_HANDOFF_S + 1.5 if give_up else 0.3)  # the watcher notes it
            guard.step_end(step)
            dist.barrier()  # the training step's own collectives
    finally:
        guard.close()
        session.close()
        source = guard.record.source if guard.record else None
        outcome = guard.record.outcome if guard.record else None
        (out / f"rank{rank}.json").write_text(
            json.dumps({"saved": saved, "source": source, "outcome": outcome, "steps": step})
        )
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
