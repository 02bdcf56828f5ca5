"""What a sweep restores, as opened once before it: the checkpoint (storage, manifest,
spec, layout, plan), the ranks it is restored for, and the state they hold.

The runner builds it; the steps of one run (:mod:`ckptprof.synth.run`), the first step
(:mod:`ckptprof.synth.first_step`) and the results (:mod:`ckptprof.synth.results`) read
it, so none of them needs the runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ckptprof.io.buffers import BufferPool
    from ckptprof.manifest import Manifest
    from ckptprof.storage.base import Storage
    from ckptprof.synth.layouts.base import Layout
    from ckptprof.synth.plan import CheckpointPlan, FilePlan, SynthSpec
    from ckptprof.synth.targets import TargetState


@dataclass(frozen=True)
class RestoreSubject:
    storage: Storage
    manifest: Manifest
    spec: SynthSpec
    layout: Layout
    plan: CheckpointPlan
    world_size: int  # the ranks the checkpoint is restored for
    ranks: tuple[int, ...]  # of those, the ones this process plays
    device: torch.device
    state: TargetState
    files: tuple[FilePlan, ...]  # what a restore reads: the ranks' data files, small files
    memory_budget: int  # the pipelined window
    #: the pinned window's buffers for a state on a device, made before any run (None: a
    #: state in host memory, whose window buffers cost nothing to make)
    buffers: BufferPool | None = None

    @property
    def paths(self) -> list[str]:
        """Every file of the checkpoint (what the cache is prepared for)."""
        return sorted(self.manifest.files)

    def where(self, path: str) -> str:
        return f"{self.storage.uri}/{path}"


__all__ = ["RestoreSubject"]
