"""The stall watchdog and the writers it does not drive: ``torch.save``, safetensors and
DCP fill their files themselves, so no request of ckptprof's sees their bytes; their
files growing on disk is progress, and a file that stops growing is still a stall."""

from __future__ import annotations

import logging
import time

import pytest

from ckptprof import activity
from ckptprof.phases import Phase
from ckptprof.tracing import CheckpointTracer, setup_telemetry


def stall_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "stalled" in r.getMessage()]


@pytest.mark.slow
def test_a_framework_writer_filling_its_file_is_not_a_stall(tmp_path, caplog):
    """A writer of its own (a framework's ``torch.save``/``save_file``, here one that adds
    a MiB every 50 ms for 3 s, the save's files named as growing as ``synth save`` and the
    callbacks name theirs) moves no byte through ckptprof's I/O, yet its file grows: no
    warning at ``stall_after`` 0.5 s. (A real framework save on a loaded disk can pause
    that long for real, which is a true stall: the writer here cannot.)"""
    telemetry = setup_telemetry(tmp_path / "traces")
    tracer = CheckpointTracer(telemetry.provider, framework="synthetic", stall_after_s=0.5)
    caplog.set_level(logging.WARNING, logger="ckptprof")
    partial = tmp_path / "optimizer.pt.partial"
    try:
        with (
            tracer.save({}) as op,
            op.phase(Phase.WRITE),
            activity.growing(partial),
            open(partial, "wb") as handle,
        ):
            for _ in range(60):
                handle.write(b"x" * (1 << 20))
                handle.flush()
                time.sleep(0.05)
    finally:
        telemetry.shutdown()
    assert partial.stat().st_size == 60 << 20
    assert not stall_warnings(caplog)


def test_a_file_that_stops_growing_is_still_a_stall(tmp_path, caplog):
    """A writer blocked mid-file (a hung mount): the file named as growing holds still, and
    the warning comes as for any other stall."""
    telemetry = setup_telemetry(tmp_path / "traces")
    tracer = CheckpointTracer(telemetry.provider, framework="synthetic", stall_after_s=0.3)
    caplog.set_level(logging.WARNING, logger="ckptprof")
    partial = tmp_path / "model.safetensors.partial"
    try:
        with tracer.save({}) as op, op.phase(Phase.WRITE), activity.growing(partial):
            partial.write_bytes(b"x" * (1 << 20))  # some bytes, then nothing more
            deadline = time.monotonic() + 10
            while not stall_warnings(caplog) and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        telemetry.shutdown()
    [warning, *_] = stall_warnings(caplog)
    assert "save stalled in write: no progress for" in warning


def test_a_jobs_save_through_a_callback_counts_its_files_growth(tmp_path, caplog, monkeypatch):
    """The callbacks' saves (Lightning, HF Trainer, DeepSpeed) name their file or folder
    (``ckpt.path``): a real ``torch.save`` of 480 MB into a folder under it, longer than
    ``stall_after``, is not a stall; the name is dropped when the save ends."""
    import torch

    from ckptprof.integrations.session import TracingSession
    from ckptprof.phases import Attr

    monkeypatch.setenv("CKPTPROF_STALL_AFTER", "0.5")
    caplog.set_level(logging.WARNING, logger="ckptprof")
    state = {f"layer{i}": torch.rand(750_000) for i in range(160)}  # 160 tensors, 3 MB each
    folder = tmp_path / "checkpoint-100"
    (folder / "optimizer_0").mkdir(parents=True)  # as a sharded save lays its files out
    session = TracingSession("test", trace_dir=tmp_path / "traces")
    try:
        with session.saving({Attr.PATH: str(folder)}):
            torch.save(state, folder / "optimizer_0" / "optimizer.pt")
    finally:
        session.close()
    assert (folder / "optimizer_0" / "optimizer.pt").stat().st_size > 480e6
    assert not stall_warnings(caplog)
    assert activity.grown() == 0  # nothing named any more
