"""``staged``: every file this restore reads into memory (or ``--stage DIR`` first), then
verify everything, deserialize everything, copy into the state: what ``s5cmd cp`` +
``torch.load`` does."""

from __future__ import annotations

from ckptprof.synth.strategies.base import (
    ANY,
    RunContext,
    Strategy,
    fetch_all,
    load_from_buffers,
)
from ckptprof.synth.strategies.registry import dcp_handler


class Staged(Strategy):
    name = "staged"

    def handlers(self):
        return {ANY: self.restore, "dcp": dcp_handler("restore_staged")}

    def restore(self, ctx: RunContext) -> None:
        load_from_buffers(ctx, fetch_all(ctx))


__all__ = ["Staged"]
