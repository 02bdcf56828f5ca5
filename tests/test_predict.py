"""`ckptprof predict`: the arithmetic against hand-computed cases (one limit binding at a
time), then the command on results a real small save and restore measured here."""

from __future__ import annotations

import json
import statistics

import pytest

from ckptprof.cli import main
from ckptprof.errors import CkptprofError
from ckptprof.predict.model import (
    Costs,
    Given,
    JobPlan,
    Limits,
    interval,
    predict_restore,
    predict_save,
)
from tests.conftest import TINY_SCALE

GB = 1e9


def plan(**kw) -> JobPlan:
    base = dict(model="m", params=10**9, nodes=4, ranks_per_node=8, sharding="fsdp")
    return JobPlan(**{**base, **kw})


def costs(read=1.0, write=0.5, part=1 << 20, cpu=None) -> Costs:
    given = {k: Given(v, "test") for k, v in (cpu or {}).items()}
    return Costs(Given(read, "test"), Given(write, "test"), part, given, {})


def test_bytes_per_rank_follow_the_sharding():
    # 1e9 params: weights 2 GB, Adam 8 GB, 32 ranks
    fsdp = plan()
    assert fsdp.total_bytes == 10 * 10**9
    assert fsdp.restore_bytes() == (312_500_000, 10 * 10**9)
    assert fsdp.save_bytes() == (312_500_000, 10 * 10**9)
    zero1 = plan(sharding="zero1")
    assert zero1.restore_bytes() == (2 * 10**9 + 250_000_000, 32 * (2 * 10**9 + 250_000_000))
    assert zero1.save_bytes() == (2 * 10**9 + 250_000_000, 10 * 10**9)
    replicated = plan(sharding="replicated")
    assert replicated.restore_bytes() == (10 * 10**9, 32 * 10 * 10**9)
    assert replicated.save_bytes() == (10 * 10**9, 10 * 10**9) and replicated.writers() == 1
    assert plan(optimizer=False, master_weights=True).total_bytes == 6 * 10**9


def test_the_client_binds_when_nothing_else_is_given():
    estimate = predict_restore(plan(), costs(read=0.5), Limits())
    assert estimate.binding.name == "a rank's client"
    assert estimate.transfer_s == pytest.approx(312_500_000 / (0.5 * GB))
    assert [b.name for b in estimate.bounds] == ["a rank's client"]


def test_the_node_binds_when_its_ranks_outrun_its_network():
    # 8 ranks x 0.3125 GB = 2.5 GB through 1 GB/s: 2.5 s; each client alone 0.3125 s
    estimate = predict_restore(plan(), costs(read=1.0), Limits(node_gbps=Given(1.0, "test")))
    assert estimate.binding.name == "the node's network"
    assert estimate.transfer_s == pytest.approx(2.5)
    assert estimate.runner_up.name == "a rank's client"


def test_the_aggregate_binds_when_the_job_outruns_the_storage():
    # 10 GB through 2 GB/s: 5 s, the node 2.5 GB at 12.5 GB/s: 0.2 s
    limits = Limits(storage_gbps=Given(2.0, "t"), node_gbps=Given(12.5, "t"))
    estimate = predict_save(plan(), costs(write=1.0), limits)
    assert estimate.binding.name == "the storage's aggregate"
    assert estimate.transfer_s == pytest.approx(5.0)


def test_the_request_rate_binds_many_small_files():
    # 32 ranks x (ceil(312.5 MB / 1 MiB) = 299 parts + 1000 files) = 41,568 GETs at 1,000/s
    limits = Limits(get_rate=Given(1000.0, "t"))
    estimate = predict_restore(plan(files_per_rank=1000), costs(read=10.0), limits)
    assert estimate.requests == 32 * (299 + 1000)
    assert estimate.binding.name == "the request rate"
    assert estimate.transfer_s == pytest.approx(41.568)


def test_a_cpu_phase_longer_than_the_transfer_is_what_binds():
    estimate = predict_restore(plan(), costs(read=10.0, cpu={"deserialize": 1e-8}), Limits())
    assert estimate.cpu["deserialize"] == pytest.approx(3.125)
    assert estimate.limit_name == "the CPU phase deserialize"
    assert estimate.total_s == pytest.approx(0.03125 + 3.125)


def test_young_daly_for_the_whole_job():
    save = predict_save(plan(), costs(write=0.3125), Limits())  # 1 s
    restore = predict_restore(plan(), costs(read=0.3125), Limits())  # 1 s
    every = interval(plan(), save, restore, node_mtbi_s=4 * 3600)  # the job: 1 h
    assert every.job_mtbi_s == 3600
    assert every.interval_s == pytest.approx((2 * 1 * 3600) ** 0.5)
    assert every.shares["restoring"] == pytest.approx(1 / 3600)
    with pytest.raises(CkptprofError, match="less than two saves"):
        interval(plan(nodes=4), save, restore, node_mtbi_s=6)


def test_a_job_that_cannot_be_built_is_one_line():
    with pytest.raises(CkptprofError, match="more than m's 10 parameters"):
        plan(params=10)


@pytest.mark.slow
def test_predict_from_a_real_small_save_and_restore(tmp_path, capsys):
    ckpt, save_out, restore_out = tmp_path / "ckpt", tmp_path / "save", tmp_path / "restore"
    assert main(["synth", "save", str(ckpt), "--scale", str(TINY_SCALE), "--repeat", "2",
                 "--ceiling-gbps", "1", "--out", str(save_out)]) == 0  # fmt: skip
    assert main(["synth", "restore", str(ckpt), "--cache", "hot", "--concurrency", "1",
                 "--repeat", "2", "--ceiling-gbps", "1", "--no-first-step", "--no-report",
                 "--out", str(restore_out)]) == 0  # fmt: skip
    capsys.readouterr()
    argv = ["predict", str(save_out), str(restore_out), "--model", "llama3-405b", "--nodes",
            "64", "--ranks-per-node", "8", "--storage-gbps", "157.9", "--mtbi", "24h"]  # fmt: skip
    assert main(argv + ["--format", "json", "--plot", str(tmp_path / "p.png")]) == 0
    doc = json.loads(capsys.readouterr().out)
    measured = json.loads((restore_out / "results.json").read_text())
    fetch = [r["phases"]["fetch"] for r in measured["runs"]]
    rates = sorted(f["bytes"] / f["busy_s"] / 1e9 for f in fetch)
    rank_bytes = doc["restore"]["rank_bytes"]
    client = next(b for b in doc["restore"]["bounds"] if b["limit"] == "a rank's client")
    assert client["seconds"] == pytest.approx(rank_bytes / (sum(rates) / len(rates) * 1e9))
    assert doc["plan"]["state_bytes"] == rank_bytes * 512
    assert (tmp_path / "p.png").stat().st_size > 10_000
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "binds:" in text and "given (--storage-gbps)" in text and "assumed" in text


def test_no_measurement_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code = main(["predict", str(tmp_path / "empty"), "--model", "llama2-7b"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "synth save" in err[0] and "synth restore" in err[0]


def test_ranks_beyond_a_nodes_cores_wait_for_one():
    # 8 ranks on 2 cores: each rank's 3.125 s of deserialize takes 4x as long
    limits = Limits(cores=Given(2.0, "t"))
    estimate = predict_restore(plan(), costs(read=10.0, cpu={"deserialize": 1e-8}), limits)
    assert estimate.cpu["deserialize"] == pytest.approx(4 * 3.125)


@pytest.mark.slow
def test_check_predicts_then_measures_and_reports_the_error(tmp_path, capsys):
    """The error printed is the prediction against the runs --check made itself."""
    out = tmp_path / "check"
    code = main(["predict", "--check", str(tmp_path / "storage"), "--cases", "scale",
                 "--scale", str(TINY_SCALE), "--repeat", "1", "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    table = capsys.readouterr().out
    rows = json.loads((out / "check.json").read_text())
    assert [(r["case"], r["what"]) for r in rows] == [
        ("scale", "save"),
        ("scale", "restore (time to state)"),
    ]
    target = f"x{TINY_SCALE * 5:g}-r1-f0"
    save = json.loads((out / f"save-{target}" / "save.json").read_text())["summary"]["median_s"]
    runs = json.loads((out / f"restore-{target}" / "results.json").read_text())["runs"]
    assert rows[0]["measured_s"] == pytest.approx(save)
    assert rows[1]["measured_s"] == pytest.approx(statistics.median(r["wall_s"] for r in runs))
    assert (
        len(runs) == 1
        and len(json.loads((out / f"save-{target}" / "save.json").read_text())["saves"]) == 1
    )
    for row in rows:
        error = (row["predicted_s"] - row["measured_s"]) / row["measured_s"]
        assert row["error"] == pytest.approx(error)
        assert f"{error:+.0%}" in table and f"{row['measured_s']:.2f}s" in table
