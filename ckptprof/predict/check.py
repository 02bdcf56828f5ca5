"""``ckptprof predict --check``: the predictions this machine can verify, made and then
measured: more ranks from one rank, a larger scale from a smaller one, many small files
from few large ones, on the storage given.

After one save that warms the storage up, each case measures its bases (``ckptprof synth
save`` and ``synth restore`` at two scales, and for many files at two file counts more,
run as a user would, in processes of their own), predicts the target from them alone,
then measures the target the same way and prints both with the error. Restores run
hot-cache-free where the storage allows (cold), ``IN_FLIGHT`` requests in flight, no
first step: what is compared is the time to state and the save's time. The ranks of one
machine share its disk or network: the node's limit is the base's own probed ceiling.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from ckptprof.errors import CkptprofError
from ckptprof.predict.measured import measured
from ckptprof.predict.model import Given, JobPlan, Limits, predict_restore, predict_save
from ckptprof.synth.presets import get_preset

CASES = ("ranks", "scale", "files")
#: requests a checked restore keeps in flight
IN_FLIGHT = 8
#: the files case: a part per file from two counts beyond the requests in flight and ten
#: times apart (below the concurrency an added file adds parallelism as well as work, and
#: close counts differ by less than the runs' noise: docs/predict.md), then ten times more
FILE_BASES, FILE_TARGET = (20, 200), 2000


@dataclass(frozen=True)
class Setting:
    """One measured configuration: what ``synth save`` and ``synth restore`` ran."""

    scale: float
    ranks: int = 1
    files: int | None = None

    def label(self) -> str:
        files = f", {self.files} files" if self.files else ""
        return f"x{self.scale:g}, {self.ranks} rank{'s' if self.ranks > 1 else ''}{files}"


@dataclass(frozen=True)
class Checked:
    case: str
    bases: tuple[Setting, ...]
    target: Setting
    what: str  # "save" or "restore (time to state)"
    predicted_s: float
    measured_s: float
    binds: str

    def base_label(self) -> str:
        return " + ".join(base.label() for base in self.bases)

    @property
    def error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s

    def to_dict(self) -> dict:
        return {"case": self.case, "from": self.base_label(), "to": self.target.label(),
                "what": self.what, "predicted_s": self.predicted_s, "binds": self.binds,
                "measured_s": self.measured_s, "error": self.error}  # fmt: skip


def _run(argv: list[str], echo: Callable[[str], None]) -> None:
    echo("  $ ckptprof " + " ".join(argv))
    done = subprocess.run([sys.executable, "-m", "ckptprof", *argv], capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CkptprofError(f"predict --check: `ckptprof {' '.join(argv)}` failed: {last}")


def _measure(where: str, work: Path, setting: Setting, repeat: int, save_options: list[str],
             echo) -> tuple[Path, Path]:  # fmt: skip
    """Save (with ``save_options``) then restore ``setting`` at ``where``; the folders of
    their results."""
    name = f"x{setting.scale:g}-r{setting.ranks}-f{setting.files or 0}"
    save_out, restore_out = work / f"save-{name}", work / f"restore-{name}"
    dest = f"{where.rstrip('/')}/{name}"
    spec = ["--scale", str(setting.scale)] + (
        ["--files", str(setting.files)] if setting.files else []
    )
    launch = ["--nproc-per-node", str(setting.ranks)] if setting.ranks > 1 else []
    _run(["synth", "save", dest, *spec, *launch, *save_options, "--repeat", str(repeat),
          "--force", "--out", str(save_out)], echo)  # fmt: skip
    _run(["synth", "restore", dest, *launch, "--cache", "cold", "--concurrency", str(IN_FLIGHT),
          "--repeat", str(repeat), "--no-first-step", "--no-report", "--verify", "full",
          "--out", str(restore_out)], echo)  # fmt: skip
    return save_out, restore_out


def _warm_up(where: str, work: Path, scale: float, save_options: list[str], echo) -> None:
    """One save that no case uses: the first writes to a fresh folder or bucket can pay the
    storage's own set-up, which the first base alone would otherwise carry."""
    echo(f"warming up {where} (one save, not measured)")
    _run(["synth", "save", f"{where.rstrip('/')}/warm-up", "--scale", str(scale),
          *save_options, "--repeat", "1", "--ceiling-gbps", "1", "--force", "--out",
          str(work / "warm-up")], echo)  # fmt: skip


def _measured_restore_s(results: Path) -> float:
    """The job's time to state: per repeat, its slowest rank's; their median."""
    doc = json.loads((results / "results.json").read_text())
    by_repeat: dict[tuple, float] = {}
    for run in doc["runs"]:
        key = (run["strategy"], run["cache"], run["concurrency"], run["repeat"])
        by_repeat[key] = max(by_repeat.get(key, 0.0), run["wall_s"])
    return median(by_repeat.values())


def _measured_save_s(saves: Path) -> float:
    return json.loads((saves / "save.json").read_text())["summary"]["median_s"]


def plan_for(model: str, setting: Setting) -> JobPlan:
    preset = get_preset(model).scaled(setting.scale)
    return JobPlan(model=model, params=preset.params, nodes=1, ranks_per_node=setting.ranks,
                   files_per_rank=max(1, (setting.files or 1) // setting.ranks))  # fmt: skip


def node_limits(save_out: Path, restore_out: Path) -> tuple[Limits, Limits]:
    """One node's disk or network, as its probes measured it: the limit every rank of a
    job on this machine shares."""
    read = json.loads((restore_out / "results.json").read_text())["ceiling"]
    write = json.loads((save_out / "save.json").read_text())["ceiling"]
    cores = Given(float(os.cpu_count() or 1), "measured: this machine's cores")
    return (
        Limits(node_gbps=Given(read["read_gbps"], f"measured: {restore_out} read ceiling"),
               cores=cores),
        Limits(node_gbps=Given(write["write_gbps"], f"measured: {save_out} write ceiling"),
               cores=cores),
    )  # fmt: skip


def check(where: str, work: Path, cases: tuple[str, ...], model: str, scale: float,
          repeat: int = 2, echo: Callable[[str], None] = print,
          direct_io: bool = False) -> tuple[list[Checked], str | None]:  # fmt: skip
    """Run each case; what it predicted and measured, and a note on where the storage is
    served from (:func:`served_here_note`, of this run's own restores). Each case's base
    is two scales (a fixed part and a part per byte), and for many files two file counts
    more (``FILE_BASES``: a part per file): what ``predict`` is given, measured the same
    way. ``direct_io``: every save through the parallel writer with ``--direct-io``, so
    that the saves time the device, not the page cache's memory."""
    save_options = ["--strategy", "parallel", "--direct-io"] if direct_io else []
    small, large = Setting(scale), Setting(scale * 2)
    targets = {
        "ranks": [Setting(scale, ranks=2), Setting(scale, ranks=4)],
        "scale": [Setting(scale * 5)],
        "files": [Setting(scale, files=FILE_TARGET)],
    }
    many = [Setting(scale, files=count) for count in FILE_BASES]
    bases = {"ranks": [small, large], "scale": [small, large], "files": [small, large, *many]}
    measured_at: dict[Setting, tuple[Path, Path]] = {}

    def at(setting: Setting) -> tuple[Path, Path]:
        if setting not in measured_at:
            echo(f"measuring {setting.label()} at {where}")
            measured_at[setting] = _measure(where, work, setting, repeat, save_options, echo)
        return measured_at[setting]

    _warm_up(where, work, scale, save_options, echo)
    out = []
    for case in cases:
        runs = [str(path) for setting in bases[case] for path in at(setting)]
        costs, base = measured(runs).costs, tuple(bases[case])
        read_limits, write_limits = node_limits(*at(small))
        for target in targets[case]:
            plan = plan_for(model, target)
            restore = predict_restore(plan, costs, read_limits)
            save = predict_save(plan, costs, write_limits)
            t_save, t_restore = at(target)
            out += [
                Checked(case, base, target, "save", save.total_s,
                        _measured_save_s(t_save), save.limit_name),
                Checked(case, base, target, "restore (time to state)", restore.total_s,
                        _measured_restore_s(t_restore), restore.limit_name),
            ]  # fmt: skip
    return out, served_here_note(at(small)[1])


def served_here_note(restore_out: Path) -> str | None:
    """A line for a check whose storage is served from this machine (the S3 endpoint its
    restore at ``restore_out`` used is a loopback address): its server shares the ranks'
    cores, a limit no one rank's run measures and a remote storage does not have; None
    otherwise (a path; a name or another address, not known to be this machine)."""
    import ipaddress
    from urllib.parse import urlsplit

    doc = json.loads((restore_out / "results.json").read_text())
    endpoint = (doc.get("environment") or {}).get("s3.endpoint")
    host = urlsplit(endpoint).hostname if endpoint else None
    if host is None:
        return None
    try:
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:  # a name: not known to be this machine
        return None
    return (
        f"note: the S3 endpoint {endpoint} is on this machine: its server runs on the ranks' "
        "cores, so more ranks or more bytes can meet a limit one rank's run does not measure "
        "and a remote storage does not have (docs/predict.md)"
    )


def render_check(rows: list[Checked], note: str | None = None) -> str:
    width = max([len(r.base_label()) for r in rows] + [4])
    lines = [f"{'case':<6} {'from':<{width}} {'to':<22} {'what':<24} {'predicted':>9} "
             f"{'measured':>9} {'error':>7}  binds"]  # fmt: skip
    for r in rows:
        lines.append(
            f"{r.case:<6} {r.base_label():<{width}} {r.target.label():<22} {r.what:<24} "
            f"{r.predicted_s:>8.2f}s {r.measured_s:>8.2f}s {r.error:>+7.0%}  {r.binds}"
        )
    return "\n".join([*lines, *([note] if note else [])]) + "\n"
