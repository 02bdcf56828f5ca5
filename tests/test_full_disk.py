"""Full, read-only and inode-starved filesystems.

Real ones: a small tmpfs mounted for the test (the kernel answers ENOSPC, EROFS), and
``/dev/full`` for a trace file that fills up mid-run.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import subprocess
from pathlib import Path

import pytest

from ckptprof.manifest import MANIFEST_NAME
from ckptprof.synth.fill import RandomFiller
from ckptprof.synth.generate import estimated_file_bytes, plan_checkpoint, write_generated
from ckptprof.synth.layouts import get_layout
from ckptprof.synth.plan import SynthSpec
from tests.conftest import TINY_SCALE, run_cli
from tests.test_bad_input import assert_one_line_error, restore_cli


@contextlib.contextmanager
def small_fs(path: Path, size: str, inodes: int | None = None, read_only: bool = False):
    """A tmpfs of ``size`` (and ``inodes``) mounted at ``path`` for the block."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    options = [f"size={size}"] + ([f"nr_inodes={inodes}"] if inodes else [])
    options += ["ro"] if read_only else []
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join(options), "ckptprof-test", str(path)], check=True
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(folder: Path) -> None:
    """Write until the filesystem says ENOSPC."""
    with open(folder / "filler", "wb") as handle, contextlib.suppress(OSError):
        while True:
            handle.write(b"\0" * (1 << 16))
            handle.flush()


def assert_refused_before_any_run(result, *needles: str) -> None:
    assert_one_line_error(result, *needles)
    assert "ceiling" not in result.stdout and " x2 " not in result.stdout


# ------------------------------------------------------------------ item 4: --out


def test_a_full_out_is_refused_before_the_sweep(checkpoints, tmp_path):
    with small_fs(tmp_path / "full", "256k") as full:
        fill(full)
        result = restore_cli(checkpoints("torch"), "--out", str(full / "out"))
        assert_refused_before_any_run(result, "--out", str(full / "out"), "0 bytes free")
        assert not list(full.rglob("*.partial"))


def test_a_read_only_out_is_refused_before_the_sweep(checkpoints, tmp_path):
    with small_fs(tmp_path / "ro", "1m", read_only=True) as ro:
        result = restore_cli(checkpoints("torch"), "--out", str(ro))
        assert_refused_before_any_run(result, "--out", str(ro), "read-only filesystem")


def test_an_out_without_room_for_the_results_is_refused(checkpoints, tmp_path):
    with small_fs(tmp_path / "tight", "64k") as tight:
        result = restore_cli(checkpoints("torch"), "--out", str(tight))
        assert_refused_before_any_run(result, "--out", "kB is free")


def test_results_that_do_not_fit_name_the_file_and_leave_no_partial(tmp_path):
    from ckptprof.synth.restore import write_results

    with small_fs(tmp_path / "full", "256k") as full:
        payload = {"runs": [], "blob": "x" * (1 << 20)}
        with pytest.raises(OSError, match="results.json") as caught:
            write_results(full, payload, [])
        assert caught.value.errno == errno.ENOSPC
        assert os.listdir(full) == []  # neither results.json nor results.json.<pid>.partial


# ------------------------------------------------------------------ item 5: traces


def test_a_full_trace_dir_is_refused_before_the_sweep(checkpoints, tmp_path):
    with small_fs(tmp_path / "full", "256k") as full:
        fill(full)
        result = restore_cli(checkpoints("torch"), "--trace-dir", str(full))
        assert_refused_before_any_run(result, "--trace-dir", str(full))


def test_a_trace_file_that_fills_up_warns_once_and_is_not_reported_as_written(
    tmp_path, caplog, monkeypatch
):
    from ckptprof.tracing.export import setup_telemetry
    from tests.test_export import record_one_restore

    for key in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(key)
    telemetry = setup_telemetry(tmp_path, run_id="run")
    telemetry.trace_file.symlink_to("/dev/full")  # every write: ENOSPC, from the kernel
    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        for _ in range(7):
            record_one_restore(telemetry)
            telemetry.flush()
        assert not telemetry.trace_written
        assert "not written" in telemetry.describe_trace()
        telemetry.shutdown()
    warnings = [r for r in caplog.records if "cannot write the trace file" in r.message]
    assert len(warnings) == 1 and "No space left on device" in warnings[0].message


# ------------------------------------------------------------------ item 7: --stage, writes


def test_a_stage_dir_without_room_is_refused_before_the_sweep(checkpoints, tmp_path):
    with small_fs(tmp_path / "stage", "1m") as stage:
        result = restore_cli(checkpoints("torch"), "--strategy", "staged", "--stage", str(stage))
        assert_refused_before_any_run(result, "--stage", str(stage), "MB is free")


def test_enospc_while_writing_a_checkpoint_file_names_it(tmp_path):
    """What `synth generate` does per file: the layout's writer inside staging_file."""
    from ckptprof.storage.posix import PosixStorage

    spec = SynthSpec("llama2-7b", "torch", TINY_SCALE, optimizer=False)
    layout = get_layout("torch")
    plan = layout.plan(spec)
    data = plan.data_files[0]
    with small_fs(tmp_path / "full", "1m") as full:
        storage = PosixStorage(str(full))
        with (
            pytest.raises(OSError, match=data.path) as caught,
            storage.staging_file(data.path) as tmp,
        ):
            write_generated(layout, plan, data, tmp, RandomFiller(0), {})
        assert caught.value.errno == errno.ENOSPC
        assert os.listdir(full) == []  # the temp file is gone too


def test_enospc_while_staging_a_download_names_the_file(checkpoints, tmp_path):
    from ckptprof.io.transfer import download
    from ckptprof.storage.posix import PosixStorage

    source = PosixStorage(str(checkpoints("torch")))
    infos = [i for i in source.list() if i.path.endswith(".pt")]
    with small_fs(tmp_path / "stage", "1m") as stage:
        with pytest.raises(OSError, match="checkpoint_rank0.pt") as caught:
            download(source, infos, stage, 2, part_size=1 << 20, progress=False)
        assert caught.value.errno == errno.ENOSPC


@pytest.mark.slow
def test_enospc_through_the_cli_names_the_file(checkpoints, tmp_path):
    out = tmp_path / "out"
    assert restore_cli(checkpoints("torch"), "--out", str(out)).returncode == 0
    with small_fs(tmp_path / "full", "64k") as full:
        fill(full)
        result = run_cli("report", str(out), "--plot", str(full / "rto.png"))
        # known before anything is drawn: refused as the command line is read
        assert_one_line_error(result, "--plot", str(full / "rto.png"), "0 bytes free")
        assert os.listdir(full) == ["filler"]  # no half-written image either


# ------------------------------------------------------------------ item 8: estimates


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout,kw",
    [
        ("torch", {"files": 100_000, "scale": 0.01}),
        ("torch", {"files": 2_000}),
        ("safetensors", {"files": 5_000, "optimizer": False}),
        ("dcp", {"files": 5_000, "optimizer": False}),
        ("deepspeed", {"ranks": 64}),
    ],
)
def test_the_space_estimate_covers_every_file_it_plans(tmp_path, layout, kw):
    """Once, 100,000 files were planned at 0.16 GB and took 0.856 GB. Write a sample of
    the planned files for real and compare the blocks each takes with its estimate."""
    plan = plan_checkpoint(SynthSpec("llama2-7b", layout, **{"scale": 0.002, **kw}))
    lay = get_layout(layout)
    data = plan.data_files
    sample = data[:20] + data[len(data) // 2 : len(data) // 2 + 20] + data[-20:]
    filler = RandomFiller(0)
    for file in sample:
        dest = tmp_path / file.path.replace("/", "_")
        write_generated(lay, plan, file, dest, filler, {})
        used = os.stat(dest).st_blocks * 512
        assert estimated_file_bytes(lay, file) >= used, (file.path, used)
        dest.unlink()


def test_too_few_inodes_are_refused_before_writing(tmp_path):
    with small_fs(tmp_path / "few", "600m", inodes=60) as few:
        result = run_cli(
            "synth",
            "generate",
            str(few / "ckpt"),
            "--scale",
            str(TINY_SCALE),
            "--files",
            "100",
            "--no-optimizer",
        )
        assert_one_line_error(result, str(few / "ckpt"), "101 files", "free inodes", "--files")
        assert not (few / "ckpt" / MANIFEST_NAME).exists()
        assert not (few / "ckpt").exists() or not any((few / "ckpt").iterdir())


# ------------------------------------------------------------------ space and tmpfs


@pytest.mark.slow
def test_a_checkpoint_that_fits_is_never_refused_for_headroom(tmp_path):
    """Once, a 144 MB checkpoint was refused on a 300 MB filesystem ("needs about
    429 MB") that `cp` of the same files fits: headroom was counted as checkpoint."""
    from ckptprof.synth.generate import generate

    spec = SynthSpec("llama2-7b", "torch", 0.002)  # ~140 MB with Adam state
    source = generate(str(tmp_path / "src"), spec, progress=False)
    assert 120e6 < source.total_bytes < 160e6
    with small_fs(tmp_path / "small", "300m") as small:
        done = run_cli("synth", "generate", str(small / "ckpt"), "--scale", "0.002")
        assert done.returncode == 0, done.stderr
        assert (small / "ckpt" / MANIFEST_NAME).exists()


@pytest.mark.slow
def test_cold_on_a_memory_filesystem_says_cold_is_impossible_there(checkpoints, tmp_path):
    """Once, on tmpfs a "cold" probe ran and then residency refused it with advice
    to re-run as root with --drop-caches."""
    import shutil

    with small_fs(tmp_path / "ram", "64m") as ram:
        shutil.copytree(checkpoints("torch"), ram / "ckpt")
        out = str(tmp_path / "out")
        cold = run_cli("synth", "restore", str(ram / "ckpt"), "--cache", "cold", "--no-report",
                       "--no-first-step", "--repeat", "1", "--out", out)  # fmt: skip
        line = assert_one_line_error(cold, "is on tmpfs", "cold read is impossible", "--cache hot")
        assert "--drop-caches" not in line and "ceiling" not in cold.stdout  # nothing ran
        hot = restore_cli(ram / "ckpt")
        assert hot.returncode == 0, hot.stderr
