"""``synth save`` in this process, checked against what the save did not produce: each
file read back by its format's own loader and compared with the state the save was
given, the ``fsync`` calls the kernel was asked for, the writes in flight at once, and
the watchdog's warning while a write is held."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from ckptprof.atomic import PARTIAL_SUFFIX, partial_path
from ckptprof.errors import CkptprofError
from ckptprof.manifest import GENERATING_NAME, MANIFEST_NAME
from ckptprof.phases import Attr
from ckptprof.storage import PosixStorage
from ckptprof.synth.generate import entry_of
from ckptprof.synth.layouts import get_layout
from ckptprof.synth.options import SaveOptions
from ckptprof.synth.plan import SynthSpec
from ckptprof.synth.ranges import LAYOUTS
from ckptprof.synth.save import build_state, run_save
from ckptprof.synth.savers import get_saver
from ckptprof.synth.savers import registry as saver_registry
from ckptprof.tracing import CheckpointTracer, setup_telemetry
from tests.conftest import TINY_SCALE, spans_in
from tests.test_synth import saved_state


def accepted(layout: str, strategy: str, object_store: bool = False) -> bool:
    try:
        get_saver(strategy).check(layout, object_store)
    except CkptprofError as refused:
        assert "\n" not in str(refused) and f"--strategy {strategy}" in str(refused)
        return False
    return True


#: every strategy each layout saves with on a local disk, from the savers' own rules (DCP's
#: parallel is refused: DCP lays out its files)
SAVES = [(lay, name) for lay in LAYOUTS for name in saver_registry.NAMES if accepted(lay, name)]


def test_every_layout_has_a_default_writer_on_every_storage_and_each_saver_a_layout():
    assert {name for _, name in SAVES} == set(saver_registry.NAMES)
    for layout in LAYOUTS:
        assert accepted(layout, saver_registry.default_strategy(layout))
        if layout != "dcp":  # DCP writes through its own writer: local or mounted paths
            assert accepted(layout, saver_registry.default_strategy(layout), object_store=True)


def save_here(dest: Path, layout: str, strategy: str, traces: Path, **options):
    """One untimed-probe save of the tiny preset into ``dest``, in this process."""
    spec = SynthSpec("llama2-7b", layout, TINY_SCALE, files=options.pop("files", None))
    telemetry = setup_telemetry(traces)
    stall_after_s = options.pop("stall_after_s", None)
    try:
        tracer = CheckpointTracer(telemetry.provider, stall_after_s=stall_after_s)
        opts = SaveOptions(repeat=1, strategy=strategy, ceiling_gbps=1.0, progress=False,
                           stall_after_s=stall_after_s, **options)  # fmt: skip
        run_save(str(dest), spec, opts, tracer, echo=lambda *_: None)
    finally:
        telemetry.shutdown()
    return spec


@pytest.mark.parametrize("layout, strategy", SAVES)
def test_the_saved_files_hold_the_state_the_save_was_given(layout, strategy, tmp_path):
    """Read by the format's own loader (torch.load, safetensors, DCP's reader, DeepSpeed's
    merge), every tensor of every group is byte for byte the one the save built."""
    dest = tmp_path / "ckpt"
    # the parallel writer's request shape: parts smaller than the files (the others write
    # as their frameworks do, and the shape would do nothing there)
    shape = {"concurrency": 4, "part_size": 256 << 10} if strategy == "parallel" else {}
    spec = save_here(dest, layout, strategy, tmp_path / "traces", **shape)
    saved = dcp_flat_saved(dest, tmp_path) if layout == "dcp" else saved_state(dest, tmp_path)
    given = build_state(get_layout(layout).plan(spec), spec.seed)  # the same seed: the same
    names = [t.name for t in spec.preset().tensors()]  # the model's parameter order
    for piece, tensor in given.items():
        if piece.name.startswith("__flat_"):  # ZeRO's flat fp32 partition of a whole group
            whole = torch.cat([saved[piece.group, n].flatten() for n in names])
            assert torch.equal(tensor[: whole.numel()], whole), piece
            continue
        rows = saved.pop((piece.group, piece.name))
        rows = rows[piece.row_start : piece.row_end] if rows.dim() else rows
        assert rows.dtype == tensor.dtype and torch.equal(rows, tensor), piece
    assert not [k for k in saved if k[0] == "model"]  # and every saved tensor was compared
    manifest = json.loads((dest / MANIFEST_NAME).read_text())["files"]
    on_disk = {p: vars(entry_of(dest / p)) for p in manifest}
    assert manifest == on_disk  # a parallel save's: hashed from what its writer was given


def dcp_flat_saved(path: Path, scratch: Path) -> dict:
    """DCP's own reader (dcp_to_torch_save, then torch.load) of a save of the flat state
    dict (``model.<name>``, ``optim.state.<name>.<moment>``), by ``(group, name)``."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = scratch / "dcp-whole.pt"
    dcp_to_torch_save(str(path), str(whole))
    saved = {}
    for key, tensor in torch.load(whole, weights_only=True).items():
        if key.startswith("model."):
            saved["model", key.removeprefix("model.")] = tensor
        else:
            name, group = key.removeprefix("optim.state.").rsplit(".", 1)
            saved[group, name] = tensor
    return saved


def fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.mark.parametrize("layout, strategy", [("torch", "framework"), ("safetensors", "parallel")])
def test_every_file_and_its_folder_is_fsynced_before_it_is_visible(
    layout, strategy, tmp_path, monkeypatch
):
    """The kernel is asked to sync each file under its temporary name (before the rename
    makes it visible), then each folder the files were renamed into, before the manifest
    says the checkpoint is complete."""
    synced: list[str] = []
    real = os.fsync

    def observed(fd):
        synced.append(fd_path(fd))
        return real(fd)

    monkeypatch.setattr(os, "fsync", observed)
    dest = tmp_path / "ckpt"
    spec = save_here(dest, layout, strategy, tmp_path / "traces")
    files = [dest / f.path for f in get_layout(layout).plan(spec).files]
    partials = [str(partial_path(f)) for f in files]
    folders = {str(f.parent) for f in files}
    assert set(partials) <= set(synced), synced
    assert folders <= set(synced), synced
    last_file = max(synced.index(p) for p in partials)
    manifest = next(i for i, p in enumerate(synced) if MANIFEST_NAME in p)
    for folder in folders:  # in the save's commit: after its files, before the manifest
        assert folder in synced[last_file:manifest], (folder, synced)


def test_the_parallel_writers_fsyncs_run_at_its_concurrency_and_a_failed_one_is_named(
    tmp_path, monkeypatch
):
    """Each file is forced to the device ``concurrency`` at a time under its temporary name
    (one file's wait hides the next's); a failed fsync is one line naming its file, the
    fsyncs not started are not run, and nothing is renamed into place."""
    in_flight, most, started = 0, 0, []
    lock = threading.Lock()
    real = os.fsync
    failing = {"on": False}

    def observed(fd):
        nonlocal in_flight, most
        path = fd_path(fd)
        if not (path.endswith(PARTIAL_SUFFIX) and "/checkpoint_" in path):
            return real(fd)  # a folder's in the commit, ckptprof's own marker or manifest
        with lock:
            started.append(path)
            nth = len(started)
            in_flight += 1
            most = max(most, in_flight)
        try:
            if failing["on"] and nth == 3:
                time.sleep(0.05)
                raise OSError(errno.EIO, "Input/output error")
            time.sleep(0.2)  # a device's flush: long enough for the others to start
            return real(fd)
        finally:
            with lock:
                in_flight -= 1

    monkeypatch.setattr(os, "fsync", observed)
    save_here(tmp_path / "ok", "torch", "parallel", tmp_path / "t1", concurrency=4, files=12)
    assert len(started) == 12 and most == 4
    started.clear()
    failing["on"] = True
    dest = tmp_path / "failed"
    with pytest.raises(CkptprofError) as caught:
        save_here(dest, "torch", "parallel", tmp_path / "t2", concurrency=2, files=12)
    message = str(caught.value)
    assert "\n" not in message and "could not be written (" in message
    assert Path(message.split(":")[0]).name.startswith(Path(started[2]).name.split(".")[0])
    # the rest cancelled: the fourth ran beside the third, a thread took one more at most
    assert len(started) <= 3 + 1 + 2
    # no file of the checkpoint left, under any name: only the marker --force clears it by
    assert [p.name for p in dest.rglob("*") if p.is_file()] == [GENERATING_NAME]


@pytest.mark.parametrize("call", ["pwritev", "fsync"])
def test_a_second_ctrl_c_lets_the_parallel_writers_calls_under_way_end_first(
    call, tmp_path, monkeypatch, capfd
):
    """Ctrl-C while a file of the checkpoint is written (or forced to the device), and a
    second one while that call is under way: the save raises only once every call under
    way has ended, before the writers close their files (a write through a closed
    descriptor may land in whatever file took its number); the wait is said, and nothing
    is left but the marker. Each system call the parallel writer makes from its threads."""
    main, real = threading.main_thread().ident, getattr(os, call)
    calls, under_way, closed_under = [], [0], []
    lock = threading.Lock()

    def observed(fd, *args):
        path = fd_path(fd)
        if not (path.endswith(PARTIAL_SUFFIX) and "/checkpoint_" in path):
            return real(fd, *args)
        with lock:
            calls.append(path)
            under_way[0] += 1
            first = len(calls) == 1  # read under the lock: exactly one call is the first
        try:
            if first:
                signal.pthread_kill(main, signal.SIGINT)
                time.sleep(0.2)
                signal.pthread_kill(main, signal.SIGINT)  # the second, this call under way
            time.sleep(0.4)
            return real(fd, *args)
        except OSError as exc:
            if exc.errno == errno.EBADF:
                closed_under.append(path)
            raise
        finally:
            with lock:
                under_way[0] -= 1

    monkeypatch.setattr(os, call, observed)
    dest = tmp_path / "ckpt"
    with pytest.raises(KeyboardInterrupt):
        save_here(dest, "torch", "parallel", tmp_path / "t", concurrency=2, files=6)
    assert calls and under_way == [0] and closed_under == []
    assert "ckptprof: stopping once the " in capfd.readouterr().err
    assert [p.name for p in dest.rglob("*") if p.is_file()] == [GENERATING_NAME]


#: the layouts the parallel writer saves: each with --direct-io too
PARALLEL = [layout for layout, name in SAVES if name == "parallel"]


def saved_files(root: Path, read: bool = True) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() if read else b""
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }


@pytest.mark.parametrize("layout", PARALLEL)
def test_a_direct_io_save_writes_the_bytes_a_buffered_one_does(layout, tmp_path):
    """--direct-io stages every part in the window's aligned buffers, writes whole blocks
    with O_DIRECT and cuts the last block's padding off: the files are byte for byte the
    buffered writer's, and they did not go through the page cache."""
    for how in ("buffered", "direct"):
        save_here(tmp_path / how, layout, "parallel", tmp_path / f"traces-{how}", concurrency=4,
                  part_size=256 << 10, direct_io=how == "direct")  # fmt: skip
        (save,) = [s for s in spans_in(tmp_path / f"traces-{how}") if s["name"] == "ckpt.save"]
        assert save["attributes"][Attr.SAVE_DIRECT_IO] is (how == "direct")
    names = sorted(saved_files(tmp_path / "direct", read=False))
    cached = PosixStorage(str(tmp_path / "direct")).resident_fraction(names)  # before reading
    assert cached < 0.05, f"{cached:.0%} of the direct save's bytes are in the page cache"
    buffered, direct = saved_files(tmp_path / "buffered"), saved_files(tmp_path / "direct")
    assert buffered == direct
    assert any(len(data) % 4096 for data in direct.values())  # a padded last block, cut off


def test_a_direct_io_save_falls_back_where_the_filesystem_refuses_o_direct(tmp_path, monkeypatch):
    """A filesystem that refuses O_DIRECT answers EINVAL at open (FUSE mounts without it;
    tmpfs took it from Linux 6.6, so the refusal is injected at that one call here): the
    save writes buffered, the same bytes, and the storage stops asking."""
    from ckptprof.storage import posix

    real_open, refused = os.open, []

    def refusing(path, flags, *args):
        if flags & os.O_DIRECT:
            refused.append(path)
            raise OSError(errno.EINVAL, "Invalid argument", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(posix.os, "open", refusing)
    save_here(tmp_path / "direct", "torch", "parallel", tmp_path / "traces", direct_io=True)
    monkeypatch.undo()
    (save,) = [s for s in spans_in(tmp_path / "traces") if s["name"] == "ckpt.save"]
    assert save["attributes"][Attr.SAVE_DIRECT_IO] is False  # what was done, not what was asked
    save_here(tmp_path / "buffered", "torch", "parallel", tmp_path / "traces")
    assert len(refused) == 1  # the first file's open; the next ones go buffered at once
    assert saved_files(tmp_path / "direct") == saved_files(tmp_path / "buffered")


def test_a_parallel_save_keeps_its_concurrency_of_writes_in_flight(tmp_path, monkeypatch):
    """The first four pwritev calls into a ``--concurrency 4`` save's archive meet at a
    barrier: they pass it only if they are in flight together; never more than four."""
    meet = threading.Barrier(4, timeout=20)
    lock = threading.Lock()
    state = {"calls": 0, "flying": 0, "most": 0}
    real = os.pwritev

    def counted(fd, buffers, offset):
        if not fd_path(fd).startswith(str(archive)):
            return real(fd, buffers, offset)  # the small config.json: one part
        with lock:
            state["calls"] += 1
            first = state["calls"] <= 4
            state["flying"] += 1
            state["most"] = max(state["most"], state["flying"])
        try:
            if first:
                meet.wait()  # BrokenBarrierError: fewer than 4 writes were ever in flight
            return real(fd, buffers, offset)
        finally:
            with lock:
                state["flying"] -= 1

    archive = tmp_path / "ckpt" / "checkpoint_rank0.pt"
    monkeypatch.setattr(os, "pwritev", counted)
    save_here(tmp_path / "ckpt", "torch", "parallel", tmp_path / "traces", concurrency=4,
              part_size=256 << 10)  # fmt: skip
    assert state["calls"] > 4 and state["most"] == 4, state
    [write] = [s for s in spans_in(tmp_path / "traces") if s["name"] == "ckpt.write"]
    assert write["attributes"][Attr.CONCURRENCY] == 4


def test_a_held_write_is_named_as_a_stalled_save_with_doubling_intervals(
    tmp_path, monkeypatch, caplog
):
    """A parallel save's writes into its archive held (the storage answers nothing): the
    watchdog names the save, the write phase and the file, and warns again only after
    twice the idle time, saying so; released, the save ends well."""
    stall_after = 0.5
    release = threading.Event()
    archive = tmp_path / "ckpt" / "checkpoint_rank0.pt"
    real = os.pwritev

    def held(fd, buffers, offset):
        if fd_path(fd).startswith(str(archive)):
            release.wait(60)
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", held)
    caplog.set_level(logging.WARNING, logger="ckptprof")
    failed: list[BaseException] = []

    def saving():
        try:
            save_here(tmp_path / "ckpt", "torch", "parallel", tmp_path / "traces",
                      stall_after_s=stall_after)  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - said by the test below
            failed.append(exc)

    thread = threading.Thread(target=saving)
    thread.start()
    try:
        for _ in range(600):  # two warnings: stall_after, then twice that, and ticks
            if len([r for r in caplog.records if "stalled" in r.getMessage()]) >= 2:
                break
            release.wait(0.05)
    finally:
        release.set()
        thread.join(60)
    assert not failed and not thread.is_alive(), failed
    warnings = [r.getMessage().splitlines()[0] for r in caplog.records
                if "stalled" in r.getMessage()]  # fmt: skip
    assert len(warnings) >= 2
    assert warnings[0].startswith("ckptprof: warning: save stalled in write: no progress")
    assert f"waiting on {archive} (" in warnings[0]
    assert "(next warning after 1 s without progress)" in warnings[0]
    assert "(next warning after 2 s without progress)" in warnings[1]
    [write] = [s for s in spans_in(tmp_path / "traces") if s["name"] == "ckpt.write"]
    first, second = [e["attributes"] for e in write["events"] if e["name"] == "ckpt.stall"][:2]
    assert stall_after <= first["ckpt.stall.idle_s"]
    assert second["ckpt.stall.idle_s"] >= 2 * stall_after  # not again at the next tick
    assert (first["ckpt.stall.warning"], second["ckpt.stall.warning"]) == (1, 2)


def test_parts_cut_as_a_stream_comes_are_the_parts_of_the_whole():
    """:class:`PartCutter` fed segment by segment hands out exactly the parts of the
    whole stream (numbers, offsets, bytes), whatever the segments' sizes."""
    import random

    from ckptprof.io.writes import PartCutter, cut_parts

    rng = random.Random(0)
    for part_size in (1, 7, 4096):
        for count in (0, 1, 5, 40):
            segments = [rng.randbytes(rng.choice((0, 1, 3, 4096, 9000))) for _ in range(count)]
            cutter = PartCutter(part_size)
            streamed = [p for s in segments for p in cutter.add(s)] + cutter.finish()
            whole = cut_parts(segments, part_size)
            assert [(p.number, p.offset, b"".join(p.views)) for p in streamed] == [
                (p.number, p.offset, b"".join(p.views)) for p in whole
            ]
            assert cutter.offset == sum(map(len, segments))


#: every data file of every layout, as the parallel saver serializes it
DATA_FILES = [
    (layout, file.path)
    for layout in LAYOUTS
    for file in get_layout(layout).plan(SynthSpec("llama2-7b", layout, TINY_SCALE)).data_files
]


@pytest.mark.parametrize("layout, path", DATA_FILES)
def test_a_file_streamed_is_the_size_said_first_and_the_bytes_of_the_whole(layout, path):
    """Where a file's codec says its size before serializing it (so that its writer is
    opened first and its parts written as they come), the size is exact and the streamed
    segments are the bytes :func:`serialized` makes, which the framework's own writer
    makes too (the tests above)."""
    from ckptprof.synth.savers.base import serialized, streamed

    spec = SynthSpec("llama2-7b", layout, TINY_SCALE)
    plan = get_layout(layout).plan(spec)
    file = next(f for f in plan.files if f.path == path)
    tensors = build_state(plan, spec.seed)
    stream = streamed(get_layout(layout), plan, file, tensors)
    codec = get_layout(layout).codec(file)
    assert (stream is not None) == (codec == "torch"), codec  # every torch.save archive is
    if stream is None:  # serialized whole: its codec says no size first (held just above)
        return
    size, make = stream
    got: list[bytes] = []
    make(lambda segment: got.append(bytes(memoryview(segment).cast("B"))))
    whole = b"".join(bytes(memoryview(s).cast("B")) for s in serialized(
        get_layout(layout), plan, file, tensors))  # fmt: skip
    assert b"".join(got) == whole and len(whole) == size


def test_a_large_archive_is_written_while_it_is_still_being_checksummed(tmp_path, monkeypatch):
    """A ``torch.save`` archive's CRC-32 is its serialization's cost: the parallel writer
    writes a large archive's first parts before the archive is fully serialized (it
    waited for the whole file: 0.8 s of a 2 s save at x0.05 before). The serialization
    pauses once well past its first window of parts, until a write into it has gone (at
    most 10 s): it then ends only after a write on the old code's order."""
    from ckptprof.synth.codecs.torch_archive import TorchArchive

    wrote, ends = threading.Event(), []
    real_write, real_serialize = os.pwritev, TorchArchive.serialize_into

    def observed_write(fd, *args):
        if fd_path(fd).endswith(PARTIAL_SUFFIX) and "optimizer" in fd_path(fd):
            wrote.set()
        return real_write(fd, *args)

    def observed_serialize(self, obj, tensors, emit):
        made = [0]

        def paced(segment):
            emit(segment)
            made[0] += memoryview(segment).nbytes
            if made[0] > 1 << 20:  # 16 parts of 64 KiB, 8 windows' worth: handed on
                wrote.wait(10)

        real_serialize(self, obj, tensors, paced)
        ends.append(wrote.is_set())  # a write into it had gone before its end

    monkeypatch.setattr(os, "pwritev", observed_write)
    monkeypatch.setattr(TorchArchive, "serialize_into", observed_serialize)
    save_here(tmp_path / "ckpt", "safetensors", "parallel", tmp_path / "t", concurrency=2,
              part_size=64 << 10)  # fmt: skip
    assert ends == [True]


def test_a_failed_save_stops_the_archive_it_is_streaming(tmp_path, monkeypatch):
    """ENOSPC on the first write into a streamed archive: the save raises the one line
    without the rest of the archive being made (each later segment paced at 5 ms, the
    whole would take seconds more), and leaves nothing but the marker."""
    from ckptprof.synth.codecs.torch_archive import TorchArchive

    failed, after = threading.Event(), []
    real_write, real_serialize = os.pwritev, TorchArchive.serialize_into

    def full_disk(fd, *args):
        if fd_path(fd).endswith(PARTIAL_SUFFIX) and "optimizer" in fd_path(fd):
            failed.set()
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, *args)

    def observed_serialize(self, obj, tensors, emit):
        def paced(segment):
            if failed.is_set():
                after.append(1)
                time.sleep(0.005)
            emit(segment)

        real_serialize(self, obj, tensors, paced)

    monkeypatch.setattr(os, "pwritev", full_disk)
    monkeypatch.setattr(TorchArchive, "serialize_into", observed_serialize)
    dest = tmp_path / "ckpt"
    with pytest.raises(CkptprofError, match="could not be written"):
        save_here(dest, "safetensors", "parallel", tmp_path / "t", concurrency=2,
                  part_size=64 << 10)  # fmt: skip
    assert failed.is_set() and len(after) < 50, len(after)  # of the archive's ~1,170
    assert [p.name for p in dest.rglob("*") if p.is_file()] == [GENERATING_NAME]


def test_a_file_written_over_several_runs_is_timed_by_its_runs_not_the_gaps():
    """A streamed file's parts go in several window runs with serialization between:
    its write time is the sum of its runs' (first start to last end of each), its bytes
    all of theirs, and it is one file, not one per run."""
    from ckptprof.io.window import FileClocks

    class Recorder:
        files: list = []

        def add_file(self, phase, path, nbytes, seconds, start_ns=None):
            self.files.append((path, nbytes, round(seconds, 3), start_ns))

    save = FileClocks()
    for first, last, nbytes in ((0, 1_000_000_000, 10), (3_000_000_000, 3_500_000_000, 5)):
        run = FileClocks()
        run.note("a.pt", first, (first + last) // 2, nbytes - 1)
        run.note("a.pt", (first + last) // 2, last, 1)
        save.fold(run)
    recorder = Recorder()
    save.record(recorder, "write")
    assert recorder.files == [("a.pt", 15, 1.5, 0)]  # not 3.5 s: the 2 s gap is not writing
