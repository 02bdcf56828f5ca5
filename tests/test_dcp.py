"""ckptprof.integrations.dcp with real torch.distributed.checkpoint: dcp.save / dcp.load /
dcp.async_save in one process, and row-sharded DTensor state saved by 2 gloo ranks and
restored by 1, 2 and 3 (a reshard), each load checked value by value."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
import time
import warnings
from datetime import datetime
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from ckptprof.integrations import dcp as traced_dcp
from ckptprof.tracing.watchdog import watchdog
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


def tensor_bytes(tree) -> int:
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    if isinstance(tree, list):
        return sum(tensor_bytes(v) for v in tree)
    return tree.numel() * tree.element_size() if isinstance(tree, torch.Tensor) else 0


def async_pair(spans: list[dict], folder) -> tuple[dict, dict]:
    """The blocking ``ckpt.save`` of the async save into ``folder`` and its background one."""
    saves = [
        s for s in spans
        if s["name"] == "ckpt.save" and s["attributes"].get("ckpt.path") == str(folder)
    ]  # fmt: skip
    blocking = [s for s in saves if not s["attributes"].get("ckpt.save.background")]
    background = [s for s in saves if s["attributes"].get("ckpt.save.background")]
    assert (len(blocking), len(background)) == (1, 1), [s["attributes"] for s in saves]
    return blocking[0], background[0]


def seconds(timestamp: str) -> float:
    """A span's ISO-8601 UTC time as seconds since the epoch (what ``time.time()`` says)."""
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def settled(timeout_s: float = 10.0) -> bool:
    """Whether every ckptprof operation has ended (waiting ``timeout_s`` at most): an
    upload future's callbacks, which end the background save, run after ``result()``."""
    deadline = time.monotonic() + timeout_s
    while (watchdog().watched() or ckptprof_threads()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not watchdog().watched() and not ckptprof_threads()


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
        assert settled()
    finally:
        traced_dcp.uninstrument()
    assert (dcp.load, dcp.save, dcp.async_save) == original  # put back exactly
    spans = spans_in(tmp_path / "traces")
    (restore,) = [s for s in spans if s["name"] == "ckpt.restore"]
    saves = [s for s in spans if s["name"] == "ckpt.save"]
    assert len(saves) == 3  # the save, and the async save's blocking and background parts
    phases = children(spans, restore)
    assert set(phases) == LOADED
    data = sum(p.stat().st_size for p in (tmp_path / "ckpt").glob("*.distcp"))
    assert phases["ckpt.fetch"]["attributes"]["ckpt.bytes"] >= data  # every item's bytes
    assert restore["attributes"]["ckpt.framework"] == "dcp"
    assert restore["attributes"]["ckpt.path"] == str(tmp_path / "ckpt")
    assert restore["attributes"]["ckpt.memory.peak_rss_bytes"] > 0
    (synchronous,) = [s for s in saves if s["attributes"]["ckpt.path"] == str(tmp_path / "ckpt")]
    blocking, background = async_pair(spans, tmp_path / "async")
    assert set(children(spans, blocking)) == {"ckpt.stage"}
    for save in (synchronous, background):
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


def test_two_ranks_async_save_each_a_blocking_and_a_background_save(tmp_path):
    """Under torchrun (2 gloo ranks), each rank's async_save is its own pair: the blocking
    part (the job's world size) and its background save, linked to it, writing its own
    shard; only the coordinator's commits (the other's ends with its write)."""
    done = torchrun(2, "async", str(tmp_path / "ckpt"), str(tmp_path / "traces"))
    assert done.returncode == 0, done.stderr[-3000:]
    spans = spans_in(tmp_path / "traces")
    for rank in (0, 1):
        mine = [s for s in spans if s["attributes"].get("ckpt.rank") == rank]
        blocking, background = async_pair(mine, tmp_path / "ckpt")
        assert blocking["attributes"]["ckpt.world_size"] == 2
        (stage,) = children(spans, blocking).values()
        # this rank's rows of each Shard(0) tensor (tests/dcp_job.py), float32
        assert stage["name"] == "ckpt.stage"
        assert stage["attributes"]["ckpt.bytes"] == (48 * 48 + 36 * 48 + 24) * 4
        [link] = background["links"]
        assert link["context"]["span_id"] == blocking["context"]["span_id"]
        phases = children(spans, background)
        assert set(phases) == (SAVE_PHASES if rank == 0 else SAVE_PHASES - {"ckpt.commit"})
        assert phases["ckpt.write"]["attributes"]["ckpt.files"] == 1  # its own .distcp
        assert background["status"]["status_code"] != "ERROR"


# ------------------------------------------------- storages and paths DCP allows for
class OldWriter(FileSystemWriter):
    """A writer written against the signatures before ``rank=`` / ``use_collectives=``."""

    def set_up_storage_writer(self, is_coordinator):
        super().set_up_storage_writer(is_coordinator)


class OldReader(FileSystemReader):
    def read_metadata(self):
        return super().read_metadata()

    def set_up_storage_reader(self, metadata, is_coordinator):
        super().set_up_storage_reader(metadata, is_coordinator)


def test_a_storage_with_the_older_signatures_is_called_as_dcp_would_call_it(tmp_path):
    """DCP passes ``rank=`` / ``use_collectives=`` only to methods whose signature has
    ``**kwargs``: the wrappers show the storage's own signatures, and forward nothing
    more — the same values and the same error (no second metadata read) as without."""
    state = model_state()
    results = {}
    for variant in ("off", "on"):
        if variant == "on":
            traced_dcp.instrument(trace_dir=tmp_path / "traces")
        try:
            dcp.save(state, storage_writer=OldWriter(tmp_path / variant), no_dist=True)
            target = zeros_like(state)
            dcp.load(target, storage_reader=OldReader(tmp_path / variant), no_dist=True)
            assert_equal(target, state)
            with pytest.raises(BaseException) as caught:
                dcp.load(zeros_like(state), storage_reader=OldReader(tmp_path / "no"), no_dist=True)
        finally:
            traced_dcp.uninstrument()
        results[variant] = (type(caught.value), str(caught.value).strip().splitlines()[-1])
    assert results["on"] == results["off"]
    assert "rank local metadata" not in results["on"][1]
    spans = spans_in(tmp_path / "traces")
    assert {s["name"] for s in spans} >= {"ckpt.save", "ckpt.restore"}


def test_a_traced_storage_pickles_as_the_bare_storage(tmp_path):
    session = traced_dcp.TracingSession("dcp", trace_dir=tmp_path / "traces")
    try:
        writer = traced_dcp.TracedStorageWriter(FileSystemWriter(tmp_path / "w"), session)
        reader = traced_dcp.TracedStorageReader(FileSystemReader(tmp_path / "r"), session)
        assert type(pickle.loads(pickle.dumps(writer))) is FileSystemWriter
        assert type(pickle.loads(pickle.dumps(reader))) is FileSystemReader
    finally:
        session.close()


PROCESS_SAVE = """
import os, sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from ckptprof.integrations import dcp as traced_dcp
base, variant, port = sys.argv[1:]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
if variant == "on":
    traced_dcp.instrument(trace_dir=os.path.join(base, "traces"))
try:
    future = dcp.async_save({"w": torch.arange(64.0)}, checkpoint_id=os.path.join(base, variant),
                            async_checkpointer_type=AsyncCheckpointerType.PROCESS)
    print("RESULT", type(future.result()).__name__, flush=True)
except BaseException as exc:
    print("RESULT", type(exc).__name__, exc, flush=True)
finally:
    traced_dcp.uninstrument()
os._exit(0)  # DCP's checkpoint process is a daemon: no orderly shutdown to wait for
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_process_based_async_save_works_as_without_ckptprof(tmp_path):
    """``AsyncCheckpointerType.PROCESS`` pickles the writer into DCP's checkpoint
    process: the call is DCP's own (untraced), and saves the same files."""
    results = {}
    for variant in ("off", "on"):
        command = [sys.executable, "-c", PROCESS_SAVE, str(tmp_path), variant, str(free_port())]
        env = {**os.environ, **LOOPBACK_ENV}
        cwd = Path(__file__).parent.parent
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=240, cwd=cwd
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
        folder = tmp_path / variant
        results[variant] = (
            lines,
            sorted(p.name for p in folder.iterdir()) if folder.is_dir() else None,
        )
    assert results["on"] == results["off"] == (["RESULT Metadata"], [".metadata", "__0_0.distcp"])


def test_async_save_stages_with_the_writers_own_stager(tmp_path, monkeypatch):
    """``async_save`` stages with ``storage_writer`` when it is an ``AsyncStager``
    (``FileSystemWriter.stage``), and with a ``DefaultStager`` when only a checkpoint id
    is given: the same choice, and the same return type, with ckptprof."""
    from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager

    called = []
    for cls in (FileSystemWriter, DefaultStager):
        original = cls.stage

        def spy(self, *args, _original=original, _name=cls.__name__, **kwargs):
            called.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "stage", spy)
    state = model_state()
    results = {}
    for variant in ("off", "on"):
        if variant == "on":
            traced_dcp.instrument(trace_dir=tmp_path / "traces")
        try:
            writer = FileSystemWriter(tmp_path / variant / "writer")
            given = dcp.async_save(state, storage_writer=writer, no_dist=True)
            given.result()
            by_id = dcp.async_save(state, checkpoint_id=tmp_path / variant / "id", no_dist=True)
            by_id.result()
            assert settled()
        finally:
            traced_dcp.uninstrument()
        results[variant] = (list(called), type(given), type(by_id))
        called.clear()
    assert results["off"][0] == ["FileSystemWriter", "DefaultStager"]
    assert results["on"] == results["off"]
    spans = spans_in(tmp_path / "traces")
    assert len([s for s in spans if s["name"] == "ckpt.save"]) == 4  # 2 blocking, 2 background
    for folder, stager in (("writer", "FileSystemWriter"), ("id", "DefaultStager")):
        blocking, _ = async_pair(spans, tmp_path / "on" / folder)
        stage = children(spans, blocking)["ckpt.stage"]["attributes"]
        assert stage["ckpt.stage.stager"] == stager
    session = traced_dcp.TracingSession("dcp", trace_dir=tmp_path / "more-traces")
    try:
        traced = traced_dcp.TracedStorageWriter(FileSystemWriter(tmp_path / "w"), session)
        assert isinstance(traced, AsyncStager)
        assert traced.should_synchronize_after_execute == writer.should_synchronize_after_execute
    finally:
        session.close()


def ckptprof_threads() -> set[str]:
    names = {"ckptprof-memory", "ckptprof-watchdog"}
    return {t.name for t in threading.enumerate() if t.name in names and t.is_alive()}


def test_a_failed_load_or_save_ends_its_operation_with_dcps_error(tmp_path):
    """A load of a missing checkpoint, a save whose folder cannot be made (in set-up,
    before any write), and the same save in the background: each operation ends, with
    the error, and its memory sampler and watchdog stop; DCP's exception is raised as is."""
    (tmp_path / "file").write_text("x")
    instrumentor = traced_dcp.instrument(trace_dir=tmp_path / "traces")
    session = instrumentor.session
    try:
        with pytest.raises(BaseException) as load_error:
            dcp.load({"w": torch.zeros(4)}, checkpoint_id=tmp_path / "missing", no_dist=True)
        assert session.restore_op is None
        with pytest.raises(BaseException) as save_error:
            dcp.save({"w": torch.zeros(4)}, checkpoint_id=tmp_path / "file" / "a", no_dist=True)
        synchronous = session.last_save  # the failed save's summary
        assert synchronous is not None
        future = dcp.async_save(
            {"w": torch.zeros(4)}, checkpoint_id=tmp_path / "file" / "b", no_dist=True
        )
        with pytest.raises(BaseException) as async_error:
            future.result()
        assert settled()  # the future's callbacks run after result() returns
        assert session.save_op is None
        # a load that fails inside read_data: DCP wraps the reader's error
        dcp.save({"w": torch.arange(64.0)}, checkpoint_id=tmp_path / "cut", no_dist=True)
        for shard in (tmp_path / "cut").glob("*.distcp"):
            with open(shard, "r+b") as handle:
                handle.truncate(100)
        with pytest.raises(BaseException) as cut_error:
            dcp.load({"w": torch.zeros(64)}, checkpoint_id=tmp_path / "cut", no_dist=True)
        assert ckptprof_threads() == set()
    finally:
        traced_dcp.uninstrument()
    assert "missing" in str(load_error.value)
    assert "Not a directory" in str(save_error.value) and "Not a directory" in str(
        async_error.value
    )
    spans = spans_in(tmp_path / "traces")
    ended = [s for s in spans if s["name"] in ("ckpt.restore", "ckpt.save")
             and s["status"]["status_code"] == "ERROR"]  # fmt: skip
    assert sorted(s["name"] for s in ended) == ["ckpt.restore"] * 2 + ["ckpt.save"] * 2
    # each failed operation carries the error its caller got (not the one DCP wrapped)
    cut = next(s for s in ended if str(tmp_path / "cut") in json.dumps(s["attributes"]))
    assert cut["status"]["description"].startswith(type(cut_error.value).__name__), cut["status"]
    blocking, background = async_pair(spans, tmp_path / "file" / "b")
    assert blocking["status"]["status_code"] != "ERROR"  # async_save returned: it staged
    assert background["status"]["status_code"] == "ERROR"


# ------------------------------------------------- async_save: what blocks, what goes on
class SlowWriter(FileSystemWriter):
    """DCP's own writer on a slower storage: the save goes on well after async_save returns."""

    def write_data(self, plan, planner):
        time.sleep(0.3)
        return super().write_data(plan, planner)


class FullDiskWriter(FileSystemWriter):
    """DCP's own writer on a storage that fails while the save writes."""

    def write_data(self, plan, planner):
        raise OSError(28, "No space left on device (injected)")


@pytest.mark.parametrize("storage", ["checkpoint_id", "writer", "traced writer"])
def test_an_async_save_is_what_blocks_and_a_linked_background_save(storage, tmp_path):
    """As every async save is recorded: a ``ckpt.save`` that ends when ``async_save``
    returns (``stage``: the state copied by the stager, its bytes), and a background
    ``ckpt.save`` linked to it with the planning, the write of the checkpoint's bytes and
    the commit, ending after it (with DCP's default stager, and with the writer's own)."""
    state = model_state()
    folder = tmp_path / "ckpt"
    where = {"checkpoint_id": folder} if storage == "checkpoint_id" else {}
    if storage != "checkpoint_id":
        where["storage_writer"] = SlowWriter(folder)
    traced_dcp.instrument(trace_dir=tmp_path / "traces")
    if storage == "traced writer":  # wrapped by the caller (it was one save, not two)
        where["storage_writer"] = traced_dcp.TracedStorageWriter(where["storage_writer"])
    try:
        called = time.time()
        future = dcp.async_save(state, no_dist=True, **where)
        returned = time.time()
        assert type(future.result()).__name__ == "Metadata"
        assert settled()
    finally:
        traced_dcp.uninstrument()
    spans = spans_in(tmp_path / "traces")
    blocking, background = async_pair(spans, folder)
    attrs, bg_attrs = blocking["attributes"], background["attributes"]
    assert attrs["ckpt.framework"] == bg_attrs["ckpt.framework"] == "dcp"
    assert attrs["ckpt.strategy"] == bg_attrs["ckpt.strategy"] == "async"
    assert attrs["ckpt.world_size"] == 1 and "ckpt.save.background" not in attrs
    [link] = background["links"]
    assert link["context"]["span_id"] == blocking["context"]["span_id"]
    phases, bg_phases = children(spans, blocking), children(spans, background)
    assert set(phases) == {"ckpt.stage"} and set(bg_phases) == SAVE_PHASES
    stage = phases["ckpt.stage"]["attributes"]
    assert stage["ckpt.bytes"] == tensor_bytes(state)  # what the stager copied
    assert stage["ckpt.stage.stager"] == (
        "DefaultStager" if "checkpoint_id" in where else "SlowWriter"
    )
    data = sum(p.stat().st_size for p in folder.glob("*.distcp"))
    assert bg_phases["ckpt.write"]["attributes"]["ckpt.bytes"] == data
    # the blocking part is the call: it ends as async_save returns, before the save does
    tick = 1e-5  # the spans' microseconds
    assert called - tick <= seconds(blocking["start_time"])
    assert seconds(blocking["end_time"]) <= returned + tick
    assert seconds(phases["ckpt.stage"]["end_time"]) <= seconds(blocking["end_time"])
    assert seconds(blocking["start_time"]) <= seconds(background["start_time"])
    assert seconds(blocking["end_time"]) <= seconds(background["end_time"])
    if storage != "checkpoint_id":  # a write slower than the call: under way after it returned
        assert seconds(bg_phases["ckpt.write"]["end_time"]) > returned
    for span in (blocking, background):
        assert span["status"]["status_code"] != "ERROR"


def test_an_async_save_that_fails_in_the_background_fails_its_background_save(tmp_path):
    """A write that fails after ``async_save`` returned: the background save carries the
    error (DCP's, from the upload future, as without ckptprof), the blocking part does
    not, and nothing stays open. A stager that fails fails the call and the blocking
    part, and no background save begins."""
    from torch.distributed.checkpoint.staging import AsyncStager

    class BrokenStager(AsyncStager):
        def stage(self, state_dict):
            raise RuntimeError("no host memory to stage into (injected)")

        def synchronize_staging(self) -> None:
            pass

        def close(self) -> None:
            pass

    state = model_state()
    results = {}
    for variant in ("off", "on"):
        if variant == "on":
            session = traced_dcp.instrument(trace_dir=tmp_path / "traces").session
        try:
            future = dcp.async_save(
                state, storage_writer=FullDiskWriter(tmp_path / variant / "full"), no_dist=True
            )
            with pytest.raises(BaseException) as write_error:
                future.result()
            with pytest.raises(RuntimeError) as stage_error:
                dcp.async_save(
                    state, checkpoint_id=tmp_path / variant / "staged", no_dist=True,
                    async_stager=BrokenStager(),
                )  # fmt: skip
            assert settled()
            if variant == "on":
                assert session.save_op is None
        finally:
            traced_dcp.uninstrument()
        results[variant] = [
            (type(e.value), str(e.value).strip().splitlines()[-1])
            for e in (write_error, stage_error)
        ]
    assert results["on"] == results["off"]
    assert "No space left on device" in str(results["on"][0])
    spans = spans_in(tmp_path / "traces")
    blocking, background = async_pair(spans, tmp_path / "on" / "full")
    assert blocking["status"]["status_code"] != "ERROR"
    assert background["status"]["status_code"] == "ERROR"
    assert "No space left on device" in background["status"]["description"]
    assert "ckpt.write" in children(spans, background)
    staged = [
        s for s in spans if s["attributes"].get("ckpt.path") == str(tmp_path / "on" / "staged")
    ]
    assert [s["name"] for s in staged] == ["ckpt.save"]  # the blocking part alone
    assert staged[0]["status"]["status_code"] == "ERROR"
    assert "no host memory" in staged[0]["status"]["description"]
    assert ckptprof_threads() == set()


def test_the_report_shows_an_async_save_as_its_blocking_part_and_its_background_save(tmp_path):
    """``ckptprof report`` of async saves: one row of what blocked the training (stage,
    the async strategy's), one of the background saves (planning, write, commit), as for
    Lightning's async saves; the goodput's save blocking is the blocking part alone."""
    from ckptprof.report import aggregate, load, render_text
    from ckptprof.report.goodput import build_goodput

    state = model_state()
    traced_dcp.instrument(trace_dir=tmp_path / "traces")
    try:
        for n in range(2):
            dcp.async_save(
                state, storage_writer=SlowWriter(tmp_path / f"ckpt-{n}"), no_dist=True
            ).result()
        assert settled()
    finally:
        traced_dcp.uninstrument()
    report = aggregate(load([tmp_path / "traces"]))
    saves = {"world_size" in g.config: g for g in report.groups if g.kind == "save"}
    assert len([g for g in report.groups if g.kind == "save"]) == 2
    blocking, background = saves[True], saves[False]
    for group in (blocking, background):
        assert group.config["strategy"] == "async" and group.breakdown.repeats == 2
        assert group.failed == 0
    rows = {p.phase: p for p in blocking.breakdown.phases if p.busy_s}
    bg_rows = {p.phase: p for p in background.breakdown.phases if p.busy_s}
    assert set(rows) == {"stage"} and {"write", "commit"} <= set(bg_rows)
    assert rows["stage"].nbytes == tensor_bytes(state)
    data = sum(p.stat().st_size for p in (tmp_path / "ckpt-0").glob("*.distcp"))
    assert bg_rows["write"].nbytes == data
    # the background save took its write's 0.3 s; the blocking part, the copy
    assert blocking.breakdown.wall_median_s < 0.3 <= background.breakdown.wall_median_s
    text = render_text(report)
    assert "save: framework=dcp format=dcp strategy=async world_size=1" in text
    assert "save: framework=dcp format=dcp strategy=async background=True\n" in text
    spans = spans_in(tmp_path / "traces")
    [lifetime] = build_goodput(spans).lifetimes
    walls = [
        s["attributes"]["ckpt.wall_s"] for s in spans
        if s["name"] == "ckpt.save" and not s["attributes"].get("ckpt.save.background")
    ]  # fmt: skip
    assert len(walls) == 2
    assert lifetime.buckets["save_blocking"] == pytest.approx(sum(walls))


def test_an_async_save_still_running_at_uninstrument_ends_marked_and_goes_on(tmp_path):
    """``uninstrument()`` before the upload future completed: the background save ends
    then, marked as not seen to complete (no operation left open, no span lost), and
    DCP's save goes on and completes as it would."""
    traced_dcp.instrument(trace_dir=tmp_path / "traces")
    try:
        future = dcp.async_save(
            {"w": torch.arange(64.0)}, storage_writer=SlowWriter(tmp_path / "ckpt"), no_dist=True
        )
    finally:
        traced_dcp.uninstrument()
    assert not watchdog().watched() and ckptprof_threads() == set()
    assert type(future.result()).__name__ == "Metadata"
    assert (tmp_path / "ckpt" / ".metadata").exists()
    blocking, background = async_pair(spans_in(tmp_path / "traces"), tmp_path / "ckpt")
    assert blocking["status"]["status_code"] != "ERROR"
    assert background["status"]["status_code"] == "ERROR"
    assert "before this async save completed" in background["status"]["description"]


def test_a_bug_in_ckptprof_during_an_async_save_is_one_warning_and_the_save_goes_on(
    tmp_path, monkeypatch, caplog
):
    """ckptprof's own failures around async_save (here: naming the stager, counting the
    staged bytes) are one warning each, however many saves; DCP saves and returns as
    without ckptprof, and every operation that began ends."""
    from ckptprof.integrations import dcp_async

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in ckptprof (injected)")

    monkeypatch.setattr(dcp_async, "_stager", broken)
    monkeypatch.setattr(dcp_async, "_tensor_bytes", broken)
    traced_dcp.instrument(trace_dir=tmp_path / "traces")
    try:
        for n in range(2):
            future = dcp.async_save(model_state(), checkpoint_id=tmp_path / f"c{n}", no_dist=True)
            assert type(future.result()).__name__ == "Metadata"
        assert settled()
    finally:
        traced_dcp.uninstrument()
    warned = [r.getMessage() for r in caplog.records if "injected" in r.getMessage()]
    assert len(warned) == 2, warned  # one per kind of failure
    for n in range(2):
        assert (tmp_path / f"c{n}" / ".metadata").exists()
        blocking, background = async_pair(spans_in(tmp_path / "traces"), tmp_path / f"c{n}")
        assert blocking["status"]["status_code"] != "ERROR"
        assert background["status"]["status_code"] != "ERROR"
