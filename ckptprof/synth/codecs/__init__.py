"""File encodings, by the name a layout gives each of its files (:meth:`Layout.codec`)."""

from __future__ import annotations

import importlib
from functools import cache

from ckptprof.synth.codecs.base import Codec

_CODECS = {
    "torch": "ckptprof.synth.codecs.torch_archive:TorchArchive",
    "safetensors": "ckptprof.synth.codecs.safetensors_file:Safetensors",
    "dcp": "ckptprof.synth.codecs.dcp_items:DcpItems",
}
CODEC_NAMES = tuple(_CODECS)


@cache
def get_codec(name: str) -> Codec:
    """The codec called ``name`` (imported on first use: each pulls torch in)."""
    module, cls = _CODECS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["CODEC_NAMES", "Codec", "get_codec"]
