"""``framework``: the layout's own loader reading straight from the storage path
(``torch.load(path, mmap=True)``, ``safe_open``, ``dcp.load`` with its
``FileSystemReader``). The files are first warmed into the page cache (``fetch``), then
the loader maps them: deserialize and fetch are told apart as the framework callbacks do.
POSIX paths only."""

from __future__ import annotations

from ckptprof.errors import CkptprofError
from ckptprof.synth.strategies.base import (
    ANY,
    RunContext,
    Strategy,
    deserialize_files,
    load_pieces,
    pieces_loaded,
    verify_files,
    warm_files,
)
from ckptprof.synth.strategies.registry import dcp_handler


class Framework(Strategy):
    name = "framework"

    def handlers(self):
        return {ANY: self.restore, "dcp": dcp_handler("restore_framework")}

    def check(self, storage) -> None:
        if not storage.files_by_path:
            raise CkptprofError(
                "--strategy framework reads files from a local or mounted path, as the "
                "frameworks' loaders do; for s3:// use staged or pipelined (or --stage DIR)."
            )

    def memory_held(self, read_bytes: int, memory_budget: int) -> int:
        return 0  # the loaders map the files: their pages are the page cache's

    def restore(self, ctx: RunContext) -> None:
        warm_files(ctx)
        verify_files(ctx)
        loaded = deserialize_files(ctx, lambda f: pieces_loaded(ctx, f))
        load_pieces(ctx, loaded)


__all__ = ["Framework"]
