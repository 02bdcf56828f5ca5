"""``ckptprof synth restore``: the six restore phases for real, cold and hot,
over a sweep of concurrency, repeated, with medians and the full environment.

One run is one ``ckpt.restore`` trace recorded through the same
:class:`~ckptprof.tracing.recorder.CheckpointTracer` the framework callbacks use.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ckptprof import schema
from ckptprof.atomic import atomic_write
from ckptprof.errors import CkptprofError, StorageError, UnreachableError
from ckptprof.fetch import DEFAULT_PART_SIZE, HostBuffer, download, fetch
from ckptprof.manifest import (
    GENERATING_NAME,
    MANIFEST_NAME,
    VERIFY_MODES,
    Manifest,
    verify_buffers,
)
from ckptprof.phases import RESTORE_PHASES, Attr, Phase
from ckptprof.preflight import check_output_dir
from ckptprof.storage import PosixStorage, open_storage
from ckptprof.storage.base import ObjectInfo, Storage
from ckptprof.synth import ceiling as ceiling_mod
from ckptprof.synth import ranges
from ckptprof.synth.layouts import get_layout
from ckptprof.synth.plan import SynthSpec
from ckptprof.tracing.recorder import CheckpointTracer, Operation

COLD_RESIDENCY_LIMIT = 0.05
# failures worth counting and moving past in a sweep; anything else (an UnreachableError
# included: a storage that stopped answering) stops it at once
TRANSIENT_ERRORS = (StorageError, EOFError, ConnectionError, TimeoutError)
MEMORY_HEADROOM = 0.85
# what a run leaves in --out and in the trace folder, upper estimates from measured runs
RESULTS_BASE_BYTES = 64 << 10
RESULTS_PER_RUN_BYTES = 4 << 10
TRACE_PER_RUN_BYTES = 32 << 10
TRACE_PER_FILE_SPAN_BYTES = 2 << 10
STAGE_HEADROOM_BYTES = 64 << 20


@dataclass
class RestoreOptions:
    caches: tuple[str, ...] = ("cold", "hot")
    concurrency: tuple[int, ...] = (1, 8, 16, 32, 64)
    repeat: int = 3
    verify: str = "full"
    world_size: int | None = None
    part_size: int = DEFAULT_PART_SIZE
    ceiling_gbps: float | None = None
    first_step: bool = True
    drop_caches: bool = False
    per_file_spans: bool = False
    stage_dir: Path | None = None
    direct_io: bool = False
    progress: bool | None = None
    simulate_interruption: bool = False
    deadline_s: float = 120.0

    def validate(self) -> None:
        """Every option in range (the CLI checked them already; code may not have)."""
        checks = (
            ("--cache", list(self.caches), schema.items(schema.text(choices=ranges.CACHES))),
            ("--concurrency", list(self.concurrency), schema.items(ranges.CONCURRENCY)),
            ("--repeat", self.repeat, ranges.REPEAT),
            ("--verify", self.verify, schema.text(choices=VERIFY_MODES)),
            ("--world-size", self.world_size, schema.optional(ranges.RANKS)),
            ("--part-size", self.part_size, ranges.PART_SIZE),
            ("--ceiling-gbps", self.ceiling_gbps, schema.optional(ranges.GBPS)),
            ("--deadline", self.deadline_s, ranges.SECONDS),
        )
        for option, value, check in checks:
            problem = check(value)
            if problem is not None:
                raise CkptprofError(f"{problem.under(option)}.")
        if not self.caches or not self.concurrency:
            raise CkptprofError("--cache and --concurrency need at least one value each.")
        if self.direct_io and self.part_size % 4096:
            raise CkptprofError(
                f"--part-size {self.part_size} must be a multiple of 4096 with --direct-io."
            )


@dataclass
class RunRecord:
    cache: str
    concurrency: int
    repeat: int
    wall_s: float
    bytes: int
    resident_fraction: float | None
    cache_method: str
    trace_id: str
    phases: dict[str, dict] = field(default_factory=dict)
    retries: int = 0
    errors: int = 0

    def to_dict(self) -> dict:
        return dict(vars(self))


class RestoreRunner:
    """Runs restores of one synthetic checkpoint; see :func:`run_restore`."""

    def __init__(self, location: str, options: RestoreOptions, tracer: CheckpointTracer) -> None:
        options.validate()
        self.options = options
        self.tracer = tracer
        self.storage: Storage = open_storage(
            location, max(options.concurrency), direct_io=options.direct_io
        )
        self.manifest = self._read_manifest()
        self.spec = SynthSpec.from_dict(self.manifest.spec, f"{self._where(MANIFEST_NAME)}: spec")
        self.layout = get_layout(self.spec.layout)
        self.plan = self.layout.plan(self.spec)
        self.world_size = options.world_size or self.spec.ranks
        self.paths = sorted(self.manifest.files)
        ensure_open_files(max(options.concurrency))
        self.check_listing(self.storage.list())  # fail before any cache work or timing
        self.model = self.optimizer = None
        self._emulated_step: tuple[float, str] | None = None
        self.runs: list[RunRecord] = []
        self.failures: list[dict] = []
        self.interruption = None  # an InterruptionGuard: the next restore links to it
        # without a local cache a "hot" run is a cold run under another name
        self.caches = tuple(
            c for c in options.caches if c == "cold" or self.storage.has_local_cache
        ) or ("cold",)

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

    def check_outputs(self, out_dir: Path, trace_dir: Path) -> None:
        """Every folder the run writes takes a write and has room, before any timed work."""
        runs = len(self.options.concurrency) * self.options.repeat * len(self.caches)
        results = RESULTS_BASE_BYTES + runs * RESULTS_PER_RUN_BYTES
        if self.options.simulate_interruption:  # the emergency save lands in --out too
            results += self.manifest.total_bytes
        check_output_dir(out_dir, "--out", results)
        per_run = TRACE_PER_RUN_BYTES
        if self.options.per_file_spans:
            per_run += len(self.paths) * TRACE_PER_FILE_SPAN_BYTES
        check_output_dir(trace_dir, "--trace-dir", runs * per_run)
        if self.options.stage_dir is not None:
            check_output_dir(
                Path(self.options.stage_dir),
                "--stage",
                self.manifest.total_bytes + STAGE_HEADROOM_BYTES,
                len(self.paths) + 16,
            )

    def check_memory(self) -> None:
        """Refuse early when fetched bytes plus the restored state cannot fit."""
        need = self.manifest.total_bytes + (self.plan.payload_bytes if self.world_size > 1 else 0)
        avail = psutil.virtual_memory().available
        if need > avail * MEMORY_HEADROOM:
            raise CkptprofError(
                f"restoring {self.storage.uri} needs about {need / 2**30:.1f} GiB of memory "
                f"(fetched bytes + restored state) but {avail / 2**30:.1f} GiB is available; "
                "use a checkpoint generated with a smaller --scale or --no-optimizer."
            )

    def build_model(self) -> bool:
        """Build the target model when a real step fits beside the fetched bytes."""
        from ckptprof.synth.model import build_model, training_bytes

        need = self.manifest.total_bytes + training_bytes(self.plan.preset)
        if self.world_size != 1 or need > psutil.virtual_memory().available * MEMORY_HEADROOM:
            return False
        self.model, self.optimizer = build_model(self.plan.preset)
        return True

    def ceiling(self) -> ceiling_mod.Ceiling:
        infos = [ObjectInfo(p, e.size) for p, e in self.manifest.files.items()]
        if self.options.ceiling_gbps:
            return ceiling_mod.Ceiling(
                self.options.ceiling_gbps,
                "--ceiling-gbps",
                self.options.part_size,
                self.manifest.total_bytes,
            )
        return ceiling_mod.probe(
            self.storage, infos, self.options.part_size, max(self.options.concurrency)
        )

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
            raise CkptprofError(
                f"{self.storage.uri}: {state.resident_fraction:.0%} of the checkpoint is still "
                f"in the page cache after {state.method}, so a run would not be cold; "
                "re-run as root with --drop-caches, or use --cache hot."
            )
        return state

    # ------------------------------------------------------------ one run
    def run_once(self, cache: str, concurrency: int, repeat: int) -> RunRecord:
        state = self.prepare_cache(cache)
        attrs = {
            Attr.FORMAT: self.layout.format,
            Attr.LAYOUT: self.layout.name,
            Attr.MODEL: self.spec.model,
            Attr.STORAGE_KIND: self.storage.kind,
            Attr.STORAGE_URI: self.storage.uri,
            Attr.CACHE: cache,
            Attr.CACHE_METHOD: state.method,
            Attr.CACHE_RESIDENT_FRACTION: state.resident_fraction,
            Attr.CONCURRENCY: concurrency,
            Attr.REPEAT: repeat,
            Attr.WORLD_SIZE: self.world_size,
            Attr.SAVED_WORLD_SIZE: self.spec.ranks,
            Attr.VERIFY_MODE: self.options.verify,
            Attr.STEP: self.spec.step,
            "ckpt.fetch.direct_io": bool(getattr(self.storage, "direct_io", False)),
        }
        buffers: dict[str, HostBuffer] = {}
        before = (
            self.storage.stats.retries,
            self.storage.stats.errors,
            self.storage.stats.requests,
        )
        links, guard, self.interruption = [], self.interruption, None
        if guard is not None:
            links, extra = guard.resume_links(restart_ns=time.time_ns())
            attrs.update(extra)
        with self.tracer.restore(attrs, links) as op:
            try:
                infos = self._list(op)
                with op.phase(Phase.FETCH, **{Attr.CONCURRENCY: concurrency}):
                    buffers = self._fetch(infos, concurrency, op)
                with op.phase(Phase.VERIFY, **{Attr.VERIFY_MODE: self.options.verify}):
                    verify_buffers(
                        buffers,
                        self.manifest,
                        self.options.verify,
                        self.storage.uri,
                        op,
                        threads=os.cpu_count() or 1,
                    )
                targets = self.layout.load_targets(
                    self.plan,
                    buffers,
                    self.world_size,
                    op,
                    threads=os.cpu_count() or 1,
                )
                self._apply(targets, op)
                del targets
                for buf in buffers.values():
                    buf.close()
                if self.options.first_step:
                    self._first_step(op)
                if guard is not None:
                    guard.resumed(op, self.spec.step)
            finally:
                for buf in buffers.values():
                    buf.close()
                stats = self.storage.stats
                op.set_attributes(
                    {
                        Attr.RETRIES: stats.retries - before[0],
                        Attr.ERRORS: stats.errors - before[1],
                        "ckpt.requests": stats.requests - before[2],
                    }
                )
        summary = op.summary
        phases = {}
        for name, stats in summary.phases.items():
            entry = {"busy_s": stats.busy_s, "bytes": stats.nbytes, "files": len(stats.files)}
            if stats.nbytes and stats.busy_s:
                entry["gbps"] = stats.nbytes / stats.busy_s / 1e9
            if stats.attributes.get(Attr.EMULATED):
                entry["emulated"] = True
                entry["emulation_reason"] = stats.attributes.get(Attr.EMULATION_REASON, "")
            phases[name] = entry
        ctx = op.span_context
        return RunRecord(
            cache,
            concurrency,
            repeat,
            summary.wall_s,
            self.manifest.total_bytes,
            state.resident_fraction,
            state.method,
            format(ctx.trace_id, "032x") if ctx else "",
            phases,
            int(summary.attributes.get(Attr.RETRIES, 0)),
            int(summary.attributes.get(Attr.ERRORS, 0)),
        )

    def sweep(self, on_run=None, echo=print) -> tuple[list[RunRecord], list[dict]]:
        """Every (concurrency, repeat, cache) run; transient storage failures are
        recorded and the sweep goes on (they make the success rate). Progress so far
        stays readable in ``self.runs`` / ``self.failures`` if the sweep is interrupted."""
        runs: list[RunRecord] = self.runs
        failures: list[dict] = self.failures
        for concurrency in self.options.concurrency:
            for repeat in range(self.options.repeat):
                for cache in self.caches:
                    try:
                        run = self.run_once(cache, concurrency, repeat)
                    except UnreachableError:
                        raise
                    except TRANSIENT_ERRORS as exc:
                        failures.append(
                            {
                                "cache": cache,
                                "concurrency": concurrency,
                                "repeat": repeat,
                                "error": str(exc),
                            }
                        )
                        echo(f"{cache:4} x{concurrency:<3} #{repeat} FAILED: {exc}")
                        continue
                    runs.append(run)
                    if on_run is not None:
                        on_run(run)
        return runs, failures

    def _list(self, op: Operation) -> list[ObjectInfo]:
        """Listing + the layout's own index reads, checked against the manifest."""
        with op.phase(Phase.LIST) as stats:
            requests_before = self.storage.stats.requests
            listed = self.storage.list()
            try:
                named = self.layout.discover(self.storage, self.plan)
            except (CkptprofError, OSError, EOFError):
                raise
            except Exception as exc:  # noqa: BLE001 - a corrupt index/latest/.metadata file
                from ckptprof.synth.layouts.base import unreadable

                raise unreadable(f"{self.storage.uri} (its index file)", exc) from None
            infos = self.check_listing(listed)
            unknown = sorted(set(named) - set(self.manifest.files))
            if unknown:
                raise CkptprofError(
                    f"{self._where(unknown[0])} is named by the checkpoint's index but is not "
                    "in the manifest; the checkpoint was modified, regenerate it."
                )
            stats.attributes[Attr.FILES] = len(infos)
            stats.attributes["ckpt.list.requests"] = self.storage.stats.requests - requests_before
        return infos

    def _fetch(self, infos: list[ObjectInfo], concurrency: int, op: Operation):
        """Straight into memory, or (``--stage DIR``) download to local disk, then read."""
        import tempfile

        part, progress = self.options.part_size, self.options.progress
        if self.options.stage_dir is None:
            return fetch(self.storage, infos, concurrency, op, part, progress)
        # a fresh folder of our own: nothing already in DIR is ever written or removed
        stage = Path(tempfile.mkdtemp(prefix="ckptprof-stage-", dir=self.options.stage_dir))
        try:
            t0 = time.perf_counter()
            download(self.storage, infos, stage, concurrency, op, part, progress)
            t1 = time.perf_counter()
            buffers = fetch(PosixStorage(str(stage)), infos, concurrency, None, part, progress)
            t2 = time.perf_counter()
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        op.set_phase_attributes(
            Phase.FETCH,
            **{
                "ckpt.fetch.stage_dir": str(stage),
                "ckpt.fetch.stage_download_s": round(t1 - t0, 6),
                "ckpt.fetch.stage_read_s": round(t2 - t1, 6),
            },
        )
        return buffers

    def check_listing(self, listed: list[ObjectInfo]) -> list[ObjectInfo]:
        """The manifest's files as listed; a missing or resized file is an error naming it."""
        by_path = {i.path: i for i in listed}
        infos = []
        for path in self.paths:
            want = self.manifest.files[path]
            info = by_path.get(path)
            if info is None:
                raise CkptprofError(
                    f"{self._where(path)} is listed in the manifest but missing; "
                    "restore the file or regenerate the checkpoint."
                )
            if info.size != want.size:
                raise CkptprofError(
                    f"{self._where(path)} is {info.size} bytes but the manifest says "
                    f"{want.size} (truncated or replaced); regenerate or restore it."
                )
            infos.append(info)
        return infos

    def _apply(self, targets, op: Operation) -> None:
        """Load the restored state into the model and optimizer (part of reshard)."""
        if self.model is None or self.world_size != 1:
            return
        import torch

        from ckptprof.synth.plan import GROUP_EXP_AVG, GROUP_EXP_AVG_SQ, GROUP_MODEL

        state = targets[0]
        with op.phase(Phase.RESHARD):
            self.model.load_state_dict(
                {name: t for (group, name), t in state.items() if group == GROUP_MODEL}
            )
            if (GROUP_EXP_AVG, "model.norm.weight") in state:
                names = [n for n, _ in self.model.named_parameters()]
                step = torch.tensor(float(self.spec.step))
                self.optimizer.load_state_dict(
                    {
                        "state": {
                            i: {
                                "step": step.clone(),
                                "exp_avg": state[(GROUP_EXP_AVG, n)],
                                "exp_avg_sq": state[(GROUP_EXP_AVG_SQ, n)],
                            }
                            for i, n in enumerate(names)
                        },
                        "param_groups": [
                            {**self.optimizer.param_groups[0], "params": list(range(len(names)))}
                        ],
                    }
                )

    def _first_step(self, op: Operation) -> None:
        import torch

        from ckptprof.synth.model import train_step

        previous = torch.set_flush_denormal(True)
        try:
            if self.model is not None and self.world_size == 1:
                with op.phase(Phase.FIRST_STEP, **{Attr.EMULATED: False}):
                    train_step(self.model, self.optimizer)
                return
            if self._emulated_step is None:  # estimated once, outside any traced restore
                raise RuntimeError("call estimate_first_step() before the sweep")
            seconds, reason = self._emulated_step
            start = time.time_ns()  # appended after the real work: the root ends later
            op.add_interval(Phase.FIRST_STEP, start, start + int(seconds * 1e9))
            op.set_phase_attributes(
                Phase.FIRST_STEP, **{Attr.EMULATED: True, Attr.EMULATION_REASON: reason}
            )
        finally:
            torch.set_flush_denormal(previous)

    def estimate_first_step(self) -> None:
        """When the real step cannot run here, time the emulation once (not in any RTO)."""
        if self.options.first_step and self.model is None:
            self._emulated_step = self._emulated_step_seconds()

    def _emulated_step_seconds(self) -> tuple[float, str]:
        """Time 1- and 2-layer models of the same width; extrapolate to all layers."""
        from dataclasses import replace

        from ckptprof.synth.model import build_model, train_step

        times = []
        for layers in (1, 2):
            model, optim = build_model(replace(self.plan.preset, layers=layers))
            train_step(model, optim)  # warm-up: first-call allocations are not per-layer cost
            t0 = time.perf_counter()
            train_step(model, optim)
            times.append(time.perf_counter() - t0)
            del model, optim
        per_layer = max(0.0, times[1] - times[0])
        total = times[0] + per_layer * (self.plan.preset.layers - 1)
        why = (
            f"world size {self.world_size} cannot step in one process"
            if self.world_size != 1
            else "model does not fit in memory"
        )
        return total, f"{why}; extrapolated from 1- and 2-layer steps of the same width"


# ---------------------------------------------------------------- results


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


def summarize(runs: list[RunRecord], ceiling: ceiling_mod.Ceiling | None) -> list[dict]:
    groups: dict[tuple[str, int], list[RunRecord]] = {}
    for run in runs:
        groups.setdefault((run.cache, run.concurrency), []).append(run)
    out = []
    for (cache, conc), items in groups.items():
        walls = [r.wall_s for r in items]
        phases = {}
        for phase in RESTORE_PHASES:
            values = [r.phases[phase.value]["busy_s"] for r in items if phase.value in r.phases]
            if values:
                phases[phase.value] = {
                    "min_s": min(values),
                    "median_s": statistics.median(values),
                    "max_s": max(values),
                }
        gbps = [r.phases["fetch"]["gbps"] for r in items if "gbps" in r.phases.get("fetch", {})]
        entry = {
            "cache": cache,
            "concurrency": conc,
            "repeats": len(items),
            "rto_s": {"min": min(walls), "median": statistics.median(walls), "max": max(walls)},
            "phases": phases,
        }
        if gbps:
            entry["fetch_gbps_median"] = statistics.median(gbps)
            if ceiling and ceiling.read_gbps and cache == "cold":
                entry["fraction_of_ceiling"] = entry["fetch_gbps_median"] / ceiling.read_gbps
        out.append(entry)
    return out


def write_results(out_dir: Path, payload: dict, runs: list[RunRecord]) -> tuple[Path, Path]:
    """results.json and results.csv, each written to a temp name and renamed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = out_dir / "results.json", out_dir / "results.csv"
    atomic_write(json_path, json.dumps(payload, indent=2, default=str))
    buf = io.StringIO()
    phase_names = [p.value for p in RESTORE_PHASES]
    writer = csv.writer(buf)
    writer.writerow(
        [
            "cache",
            "concurrency",
            "repeat",
            "rto_s",
            *[f"{p}_s" for p in phase_names],
            "bytes",
            "fetch_gbps",
            "resident_fraction",
            "cache_method",
            "first_step_emulated",
            "retries",
            "errors",
            "trace_id",
        ]
    )
    for r in runs:
        writer.writerow(
            [
                r.cache,
                r.concurrency,
                r.repeat,
                f"{r.wall_s:.6f}",
                *[f"{r.phases[p]['busy_s']:.6f}" if p in r.phases else "" for p in phase_names],
                r.bytes,
                f"{r.phases.get('fetch', {}).get('gbps', 0):.4f}",
                "" if r.resident_fraction is None else f"{r.resident_fraction:.4f}",
                r.cache_method,
                r.phases.get("first_step", {}).get("emulated", False),
                r.retries,
                r.errors,
                r.trace_id,
            ]
        )
    atomic_write(csv_path, buf.getvalue())
    return json_path, csv_path


def run_restore(
    location: str,
    options: RestoreOptions,
    out_dir: Path,
    trace_dir: Path | None = None,
    echo=print,
) -> dict:
    """Probe the ceiling, run the sweep, write results.json/results.csv and traces."""
    from ckptprof.tracing.export import setup_telemetry

    telemetry = setup_telemetry(trace_dir or out_dir / "traces")
    tracer = CheckpointTracer(
        telemetry.provider,
        framework="synthetic",
        run_id=telemetry.run_id,
        per_file_spans=options.per_file_spans,
    )
    try:
        runner = RestoreRunner(location, options, tracer)
        runner.check_outputs(out_dir, telemetry.trace_file.parent)
        runner.check_memory()
        if options.first_step and not runner.build_model():
            echo("first_step will be emulated (model does not fit, or world size > 1).")
            runner.estimate_first_step()
        ceiling = runner.ceiling()
        echo(ceiling.describe())
        if options.simulate_interruption:
            from ckptprof.synth.interruption import simulate

            runner.interruption = simulate(runner, out_dir, telemetry, options.deadline_s)
            record = runner.interruption.record
            side = "before" if record.margin_s >= 0 else "after"
            echo(
                f"simulated interruption: emergency save {record.outcome} in "
                f"{(record.save_end_ns - record.save_start_ns) / 1e9:.3f} s, "
                f"{abs(record.margin_s):.1f} s {side} the {options.deadline_s:g} s deadline; "
                "the first restore below is the recovery"
            )
        if runner.caches != tuple(options.caches):
            echo(
                f"{runner.storage.kind}: no local page cache, so only cold runs "
                "(use --stage DIR to restore from a local copy)"
            )
        try:
            runs, failures = runner.sweep(lambda run: echo(_run_line(run, ceiling)), echo)
        except BaseException:
            if runner.runs:  # keep what was measured before the interruption
                payload = _payload(runner, options, ceiling, telemetry, partial=True)
                json_path, _ = _save_results(out_dir, payload, runner.runs, telemetry)
                echo(f"partial results of {len(runner.runs)} runs: {json_path}")
            raise
        attempted = len(runs) + len(failures)
        stats = runner.storage.stats
        payload = _payload(runner, options, ceiling, telemetry)
        json_path, csv_path = _save_results(out_dir, payload, runs, telemetry)
        echo(f"results: {json_path} and {csv_path}; {telemetry.describe_trace()}")
        if stats.retries or stats.errors or failures:
            echo(
                f"storage: {stats.requests} requests, {stats.retries} retries, "
                f"{stats.errors} failed attempts; runs succeeded: {len(runs)}/{attempted}"
            )
        if failures:
            raise StorageError(
                f"{len(failures)} of {attempted} runs failed (success rate "
                f"{len(runs) / attempted:.0%}); first: {failures[0]['error']}"
            )
        return payload
    finally:
        telemetry.shutdown()


def _save_results(out_dir: Path, payload: dict, runs: list[RunRecord], telemetry):
    """write_results, or an error that names the file and where the runs still are."""
    telemetry.flush()
    try:
        return write_results(out_dir, payload, runs)
    except OSError as exc:
        kept = (
            f"; the {len(runs)} runs are in {telemetry.trace_file} "
            f"(`ckptprof report {telemetry.trace_file}`)"
            if telemetry.trace_written
            else ""
        )
        raise StorageError(f"could not write the results: {exc}{kept}.") from None


def _payload(runner, options, ceiling, telemetry, partial: bool = False) -> dict:
    from ckptprof import __version__
    from ckptprof.env import capture

    runs, failures, stats = runner.runs, runner.failures, runner.storage.stats
    attempted = len(runs) + len(failures)
    payload = {
        "ckptprof_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "location": runner.storage.uri,
        "spec": runner.spec.to_dict(),
        "options": {
            "verify": options.verify,
            "world_size": runner.world_size,
            "part_size": options.part_size,
            "repeat": options.repeat,
            "caches": list(options.caches),
            "concurrency": list(options.concurrency),
        },
        "environment": capture(
            {**runner.storage.describe(), "fetch.part_size": str(options.part_size)}
        ),
        "ceiling": ceiling.to_dict(),
        "runs": [r.to_dict() for r in runs],
        "summary": summarize(runs, ceiling),
        "success_rate": len(runs) / attempted if attempted else 0.0,
        "failures": failures,
        "requests": {
            "requests": stats.requests,
            "retries": stats.retries,
            "errors": stats.errors,
        },
        "trace_file": str(telemetry.trace_file),
        "partial": partial,
    }
    return payload


def _run_line(run: RunRecord, ceiling) -> str:
    fetch = run.phases.get("fetch", {})
    frac = ""
    if fetch.get("gbps") and ceiling.read_gbps and run.cache == "cold":
        frac = f" ({fetch['gbps'] / ceiling.read_gbps:.0%} of ceiling)"
    resident = "" if run.resident_fraction is None else f" resident={run.resident_fraction:.1%}"
    phases = " ".join(f"{k}={v['busy_s']:.3f}" for k, v in run.phases.items())
    return (
        f"{run.cache:4} x{run.concurrency:<3} #{run.repeat} RTO {run.wall_s:.3f}s "
        f"fetch {fetch.get('gbps', 0):.2f} GB/s{frac}{resident} | {phases}"
    )
