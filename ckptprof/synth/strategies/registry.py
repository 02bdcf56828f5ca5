"""Strategy names, defined once: each maps to its class and, for a loader from an optional
package, how to install it (as fsspec's ``known_implementations``). Importing this module
imports no strategy: the CLI checks names without loading torch."""

from __future__ import annotations

import difflib
import importlib
from typing import TYPE_CHECKING

from ckptprof.errors import CkptprofError

if TYPE_CHECKING:
    from ckptprof.synth.strategies.base import Handler, RunContext, Strategy

_PREFIX = "ckptprof.synth.strategies"
KNOWN: dict[str, dict[str, str | None]] = {
    "staged": {"class": f"{_PREFIX}.staged:Staged", "install": None},
    "pipelined": {"class": f"{_PREFIX}.pipelined:Pipelined", "install": None},
    "framework": {"class": f"{_PREFIX}.framework:Framework", "install": None},
    "runai": {
        "class": f"{_PREFIX}.runai:RunAI",
        "install": "pip install runai-model-streamer (or ckptprof[bench])",
    },
    "s3torchconnector": {
        "class": f"{_PREFIX}.s3torchconnector:S3TorchConnector",
        "install": "pip install 's3torchconnector[dcp]' (or ckptprof[bench])",
    },
}
BUILTIN = tuple(name for name, entry in KNOWN.items() if entry["install"] is None)
OPTIONAL = tuple(name for name, entry in KNOWN.items() if entry["install"] is not None)
NAMES = BUILTIN + OPTIONAL
DEFAULT = "pipelined"


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name`` (its module imported only now)."""
    entry = KNOWN.get(name)
    if entry is None:
        close = difflib.get_close_matches(name, NAMES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise CkptprofError(
            f"--strategy {name!r} is not known.{hint} Choose from {', '.join(NAMES)}."
        )
    module, cls = str(entry["class"]).split(":")
    return getattr(importlib.import_module(module), cls)()


def dcp_handler(name: str) -> Handler:
    """DCP's own restore path ``name`` (:mod:`.dcp`), its module imported when a DCP
    checkpoint is restored: torch.distributed.checkpoint takes ~0.8 s to import, which
    no other layout needs (every restore paid it before its first read)."""

    def restore(ctx: RunContext) -> None:
        getattr(importlib.import_module(f"{_PREFIX}.dcp"), name)(ctx)

    return restore


def install_hint(name: str) -> str | None:
    return KNOWN[name]["install"]


__all__ = [
    "BUILTIN",
    "DEFAULT",
    "KNOWN",
    "NAMES",
    "OPTIONAL",
    "dcp_handler",
    "get_strategy",
    "install_hint",
]
