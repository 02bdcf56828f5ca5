"""The first step after a resume, as the callbacks clock it: ended on the device's
completion (a step hook returns while the GPU may still run the step), and split where
its first batch was fetched."""

from __future__ import annotations

import sys

from ckptprof.phases import Attr


def wait_for_device() -> None:
    """When the framework's step hook runs, the step's kernels may still be queued on
    the GPU: the first step ends when the device has run them (one synchronize per
    resume; nothing where CUDA was never started)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def first_step_parts(
    start_ns: int, batch: tuple[int, int], end_ns: int, busy_s: float
) -> dict[str, float]:
    """first_step split at the first batch's fetch (see ``first_step_done``); the step
    itself is what is left of its busy time."""
    fetched_from, fetched_to = max(batch[0], start_ns), min(max(batch[1], start_ns), end_ns)
    setup_s = (fetched_from - start_ns) / 1e9
    batch_s = (fetched_to - fetched_from) / 1e9
    return {
        Attr.FIRST_STEP_SETUP_S: round(setup_s, 6),
        Attr.FIRST_STEP_BATCH_S: round(batch_s, 6),
        Attr.FIRST_STEP_COMPUTE_S: round(max(busy_s - setup_s - batch_s, 0.0), 6),
    }


__all__ = ["first_step_parts", "wait_for_device"]
