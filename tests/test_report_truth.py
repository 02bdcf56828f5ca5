"""The sweep report tells one truth: every figure from the runs (a written summary that
disagrees is said, not shown), no spread for one run, the fetch column named as the
fetch's, and each hint naming the row its figures are from. Real tiny sweeps."""

from __future__ import annotations

import copy
import json
import re
import statistics
from pathlib import Path

import pytest

from ckptprof.cli import main
from ckptprof.report import aggregate, load, render_text
from ckptprof.report.json_files import parse_results, read_results
from ckptprof.report.sweep import sweep_from_results
from ckptprof.results_schema import summarize

RESTORE = ["--cache", "cold", "--no-first-step", "--ceiling-gbps", "1000", "--no-report"]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, checkpoints) -> dict[str, Path]:
    """Real cold restores: "three" (two strategies at 1 and 2 in flight, 3 repeats) and
    "one" (a single run at 2 in flight)."""
    root = tmp_path_factory.mktemp("truth")
    ckpt = checkpoints("safetensors")
    runs = {
        "three": ["--strategy", "pipelined,staged", "--concurrency", "1,2", "--repeat", "3"],
        "one": ["--strategy", "pipelined", "--concurrency", "2", "--repeat", "1"],
    }
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CKPTPROF_STATE_DIR", str(root / "state"))
        for name, options in runs.items():
            out = str(root / name)
            assert main(["synth", "restore", str(ckpt), *RESTORE, *options, "--out", out]) == 0
    return {name: root / name for name in runs}


def results(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def cell_of(entry: dict) -> tuple:
    """A run's (or a row's) strategy, cache state and concurrency."""
    return entry["strategy"], entry["cache"], entry["concurrency"]


def rewritten(folder: Path, doc: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(doc))
    return folder / "results.json"


def test_figures_come_from_the_runs_and_a_disagreeing_summary_is_said(sweeps, tmp_path):
    doc = results(sweeps["three"])
    # the runner writes what the report recomputes, so a real file reads as written
    assert doc["summary"] == summarize(doc["runs"], doc["ceiling"]["read_gbps"])

    edited = copy.deepcopy(doc)
    cell = edited["summary"][0]
    cell["rto_s"] = {"min": 9.9, "median": 9.9, "max": 9.9}
    cell["fetch_gbps_median"] = 99.0
    path = rewritten(tmp_path / "edited", edited)
    report = aggregate(load([path]))
    key = cell_of(cell)
    walls = [r["wall_s"] for r in doc["runs"] if cell_of(r) == key]
    (row,) = [r for r in report.sweeps[0].rows if cell_of(vars(r.breakdown)) == key]
    assert row.breakdown.wall_median_s == pytest.approx(statistics.median(walls))
    assert row.fetch_gbps != 99.0
    text = render_text(report)
    assert "9.900" not in text and "99.00" not in text

    warnings: list[str] = []
    read_results(path, warnings)
    assert len(warnings) == 1 and str(path) in warnings[0] and "disagrees" in warnings[0]
    warnings = []
    parse_results(doc, "three/results.json", warnings)  # the runner's own: nothing to say
    assert warnings == []


@pytest.mark.parametrize("columns", [60, 100, 160])
def test_one_run_shows_no_spread_and_the_table_counts_runs(sweeps, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    text = render_text(aggregate(load([sweeps["one"]])))
    header = next(line for line in text.splitlines() if line.lstrip().startswith("strategy")
                  or line.lstrip().startswith("cache"))  # fmt: skip
    assert re.search(r"\s(runs|n)\s", header), header
    assert "fetch GB/s" in header  # the fetch phase's, never a bare "GB/s"
    row = text.splitlines()[text.splitlines().index(header) + 1]
    assert re.search(r"\s1\s+\d+\.\d{3} (±–|\(n=1\))\s", row), row
    assert "±0%" not in text and not re.search(r"\((\d+\.\d+)-\1\)", text)


def test_a_hint_names_the_row_its_figures_are_from(sweeps):
    doc = results(sweeps["three"])
    slowed = set()
    for run in doc["runs"]:  # one repeat of every cell four times slower: every row noisy
        if cell_of(run) not in slowed:
            slowed.add(cell_of(run))
            run["wall_s"] *= 4
    doc["summary"] = summarize(doc["runs"], doc["ceiling"]["read_gbps"])  # as a runner would
    sweep = sweep_from_results(parse_results(doc))
    rows = {r.breakdown.label: r.breakdown for r in sweep.rows}
    (noisy,) = [h for h in sweep.hints if h.code == "noisy"]
    assert noisy.message.endswith("(every row)")
    label, _, rest = noisy.message.partition(": ")
    assert label in rows, noisy.message
    quoted = f"RTO {rows[label].wall_min_s:.2f}-{rows[label].wall_max_s:.2f} s"
    assert rest.startswith(f"the repeats disagree ({quoted}")

    (below,) = [h for h in sweep.hints if h.code == "fetch-below-ceiling"]
    named = below.message.partition(": ")[0]
    assert named in rows and rows[named].cache == "cold", below.message
