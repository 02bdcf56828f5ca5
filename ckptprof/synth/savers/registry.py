"""Save strategy names, defined once, each mapped to its class (as the restore strategies'
registry): importing this module imports no saver, so the CLI checks names without
loading torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ckptprof.errors import CkptprofError

if TYPE_CHECKING:
    from ckptprof.synth.savers.base import Saver

_PREFIX = "ckptprof.synth.savers"
KNOWN: dict[str, str] = {
    "framework": f"{_PREFIX}.framework:Framework",
    "parallel": f"{_PREFIX}.parallel:Parallel",
    "async": f"{_PREFIX}.dcp:Async",
}
NAMES = tuple(KNOWN)


def default_strategy(layout: str) -> str:
    """The writer ``synth save`` uses unless told: ``parallel`` on every storage, so two
    storages saved with the defaults are compared through the same writer (the layout's
    own writers cannot write to S3); DCP lays out its own files: ``framework``."""
    return "framework" if layout == "dcp" else "parallel"


def get_saver(name: str) -> Saver:
    """The saver called ``name`` (its module imported only now)."""
    if name not in KNOWN:
        raise CkptprofError(f"--strategy {name}: choose one of {', '.join(NAMES)}.")
    module, cls = KNOWN[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def check_strategy(strategy: str, layout: str, object_store: bool) -> None:
    """Refuse a strategy x layout x storage this save cannot do (one line, with the fix)."""
    get_saver(strategy).check(layout, object_store)


__all__ = ["KNOWN", "NAMES", "check_strategy", "default_strategy", "get_saver"]
