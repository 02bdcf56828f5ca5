"""Checkpoint layouts, by the name ``--layout`` takes."""

from __future__ import annotations

import difflib
import importlib

from ckptprof.errors import CkptprofError
from ckptprof.synth import ranges
from ckptprof.synth.layouts.base import Layout

_LAYOUTS = {
    "torch": "ckptprof.synth.layouts.torch_save:TorchSaveLayout",
    "safetensors": "ckptprof.synth.layouts.safetensors_hf:SafetensorsLayout",
    "dcp": "ckptprof.synth.layouts.dcp:DcpLayout",
    "deepspeed": "ckptprof.synth.layouts.deepspeed_zero:DeepSpeedLayout",
}
LAYOUT_NAMES = ranges.LAYOUTS
assert tuple(_LAYOUTS) == LAYOUT_NAMES, "synth.ranges.LAYOUTS names every layout"


def get_layout(name: str) -> Layout:
    if name not in _LAYOUTS:
        close = difflib.get_close_matches(name, _LAYOUTS, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise CkptprofError(
            f"--layout '{name}' is not known.{hint} Choose one of: {', '.join(_LAYOUTS)}."
        )
    module, cls = _LAYOUTS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["LAYOUT_NAMES", "Layout", "get_layout"]
