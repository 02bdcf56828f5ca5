"""A save beside the restore of the same checkpoint (write/read ratio) and the checkpoint
interval its measured cost asks for (Young/Daly), from real saves and restores."""

from __future__ import annotations

import json
import math
from statistics import median

import pytest

from ckptprof.cli.options import parse_duration
from ckptprof.report.checkpoint_cost import CheckpointInterval
from tests.conftest import TINY_SCALE, run_cli


def test_the_interval_balances_saving_against_lost_work():
    interval = CheckpointInterval("ckpt", save_s=60.0, mtbi_s=6 * 3600, restore_s=120.0)
    assert interval.interval_s == pytest.approx(math.sqrt(2 * 60 * 6 * 3600))  # ~26.8 min
    # at Young's optimum the two costs that depend on the interval are equal
    assert interval.save_share == pytest.approx(interval.lost_share)
    assert interval.save_share == pytest.approx(60 / interval.interval_s)
    assert interval.restore_share == pytest.approx(120 / (6 * 3600))
    total = interval.save_share + interval.lost_share + interval.restore_share
    assert interval.overhead_share == pytest.approx(total)
    # and any other interval loses more
    for other in (interval.interval_s / 2, interval.interval_s * 2):
        cost = 60 / other + other / (2 * 6 * 3600)
        assert cost > interval.save_share + interval.lost_share


@pytest.mark.parametrize(
    "text, seconds", [("6h", 21600), ("30m", 1800), ("90s", 90), ("2d", 172800), ("45", 45)]
)
def test_durations_read_as_people_write_them(text, seconds):
    assert parse_duration(text) == seconds


def test_a_bad_mtbi_is_one_line(tmp_path):
    done = run_cli("report", str(tmp_path), "--mtbi", "soon")
    assert done.returncode == 2
    assert "--mtbi" in done.stderr and "6h" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_the_report_sets_a_save_beside_the_restore_of_the_same_bytes(tmp_path):
    dest = tmp_path / "ckpt"
    saved = run_cli(
        "synth", "save", str(dest), "--layout", "safetensors", "--scale", str(TINY_SCALE),
        "--repeat", "3", "--out", str(tmp_path / "save"),
    )  # fmt: skip
    assert saved.returncode == 0, saved.stderr
    restored = run_cli(
        "synth", "restore", str(dest), "--cache", "cold", "--concurrency", "1,4",
        "--repeat", "2", "--first-step-s", "0.5", "--ceiling-gbps", "1", "--no-report",
        "--out", str(tmp_path / "restore"),
    )  # fmt: skip
    assert restored.returncode == 0, restored.stderr
    paths = [str(tmp_path / "save"), str(tmp_path / "restore")]
    shown = run_cli("report", *paths, "--mtbi", "6h", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    [pair] = report["save_restore"]
    assert pair["location"] == str(dest) and pair["saves"] == 3
    [save_group] = [g for g in report["groups"] if g["kind"] == "save"]
    assert pair["save_s"] == pytest.approx(save_group["breakdown"]["wall_median_s"])
    results = json.loads((tmp_path / "restore" / "results.json").read_text())
    cold = {}
    for run in results["runs"]:  # the read, list -> reshard: the (given) first step left out
        read = run["wall_s"] - run["phases"]["first_step"]["busy_s"]
        assert read < run["wall_s"] - 0.4
        cold.setdefault(run["concurrency"], []).append(read)
    assert pair["restore_s"] == pytest.approx(min(median(w) for w in cold.values()))
    write_gbps = pair["save_bytes"] / pair["save_s"]
    read_gbps = pair["restore_bytes"] / pair["restore_s"]
    assert pair["restore_bytes"] == pair["save_bytes"]  # the same checkpoint both ways
    assert pair["ratio"] == pytest.approx(write_gbps / read_gbps)
    [interval] = report["intervals"]
    assert interval["save_s"] == pytest.approx(pair["save_s"])
    assert interval["mtbi_s"] == 21600
    assert interval["interval_s"] == pytest.approx(math.sqrt(2 * pair["save_s"] * 21600))
    text = run_cli("report", *paths, "--mtbi", "6h").stdout
    assert "write/read ratio" in text and f"{write_gbps / read_gbps:.2f}" in text
    assert "checkpoint interval for a mean time between interruptions of 6.0 h" in text
    page = tmp_path / "report.html"
    assert run_cli("report", *paths, "--mtbi", "6h", "--html", str(page)).returncode == 0
    section = page.read_text().split("Save vs restore")[1].split("</table>")[0]
    assert "to state s" in section and "RTO" not in section  # the figure it heads
    assert f"{pair['restore_s']:.3f}" in section
