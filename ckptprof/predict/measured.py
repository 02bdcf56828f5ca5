"""What one node measured on the target storage, as each phase's cost on one rank.

Read from ``results.json`` (``synth restore``) and ``save.json`` (``synth save``), as
many as given: a rank's fetch and write at the concurrency it used, its CPU phases, and
the rest of its wall time. Every run of the best restore setting measured (cold where
measured: a restore after a failure reads from the storage) is a point; one size gives a
cost per byte, two sizes or more a fixed part and a part per byte, two file counts a part
per file (``ckptprof/predict/fit.py``). Each number says where it came from.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from ckptprof.errors import CkptprofError
from ckptprof.predict.fit import Point, fit, remainder
from ckptprof.predict.model import Cost, Costs, Given
from ckptprof.storage import is_object_store
from ckptprof.storage.base import DEFAULT_PART_SIZE

RESTORE_CPU = ("verify", "deserialize", "reshard")
SAVE_CPU = ("commit",)
#: a rank's wall time outside the phases measured: set-up, listing, the gaps between them
#: (not a restore's first step: the model's compute, left out as time to state leaves it)
REST = "other"


@dataclass(frozen=True)
class Measured:
    costs: Costs
    object_store: bool
    sources: tuple[str, ...]
    #: the node's read and write bandwidth to the storage, as the runs' probes found it
    #: (or as they were given): what every rank of a node shares
    read_ceiling: Given | None = None
    write_ceiling: Given | None = None


def _ceiling(path: Path, doc: dict, key: str) -> Given | None:
    ceiling = doc.get("ceiling") or {}
    value = ceiling.get(key)
    if not isinstance(value, (int, float)) or value <= 0:
        return None
    how = str(ceiling.get("source") or "")
    where = "given to" if how.startswith(("given", "--ceiling")) else "measured by"
    return Given(float(value), f"{where} {path}'s run ({how})")


def _files(paths: list[str]) -> tuple[list[Path], list[Path]]:
    results, saves = [], []
    for raw in paths:
        path = Path(raw)
        found = [path] if path.is_file() else sorted(path.rglob("*.json"))
        for file in found:
            if file.name == "results.json":
                results.append(file)
            elif file.name == "save.json":
                saves.append(file)
    if not results and not saves:
        raise CkptprofError(
            f"{', '.join(paths)}: no results.json or save.json; measure the target storage "
            "first with `ckptprof synth save` and `ckptprof synth restore` (one node, small "
            "scale) and give their --out folders"
        )
    return results, saves


def _load(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CkptprofError(
            f"{path}: not readable as JSON ({exc}); give a ckptprof result"
        ) from None
    if not isinstance(doc, dict):
        raise CkptprofError(f"{path}: not a ckptprof result (a JSON object)")
    return doc


def _files_per_rank(doc: dict) -> int:
    spec = doc.get("spec") or {}
    return max(1, int(spec.get("files") or 0) // max(1, int(spec.get("ranks") or 1)))


def _label(paths: list[Path]) -> str:
    return ", ".join(str(p) for p in paths)


def _fetch_gbps(run: dict) -> float:
    fetch = run["phases"].get("fetch", {})
    return fetch.get("bytes", 0) / fetch["busy_s"] / 1e9 if fetch.get("busy_s") else 0.0


def _restore_costs(docs: dict[Path, dict]) -> tuple[Cost, dict[str, Cost], int, str]:
    """The fetch, CPU phases and the rest, over the runs of the best setting measured."""
    runs: dict[tuple, list[tuple[dict, dict]]] = defaultdict(list)
    for path, doc in docs.items():
        found = [r for r in doc.get("runs", []) if isinstance(r, dict) and r.get("phases")]
        if not found:
            raise CkptprofError(
                f"{path}: no restore runs in it; run `ckptprof synth restore` again"
            )
        cold = [r for r in found if r.get("cache") == "cold"] or found
        for run in cold:
            runs[(run.get("strategy"), run.get("cache"), run.get("concurrency"))].append((doc, run))
    key, group = max(runs.items(), key=lambda kv: median(_fetch_gbps(r) for _, r in kv[1]))
    if median(_fetch_gbps(r) for _, r in group) <= 0:
        raise CkptprofError(
            f"{_label(list(docs))}: its restores fetched no bytes; nothing to scale from"
        )
    strategy, cache, concurrency = key
    where = f"{_label(list(docs))} ({strategy}, {cache}, {concurrency} in flight)"
    points: dict[str, list[Point]] = defaultdict(list)
    for doc, run in group:
        phases, files = run["phases"], _files_per_rank(doc)
        nbytes = phases.get("fetch", {}).get("bytes") or 0
        if not nbytes:
            continue
        busy = {name: phases[name]["busy_s"] for name in ("fetch", *RESTORE_CPU) if name in phases}
        for name, seconds in busy.items():
            points[name].append(Point(nbytes, files, seconds))
        step = phases.get("first_step", {}).get("busy_s") or 0.0
        points["wall"].append(Point(nbytes, files, run["wall_s"] - step))  # time to state
    costs = {name: fit(found, where) for name, found in points.items()}
    costs[REST] = remainder(costs.pop("wall"), list(costs.values()), "the time to state")
    doc = next(iter(docs.values()))
    part = int((doc.get("options") or {}).get("part_size") or DEFAULT_PART_SIZE)
    cpu = {name: costs[name] for name in (*RESTORE_CPU, REST) if name in costs}
    return costs["fetch"], cpu, part, str(doc.get("location", ""))


def _save_costs(docs: dict[Path, dict]) -> tuple[Cost, dict[str, Cost], str]:
    """The write (with its serialize and fsync), the commit and the rest, over every save."""
    points: dict[str, list[Point]] = defaultdict(list)
    strategies = set()
    for path, doc in docs.items():
        saves = [s for s in doc.get("saves", []) if isinstance(s, dict) and s.get("bytes")]
        if not saves:
            raise CkptprofError(f"{path}: no saves in it; run `ckptprof synth save` again")
        strategies.add(str((doc.get("options") or {}).get("strategy", "?")))
        files = _files_per_rank(doc)
        for save in saves:
            phases = save.get("phases") or {}
            nbytes = save["bytes"] // max(1, int(save.get("ranks") or 1))  # the job's: all ranks
            moving = sum(v for k, v in phases.items() if k not in SAVE_CPU) or save["wall_s"]
            points["write"].append(Point(nbytes, files, moving))
            for name in SAVE_CPU:
                if name in phases:
                    points[name].append(Point(nbytes, files, phases[name]))
            points["wall"].append(Point(nbytes, files, save["wall_s"]))
    where = f"{_label(list(docs))} ({', '.join(sorted(strategies))})"
    costs = {name: fit(found, where) for name, found in points.items()}
    costs[REST] = remainder(costs.pop("wall"), list(costs.values()))
    doc = next(iter(docs.values()))
    location = str((doc.get("environment") or {}).get("storage.uri", ""))
    return costs["write"], {n: costs[n] for n in (*SAVE_CPU, REST) if n in costs}, location


def measured(paths: list[str]) -> Measured:
    """The costs the results under ``paths`` measured: every restore and every save."""
    results, saves = _files(paths)
    if not results:
        raise CkptprofError(
            f"{', '.join(paths)}: no restore measured (results.json); run `ckptprof synth "
            "restore` on the target storage too"
        )
    restores = {p: _load(p) for p in results}
    read, cpu, part, location = _restore_costs(restores)
    write, save_cpu, write_ceiling = None, {}, None
    if saves:
        saved = {p: _load(p) for p in saves}
        write, save_cpu, save_location = _save_costs(saved)
        location = location or save_location
        write_ceiling = _ceiling(saves[0], saved[saves[0]], "write_gbps")
    costs = Costs(read, write, part, cpu, save_cpu)
    sources = tuple(str(p) for p in results + saves)
    read_ceiling = _ceiling(results[0], restores[results[0]], "read_gbps")
    return Measured(costs, is_object_store(location), sources, read_ceiling, write_ceiling)
