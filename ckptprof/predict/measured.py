"""What one node measured on the target storage, as rates and costs per byte.

Read from ``results.json`` (``synth restore``) and ``save.json`` (``synth save``): a
rank's fetch and write rates at the concurrency it used, and the CPU phases' seconds per
byte. The best setting measured is taken (cold where measured: a restore after a failure
reads from the storage), its median over repeats; each number says where it came from.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from ckptprof.errors import CkptprofError
from ckptprof.predict.model import Costs, Given
from ckptprof.storage import is_object_store

RESTORE_CPU = ("verify", "deserialize", "reshard")
SAVE_CPU = ("commit",)
DEFAULT_PART_SIZE = 16 << 20


@dataclass(frozen=True)
class Measured:
    costs: Costs
    object_store: bool
    sources: tuple[str, ...]
    restore_scale: float | None = None
    save_scale: float | None = None


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


def _restore_costs(path: Path, doc: dict) -> tuple[Given, dict[str, Given], int, str, float]:
    runs = [r for r in doc.get("runs", []) if isinstance(r, dict) and r.get("phases")]
    if not runs:
        raise CkptprofError(f"{path}: no restore runs in it; run `ckptprof synth restore` again")
    cold = [r for r in runs if r.get("cache") == "cold"] or runs
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for run in cold:
        groups[(run.get("strategy"), run.get("cache"), run.get("concurrency"))].append(run)

    def rate(run: dict) -> float:
        fetch = run["phases"].get("fetch", {})
        return fetch.get("bytes", 0) / fetch["busy_s"] / 1e9 if fetch.get("busy_s") else 0.0

    key, group = max(groups.items(), key=lambda kv: median(rate(r) for r in kv[1]))
    strategy, cache, concurrency = key
    where = f"measured: {path} ({strategy}, {cache}, {concurrency} in flight, {len(group)} runs)"
    read = Given(median(rate(r) for r in group), where)
    if read.value <= 0:
        raise CkptprofError(f"{path}: its restores fetched no bytes; nothing to scale from")
    cpu = {}
    for phase in RESTORE_CPU:
        per_byte = [
            r["phases"][phase]["busy_s"] / r["phases"]["fetch"]["bytes"]
            for r in group
            if phase in r["phases"] and r["phases"].get("fetch", {}).get("bytes")
        ]
        if per_byte:
            cpu[phase] = Given(median(per_byte), where)
    part = int((doc.get("options") or {}).get("part_size") or DEFAULT_PART_SIZE)
    scale = float((doc.get("spec") or {}).get("scale") or 0) or None
    return read, cpu, part, str(doc.get("location", "")), scale


def _save_costs(path: Path, doc: dict) -> tuple[Given, dict[str, Given], str, float | None]:
    saves = [s for s in doc.get("saves", []) if isinstance(s, dict) and s.get("bytes")]
    if not saves:
        raise CkptprofError(f"{path}: no saves in it; run `ckptprof synth save` again")
    options = doc.get("options") or {}
    strategy = options.get("strategy", "?")
    where = f"measured: {path} ({strategy}, {len(saves)} saves)"

    def moving(save: dict) -> float:  # the write with its fsync; the commit apart
        phases = save.get("phases") or {}
        return sum(v for k, v in phases.items() if k != "commit") or save["wall_s"]

    write = Given(median(s["bytes"] / moving(s) / 1e9 for s in saves), where)
    cpu = {}
    for phase in SAVE_CPU:
        per_byte = [s["phases"][phase] / s["bytes"] for s in saves if phase in s.get("phases", {})]
        if per_byte:
            cpu[phase] = Given(median(per_byte), where)
    location = str((doc.get("environment") or {}).get("storage.uri", ""))
    scale = float((doc.get("spec") or {}).get("scale") or 0) or None
    return write, cpu, location, scale


def measured(paths: list[str]) -> Measured:
    """The costs the results under ``paths`` measured (the first restore and save found)."""
    results, saves = _files(paths)
    read, cpu, part, location, restore_scale = None, {}, DEFAULT_PART_SIZE, "", None
    if results:
        read, cpu, part, location, restore_scale = _restore_costs(results[0], _load(results[0]))
    write, save_cpu, save_scale = None, {}, None
    if saves:
        write, save_cpu, save_location, save_scale = _save_costs(saves[0], _load(saves[0]))
        location = location or save_location
    if read is None:
        raise CkptprofError(
            f"{', '.join(paths)}: no restore measured (results.json); run `ckptprof synth "
            "restore` on the target storage too"
        )
    costs = Costs(read, write, part, cpu, save_cpu)
    sources = tuple(str(p) for p in results[:1] + saves[:1])
    return Measured(costs, is_object_store(location), sources, restore_scale, save_scale)
