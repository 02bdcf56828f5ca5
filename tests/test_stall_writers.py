"""The stall watchdog and the writers it does not drive: ``torch.save``, safetensors and
DCP fill their files themselves, so no request of ckptprof's sees their bytes; their
files growing on disk is progress, and a file that stops growing is still a stall."""

from __future__ import annotations

import contextlib
import logging
import time

import pytest

from ckptprof import activity
from ckptprof.phases import Phase
from ckptprof.synth.plan import SynthSpec
from ckptprof.synth.save import SaveOptions, run_save
from ckptprof.tracing import CheckpointTracer, setup_telemetry


def stall_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "stalled" in r.getMessage()]


@pytest.mark.slow
def test_a_framework_writer_filling_its_file_is_not_a_stall(tmp_path, caplog):
    """``synth save --layout safetensors --scale 0.03 --stall-after 1``: each file is one
    call of its framework's writer (safetensors' ``save_file``; ``torch.save`` for the
    1.5 GB optimizer.pt), most often longer than ``stall_after`` here, while the file grows
    on disk. No warning comes while a file being written holds bytes; one before its first
    byte (the writer still serializing, on a machine this loaded) is a true "nothing
    moved yet", so it is not counted against the fix: each warning is checked against the
    files on disk at the moment it is said."""
    stall_after = 1.0  # 0.5 s: CI's loaded machine paused a write mid-file that long
    telemetry = setup_telemetry(tmp_path / "traces")
    tracer = CheckpointTracer(telemetry.provider, framework="synthetic", stall_after_s=stall_after)
    options = SaveOptions(repeat=1, fsync=False, ceiling_gbps=1.0, stall_after_s=stall_after,
                          strategy="framework")  # fmt: skip
    caplog.set_level(logging.WARNING, logger="ckptprof")
    written_when_warned = []

    class AtWarning(logging.Handler):
        def emit(self, record):
            if "stalled" in record.getMessage():
                sizes = []
                for partial in (tmp_path / "ckpt").glob("*.partial*"):
                    with contextlib.suppress(FileNotFoundError):  # renamed meanwhile
                        sizes.append(partial.stat().st_size)
                written_when_warned.append(sum(sizes))

    handler = AtWarning()
    logging.getLogger("ckptprof").addHandler(handler)
    try:
        spec = SynthSpec("llama2-7b", "safetensors", 0.03)
        result = run_save(str(tmp_path / "ckpt"), spec, options, tracer, echo=lambda _: None)
    finally:
        logging.getLogger("ckptprof").removeHandler(handler)
        telemetry.shutdown()
    assert result.records[0].bytes > 1.5e9
    assert all(size == 0 for size in written_when_warned), written_when_warned


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
