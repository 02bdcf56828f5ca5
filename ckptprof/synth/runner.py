"""One synthetic checkpoint's restores: the place and its manifest checked, the state a
job's model holds allocated once, the outputs and memory checked before any timing, the
caches made cold or hot, the read ceiling, and the sweep of runs
(:func:`~ckptprof.synth.run.restore_once` each)."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from ckptprof.errors import CkptprofError, StorageError, UnreachableError
from ckptprof.io.buffers import BufferPool
from ckptprof.manifest import GENERATING_NAME, MANIFEST_NAME, Manifest
from ckptprof.phases import RESTORE_PHASES
from ckptprof.preflight import check_output_dir
from ckptprof.results_schema import STEP_ESTIMATE
from ckptprof.storage import open_storage
from ckptprof.storage.base import ObjectInfo, Storage
from ckptprof.synth import ceiling as ceiling_mod
from ckptprof.synth.device import PinnedBuffer, resolve_device
from ckptprof.synth.distributed import Job
from ckptprof.synth.first_step import FirstStep
from ckptprof.synth.layouts import get_layout
from ckptprof.synth.options import RestoreOptions
from ckptprof.synth.plan import SynthSpec
from ckptprof.synth.results import RunRecord
from ckptprof.synth.run import RunSettings, check_listing, restore_once
from ckptprof.synth.strategies import get_strategy
from ckptprof.synth.strategies.base import needed_files
from ckptprof.synth.subject import RestoreSubject
from ckptprof.synth.targets import TargetState, plan_targets
from ckptprof.tracing.pieces import MAX_PIECES
from ckptprof.tracing.tracer import CheckpointTracer
from ckptprof.units import fmt_bytes

COLD_RESIDENCY_LIMIT = ceiling_mod.COLD_RESIDENCY_LIMIT
# failures worth counting and moving past in a sweep; anything else (an UnreachableError
# included: a storage that stopped answering) stops it at once
TRANSIENT_ERRORS = (StorageError, EOFError, ConnectionError, TimeoutError)
MEMORY_HEADROOM = 0.85
# the pipelined window when --memory-budget is not given: a share of free memory, capped
DEFAULT_BUDGET_SHARE = 0.25
DEFAULT_BUDGET_CAP = 2 << 30
# what a run leaves in --out and in the trace folder, upper estimates from measured runs
RESULTS_BASE_BYTES = 64 << 10
RESULTS_PER_RUN_BYTES = 4 << 10
TRACE_PER_RUN_BYTES = 32 << 10
#: a phase that ran in pieces: a ckpt.piece span each (~0.8 KB as written, measured)
TRACE_PER_PIECE_BYTES = 1 << 10
TRACE_PER_FILE_SPAN_BYTES = 2 << 10
STAGE_HEADROOM_BYTES = 64 << 20


class RestoreRunner:
    """Runs restores of one synthetic checkpoint; see :func:`run_restore`."""

    def __init__(
        self,
        location: str,
        options: RestoreOptions,
        tracer: CheckpointTracer,
        job: Job | None = None,
    ) -> None:
        options.validate()
        self.options = options
        self.tracer = tracer
        self.job = job  # one rank of a distributed job (None: one process plays every rank)
        self.storage: Storage = open_storage(
            location, max(options.concurrency), direct_io=options.direct_io
        )
        # the place and its manifest first: a typo is refused before a strategy loads torch
        self.manifest = self._read_manifest()
        self.spec = SynthSpec.from_dict(self.manifest.spec, f"{self._where(MANIFEST_NAME)}: spec")
        for name in options.strategies:
            get_strategy(name).check(self.storage)
        self.layout = get_layout(self.spec.layout)
        for name in options.strategies:
            get_strategy(name).check_layout(self.layout)
        self.plan = self.layout.plan(self.spec)
        if job is not None:
            self._check_job_options(job)
        self.world_size = job.world if job else options.world_size or self.spec.ranks
        if options.rank is not None and options.rank >= self.world_size:
            raise CkptprofError(
                f"--rank {options.rank} is not a rank of the {self.world_size} this restore "
                f"plays (the checkpoint was saved by {self.spec.ranks}); pass --world-size."
            )
        if job is not None:
            self.ranks = [job.rank]
        elif options.rank is not None:
            self.ranks = [options.rank]
        else:
            self.ranks = list(range(self.world_size))
        groups = self.layout.state_groups(self.spec)
        device = resolve_device(options.device)
        targets = plan_targets(self.plan, groups, self.world_size, self.ranks)
        state = TargetState(targets, device)
        sharing = job.local_world if job else 1  # the ranks of a node share its memory
        self.subject = RestoreSubject(
            storage=self.storage,
            manifest=self.manifest,
            spec=self.spec,
            layout=self.layout,
            plan=self.plan,
            world_size=self.world_size,
            ranks=tuple(self.ranks),
            device=device,
            state=state,
            files=tuple(needed_files(self.plan, state.targets)),
            memory_budget=options.memory_budget or default_budget(options.part_size, sharing),
            buffers=BufferPool(PinnedBuffer) if device.type != "cpu" else None,
        )
        ensure_open_files(max(options.concurrency))
        check_listing(self.subject, self.storage.list())  # fail before any cache work or timing
        self.first_step = FirstStep(
            self.subject,
            options.first_step,
            options.first_step_s,
            options.progress,
            tokens=options.first_step_tokens,
        )
        self.prepared = False
        self.runs: list[RunRecord] = []
        self.failures: list[dict] = []
        self.interruption = None  # an InterruptionGuard: the next restore links to it
        self.found_ceiling: ceiling_mod.Ceiling | None = None  # once found: on every run
        # without a local cache a "hot" run is a cold run under another name
        self.caches = tuple(
            c for c in options.caches if c == "cold" or self.storage.has_local_cache
        ) or ("cold",)
        in_memory = self.storage.memory_filesystem()
        if "cold" in self.caches and in_memory:
            raise CkptprofError(
                f"{self.storage.uri} is on {in_memory}, which keeps its files in memory: a "
                "cold read is impossible there (nothing can evict them to a disk); use "
                "--cache hot, or put the checkpoint on a disk-backed filesystem."
            )

    def _check_job_options(self, job: Job) -> None:
        o = self.options
        if (o.world_size not in (None, job.world)) or (o.rank not in (None, job.rank)):
            raise CkptprofError(
                f"under torch.distributed the launcher sets the world size ({job.world}) and "
                f"this process's rank ({job.rank}); drop --world-size/--rank, or launch "
                "another number of processes (--nproc-per-node)."
            )
        if o.simulate_interruption:
            raise CkptprofError(
                "--simulate-interruption runs in one process; drop it, or run without "
                "--nproc-per-node / torchrun."
            )

    @property
    def state(self):
        return self.subject.state

    @property
    def device(self):
        return self.subject.device

    @property
    def paths(self) -> list[str]:
        return self.subject.paths

    @property
    def memory_budget(self) -> int:
        return self.subject.memory_budget

    # ------------------------------------------------------------ setup
    def _where(self, path: str) -> str:
        return f"{self.storage.uri}/{path}"

    def _read_manifest(self) -> Manifest:
        try:
            raw = self.storage.read_bytes(MANIFEST_NAME)
        except FileNotFoundError:
            if not self.storage.location_exists():
                raise CkptprofError(
                    f"{self.storage.uri}: no such checkpoint location; check the path, or "
                    "create one with `ckptprof synth generate`."
                ) from None
            writer = self.storage.writer()
            if writer is not None:
                raise CkptprofError(
                    f"{self.storage.uri} is being written now ({writer}): its "
                    f"{MANIFEST_NAME} comes last; wait for that run to finish, then restore."
                ) from None
            if self.storage.exists(GENERATING_NAME):
                raise CkptprofError(
                    f"{self._where(MANIFEST_NAME)} is missing: the `ckptprof synth generate` "
                    f"that wrote {self.storage.uri} did not finish ({GENERATING_NAME} is there); "
                    "run it again with --force."
                ) from None
            raise CkptprofError(
                f"{self._where(MANIFEST_NAME)} is missing: this is not a complete ckptprof "
                "checkpoint (generation unfinished?); run `ckptprof synth generate` first."
            ) from None
        return Manifest.from_json(raw, self._where(MANIFEST_NAME))

    def check_outputs(self, out_dir: Path, trace_dir: Path | None) -> None:
        """Every folder the run writes takes a write and has room, before any timed work."""
        runs = len(self.options.concurrency) * self.options.repeat * len(self.caches)
        results = RESULTS_BASE_BYTES + runs * RESULTS_PER_RUN_BYTES
        if self.options.simulate_interruption:  # the emergency save lands in --out too
            results += self.manifest.total_bytes
        check_output_dir(out_dir, "--out", results)
        per_run = TRACE_PER_RUN_BYTES + len(RESTORE_PHASES) * MAX_PIECES * TRACE_PER_PIECE_BYTES
        if self.options.per_file_spans:
            per_run += len(self.paths) * TRACE_PER_FILE_SPAN_BYTES
        if trace_dir is not None:  # None: OpenTelemetry is off, no trace file
            check_output_dir(trace_dir, "--trace-dir", runs * per_run)
        if self.options.stage_dir is not None:
            check_output_dir(
                Path(self.options.stage_dir),
                "--stage",
                self.manifest.total_bytes + STAGE_HEADROOM_BYTES,
                len(self.paths) + 16,
            )

    def check_memory(self) -> None:
        """Refuse early when the restored state plus what a strategy holds cannot fit."""
        read = sum(self.manifest.files[f.path].size for f in self.subject.files)
        strategies = {name: get_strategy(name) for name in self.options.strategies}
        holds = {n: s.memory_held(read, self.memory_budget) for n, s in strategies.items()}
        on_device = self.device.type == "cuda"
        if on_device:
            import torch

            free = torch.cuda.mem_get_info(self.device)[0]
            if self.state.nbytes > free * MEMORY_HEADROOM:
                raise CkptprofError(
                    f"the restored state ({fmt_bytes(self.state.nbytes)}) does not fit in "
                    f"the {fmt_bytes(free)} free on {self.device}; restore one rank of a "
                    "larger job (--world-size W --rank R), --device cpu, or a smaller --scale."
                )
        state_on_host = 0 if on_device else self.state.nbytes
        need = state_on_host + max(holds[s] for s in self.options.strategies)
        avail = psutil.virtual_memory().available
        if self.job is not None:  # every rank of this node needs about as much
            avail //= self.job.local_world
        if need > avail * MEMORY_HEADROOM:
            what = " and ".join(self.options.strategies)
            largest = max(self.options.strategies, key=holds.__getitem__)
            if state_on_host > avail * MEMORY_HEADROOM or holds[largest] == 0:
                fix = "restore one rank of a larger job (--world-size W --rank R)"
            elif strategies[largest].bounded_by_budget:
                fix = f"give a smaller --memory-budget (now {fmt_bytes(self.memory_budget)})"
            else:
                fix = (f"{largest} holds every byte it reads: use --strategy pipelined "
                       "(it holds only its --memory-budget)")  # fmt: skip
            raise CkptprofError(
                f"restoring {self.storage.uri} ({what}) needs about {fmt_bytes(need)} "
                f"of memory (the restored state, {fmt_bytes(self.state.nbytes)}, plus what "
                f"the strategy holds) but {fmt_bytes(avail)} is available; {fix}, or use "
                "a smaller --scale."
            )

    def prepare(self) -> None:
        """Before any timing, as a job has them before it restores: the model (when the
        first step can run) and the state's tensors, allocated and touched."""
        if self.prepared:
            return
        if self.job is not None and self.first_step.mode == STEP_ESTIMATE:
            if self.job.rank == 0:  # timed once for the job, on rank 0
                self.first_step.prepare()
            self.first_step.estimate = self.job.broadcast(self.first_step.estimate)
            self.state.allocate()
        else:
            self.state.allocate(self.first_step.prepare())
        if self.subject.buffers is not None:  # pinned once, as a job keeps them
            part = self.options.part_size
            slots = max(2, min(self.memory_budget // part, 2 * max(self.options.concurrency) + 2))
            self.subject.buffers.reserve(slots, part)
        self.prepared = True

    def ceiling(self) -> ceiling_mod.Ceiling:
        """The path's bandwidth: probed once (rank 0 of a job, the others wait), or given."""
        if self.job is not None:
            found = self._ceiling() if self.job.rank == 0 else None
            self.found_ceiling = self.job.broadcast(found)
        else:
            self.found_ceiling = self._ceiling()
        return self.found_ceiling

    def _ceiling(self) -> ceiling_mod.Ceiling:
        infos = [ObjectInfo(p, e.size) for p, e in self.manifest.files.items()]
        if self.options.ceiling_gbps:
            return ceiling_mod.Ceiling(
                self.options.ceiling_gbps,
                "--ceiling-gbps",
                self.options.part_size,
                self.manifest.total_bytes,
            )
        return ceiling_mod.probe(
            self.storage,
            infos,
            self.options.part_size,
            max(self.options.concurrency),
            self.probe_bytes,
        )

    @property
    def probe_bytes(self) -> int:
        """What each pass of the read probe may read: its passes and its latency samples
        together at most a share of the bytes the sweep itself reads
        (``ceiling.probe_budget``)."""
        o = self.options
        runs = len(o.strategies) * len(o.caches) * len(o.concurrency) * o.repeat
        budget = ceiling_mod.probe_budget(self.manifest.total_bytes * runs)
        return max(1, budget // (ceiling_mod.PROBE_PASSES + 1))

    # ------------------------------------------------------------ cache
    def prepare_cache(self, cache: str):
        if cache == "hot":
            return self.storage.warm(self.paths)
        state = self.storage.evict(self.paths)
        if (
            state.resident_fraction is not None
            and state.resident_fraction > COLD_RESIDENCY_LIMIT
            and self.options.drop_caches
        ):
            from ckptprof.storage import pagecache

            if pagecache.drop_caches():
                state = self.storage.evict(self.paths)
                state.method += " + drop_caches (machine-wide)"
        if state.resident_fraction is not None and state.resident_fraction > COLD_RESIDENCY_LIMIT:
            if self.options.drop_caches:  # asked already: something keeps the pages
                fix = "a process mapping the files keeps them resident; use --cache hot"
            elif os.geteuid() == 0:
                fix = "re-run with --drop-caches (machine-wide), or use --cache hot"
            else:
                fix = "re-run as root with --drop-caches, or use --cache hot"
            raise CkptprofError(
                f"{self.storage.uri}: {state.resident_fraction:.0%} of the checkpoint is still "
                f"in the page cache after {state.method}, so a run would not be cold; {fix}."
            )
        return state

    # ------------------------------------------------------------ one run
    def job_cache(self, cache: str):
        """A job's cache state: prepared once per node (its local rank 0, while the others
        wait), then every rank starts together, so none measures a cache another warmed."""
        job = self.job
        job.barrier()  # no rank is still reading from the previous run
        state = self.prepare_cache(cache) if job.local_rank == 0 else None
        job.barrier()
        if state is None:  # what this rank finds, as prepared by its node's local rank 0
            from ckptprof.storage.base import CacheState

            measure = getattr(self.storage, "resident_fraction", None)
            fraction = measure(self.paths) if measure is not None else None
            state = CacheState(f"{cache}, prepared by this node's local rank 0", fraction)
        return state

    def run_once(self, strategy: str, cache: str, concurrency: int, repeat: int) -> RunRecord:
        """One traced restore (:func:`~ckptprof.synth.run.restore_once`) from the cache
        state ``cache`` prepared for it."""
        self.prepare()
        cache_state = self.prepare_cache(cache) if self.job is None else self.job_cache(cache)
        guard, self.interruption = self.interruption, None
        found = self.found_ceiling
        run = RunSettings(strategy, cache, concurrency, repeat, found and found.read_gbps)
        return restore_once(
            self.subject, self.options, self.tracer, self.first_step, run, cache_state,
            self.job, guard,
        )  # fmt: skip

    def sweep(self, on_run=None, echo=print) -> tuple[list[RunRecord], list[dict]]:
        """Every (concurrency, repeat, strategy, cache) run, strategies interleaved so they
        share the machine's moods; transient storage failures are recorded and the sweep
        goes on (they make the success rate). Progress so far stays readable in
        ``self.runs`` / ``self.failures`` if the sweep is interrupted."""
        runs: list[RunRecord] = self.runs
        failures: list[dict] = self.failures
        for concurrency in self.options.concurrency:
            for repeat in range(self.options.repeat):
                for strategy in self.options.strategies:
                    for cache in self.caches:
                        try:
                            run = self.run_once(strategy, cache, concurrency, repeat)
                        except UnreachableError:
                            raise
                        except TRANSIENT_ERRORS as exc:
                            failures.append(
                                {
                                    "strategy": strategy,
                                    "cache": cache,
                                    "concurrency": concurrency,
                                    "repeat": repeat,
                                    "error": str(exc),
                                }
                            )
                            echo(f"{strategy} {cache:4} x{concurrency:<3} #{repeat} FAILED: {exc}")
                            continue
                        runs.append(run)
                        if on_run is not None:
                            on_run(run)
        return runs, failures


def default_budget(part_size: int, sharing: int = 1) -> int:
    """The pipelined window by default: a quarter of free memory (split among the
    ``sharing`` ranks of a node), at most 2 GiB, at least two reads."""
    share = int(psutil.virtual_memory().available * DEFAULT_BUDGET_SHARE / sharing)
    return max(2 * part_size, min(DEFAULT_BUDGET_CAP, share))


OPEN_FILES_SPARE = 64  # the interpreter, torch, telemetry and the report (measured ~20)


def ensure_open_files(concurrency: int, spare: int = OPEN_FILES_SPARE) -> None:
    """Each request in flight holds at most two descriptors (the file or socket it reads,
    the staged copy it writes); fetched bytes hold none, so the file count does not matter.
    Raise the soft limit to make room, or say which --concurrency fits."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * concurrency + spare
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, target), hard))
        soft = max(soft, target)
    if soft != resource.RLIM_INFINITY and soft < need:
        fits = max(1, (soft - spare) // 2)
        raise CkptprofError(
            f"--concurrency {concurrency} needs about {need} open files but only {soft} may "
            f"be open at once (`ulimit -n`, hard limit {hard}); use --concurrency {fits} or "
            "less."
        )
