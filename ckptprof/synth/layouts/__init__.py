"""Checkpoint layouts, by the name ``--layout`` takes."""

from __future__ import annotations

import difflib
import importlib

from ckptprof.errors import CkptprofError
from ckptprof.synth import ranges
from ckptprof.synth.layouts.base import Layout

LAYOUT_NAMES = tuple(ranges.LAYOUTS)


def get_layout(name: str) -> Layout:
    if name not in ranges.LAYOUTS:
        close = difflib.get_close_matches(name, LAYOUT_NAMES, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise CkptprofError(
            f"--layout '{name}' is not known.{hint} Choose one of: {', '.join(LAYOUT_NAMES)}."
        )
    module, cls = ranges.LAYOUTS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["LAYOUT_NAMES", "Layout", "get_layout"]
