"""What ``synth restore`` and ``synth save`` are asked to do: their options, with the
defaults the command line shows (``ckptprof.cli`` reads them from here) and the checks
that code building them directly needs. No torch, no storage: the CLI imports it to
build its parser."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ckptprof import schema
from ckptprof.errors import CkptprofError
from ckptprof.manifest import VERIFY_MODES
from ckptprof.storage.base import DEFAULT_PART_SIZE, DIRECT_ALIGN
from ckptprof.synth import ranges
from ckptprof.synth.device import check_device
from ckptprof.synth.strategies import registry as strategy_registry

#: notice to termination for ``--simulate-interruption``: EC2 Spot's two minutes
DEADLINE_S = 120.0


@dataclass
class RestoreOptions:
    strategies: tuple[str, ...] = (strategy_registry.DEFAULT,)
    caches: tuple[str, ...] = ("cold", "hot")
    concurrency: tuple[int, ...] = (1, 8, 16, 32, 64)
    repeat: int = 3
    verify: str = "full"
    world_size: int | None = None
    rank: int | None = None  # restore only this rank of --world-size (else every rank)
    part_size: int = DEFAULT_PART_SIZE
    memory_budget: int | None = None  # the pipelined window (default from free memory)
    ceiling_gbps: float | None = None
    first_step: bool = True
    first_step_s: float | None = None  # the step time measured in the real job
    first_step_tokens: int | None = None  # the step's tokens (default: the device's)
    drop_caches: bool = False
    per_file_spans: bool = False
    stage_dir: Path | None = None
    direct_io: bool = False
    progress: bool | None = None
    simulate_interruption: bool = False
    deadline_s: float | None = None  # None: DEADLINE_S (given: --simulate-interruption's)
    #: seconds without progress before a run is named as stalled (True: the env/default)
    stall_after_s: float | None | bool = True
    device: str = "auto"  # where the restored state lives: auto, cpu, cuda, cuda:N

    def validate(self) -> None:
        """Every option in range (the CLI checked them already; code may not have)."""
        checks = (
            (
                "--strategy",
                list(self.strategies),
                schema.items(schema.text(choices=strategy_registry.NAMES)),
            ),
            ("--cache", list(self.caches), schema.items(schema.text(choices=ranges.CACHES))),
            ("--concurrency", list(self.concurrency), schema.items(ranges.CONCURRENCY)),
            ("--repeat", self.repeat, ranges.REPEAT),
            ("--verify", self.verify, schema.text(choices=VERIFY_MODES)),
            ("--world-size", self.world_size, schema.optional(ranges.RANKS)),
            ("--rank", self.rank, schema.optional(ranges.RANK)),
            ("--part-size", self.part_size, ranges.PART_SIZE),
            ("--memory-budget", self.memory_budget, schema.optional(ranges.MEMORY_BUDGET)),
            ("--ceiling-gbps", self.ceiling_gbps, schema.optional(ranges.GBPS)),
            ("--first-step-s", self.first_step_s, schema.optional(ranges.STEP_SECONDS)),
            ("--first-step-tokens", self.first_step_tokens, schema.optional(ranges.STEP_TOKENS)),
            ("--deadline", self.deadline_s, schema.optional(ranges.SECONDS)),
        )
        for option, value, check in checks:
            problem = check(value)
            if problem is not None:
                raise CkptprofError(f"{problem.under(option)}.")
        problem = check_device(self.device)
        if problem is not None:
            raise CkptprofError(f"--device {problem}.")
        if not self.caches or not self.concurrency or not self.strategies:
            raise CkptprofError(
                "--strategy, --cache and --concurrency need at least one value each."
            )
        for option, values in (("--strategy", self.strategies), ("--cache", self.caches),
                               ("--concurrency", self.concurrency)):  # fmt: skip
            twice = sorted({str(v) for v in values if list(values).count(v) > 1})
            if twice:
                raise CkptprofError(
                    f"{option} names {', '.join(twice)} more than once; each setting runs "
                    "--repeat times already: name it once, or raise --repeat."
                )
        if self.direct_io and self.part_size % DIRECT_ALIGN:
            raise CkptprofError(
                f"--part-size {self.part_size} must be a multiple of {DIRECT_ALIGN} with "
                "--direct-io."
            )
        if self.memory_budget is not None and self.memory_budget < 2 * self.part_size:
            raise CkptprofError(
                f"--memory-budget {self.memory_budget} holds fewer than two --part-size "
                f"{self.part_size} reads; raise it, or lower --part-size."
            )
        if self.rank is not None and self.world_size is not None and self.rank >= self.world_size:
            raise CkptprofError(
                f"--rank {self.rank} is not a rank of --world-size {self.world_size} "
                f"(0 to {self.world_size - 1})."
            )
        if self.simulate_interruption and not self.first_step:
            raise CkptprofError(
                "--simulate-interruption saves the first step's model and optimizer, which "
                "--no-first-step does not build; drop one of them."
            )
        if self.simulate_interruption and self.first_step_s is not None:
            raise CkptprofError(
                "--simulate-interruption saves the first step's model and optimizer, which "
                "--first-step-s does not build (it gives the step's time: no step runs); "
                "drop one of them."
            )

    @property
    def deadline(self) -> float:
        """The simulated notice's seconds to termination."""
        return DEADLINE_S if self.deadline_s is None else self.deadline_s


@dataclass
class SaveOptions:
    repeat: int = 3
    fsync: bool = True
    force: bool = False
    strategy: str = "parallel"  # savers.default_strategy: the same on every storage
    concurrency: int = 8  # parts in flight (parallel; the write probe's too)
    part_size: int = DEFAULT_PART_SIZE
    ceiling_gbps: float | None = None  # given: no write probe
    direct_io: bool = False  # parallel on a path: O_DIRECT from staged buffers, no page cache
    #: seconds without progress before a save is named as stalled (True: the env/default)
    stall_after_s: float | None | bool = True
    progress: bool | None = None
