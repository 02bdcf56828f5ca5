"""ckptprof.integrations.dcp with real torch.distributed.checkpoint: dcp.save / dcp.load /
dcp.async_save in one process, and row-sharded DTensor state saved by 2 gloo ranks and
restored by 1, 2 and 3 (a reshard), each load checked value by value."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

from ckptprof.integrations import dcp as traced_dcp
from tests.conftest import LOOPBACK_ENV, RESTORE_PHASES, children, spans_in

pytestmark = pytest.mark.slow  # real jobs in fresh processes

JOB = Path(__file__).with_name("dcp_job.py")
SAVE_PHASES = {"ckpt.serialize", "ckpt.write", "ckpt.commit"}
LOADED = RESTORE_PHASES - {"ckpt.first_step"}  # a bare dcp.load has no training step


@pytest.fixture(autouse=True)
def quiet_single_process():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def model_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Linear(256, 32))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 128)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optim": optimizer.state_dict()}


def zeros_like(tree):
    if isinstance(tree, dict):
        return {k: zeros_like(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [zeros_like(v) for v in tree]
    return torch.zeros_like(tree) if isinstance(tree, torch.Tensor) else tree


def assert_equal(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_equal(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_equal(x, y)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    else:
        assert a == b


def test_instrument_traces_save_load_and_async_save_and_puts_dcp_back(tmp_path):
    original = (dcp.load, dcp.save, dcp.async_save)
    traced_dcp.instrument(trace_dir=tmp_path / "traces")
    try:
        assert dcp.load is not original[0]
        state = model_state()
        dcp.save(state, checkpoint_id=tmp_path / "ckpt", no_dist=True)
        target = zeros_like(state)
        dcp.load(target, checkpoint_id=tmp_path / "ckpt", no_dist=True)
        assert_equal(target, state)
        dcp.async_save(state, checkpoint_id=tmp_path / "async", no_dist=True).result()
    finally:
        traced_dcp.uninstrument()
    assert (dcp.load, dcp.save, dcp.async_save) == original  # put back exactly
    spans = spans_in(tmp_path / "traces")
    (restore,) = [s for s in spans if s["name"] == "ckpt.restore"]
    saves = [s for s in spans if s["name"] == "ckpt.save"]
    assert len(saves) == 2  # the save and the async save
    phases = children(spans, restore)
    assert set(phases) == LOADED
    data = sum(p.stat().st_size for p in (tmp_path / "ckpt").glob("*.distcp"))
    assert phases["ckpt.fetch"]["attributes"]["ckpt.bytes"] >= data  # every item's bytes
    assert restore["attributes"]["ckpt.framework"] == "dcp"
    assert restore["attributes"]["ckpt.path"] == str(tmp_path / "ckpt")
    assert restore["attributes"]["ckpt.memory.peak_rss_bytes"] > 0
    for save in saves:
        phases = children(spans, save)
        assert set(phases) == SAVE_PHASES
        assert phases["ckpt.write"]["attributes"]["ckpt.bytes"] == data


def test_the_same_save_and_load_behave_the_same_without_ckptprof(tmp_path):
    """Files and bytes written, values loaded, and the framework's own errors: identical."""
    state = model_state()
    results = {}
    for variant in ("off", "on"):
        if variant == "on":
            traced_dcp.instrument(trace_dir=tmp_path / "traces")
        try:
            folder = tmp_path / variant
            dcp.save(state, checkpoint_id=folder, no_dist=True)
            target = zeros_like(state)
            dcp.load(target, checkpoint_id=folder, no_dist=True)
            assert_equal(target, state)
            with pytest.raises(BaseException) as caught:  # DCP raises a BaseException
                dcp.load(zeros_like(state), checkpoint_id=tmp_path / "missing", no_dist=True)
        finally:
            traced_dcp.uninstrument()
        names = sorted(p.name for p in folder.iterdir())
        data = {p.name: p.read_bytes() for p in folder.glob("*.distcp")}
        # DCP's message carries the remote traceback (frames differ); its error is the end
        error = (type(caught.value), str(caught.value).strip().splitlines()[-1])
        results[variant] = (names, data, error)
    assert results["on"] == results["off"]
    assert not (tmp_path / "on" / "ckptprof-manifest.json").exists()


def test_an_fsspec_url_is_saved_and_loaded_where_dcp_would(tmp_path, monkeypatch):
    """``checkpoint_id="memory://…"`` without a storage: DCP's own fsspec writer and reader,
    never a local folder named after the URL. The user info in the URL reaches no span."""
    fsspec = pytest.importorskip("fsspec")
    monkeypatch.chdir(tmp_path)
    url = "memory://me:s3cr3t@bucket/ckpt"  # fsspec's memory filesystem: a remote store
    state = model_state()
    traced_dcp.instrument(trace_dir=tmp_path / "traces")
    try:
        dcp.save(state, checkpoint_id=url, no_dist=True)
        target = zeros_like(state)
        dcp.load(target, checkpoint_id=url, no_dist=True)
    finally:
        traced_dcp.uninstrument()
    memory = fsspec.filesystem("memory")
    try:
        assert memory.exists("me:s3cr3t@bucket/ckpt/.metadata")
        assert_equal(target, state)
        assert {p.name for p in tmp_path.iterdir()} <= {"ckptprof-state", "traces"}
        spans = spans_in(tmp_path / "traces")
        (restore,) = [s for s in spans if s["name"] == "ckpt.restore"]
        assert restore["attributes"]["ckpt.dcp.storage"] == "FsspecReader"
        assert restore["attributes"]["ckpt.path"] == "memory://bucket/ckpt"
        assert set(children(spans, restore)) == LOADED - {"ckpt.verify"}  # local folders only
        for trace_file in (tmp_path / "traces").glob("*.jsonl"):
            assert "s3cr3t" not in trace_file.read_text()
    finally:
        memory.rm("me:s3cr3t@bucket", recursive=True)


def test_a_wrapped_reader_is_left_as_it_was(tmp_path):
    state = model_state()
    dcp.save(state, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    reader = FileSystemReader(tmp_path / "ckpt")
    fs = reader.fs
    session = traced_dcp.TracingSession("dcp", trace_dir=tmp_path / "traces")
    try:
        wrapped = traced_dcp.TracedStorageReader(reader, session)
        target = zeros_like(state)
        dcp.load(target, storage_reader=wrapped, no_dist=True)
    finally:
        session.close()
    assert_equal(target, state)
    assert reader.fs is fs  # swapped for read_data only, and put back
    assert wrapped.path == reader.path  # everything else is the reader's own
    (restore,) = [s for s in spans_in(tmp_path / "traces") if s["name"] == "ckpt.restore"]
    assert set(children(spans_in(tmp_path / "traces"), restore)) == LOADED


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(nproc), str(JOB), *args]  # fmt: skip
    env = {**os.environ, **LOOPBACK_ENV}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def saved_by_two(tmp_path_factory):
    root = tmp_path_factory.mktemp("dcp-2")
    done = torchrun(2, "save", str(root / "ckpt"), str(root / "save-traces"))
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def test_two_ranks_save_each_its_own_shards(saved_by_two):
    spans = spans_in(saved_by_two / "save-traces")
    saves = {s["attributes"]["ckpt.rank"]: s for s in spans if s["name"] == "ckpt.save"}
    assert sorted(saves) == [0, 1]
    assert set(children(spans, saves[0])) == SAVE_PHASES  # the coordinator commits
    assert set(children(spans, saves[1])) == SAVE_PHASES - {"ckpt.commit"}
    for save in saves.values():
        write = children(spans, save)["ckpt.write"]["attributes"]
        assert write["ckpt.bytes"] > 0 and write["ckpt.files"] == 1  # its own .distcp


@pytest.mark.parametrize("nproc", [1, 3])
def test_saved_by_two_restored_by_another_world_size(nproc, saved_by_two, tmp_path):
    """Each rank's restore reads only the saved items its rows overlap, and reshards them
    into its own rows; the job checks every value (tests/dcp_job.py)."""
    done = torchrun(nproc, "load", str(saved_by_two / "ckpt"), str(tmp_path / "traces"))
    assert done.returncode == 0, done.stderr[-3000:]
    spans = spans_in(tmp_path / "traces")
    restores = [s for s in spans if s["name"] == "ckpt.restore"]
    assert sorted(s["attributes"]["ckpt.rank"] for s in restores) == list(range(nproc))
    data = sum(p.stat().st_size for p in (saved_by_two / "ckpt").glob("*.distcp"))
    fetched = 0
    for restore in restores:
        phases = children(spans, restore)
        assert set(phases) == LOADED
        fetched += phases["ckpt.fetch"]["attributes"]["ckpt.bytes"]
    assert fetched >= data  # together the ranks read every saved item at least once
