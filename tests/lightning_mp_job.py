"""A real Lightning job on a sharded (DCP) checkpoint for the tests: 2 CPU ranks under
``ModelParallelStrategy`` (FSDP2 ``fully_shard`` over a gloo device mesh), which saves and
loads its checkpoint folder through ``torch.distributed.checkpoint`` as Lightning's FSDP
strategy does on GPUs. Prints each rank's parameter checksum at the end, so a run with
and one without ckptprof can be compared.

    python tests/lightning_mp_job.py STEPS ROOT CKPT_PATH|- TRACES|-   (- : no ckptprof)
"""

from __future__ import annotations

import os
import sys

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.utils.data import DataLoader, TensorDataset


class ShardedModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
        )

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def main() -> int:
    steps, root, ckpt, traces = sys.argv[1:5]
    callbacks = []
    if traces != "-":
        from ckptprof.integrations.lightning import CkptProf

        callbacks.append(CkptProf(trace_dir=traces))
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 32, generator=g), torch.randn(64, 1, generator=g))
    trainer = L.Trainer(
        accelerator="cpu", devices=2, max_steps=int(steps), default_root_dir=root,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        callbacks=callbacks, logger=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    model = ShardedModel()
    trainer.fit(model, DataLoader(data, batch_size=8), ckpt_path=None if ckpt == "-" else ckpt)
    import torch.distributed.checkpoint as dcp

    from ckptprof.integrations.patching import is_ours

    checksum = sum(float(p.detach().to_local().double().sum()) for p in model.parameters())
    patched = is_ours(dcp.load) or is_ours(dcp.save)
    rank = trainer.global_rank
    lines = (
        f"rank {rank} step {trainer.global_step} checksum {checksum:.12e}\n"
        f"rank {rank} dcp patched after fit: {patched}\n"
    )
    sys.stdout.flush()
    os.write(1, lines.encode())  # one write: the ranks share the pipe, lines never interleave
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
