"""The Hugging Face ``Trainer``'s checkpoint folders as ckptprof reads them: where a save
goes (``checkpoint-N`` in the run's output folder), which ``checkpoint-N`` exist, which
weight files the Trainer loads (one file, or an index and its shards), their format,
and the distribution strategy a resume is labelled with.

Why apart from the instrumentor: the save and the resume both read this layout, and it
follows transformers' own conventions, not how ckptprof traces the Trainer.
"""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING

from ckptprof.integrations.files import FolderListing

if TYPE_CHECKING:
    from transformers import Trainer

TRAINER_STATE = "trainer_state.json"
WEIGHTS = re.compile(r"^(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)(\.index\.json)?$")


def checkpoint_folder(trainer: Trainer, trial=None) -> str:
    """Where ``_save_checkpoint`` writes the current step."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    run_dir = trainer._get_output_dir(trial=trial)
    return os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")


def checkpoints_in(run_dir: str) -> set[str]:
    """The ``checkpoint-*`` names in ``run_dir`` (none when it is gone)."""
    try:
        return {e.name for e in os.scandir(run_dir) if e.name.startswith("checkpoint-")}
    except FileNotFoundError:
        return set()


def weight_files(listing: FolderListing | None) -> list[str]:
    """The weight files ``_load_from_checkpoint`` reads, in the Trainer's preference order."""
    if listing is None:
        return []
    for single in ("model.safetensors", "pytorch_model.bin"):
        if single in listing.sizes:
            return [single]
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if index in listing.sizes:
            try:
                with open(os.path.join(listing.folder, index), encoding="utf-8") as handle:
                    shards = sorted(set(json.load(handle)["weight_map"].values()))
            except (OSError, ValueError, KeyError):
                return [index]  # the Trainer reports a broken index itself
            return [index, *shards]
    return []


def weights_format(names) -> str:
    """``safetensors`` or ``torch``: the weights among ``names`` (or a listing's)."""
    names = getattr(names, "sizes", names)
    if "model.safetensors" in names or "model.safetensors.index.json" in names:
        return "safetensors"
    return "torch"


def strategy(trainer: Trainer) -> str:
    """How the run is distributed: ``deepspeed``, ``fsdp`` or the Trainer's parallel mode."""
    if getattr(trainer, "is_deepspeed_enabled", False):
        return "deepspeed"
    if getattr(trainer, "is_fsdp_enabled", False):
        return "fsdp"
    return str(trainer.args.parallel_mode).rsplit(".", 1)[-1].lower()


__all__ = [
    "TRAINER_STATE",
    "WEIGHTS",
    "checkpoint_folder",
    "checkpoints_in",
    "strategy",
    "weight_files",
    "weights_format",
]
