"""A real DCP job for the tests: ``save`` or ``load`` a row-sharded (DTensor ``Shard(0)``)
state of a small model on a CPU device mesh, one process per rank under torchrun (gloo),
with ``ckptprof.integrations.dcp.instrument()`` on. ``load`` checks every rank's shard
against the saved values, so a reshard to another world size is checked, not assumed.

``async`` saves the same state with ``dcp.async_save`` and waits for its upload future.

    python -m torch.distributed.run --nproc-per-node N tests/dcp_job.py save|async|load CKPT TRACES
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from ckptprof.integrations.dcp import instrument, uninstrument


def full_state() -> dict[str, torch.Tensor]:
    """The same values on every rank and in every run (a seeded generator)."""
    g = torch.Generator().manual_seed(7)
    return {
        "embed": torch.randn(96, 48, generator=g),
        "proj": torch.randn(72, 48, generator=g),
        "norm": torch.randn(48, generator=g),
    }


def main() -> int:
    mode, ckpt, traces = sys.argv[1:4]
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    instrument(trace_dir=traces)
    try:
        full = full_state()
        if mode == "save":
            state = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in full.items()}
            dcp.save({"model": state}, checkpoint_id=ckpt)
        elif mode == "async":
            state = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in full.items()}
            dcp.async_save({"model": state}, checkpoint_id=ckpt).result()
        else:
            state = {
                k: distribute_tensor(torch.zeros_like(v), mesh, [Shard(0)]) for k, v in full.items()
            }
            dcp.load({"model": state}, checkpoint_id=ckpt)
            for k, v in state.items():
                assert torch.equal(v.full_tensor(), full[k]), k
    finally:
        uninstrument()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
