"""The codec of DCP's ``.distcp`` files: each item a ``torch.save`` archive appended to
its rank's file, found through ``.metadata``'s offsets. DCP's own planner and storage
layer write and read these files in a save or restore (:mod:`ckptprof.synth.savers.dcp`,
:mod:`ckptprof.synth.strategies.dcp`), so only generation is here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ckptprof.synth.codecs.base import Codec
from ckptprof.synth.codecs.torch_archive import write_torch_save

if TYPE_CHECKING:
    from ckptprof.synth.fill import RandomFiller


class DcpItems(Codec):
    """``{key: tensor}``, each tensor an archive of its own, one after another."""

    name = "dcp"

    def generate(self, dest: Path, obj: dict, filler: RandomFiller) -> dict:
        dest.write_bytes(b"")
        placed = {}
        for key, tensor in obj.items():
            start, end = write_torch_save(dest, tensor, filler, append=True)
            placed[key] = (start, end - start)
        return placed
