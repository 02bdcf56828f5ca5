"""User mistakes get one line naming the file or option and the fix; no traceback."""

from __future__ import annotations

import shutil

import pytest

from ckptprof.manifest import MANIFEST_NAME
from tests.conftest import TINY_SCALE, run_cli


def assert_one_line_error(result, *needles: str) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def ckpt_copy(checkpoints, tmp_path):
    dest = tmp_path / "ckpt"
    shutil.copytree(checkpoints("torch"), dest)
    return dest


def restore_cli(path, *extra, **popen):
    return run_cli(
        "synth",
        "restore",
        str(path),
        "--cache",
        "hot",
        "--concurrency",
        "2",
        "--repeat",
        "1",
        "--ceiling-gbps",
        "1",
        "--no-report",
        "--no-first-step",
        "--out",
        str(path.parent / "out"),
        *extra,
        **popen,
    )


def test_missing_dest(tmp_path):
    result = restore_cli(tmp_path / "nope")
    assert_one_line_error(result, str(tmp_path / "nope"), "synth generate")


def test_dest_without_manifest(tmp_path):
    (tmp_path / "some-dir").mkdir()
    (tmp_path / "some-dir" / "model.pt").write_bytes(b"x")
    result = restore_cli(tmp_path / "some-dir")
    assert_one_line_error(result, MANIFEST_NAME, "is missing")


def test_file_missing_from_listing(ckpt_copy):
    (ckpt_copy / "checkpoint_rank0.pt").unlink()
    result = restore_cli(ckpt_copy)
    assert_one_line_error(result, "checkpoint_rank0.pt", "missing", "regenerate")


def test_truncated_file(ckpt_copy):
    target = ckpt_copy / "checkpoint_rank0.pt"
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    result = restore_cli(ckpt_copy)
    assert_one_line_error(result, "checkpoint_rank0.pt", "truncated")


def test_flipped_byte_caught_by_full_verify(ckpt_copy):
    target = ckpt_copy / "checkpoint_rank0.pt"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    result = restore_cli(ckpt_copy, "--verify", "full")
    line = assert_one_line_error(result, "checkpoint_rank0.pt", "does not match", "corrupt")
    assert result.returncode == 3, line


def test_corrupt_manifest(ckpt_copy):
    (ckpt_copy / MANIFEST_NAME).write_text("{not json")
    result = restore_cli(ckpt_copy)
    assert_one_line_error(result, MANIFEST_NAME, "not a valid ckptprof manifest")


@pytest.mark.parametrize(
    "args,needles",
    [
        (["--model", "llama-7b"], ["--model 'llama-7b'", "llama2-7b"]),
        (["--layout", "safetensor"], ["--layout 'safetensor'", "safetensors"]),
        (["--scale", "0"], ["--scale 0", "0 < S <= 1"]),
        (["--scale", "2"], ["--scale 2"]),
        (["--ranks", "0"], ["--ranks 0"]),
        (["--files", "3", "--ranks", "2"], ["--files 3", "multiple of --ranks 2"]),
        (["--layout", "deepspeed", "--files", "8"], ["--files", "deepspeed"]),
    ],
)
def test_bad_generate_options(tmp_path, args, needles):
    result = run_cli("synth", "generate", str(tmp_path / "c"), "--scale", str(TINY_SCALE), *args)
    assert_one_line_error(result, *needles)
    assert not (tmp_path / "c" / MANIFEST_NAME).exists()


def test_not_enough_disk_is_checked_before_writing(tmp_path):
    dest = tmp_path / "huge"
    result = run_cli("synth", "generate", str(dest), "--model", "llama3-405b", "--layout", "dcp")
    assert_one_line_error(result, str(dest), "GiB is free", "--scale")
    assert not dest.exists() or not any(dest.iterdir())


def test_non_empty_dest_needs_force(ckpt_copy):
    result = run_cli("synth", "generate", str(ckpt_copy), "--scale", str(TINY_SCALE))
    assert_one_line_error(result, "not empty", "--force")
    assert (ckpt_copy / MANIFEST_NAME).exists()  # nothing of the user's was touched


def test_bad_restore_option_values(ckpt_copy):
    result = restore_cli(ckpt_copy, "--cache", "lukewarm")
    assert_one_line_error(result, "--cache 'lukewarm'")
    result = restore_cli(ckpt_copy, "--repeat", "0")
    assert_one_line_error(result, "--repeat 0")


def test_interrupted_generation_never_looks_complete(tmp_path):
    """A failure mid-way leaves no manifest, so restore refuses the folder."""
    dest = tmp_path / "partial"
    # a directory where the third data file must go makes publishing it fail for real
    (dest / "checkpoint_rank0_part0002.pt").mkdir(parents=True)
    result = run_cli("synth", "generate", str(dest), "--scale", str(TINY_SCALE), "--files", "4")
    assert_one_line_error(result, "checkpoint_rank0_part0002.pt")
    assert (dest / "checkpoint_rank0_part0001.pt").exists()  # it did get half-way
    assert not (dest / MANIFEST_NAME).exists()
    assert not list(dest.glob("*.partial"))
    assert_one_line_error(restore_cli(dest), MANIFEST_NAME, "is missing")


def test_force_never_deletes_what_ckptprof_did_not_write(tmp_path):
    dest = tmp_path / "checkpoint"
    dest.mkdir()
    (dest / "my-training-run.pt").write_bytes(b"precious")
    result = run_cli("synth", "generate", str(dest), "--scale", str(TINY_SCALE), "--force")
    assert_one_line_error(result, "not a ckptprof checkpoint", "--force will not delete")
    assert (dest / "my-training-run.pt").read_bytes() == b"precious"


def test_corrupt_bytes_of_the_right_size_name_the_file(ckpt_copy):
    target = ckpt_copy / "checkpoint_rank0.pt"
    data = bytearray(target.read_bytes())
    data[:64] = b"\0" * 64  # the zip header: torch.load cannot parse it
    target.write_bytes(bytes(data))
    result = restore_cli(ckpt_copy, "--verify", "size")
    assert_one_line_error(result, "checkpoint_rank0.pt", "corrupt", "--verify full")


def test_other_url_schemes_are_refused_without_echoing_secrets(tmp_path):
    url = "https://bucket.s3.amazonaws.com/ckpt?X-Amz-Signature=abc123&X-Amz-Credential=AKIA"
    line = assert_one_line_error(restore_cli_url(url, tmp_path), "https://", "s3://bucket/prefix")
    assert "abc123" not in line and "AKIA" not in line


def restore_cli_url(url, tmp_path):
    return run_cli("synth", "restore", url, "--out", str(tmp_path / "o"), "--no-report")


def _limit_files(soft: int, hard: int):
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_open_file_limit_is_raised_or_named(checkpoints):
    many = checkpoints("torch", 1, optimizer=False, files=300)
    capped = restore_cli(many, "--verify", "size", preexec_fn=_limit_files(128, 128))
    line = assert_one_line_error(capped, "301 files", "ulimit -n")
    assert "128" in line
    raised = restore_cli(many, "--verify", "size", preexec_fn=_limit_files(128, 4096))
    assert raised.returncode == 0, raised.stderr  # the soft limit was raised for the run
