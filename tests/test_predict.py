"""`ckptprof predict`: the arithmetic against hand-computed cases (one limit binding at a
time), then the command on results a real small save and restore measured here."""

from __future__ import annotations

import json
import statistics

import pytest

from ckptprof.cli import main
from ckptprof.errors import CkptprofError
from ckptprof.predict.check import FILE_BASES, FILE_TARGET, Setting, node_limits, plan_for
from ckptprof.predict.fit import Point, fit, remainder
from ckptprof.predict.measured import REST, measured
from ckptprof.predict.model import (
    Cost,
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


def per_byte(gbps: float) -> Cost:
    return Cost(Given(1 / (gbps * GB), "test"))


def costs(read=1.0, write=0.5, part=1 << 20, cpu=None) -> Costs:
    given = {k: Cost(Given(v, "test")) for k, v in (cpu or {}).items()}
    return Costs(per_byte(read), per_byte(write), part, given, {})


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
    rank_bytes = doc["restore"]["rank_bytes"]
    client = next(b for b in doc["restore"]["bounds"] if b["limit"] == "a rank's client")
    # one size measured: a cost per byte alone (its repeats' median), no fixed part
    per_byte = statistics.median(f["busy_s"] for f in fetch) / fetch[0]["bytes"]
    assert client["seconds"] == pytest.approx(rank_bytes * per_byte)
    assert doc["costs"]["restore"]["fetch"]["fixed_s"] is None
    assert doc["plan"]["state_bytes"] == rank_bytes * 512
    assert (tmp_path / "p.png").stat().st_size > 10_000
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "binds:" in text and "given (--storage-gbps)" in text and "assumed" in text
    # the node the runs measured, set beside the node limit assumed, in both views
    read_gbps = measured["ceiling"]["read_gbps"]  # --ceiling-gbps 1: given to the run
    assert doc["node_measured"]["read_gbps"]["value"] == pytest.approx(read_gbps)
    assert "given to" in doc["node_measured"]["read_gbps"]["source"]
    assert f"the runs' node read at {read_gbps:.2f} GB/s" in " ".join(text.split())
    assert f"--node-gbps {read_gbps:.2f}" in text


def test_no_measurement_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code = main(["predict", str(tmp_path / "empty"), "--model", "llama2-7b"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "synth save" in err[0] and "synth restore" in err[0]


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--direct-io"], "add --check DEST"),
        (["--check", "s3://bucket/chk", "--direct-io"], "local or mounted paths only"),
    ],
)
def test_direct_io_where_check_cannot_use_it_is_one_line(argv, says, tmp_path, capsys):
    """--direct-io is how --check saves on a path: without --check, or on S3, it is refused
    before anything runs."""
    code = main(["predict", *argv, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and says in err[0] and "--direct-io" in err[0]
    assert not (tmp_path / "out").exists()


def test_ranks_beyond_a_nodes_cores_wait_for_one():
    # 8 ranks on 2 cores: each rank's 3.125 s of deserialize takes 4x as long
    limits = Limits(cores=Given(2.0, "t"))
    estimate = predict_restore(plan(), costs(read=10.0, cpu={"deserialize": 1e-8}), limits)
    assert estimate.cpu["deserialize"] == pytest.approx(4 * 3.125)


#: the S3 check's smaller base: its two bases have the widths TINY_SCALE's have (hidden 64,
#: then 128: 18 and 56 MB), and its target (x5) is 77 MB, not 155: a third fewer bytes through
#: the loopback server, whose requests wait on the same cores as the runs (and the suite's)
S3_CHECK_SCALE = 0.0003


def test_check_predicts_then_measures_on_s3_and_reports_the_error(
    tmp_path, capsys, s3_bucket, s3_env
):
    """The error printed is the prediction against the runs --check made itself, on S3
    (the loopback SeaweedFS); the prediction is fitted from its two base scales."""
    s3_env()
    out, scale = tmp_path / "check", S3_CHECK_SCALE
    code = main(["predict", "--check", f"s3://{s3_bucket.name}/chk", "--cases", "scale",
                 "--scale", str(scale), "--repeat", "1", "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    table = capsys.readouterr().out
    rows = json.loads((out / "check.json").read_text())
    assert [(r["case"], r["what"], r["from"]) for r in rows] == [
        ("scale", what, f"x{scale:g}, 1 rank + x{scale * 2:g}, 1 rank")
        for what in ("save", "restore (time to state)")
    ]
    target = f"x{scale * 5:g}-r1-f0"
    save = json.loads((out / f"save-{target}" / "save.json").read_text())
    runs = json.loads((out / f"restore-{target}" / "results.json").read_text())["runs"]
    assert save["environment"]["storage.uri"].startswith("s3://")
    assert rows[0]["measured_s"] == pytest.approx(save["summary"]["median_s"])
    assert rows[1]["measured_s"] == pytest.approx(statistics.median(r["wall_s"] for r in runs))
    assert len(runs) == 1 and len(save["saves"]) == 1
    # one save warmed the bucket up first, and no case reads it
    assert (out / "warm-up" / "save.json").exists() and "warm-up" not in json.dumps(rows)
    # the prediction is the fit of the two bases' runs: predict given them says the same
    small = (out / f"save-x{scale:g}-r1-f0", out / f"restore-x{scale:g}-r1-f0")
    large = (out / f"save-x{scale * 2:g}-r1-f0", out / f"restore-x{scale * 2:g}-r1-f0")
    found = measured([str(p) for p in small + large])
    assert found.object_store and found.costs.read.source.startswith("fitted: 2 settings")
    target_plan = plan_for("llama2-7b", Setting(scale * 5))
    read_limits, write_limits = node_limits(*small)
    assert rows[0]["predicted_s"] == pytest.approx(
        predict_save(target_plan, found.costs, write_limits).total_s
    )
    assert rows[1]["predicted_s"] == pytest.approx(
        predict_restore(target_plan, found.costs, read_limits).total_s
    )
    for row in rows:
        error = (row["predicted_s"] - row["measured_s"]) / row["measured_s"]
        assert row["error"] == pytest.approx(error)
        assert f"{error:+.0%}" in table and f"{row['measured_s']:.2f}s" in table
    # the loopback server shares the ranks' cores: the check says so under its table
    found_at = json.loads((out / f"restore-{target}" / "results.json").read_text())
    endpoint = found_at["environment"]["s3.endpoint"]
    assert table.splitlines()[-1].startswith(f"note: the S3 endpoint {endpoint} is on this machine")
    assert table.endswith((out / "check.txt").read_text())  # the same table in check.txt


@pytest.mark.slow
def test_check_predicts_more_ranks_and_many_files_on_the_local_disk(tmp_path, capsys):
    """The ranks case runs its targets under the launcher, the files case writes and reads
    FILE_TARGET files, and each prediction is what `predict` says given the bases the check
    measured (the part per file from the two counts beyond the requests in flight)."""
    dest, out = tmp_path / "dest", tmp_path / "check"
    code = main(["predict", "--check", str(dest), "--cases", "ranks,files", "--scale",
                 str(TINY_SCALE), "--repeat", "1", "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    table = capsys.readouterr().out
    rows = json.loads((out / "check.json").read_text())
    scale = f"x{TINY_SCALE:g}"
    targets = [f"{scale}, 2 ranks", f"{scale}, 4 ranks", f"{scale}, 1 rank, {FILE_TARGET} files"]
    assert [(r["case"], r["to"], r["what"]) for r in rows] == [
        (case, to, what)
        for case, to in zip(("ranks", "ranks", "files"), targets, strict=True)
        for what in ("save", "restore (time to state)")
    ]
    for ranks in (2, 4):  # under the launcher: every rank saved and restored
        name = f"{scale}-r{ranks}-f0"
        save = json.loads((out / f"save-{name}" / "save.json").read_text())
        job = json.loads((out / f"restore-{name}" / "results.json").read_text())["job"]
        assert [s["ranks"] for s in save["saves"]] == [ranks]
        assert sorted(r["rank"] for r in job["per_rank"]) == list(range(ranks))
    written = list((dest / f"{scale}-r1-f{FILE_TARGET}").glob("*.pt"))
    assert len(written) == FILE_TARGET
    bases = [Setting(TINY_SCALE), Setting(TINY_SCALE * 2)] + [
        Setting(TINY_SCALE, files=count) for count in FILE_BASES
    ]
    runs = [
        out / f"{kind}-x{b.scale:g}-r{b.ranks}-f{b.files or 0}"
        for b in bases
        for kind in ("save", "restore")
    ]
    found = measured([str(run) for run in runs])
    fewer, more = FILE_BASES
    assert found.costs.read.per_file_s.source.endswith(f"per file: {fewer} → {more} files")
    target = plan_for("llama2-7b", Setting(TINY_SCALE, files=FILE_TARGET))
    assert target.files_per_rank == FILE_TARGET
    read_limits, write_limits = node_limits(*runs[:2])
    files_save, files_restore = rows[4:]
    # measured: the target's own runs, the files the check wrote and read back
    name = f"{scale}-r1-f{FILE_TARGET}"
    saved = json.loads((out / f"save-{name}" / "save.json").read_text())
    restored = json.loads((out / f"restore-{name}" / "results.json").read_text())["runs"]
    assert files_save["measured_s"] == pytest.approx(saved["summary"]["median_s"])
    assert files_restore["measured_s"] == pytest.approx(
        statistics.median(r["wall_s"] for r in restored)
    )
    assert files_save["predicted_s"] == pytest.approx(
        predict_save(target, found.costs, write_limits).total_s
    )
    assert files_restore["predicted_s"] == pytest.approx(
        predict_restore(target, found.costs, read_limits).total_s
    )
    for row in rows:
        assert row["error"] == pytest.approx(
            (row["predicted_s"] - row["measured_s"]) / row["measured_s"]
        )
        assert f"{row['error']:+.0%}" in table and f"{row['predicted_s']:.2f}s" in table
    assert "note:" not in table  # a local disk: no server on the ranks' cores


@pytest.mark.parametrize(
    "endpoint, here",
    [("http://127.0.0.1:8333", True), ("http://[::1]:8333", True), ("http://localhost:9000", True),
     ("https://s3.us-east-1.amazonaws.com", False), ("http://10.0.0.5:9000", False), (None, False)],
)  # fmt: skip
def test_the_check_notes_a_storage_served_from_this_machine(endpoint, here, tmp_path):
    """Only an S3 endpoint on a loopback address is this machine's; a name or another
    address is not known to be, and a path has no endpoint."""
    from ckptprof.predict.check import served_here_note

    environment = {"s3.endpoint": endpoint} if endpoint else {"storage.kind": "posix"}
    (tmp_path / "results.json").write_text(json.dumps({"environment": environment}))
    note = served_here_note(tmp_path)
    assert (note is not None) == here
    if here:
        assert note.startswith(f"note: the S3 endpoint {endpoint} is on this machine")


def test_two_scales_give_back_a_fixed_and_a_per_byte_cost():
    # 0.5 s fixed + 2 s/GB: 100 MB take 0.7 s, 300 MB 1.1 s (each twice)
    points = [Point(n, 1, 0.5 + n * 2e-9) for n in (10**8, 3 * 10**8) for _ in range(2)]
    cost = fit(points, "runs")
    assert cost.fixed_s.value == pytest.approx(0.5)
    assert cost.per_byte_s.value == pytest.approx(2e-9)
    assert cost.per_file_s is None and cost.fixed_s.source.startswith("fitted: 2 settings")
    # a tenfold job: 0.5 + 2 s, where per byte alone from 100 MB says 7 s
    assert cost.seconds(10**9) == pytest.approx(2.5)
    assert fit(points[:1], "one run").seconds(10**9) == pytest.approx(7.0)
    assert fit(points[:1], "one run").per_byte_s.source == "measured: one run"


def test_file_counts_give_back_a_per_file_cost():
    # 0.2 s + 1 s/GB + 10 ms a file
    def seconds(n, files):
        return 0.2 + n * 1e-9 + files * 0.01

    settings = [(10**8, 1), (2 * 10**8, 1), (10**8, 2), (10**8, 20)]
    cost = fit([Point(n, f, seconds(n, f)) for n, f in settings], "runs")
    assert (cost.fixed_s.value, cost.per_byte_s.value, cost.per_file_s.value) == pytest.approx(
        (0.2, 1e-9, 0.01)
    )
    assert cost.seconds(10**8, 200) == pytest.approx(seconds(10**8, 200))


def test_the_part_per_file_is_the_cost_of_the_files_beyond_the_concurrency():
    """Below the files read at a time, an added file adds parallelism as well as work (the
    slope from 2 to 20 files was 3-4x the cost of the files beyond, docs/predict.md): the
    part per file is the slope between the two largest counts at the same bytes."""
    seconds = {1: 0.50, 2: 0.60, 20: 0.80, 60: 1.00}  # 5 ms a file from 20 to 60
    points = [Point(10**8, f, s) for f, s in seconds.items()] + [Point(2 * 10**8, 1, 0.7)]
    cost = fit(points, "runs")
    assert cost.per_file_s.value == pytest.approx(0.005)
    assert cost.per_file_s.source.endswith("per file: 20 → 60 files")
    # the fixed part stays a fixed part: a single file does not carry it as a per-file cost
    assert cost.fixed_s is not None and cost.fixed_s.value > 0.4
    # more files that took less time: no part per file
    fewer_faster = [Point(10**8, 2, 1.0), Point(10**8, 20, 0.9), Point(2 * 10**8, 2, 1.2)]
    assert fit(fewer_faster, "runs").per_file_s is None


def test_the_part_per_file_does_not_depend_on_the_order_of_the_runs():
    """The pair is the largest count with a smaller one at about its bytes, whatever order
    the runs came in; a largest count alone at its size leaves the pair below it."""
    import itertools

    from ckptprof.predict.fit import per_file_slope

    runs = {(10**8, 2): [1.0], (10**8, 20): [1.2], (2 * 10**8, 20): [1.5], (5 * 10**8, 200): [9.0]}
    for order in itertools.permutations(runs.items()):
        assert per_file_slope(dict(order)) == (pytest.approx(0.2 / 18), 2, 20)


def test_a_negative_term_is_dropped_and_the_rest_fitted_again():
    # noise that makes the larger size faster: per byte alone (a larger job is not free),
    # least squares through zero: (1e8 x 1.0 + 2e8 x 0.9) / (1e16 + 4e16) = 5.6e-9 s/B
    cost = fit([Point(10**8, 1, 1.0), Point(2 * 10**8, 1, 0.9)], "runs")
    assert cost.fixed_s is None and cost.per_byte_s.value == pytest.approx(5.6e-9)
    # a negative part per file is dropped, the fixed part and the part per byte kept
    points = [Point(10**8, 1, 1.0), Point(2 * 10**8, 1, 1.5), Point(10**8, 10, 0.9)]
    cost = fit(points, "runs")
    assert cost.per_file_s is None and cost.fixed_s.value > 0 and cost.per_byte_s.value > 0


def test_a_fixed_cost_does_not_shrink_with_more_ranks():
    # fetch 0.5 s + 1 s/GB: 32 ranks of 312.5 MB each take 0.8125 s
    fetch = Cost(Given(1e-9, "t"), fixed_s=Given(0.5, "t"))
    estimate = predict_restore(plan(), Costs(fetch, None, 1 << 20), Limits())
    assert estimate.transfer_s == pytest.approx(0.5 + 0.3125)


def test_the_rest_of_the_wall_time_is_what_the_phases_leave_term_by_term():
    # wall 1 s + 2 s/GB; fetch 0.3 s + 1 s/GB + 5 ms a file; reshard 0.5 s
    wall = Cost(Given(2e-9, "w"), fixed_s=Given(1.0, "w"))
    fetch = Cost(Given(1e-9, "f"), fixed_s=Given(0.3, "f"), per_file_s=Given(0.005, "f"))
    reshard = Cost(Given(0.0, "r"), fixed_s=Given(0.5, "r"))
    other = remainder(wall, [fetch, reshard])
    assert (other.fixed_s.value, other.per_byte_s.value, other.per_file_s.value) == pytest.approx(
        (0.2, 1e-9, -0.005)  # negative: the files' cost overlapped the rest
    )
    for nbytes, files in ((10**8, 1), (10**9, 40)):
        parts = sum(c.seconds(nbytes, files) for c in (fetch, reshard, other))
        assert parts == pytest.approx(wall.seconds(nbytes, files))


def test_the_rest_of_a_restore_leaves_out_its_first_step(tmp_path):
    """``other`` is the time to state less its phases: a first step measured beside the
    restore (the model's compute) is not storage or loader time to scale to the job."""

    def run(first_step_s):
        phases = {"fetch": {"bytes": 10**9, "busy_s": 1.0}, "reshard": {"busy_s": 0.25}}
        if first_step_s:
            phases["first_step"] = {"busy_s": first_step_s}
        return {"strategy": "pipelined", "cache": "cold", "concurrency": 8,
                "wall_s": 1.5 + first_step_s, "phases": phases}  # fmt: skip

    others = []
    for first_step_s in (0.0, 4.0):
        folder = tmp_path / str(first_step_s)
        folder.mkdir()
        doc = {"spec": {"files": 1, "ranks": 1}, "runs": [run(first_step_s)] * 2}
        (folder / "results.json").write_text(json.dumps(doc))
        others.append(measured([str(folder)]).costs.cpu[REST].seconds(10**9, 1))
    assert others == pytest.approx([0.25, 0.25])


def test_every_option_of_predict_is_used_where_given_or_refused():
    """Each option belongs to --check, to a prediction from PATHs, or to both, and one
    given where it would do nothing is refused by the command's rules (each case:
    tests/test_seams_options.py::test_every_moot_rule_refuses_each_option)."""
    import argparse

    from ckptprof.cli import build_parser
    from ckptprof.cli.predict import BOTH, CHECK_ONLY, PREDICTION_ONLY

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    predict = commands.choices["predict"]
    dests = [a.dest for a in predict._actions if not isinstance(a, argparse._HelpAction)]
    groups = [*CHECK_ONLY, *PREDICTION_ONLY, *BOTH]
    assert sorted(dests) == sorted(groups)  # each option in exactly one group
    assert {rule.dests for rule in predict.moot_rules} == {CHECK_ONLY, PREDICTION_ONLY}
