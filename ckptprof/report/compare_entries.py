"""``ckptprof compare``'s reading: the settings one PATH holds, saves and restores, as
:class:`~ckptprof.report.comparison.Entry` objects, from results.json runs and from traces
(and save.json) alike, named so that the two match."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ckptprof.phases import Attr, Phase
from ckptprof.report.checkpoint_cost import bytes_read, time_to_state, written_bytes
from ckptprof.report.comparison import SAVE, Entry, why_apart
from ckptprof.report.groups import CONFIG_ATTRS, rank_instances, short_label
from ckptprof.report.load import load
from ckptprof.report.records import ReportData, TraceOperation
from ckptprof.units import fmt_bytes

#: configuration keys that name where a run was stored, not what it did
WHERE_KEYS = ("storage",)
SYNTHETIC = "synthetic"


def _checkpoint(model: Any, layout: Any, size: Any) -> tuple[str | None, ...]:
    """What a run restored: model, layout, size ("llama2-7b", "safetensors", "x0.01")."""
    if isinstance(size, int) and not isinstance(size, bool):
        size = fmt_bytes(size) if size > 0 else None
    elif isinstance(size, float):
        size = f"x{size:g}"
    return tuple(str(p) if p else None for p in (model, layout, size))


def _restore_setting(strategy: Any, cache: Any, concurrency: Any) -> str:
    conc = f"c={concurrency}" if concurrency else ""
    return " ".join(str(p) for p in (strategy, cache, conc) if p) or "restore"


def _trace_setting(op: TraceOperation) -> str:
    """A synthetic restore as its results' setting is named (so traces and results.json
    match), a synthetic save as "save", a callback's operation by its configuration."""
    if op.attr(Attr.FRAMEWORK) == SYNTHETIC:
        if op.kind == SAVE:
            return "save" if op.attr(Attr.SAVE_FSYNC) is not False else "save no-fsync"
        return _restore_setting(
            op.attr(Attr.STRATEGY), op.attr(Attr.CACHE), op.attr(Attr.CONCURRENCY)
        )
    config = {label: op.attributes[key] for key, label in CONFIG_ATTRS
              if key in op.attributes and label not in WHERE_KEYS}  # fmt: skip
    label = short_label(config)
    return f"save {label}".strip() if op.kind == SAVE else label or "restore"


def _results_entries(data: ReportData, label: str) -> list[Entry]:
    out: list[Entry] = []
    for results in data.results:
        spec = results.spec
        what = _checkpoint(spec.get("model"), spec.get("layout"), spec.get("scale"))
        ceiling = results.ceiling.read_gbps if results.ceiling else None
        where = results.environment.get("storage.uri")
        by_setting: dict[str, Entry] = {}
        for run in results.runs:
            setting = _restore_setting(run.strategy, run.cache, run.concurrency)
            entry = by_setting.setdefault(
                setting,
                Entry(label, setting, [], checkpoint=what, synthetic=True, nbytes=bytes_read(run),
                      cache=run.cache, origins=[results.path], location=where),
            )  # fmt: skip
            entry.walls.append(run.wall_s)
            entry.tts.append(time_to_state(run))
            entry.run_ids += [str(run.trace_id).removeprefix("0x")] if run.trace_id else []
            if ceiling:
                entry.ceilings.append(ceiling)
            fetch = run.phases.get(Phase.FETCH.value)
            if fetch is not None and fetch.nbytes and fetch.busy_s > 0:
                entry.fetch_gbps.append(fetch.nbytes / fetch.busy_s / 1e9)
            for name, sample in run.phases.items():
                entry.phases.setdefault(name, []).append(sample.busy_s)
        out += by_setting.values()
    return out


def _trace_entries(operations: Sequence[TraceOperation], label: str) -> list[Entry]:
    """Restores and saves of traces (and of save.json), one entry per setting and work
    (a folder of traces of two checkpoints gives two: compare refuses to pool them); a
    job's operation is its slowest rank's; an async save's background half is left out."""
    buckets: dict[tuple[str, str], list[TraceOperation]] = defaultdict(list)
    for op in operations:
        if not op.failed and not op.attr(Attr.SAVE_BACKGROUND):
            buckets[(op.kind, _trace_setting(op))].append(op)
    out = []
    for (kind, setting), ops in buckets.items():
        apart: list[Entry] = []
        for instance in rank_instances(ops):
            entry = _instance_entry(label, kind, setting, instance)
            known = next((e for e in apart if why_apart(e, entry) is None), None)
            if known is None:
                apart.append(entry)
            else:
                known.pool(entry)
        out += apart
    return out


def _instance_entry(label: str, kind: str, setting: str, instance: list[TraceOperation]) -> Entry:
    """One save or restore (every rank of it) as an entry of one run."""
    op = max(instance, key=lambda o: o.wall_s)  # the job waits for its slowest rank
    entry = Entry(
        label,
        setting,
        [op.wall_s],
        checkpoint=_checkpoint(
            op.attr(Attr.MODEL),
            op.attr(Attr.LAYOUT, op.attr(Attr.FORMAT)),
            op.attr(Attr.CHECKPOINT_BYTES),
        ),
        kind=kind,
        synthetic=op.attr(Attr.FRAMEWORK) == SYNTHETIC,
        writer=op.attr(Attr.STRATEGY) if kind == SAVE else None,
        cache=op.attr(Attr.CACHE),
        location=op.attr(Attr.STORAGE_URI),
        origins=[op.source] if op.source else [],
        run_ids=[op.trace_id.removeprefix("0x")] if op.trace_id else [],
    )
    for name, sample in op.phases.items():
        entry.phases.setdefault(name, []).append(sample.busy_s)
    if kind == SAVE:
        ceiling = _number(op.attr(Attr.SAVE_CEILING_GBPS))
        entry.ceilings += [ceiling] if ceiling else []
        entry.nbytes = sum(written_bytes(o) for o in instance) or None
        return entry
    entry.tts.append(time_to_state(op))
    ceiling = _number(op.attr(Attr.RESTORE_CEILING_GBPS))
    entry.ceilings += [ceiling] if ceiling else []
    size = op.attr(Attr.CHECKPOINT_BYTES)
    fetch = op.phases.get(Phase.FETCH.value)
    if not isinstance(size, int) and fetch is not None:
        size = fetch.nbytes
    if fetch is not None and fetch.nbytes and fetch.busy_s > 0:
        entry.fetch_gbps.append(fetch.nbytes / fetch.busy_s / 1e9)
    entry.nbytes = size if isinstance(size, int) and size > 0 else None
    return entry


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def entries_of(path: str, label: str) -> list[Entry]:
    """The settings one PATH holds (saves and restores), with their runs."""
    data = load([path])
    return _results_entries(data, label) + _trace_entries(data.operations, label)


__all__ = ["entries_of"]
