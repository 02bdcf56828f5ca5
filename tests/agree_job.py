"""Two ranks (torchrun, gloo) stepping with an InterruptionGuard each; rank 1 gets a real
SIGUSR1 from itself at step 3. Each rank writes the steps it saved at to OUT/rank<R>.json.

    python -m torch.distributed.run --nproc-per-node 2 tests/agree_job.py OUT [--no-agree]
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
from ckptprof.interrupt.guard import InterruptionGuard


def main() -> int:
    out = Path(sys.argv[1])
    agree = "--no-agree" not in sys.argv
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
                time.sleep(0.3)  # the watcher thread notes it
            guard.step_end(step)
            dist.barrier()  # the training step's own collectives
    finally:
        guard.close()
        session.close()
        source = guard.record.source if guard.record else None
        (out / f"rank{rank}.json").write_text(json.dumps({"saved": saved, "source": source}))
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
