"""The synthetic restore as a real distributed job: one process per rank, launched by
torch.distributed.run (gloo on CPU), on one "node" or two sharing a c10d rendezvous on
127.0.0.1. Each rank restores what its rank of the target job holds; rank 0 gathers."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptprof.cli import main
from ckptprof.manifest import MANIFEST_NAME
from tests.conftest import LOOPBACK_ENV, children, run_cli, spans_in

pytestmark = pytest.mark.slow  # real training jobs

SWEEP = ["--cache", "cold", "--concurrency", "2", "--repeat", "1", "--ceiling-gbps", "1"]


def rank_hooks(**faults: str) -> dict[str, str]:
    """The environment that puts the suite's faults into the ranks of a job (see
    tests/rank_hooks/sitecustomize.py), e.g. ``CKPTPROF_TEST_SLOW_RANK="1:6"``."""
    hooks = str(Path(__file__).parent / "rank_hooks")
    path = os.pathsep.join(p for p in (hooks, os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, **faults}


def job(path, out, nproc, *extra, env=None):
    return run_cli(
        "synth", "restore", str(path), "--nproc-per-node", str(nproc), *SWEEP,
        "--out", str(out), *extra, env={**LOOPBACK_ENV, **(env or {})}, timeout=300,
    )  # fmt: skip


def results(out) -> dict:
    return json.loads((out / "results.json").read_text())


def sizes(path) -> dict[str, int]:
    return {
        p: f["size"] for p, f in json.loads((path / MANIFEST_NAME).read_text())["files"].items()
    }


def assert_one_job(doc: dict, world: int, nodes: int = 1) -> None:
    """Rank 0 wrote every rank's runs; the job's run is its slowest rank's."""
    job = doc["job"]
    assert job["world_size"] == world and job["nodes"] == nodes
    assert doc["runs"]
    for run in doc["runs"]:
        ranks = [r for r in doc["rank_runs"] if r["cache"] == run["cache"]]
        assert sorted(r["rank"] for r in ranks) == list(range(world))
        assert run["ranks"] == world
        assert run["wall_s"] == max(r["wall_s"] for r in ranks)
        assert run["read_bytes"] == sum(r["read_bytes"] for r in ranks)
    assert doc["options"]["processes"].startswith("one per rank")


def assert_one_trace_per_run(out, world: int) -> None:
    """Each rank wrote its own trace file; a run's spans (one per rank) share one trace
    id, and the job's runs one run id."""
    roots = [s for s in spans_in(out / "traces") if s["name"] == "ckpt.restore"]
    by_trace: dict[str, list[int]] = {}
    for root in roots:
        by_trace.setdefault(root["context"]["trace_id"], []).append(root["attributes"]["ckpt.rank"])
    assert by_trace and all(sorted(v) == list(range(world)) for v in by_trace.values())
    assert len({r["attributes"]["ckpt.run_id"] for r in roots}) == 1
    for root in roots:
        assert root["attributes"]["ckpt.host"] == socket.gethostname()
        assert root["attributes"]["ckpt.dist.backend"] == "gloo"
        assert "ckpt.local_rank" in root["attributes"]


def test_each_rank_reads_its_own_file_and_the_straggler_is_named(checkpoints, tmp_path):
    """torch saved by 2, restored by 2 processes: each rank reads exactly its own file
    and the small files (read amplification measured exactly); rank 1, slowed on purpose,
    is the job's RTO and is named."""
    path = checkpoints("torch", 2)
    out = tmp_path / "out"
    delay = 1.5  # rank 1 sleeps this long inside its fetch
    temporary = tmp_path / "tmp"  # the machine's temporary folder, for this job
    temporary.mkdir()
    # OMP_NUM_THREADS unset, as a user's would be: the launcher's warning is ours to spare
    hooks = rank_hooks(CKPTPROF_TEST_SLOW_RANK=f"1:{delay}")
    env = {**hooks, "OMP_NUM_THREADS": None, "TMPDIR": str(temporary)}
    done = job(path, out, 2, "--cache", "cold,hot", env=env)
    assert done.returncode == 0, done.stderr
    assert list(temporary.iterdir()) == []  # the launcher's files (torchelastic_*) removed
    doc = results(out)
    assert_one_job(doc, 2)
    size = sizes(path)
    small = sum(n for p, n in size.items() if not p.startswith("checkpoint_rank"))
    for run in doc["rank_runs"]:
        assert run["read_bytes"] == size[f"checkpoint_rank{run['rank']}.pt"] + small
    job_ = doc["job"]
    assert job_["read_amplification"] == pytest.approx(
        (sum(size.values()) + small) / sum(size.values())
    )
    # the straggler, by order and not by the clock: in every run rank 1 (and only its fetch)
    # holds the injected delay, so it is the slowest; the spread is the runs' own numbers,
    # and at least the delay less the fast rank's whole time
    assert job_["slowest_rank"] == 1 and job_["fastest_rank"] == 0
    spreads = []
    for cache in ("cold", "hot"):
        wall = {r["rank"]: r["wall_s"] for r in doc["rank_runs"] if r["cache"] == cache}
        fetch = {
            r["rank"]: r["phases"]["fetch"]["busy_s"]
            for r in doc["rank_runs"]
            if r["cache"] == cache
        }
        assert fetch[1] >= delay - 0.01 and wall[1] >= fetch[1] - 1e-6  # where it was put
        assert wall[1] > wall[0]
        spreads.append(wall[1] - wall[0])
        assert spreads[-1] >= delay - wall[0] - 0.01
    assert job_["spread_s"] == pytest.approx(sum(spreads) / 2, abs=1e-6)  # their median
    assert job_["spread_s"] > 0
    assert {r["rank"] for r in doc["runs"]} == {1}  # both runs: the straggler's time
    assert_one_trace_per_run(out, 2)
    assert {r["cache"] for r in doc["runs"]} == {"cold", "hot"}  # two runs, two traces
    text = " ".join(done.stdout.split())
    assert "job: 2 ranks on 1 node, one process each; RTO = the slowest rank's (rank 1" in text
    assert "rank 1 on node 0" in text and "is the straggler" in text
    # rank skew from every rank's runs (they began together; rank 1 loaded last)
    assert all(r["start_s"] > 0 for r in doc["rank_runs"])
    assert "the job waited on rank 1 (the last loaded" in text
    assert done.stdout.count("results:") == 2  # one display for the job: rank 0's run lines
    assert "OMP_NUM_THREADS" not in done.stderr  # no launcher noise


@pytest.mark.parametrize("layout", ["safetensors", "deepspeed"])
def test_two_ranks_restore_every_layout(layout, checkpoints, tmp_path):
    ranks = 2 if layout == "deepspeed" else 1
    path = checkpoints(layout, ranks)
    out = tmp_path / "out"
    done = job(path, out, 2, "--verify", "size")  # (full hashes would need whole files)
    assert done.returncode == 0, done.stderr
    doc = results(out)
    assert_one_job(doc, 2)
    whole = sum(sizes(path).values())
    for run in doc["rank_runs"]:
        assert 0 < run["read_bytes"] < whole  # a rank reads its share, not the checkpoint
        assert set(run["phases"]) >= {"list", "fetch", "verify", "deserialize", "reshard"}
    assert_one_trace_per_run(out, 2)


@pytest.fixture(scope="module")
def dcp_by_four(checkpoints):
    """The DCP checkpoint saved by 4 ranks, made once for the three restores of it: a
    module fixture, so tests/conftest.py runs them on one xdist worker (the session's
    ``checkpoints`` is per worker: spread over three, each made its own)."""
    return checkpoints("dcp", 4)


@pytest.mark.parametrize("nproc", [2, 3, 4])
def test_dcp_saved_by_four_restored_by_two_three_and_four(nproc, dcp_by_four, tmp_path):
    """Each rank's dcp.load reads only the saved items its rows overlap (DCP reads an item
    whole): with 4 ranks each reads exactly its own file and .metadata; with 2 or 3 the
    items cut by a rank boundary are read twice, and read amplification says so."""
    path = dcp_by_four
    out = tmp_path / "out"
    done = job(path, out, nproc, "--verify", "size")  # (full hashes need whole files)
    assert done.returncode == 0, done.stderr
    doc = results(out)
    assert_one_job(doc, nproc)
    assert doc["options"]["world_size"] == nproc and doc["spec"]["ranks"] == 4
    size = sizes(path)
    whole = sum(size.values())
    for run in doc["rank_runs"]:
        if nproc == 4:
            assert run["read_bytes"] == size[f"__{run['rank']}_0.distcp"] + size[".metadata"]
        else:
            assert run["read_bytes"] < 0.75 * whole
    amplification = doc["job"]["read_amplification"]
    assert amplification == pytest.approx(sum(r["read_bytes"] for r in doc["rank_runs"]) / whole)
    assert 1.0 < amplification < 1.6
    states = [r["state_bytes"] for r in doc["rank_runs"]]
    assert max(states) - min(states) <= 0.05 * max(states)  # an even split of the state


def test_two_nodes_share_a_c10d_rendezvous(checkpoints, tmp_path):
    """Two torchrun launches (the two "nodes") meet at one c10d endpoint on 127.0.0.1:
    the multi-node command of docs/synthetic.md, with one rank per node. The endpoint's store is
    the test's, on a port the kernel gave it and held until the end: both nodes join it
    (``is_host=false``), so no port is picked, released and raced for by another process
    (the workers' own store is rank 0's agent's, also on a port of the kernel's choice)."""
    from datetime import timedelta

    import torch.distributed as dist

    path = checkpoints("torch", 2)
    out = tmp_path / "out"
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=300)
    )
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
        "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{store.port}",
        "--rdzv-conf", "is_host=false",
        "--rdzv-id", "ckptprof-test", "-m", "ckptprof", "synth", "restore", str(path), *SWEEP,
        "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, **LOOPBACK_ENV}
    nodes = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]  # fmt: skip
    try:
        outputs = [node.communicate(timeout=300) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
        del store
    assert [node.returncode for node in nodes] == [0, 0], outputs
    doc = results(out)
    assert_one_job(doc, 2, nodes=2)
    assert sorted(n["node"] for n in doc["job"]["per_node"]) == [0, 1]
    assert_one_trace_per_run(out, 2)
    assert "job: 2 ranks on 2 nodes" in " ".join("".join(o for o, _ in outputs).split())


def test_a_rank_that_dies_mid_restore_is_one_line_and_no_hang(checkpoints, tmp_path):
    path = checkpoints("torch", 2)
    out = tmp_path / "out"
    # a rank left waiting for the dead one would fail only when its collective times out;
    # the job's own timeout (under the test's 300 s) tells the two apart
    collective_timeout_s = 240
    started = time.monotonic()
    env = rank_hooks(CKPTPROF_TEST_DIE_RANK="1", CKPTPROF_DIST_TIMEOUT=str(collective_timeout_s))
    done = job(path, out, 2, env=env)
    assert time.monotonic() - started < collective_timeout_s  # torch's agent stopped it
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("ckptprof: error")]
    assert errors == [
        "ckptprof: error: rank 1 of 2 exited with code 70 during the restore (its output is "
        "above); the other ranks were stopped."
    ], done.stderr
    assert not (out / "results.json").exists()


def test_a_ranks_own_error_is_quoted_by_the_launcher(checkpoints, tmp_path):
    """What only the ranks can find (a file of the checkpoint missing: options the
    launcher decides are refused before it starts them) is refused by every rank in one
    line, which the launcher quotes."""
    import shutil

    path = tmp_path / "ckpt"
    shutil.copytree(checkpoints("torch", 2), path)
    gone = sorted(sizes(path))[0]
    (path / gone).unlink()
    done = job(path, tmp_path / "out", 2)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()  # the ranks leave it to the launcher
    # both ranks refuse; the one that failed first is quoted
    assert re.match(r"ckptprof: error: rank [01] of 2 exited with code 2 during the restore: ",
                    line), line  # fmt: skip
    assert gone in line and line.endswith("; the other ranks were stopped."), line


def test_only_torchruns_own_environment_makes_a_rank(monkeypatch):
    """A batch script's RANK / MASTER_ADDR (for its own job) must not make a plain
    `ckptprof synth restore` wait for a rendezvous."""
    from ckptprof.synth.distributed import launched

    for name in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert not launched()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    assert launched()


def seconds(start: str, end: str) -> float:
    """Seconds between two span timestamps (ISO 8601, as the trace files write them)."""
    from datetime import datetime

    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def test_two_ranks_save_at_once_and_the_job_takes_the_slowest(tmp_path, capsys):
    """``synth save --nproc-per-node 2``: each rank writes its own file at the same time,
    one trace per save with a span per rank; the job's save time is its slowest rank's,
    and the checkpoint restores with every byte checked. Rank 1 comes to its first save
    late (it builds its state ``late_s`` later): the ranks' barrier starts them together."""
    dest, out = tmp_path / "ckpt", tmp_path / "out"
    late_s = 3.0
    saved = run_cli(
        "synth", "save", str(dest), "--layout", "torch", "--scale", "0.0005",
        "--nproc-per-node", "2", "--repeat", "2", "--ceiling-gbps", "1", "--out", str(out),
        env={**LOOPBACK_ENV, **rank_hooks(CKPTPROF_TEST_SLOW_SAVE_START=f"1:{late_s}")},
        timeout=300,
    )  # fmt: skip
    assert saved.returncode == 0, saved.stderr
    assert saved.stdout.count("save #") == 2  # one display for the job: rank 0's
    assert sorted(p.name for p in dest.glob("checkpoint_rank*.pt")) == [
        "checkpoint_rank0.pt", "checkpoint_rank1.pt",
    ]  # fmt: skip
    spans = [s for s in spans_in(out / "traces") if s["name"] == "ckpt.save"]
    for repeat in (0, 1):  # each save starts on both ranks well within the late delay
        first, second = sorted(
            s["start_time"] for s in spans if s["attributes"]["ckpt.repeat"] == repeat
        )
        assert seconds(first, second) < late_s / 2, repeat  # the ranks waited for each other
    by_trace: dict[str, list[dict]] = {}
    for span in spans:
        by_trace.setdefault(span["context"]["trace_id"].removeprefix("0x"), []).append(span)
    assert len(by_trace) == 2  # one trace per save of the job
    doc = json.loads((out / "save.json").read_text())
    for record in doc["saves"]:
        ranks = by_trace[record["trace_id"]]
        assert sorted(s["attributes"]["ckpt.rank"] for s in ranks) == [0, 1]
        walls = {
            s["attributes"]["ckpt.rank"]: seconds(s["start_time"], s["end_time"]) for s in ranks
        }
        assert record["ranks"] == 2 and record["rank"] == max(walls, key=walls.get)
        assert record["wall_s"] == pytest.approx(max(walls.values()), abs=2e-3)
        first, second = sorted(s["start_time"] for s in ranks)
        assert seconds(first, second) < max(walls.values())  # the ranks wrote at once
    manifest = json.loads((dest / MANIFEST_NAME).read_text())
    assert doc["saves"][0]["bytes"] == sum(f["size"] for f in manifest["files"].values())
    # in this process (a real restore all the same): a process of its own would only add
    # another interpreter's start and torch's import to the test
    restore = ["synth", "restore", str(dest), "--verify", "full", "--cache", "hot",
               "--concurrency", "2", "--repeat", "1", "--no-first-step", "--ceiling-gbps", "1",
               "--no-report", "--out", str(tmp_path / "rout")]  # fmt: skip
    assert main(restore) == 0, capsys.readouterr().err


def test_rank_zero_names_the_straggler_while_it_straggles(checkpoints, tmp_path):
    """Rank 1 held inside its fetch (the suite's slow rank) while rank 0 has finished the
    run: rank 0 warns, during the run, that the job waits on rank 1 in fetch; rank 1's own
    watchdog says it made no progress; the run still ends well."""
    path = checkpoints("torch", 2)
    out = tmp_path / "out"
    done = job(path, out, 2, "--cache", "hot", "--stall-after", "1",
               env=rank_hooks(CKPTPROF_TEST_SLOW_RANK="1:6"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    named = [line for line in done.stderr.splitlines() if "still in fetch" in line]
    assert named, done.stderr
    assert named[0].startswith("ckptprof: warning: rank 1 on ")
    assert "after every other rank of the job left it: the job waits on it" in named[0]
    seconds = float(named[0].split("still in fetch ")[1].split(" s ")[0])
    assert "restore rank 1" in done.stderr and "stalled in fetch" in done.stderr  # its own
    spans = spans_in(out / "traces")
    root0, root1 = sorted(
        (s for s in spans if s["name"] == "ckpt.restore"),
        key=lambda s: s["attributes"]["ckpt.rank"],
    )
    fetch1 = children(spans, root1)["ckpt.fetch"]
    # by order, not by the clock: named after --stall-after, for time rank 1 spent in its
    # fetch (said while it straggled), and rank 0 was done before that fetch ended
    assert 1.0 <= seconds < fetch1["attributes"]["ckpt.busy_s"]
    assert root0["end_time"] < fetch1["end_time"]
