"""One restore run, step by step: its root span's attributes, ``list`` (the listing and
the layout's own index, checked against the manifest), the strategy, the first step,
and the record it leaves (:class:`~ckptprof.synth.results.RunRecord`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ckptprof.errors import CkptprofError
from ckptprof.memory import MemoryWatch
from ckptprof.phases import Attr, Phase
from ckptprof.storage.base import ObjectInfo
from ckptprof.synth.device import device_attributes
from ckptprof.synth.distributed import Job, job_context
from ckptprof.synth.results import RunRecord, phases_of
from ckptprof.synth.strategies import get_strategy
from ckptprof.synth.strategies.base import RunContext
from ckptprof.synth.subject import RestoreSubject
from ckptprof.tracing.recorder import Operation
from ckptprof.tracing.tracer import CheckpointTracer


@dataclass(frozen=True)
class RunSettings:
    """What tells the runs of a sweep apart."""

    strategy: str
    cache: str
    concurrency: int
    repeat: int
    ceiling_gbps: float | None = None  # the sweep's read ceiling (probed or given)


def restore_once(
    subject: RestoreSubject,
    options,
    tracer: CheckpointTracer,
    first_step,
    run: RunSettings,
    cache_state,
    job: Job | None = None,
    guard=None,
) -> RunRecord:
    """One traced restore into ``subject.state``, from a prepared cache state; ``guard``
    (an interruption this restore recovers from) links the spans."""
    attrs = run_attributes(subject, options, run, cache_state)
    parent = None
    if job is not None:
        attrs.update(job.attributes())
        parent = job_context(job)  # every rank's span of this run: one trace
    stats = subject.storage.stats
    before = (stats.retries, stats.errors, stats.requests)
    stats.reset_slowest()
    links = []
    if guard is not None:
        links, extra = guard.resume_links(restart_ns=time.time_ns())
        attrs.update(extra)
    with tracer.restore(attrs, links, parent) as op:
        memory = MemoryWatch(reset_peak=True, cuda=subject.device.type == "cuda").start()
        try:
            list_phase(subject, op)
            get_strategy(run.strategy).run(run_context(subject, options, op, run.concurrency))
            first_step.attach(op)
            first_step.run(op)
            if guard is not None:
                guard.resumed(op, subject.spec.step)
        finally:
            memory.stop()
            memory.record(op)
            op.set_attributes({
                Attr.RETRIES: stats.retries - before[0],
                Attr.ERRORS: stats.errors - before[1],
                Attr.REQUESTS: stats.requests - before[2],
            })  # fmt: skip
            if stats.slowest_s:  # a stall below the read timeout shows here
                op.set_phase_attributes(Phase.FETCH, **{
                    Attr.FETCH_SLOWEST_REQUEST_S: round(stats.slowest_s, 6),
                    Attr.FETCH_SLOWEST_REQUEST: stats.slowest,
                })  # fmt: skip
    return run_record(subject, run, cache_state, op, memory, first_step, job)


def run_context(subject: RestoreSubject, options, op: Operation, concurrency: int) -> RunContext:
    return RunContext(
        storage=subject.storage,
        layout=subject.layout,
        plan=subject.plan,
        manifest=subject.manifest,
        state=subject.state,
        files=list(subject.files),
        op=op,
        concurrency=concurrency,
        part_size=options.part_size,
        memory_budget=subject.memory_budget,
        verify=options.verify,
        progress=options.progress,
        threads=os.cpu_count() or 1,
        stage_dir=options.stage_dir,
        buffers=subject.buffers,
    )


def run_attributes(subject: RestoreSubject, options, run: RunSettings, cache_state) -> dict:
    """The root span's attributes: what was restored, how, from which cache state."""
    storage, spec = subject.storage, subject.spec
    attrs = {
        Attr.FORMAT: subject.layout.format,
        Attr.LAYOUT: subject.layout.name,
        Attr.MODEL: spec.model,
        Attr.STORAGE_KIND: storage.kind,
        Attr.STORAGE_URI: storage.uri,
        Attr.CACHE: run.cache,
        Attr.CACHE_METHOD: cache_state.method,
        Attr.CACHE_RESIDENT_FRACTION: cache_state.resident_fraction,
        Attr.CONCURRENCY: run.concurrency,
        Attr.REPEAT: run.repeat,
        Attr.WORLD_SIZE: subject.world_size,
        Attr.SAVED_WORLD_SIZE: spec.ranks,
        Attr.VERIFY_MODE: options.verify,
        Attr.STEP: spec.step,
        Attr.STRATEGY: run.strategy,
        Attr.RANKS: ",".join(map(str, subject.ranks)),
        Attr.STATE_BYTES: subject.state.nbytes,
        Attr.FETCH_DIRECT_IO: bool(getattr(storage, "direct_io", False)),
        **device_attributes(subject.device),
    }
    if run.ceiling_gbps:  # what compare's share of the ceiling reads from traces too
        attrs[Attr.RESTORE_CEILING_GBPS] = round(run.ceiling_gbps, 4)
    if len(subject.ranks) == 1:
        attrs[Attr.RANK] = subject.ranks[0]
    return attrs


def run_record(
    subject: RestoreSubject, run: RunSettings, cache_state, op, memory, first_step, job
) -> RunRecord:
    """What the run leaves in results.json."""
    summary, ctx = op.summary, op.span_context
    fetch = summary.phases.get(Phase.FETCH.value)
    estimate = first_step.estimate
    stats = subject.storage.stats
    return RunRecord(
        strategy=run.strategy,
        cache=run.cache,
        concurrency=run.concurrency,
        repeat=run.repeat,
        wall_s=summary.wall_s,
        bytes=subject.manifest.total_bytes,
        resident_fraction=cache_state.resident_fraction,
        cache_method=cache_state.method,
        trace_id=format(ctx.trace_id, "032x") if ctx else "",
        phases=phases_of(summary),
        retries=int(summary.attributes.get(Attr.RETRIES, 0)),
        errors=int(summary.attributes.get(Attr.ERRORS, 0)),
        read_bytes=fetch.nbytes if fetch is not None else 0,
        state_bytes=subject.state.nbytes,
        peak_rss_bytes=memory.peak,
        start_rss_bytes=memory.start_rss,
        window_bytes=int(summary.attributes.get(Attr.MEMORY_WINDOW_BYTES, 0)),
        first_step=first_step.mode,
        first_step_estimate_s=estimate[0] if estimate else None,
        first_step_tokens=first_step.tokens_here,
        device_peak_bytes=memory.device_peak,
        device_reserved_peak_bytes=memory.device_reserved_peak,
        slowest_request_s=stats.slowest_s,
        slowest_request=stats.slowest,
        rank=job.rank if job else None,
        node=job.node if job else None,
        host=job.host if job else None,
        start_s=op.start_ns / 1e9,
    )


def list_phase(subject: RestoreSubject, op: Operation) -> list[ObjectInfo]:
    """``list``: the listing and the layout's own index reads, checked against the manifest."""
    storage = subject.storage
    with op.phase(Phase.LIST) as stats:
        requests_before = storage.stats.requests
        listed = storage.list()
        infos = check_listing(subject, listed)  # first: a missing index is named as missing
        named = index_names(subject)
        unknown = sorted(set(named) - set(subject.manifest.files))
        if unknown:
            raise CkptprofError(
                f"{subject.where(unknown[0])} is named by the checkpoint's index but is not "
                "in the manifest; the checkpoint was modified, regenerate it."
            )
        stats.attributes[Attr.FILES] = len(infos)
        stats.attributes[Attr.LIST_REQUESTS] = storage.stats.requests - requests_before
    return infos


def index_names(subject: RestoreSubject) -> list[str]:
    """The files the layout's index names, its bytes read through storage as the framework
    reads them at resume (none to read: every file of the plan)."""
    layout, index = subject.layout, subject.layout.index_file
    if index is None:
        return layout.named_files(subject.plan, b"")
    raw = subject.storage.read_bytes(index)
    try:
        return layout.named_files(subject.plan, raw)
    except CkptprofError as exc:  # named by where it is, as every other file is
        said = str(exc).removeprefix(f"{index}: ")
        raise type(exc)(f"{subject.where(index)}: {said}") from None
    except Exception as exc:  # noqa: BLE001 - a corrupt index/latest/.metadata file
        from ckptprof.errors import unreadable

        raise unreadable(subject.where(index), exc) from None


def check_listing(subject: RestoreSubject, listed: list[ObjectInfo]) -> list[ObjectInfo]:
    """The manifest's files as listed; a missing or resized file is an error naming it."""
    by_path = {i.path: i for i in listed}
    infos = []
    for path in subject.paths:
        want = subject.manifest.files[path]
        info = by_path.get(path)
        if info is None:
            raise CkptprofError(
                f"{subject.where(path)} is listed in the manifest but missing; "
                "restore the file or regenerate the checkpoint."
            )
        if info.size != want.size:
            raise CkptprofError(
                f"{subject.where(path)} is {info.size} bytes but the manifest says "
                f"{want.size} (truncated or replaced); regenerate or restore it."
            )
        infos.append(info)
    return infos


__all__ = ["RunSettings", "check_listing", "list_phase", "restore_once", "run_attributes"]
