"""How ``ckptprof synth save`` writes one save: the strategies (one module each, named in
:mod:`.registry`), each timed phase by phase.

* ``framework``: the layout's own writer as a job calls it (``torch.save`` into the file,
  safetensors' ``save_file``, ``dcp.save`` with its ``FileSystemWriter``); it serializes
  while it writes, so ``write`` is marked fused with ``serialize``.
* ``parallel``: the same bytes through ckptprof's I/O core: each file serialized
  (``serialize``: the archive's or header's small parts, and views of the tensors'
  memory for their bytes: nothing copied), then cut at the part size and written with
  ``concurrency`` parts in flight (``pwritev`` at offsets on a POSIX file, a multipart
  upload on S3).
* ``async``: DCP's ``async_save``: the blocking part (``stage``: the state copied into
  the buffers the background writer uses) is this save's span; the background write and
  commit are their own ``ckpt.save`` marked ``ckpt.save.background`` and linked to it, as
  the Lightning and DeepSpeed callbacks record an asynchronous save.

Every strategy writes under temporary names (DCP: its ``.metadata`` last) and makes the
files visible in ``commit``; ``fsync`` (on unless told otherwise) forces each file to the
device first. A failed save removes what it wrote.
"""

from __future__ import annotations

from ckptprof.synth.savers.base import SaveContext, Saver, Written
from ckptprof.synth.savers.registry import NAMES, check_strategy, default_strategy, get_saver


def save(strategy: str, ctx: SaveContext) -> Written:
    """One save of ``ctx``'s state by the strategy called ``strategy``."""
    return get_saver(strategy).save(ctx)


__all__ = [
    "NAMES",
    "SaveContext",
    "Saver",
    "Written",
    "check_strategy",
    "default_strategy",
    "get_saver",
    "save",
]
