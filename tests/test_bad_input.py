"""User mistakes get one line naming the file or option and the fix; no traceback."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from ckptprof.manifest import MANIFEST_NAME
from tests.conftest import TINY_SCALE, interrupted_generation, run_cli


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


def restore_cli(path, *extra, first_step=False, **popen):
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
        *([] if first_step else ["--no-first-step"]),
        "--out",
        str(path.parent / "out"),
        *extra,
        **popen,
    )


def test_missing_dest(tmp_path):
    result = restore_cli(tmp_path / "nope")
    assert_one_line_error(result, str(tmp_path / "nope"), "synth generate")


def test_a_wrong_place_is_refused_before_torch_loads(tmp_path):
    """A typo in the path took 4.5 s to refuse: the strategies imported torch before the
    manifest was read. The place and its manifest are checked first now."""
    import subprocess
    import sys

    (tmp_path / "no-manifest").mkdir()
    for place in (tmp_path / "nope", tmp_path / "no-manifest"):
        probe = (
            "import sys; from ckptprof.cli import main; "
            f"rc = main(['synth', 'restore', {str(place)!r}, '--no-report']); "
            "print(rc, 'torch' in sys.modules)"
        )
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        assert done.stdout.split() == ["2", "False"], (done.stdout, done.stderr)


def test_dest_without_manifest(tmp_path):
    (tmp_path / "some-dir").mkdir()
    (tmp_path / "some-dir" / "model.pt").write_bytes(b"x")
    result = restore_cli(tmp_path / "some-dir")
    assert_one_line_error(result, MANIFEST_NAME, "is missing")


@pytest.mark.slow
def test_file_missing_from_listing(ckpt_copy):
    (ckpt_copy / "checkpoint_rank0.pt").unlink()
    result = restore_cli(ckpt_copy)
    assert_one_line_error(result, "checkpoint_rank0.pt", "missing", "regenerate")


@pytest.mark.slow
def test_truncated_file(ckpt_copy):
    target = ckpt_copy / "checkpoint_rank0.pt"
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    result = restore_cli(ckpt_copy)
    assert_one_line_error(result, "checkpoint_rank0.pt", "truncated")


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,needles",
    [
        (["--model", "llama-7b"], ["--model", "'llama-7b'", "llama2-7b"]),
        (["--layout", "safetensor"], ["--layout", "'safetensor'", "safetensors"]),
        (["--scale", "0"], ["--scale", "'0'", "above 0 and at most 1"]),
        (["--scale", "2"], ["--scale", "'2'"]),
        (["--scale", "nan"], ["--scale", "'nan'"]),
        (["--ranks", "0"], ["--ranks", "'0'", "at least 1"]),
        (["--files", "3", "--ranks", "2"], ["--files 3", "multiple of --ranks 2"]),
        (["--layout", "deepspeed", "--files", "8"], ["--files", "deepspeed"]),
        # once tracebacks: IndexError, ZeroDivisionError, numpy's ValueError
        (["--ranks", "2000", "--scale", "0.001"], ["--ranks 2000", "use --ranks 1008"]),
        (
            ["--model", "llama3-405b", "--layout", "dcp", "--ranks", "512", "--scale", "0.00001"],
            ["--ranks 512", "larger --scale"],
        ),
        (["--dry-run", "--bandwidth-gbps", "0"], ["--bandwidth-gbps", "'0'", "above 0"]),
        (["--seed", "-1"], ["--seed", "'-1'", "at least 0"]),
        # once "must be a multiple of --ranks 1"
        (["--files", "0"], ["--files", "'0'", "at least 1"]),
        (["--step", "x"], ["--step", "'x'", "whole number"]),
    ],
)
def test_bad_generate_options(tmp_path, args, needles):
    result = run_cli("synth", "generate", str(tmp_path / "c"), "--scale", str(TINY_SCALE), *args)
    line = assert_one_line_error(result, *needles)
    assert "multiple of --ranks 1" not in line
    assert not (tmp_path / "c").exists()  # refused before anything was written


@pytest.mark.slow
def test_not_enough_disk_is_checked_before_writing(tmp_path):
    dest = tmp_path / "huge"
    result = run_cli("synth", "generate", str(dest), "--model", "llama3-405b", "--layout", "dcp")
    assert_one_line_error(result, str(dest), "GB is free", "--scale")
    assert not dest.exists() or not any(dest.iterdir())


def test_non_empty_dest_needs_force(ckpt_copy):
    result = run_cli("synth", "generate", str(ckpt_copy), "--scale", str(TINY_SCALE))
    assert_one_line_error(result, "not empty", "--force")
    assert (ckpt_copy / MANIFEST_NAME).exists()  # nothing of the user's was touched


@pytest.mark.parametrize(
    "args,needles",
    [
        (["--cache", "lukewarm"], ["--cache", "'lukewarm'", "cold, hot"]),
        (["--repeat", "0"], ["--repeat", "'0'"]),
        (["--concurrency", "1,0"], ["--concurrency", "'0'", "at least 1"]),
        (["--part-size", "infM"], ["--part-size", "'infM'", "like 16M"]),  # was OverflowError
        (["--part-size", "1k"], ["--part-size", "'1k'", "4096"]),
        (["--ceiling-gbps", "inf"], ["--ceiling-gbps", "'inf'"]),
        (["--deadline", "-5"], ["--deadline", "'-5'"]),
        (["--out", ""], ["--out", "a folder"]),
        (["--strategy", "lazy"], ["--strategy", "'lazy'", "staged, pipelined, framework"]),
        (["--memory-budget", "lots"], ["--memory-budget", "'lots'", "like 16M"]),
        (["--rank", "-1"], ["--rank", "'-1'"]),
        (["--first-step-s", "soon"], ["--first-step-s", "'soon'"]),
        (["--device", "gpu"], ["--device", "'gpu'", "auto, cpu, cuda or cuda:N"]),
    ],
)
def test_bad_restore_option_values(ckpt_copy, args, needles):
    result = restore_cli(ckpt_copy, *args)
    assert_one_line_error(result, *needles, "--help")
    assert "ceiling" not in result.stdout  # refused before any work


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,needles",
    [
        (["--memory-budget", "1M"], ["--memory-budget", "two --part-size", "lower"]),
        (["--world-size", "2", "--rank", "2"], ["--rank 2", "--world-size 2", "0 to 1"]),
        (["--rank", "1"], ["--rank 1", "pass --world-size"]),  # saved by 1: one rank only
        # an option another leaves without effect (synth_restore.MOOT): refused, not ignored
        (["--stage", "."], ["--stage would do", "add staged to --strategy"]),  # pipelined has none
        (["--first-step-s", "1"], ["--first-step-s would do", "--no-first-step skips"]),
        (["--first-step-tokens", "64"], ["--first-step-tokens would do", "--no-first-step"]),
        (["--deadline", "30"], ["--deadline would do nothing", "add --simulate-interruption"]),
        (["--drop-caches"], ["--drop-caches would do nothing", "add cold to --cache"]),
        (["--simulate-interruption"], ["--simulate-interruption saves", "--no-first-step"]),
        # a setting named twice would run twice as many repeats under one name
        (["--strategy", "staged,staged"], ["--strategy names staged more than once"]),
        (["--concurrency", "2,2"], ["--concurrency names 2 more than once"]),
    ]
    + (  # asking for a GPU where there is none
        [] if torch.cuda.is_available() else [(["--device", "cuda"], ["no CUDA device here"])]
    ),
)
def test_options_that_do_not_fit_together(ckpt_copy, args, needles):
    result = restore_cli(ckpt_copy, *args)
    assert_one_line_error(result, *needles)
    assert "ceiling" not in result.stdout  # refused before any work


def test_an_interruption_needs_a_step_that_runs(ckpt_copy):
    """Its emergency save saves the step's model: a step time given builds none (it
    failed after the ceiling probe, its traces left behind)."""
    result = restore_cli(ckpt_copy, "--simulate-interruption", "--first-step-s", "1",
                         first_step=True)  # fmt: skip
    assert_one_line_error(result, "--simulate-interruption saves", "--first-step-s does not")
    assert "ceiling" not in result.stdout and not (ckpt_copy.parent / "out").exists()


def test_a_step_time_given_leaves_no_step_to_shape(ckpt_copy):
    result = restore_cli(ckpt_copy, "--first-step-s", "1", "--first-step-tokens", "64",
                         first_step=True)  # fmt: skip
    assert_one_line_error(result, "--first-step-tokens would do nothing", "--first-step-s gives")
    assert "ceiling" not in result.stdout  # refused before any work


@pytest.mark.slow
def test_interrupted_generation_never_looks_complete(tmp_path, monkeypatch):
    """A failure mid-way leaves no manifest, so restore refuses the folder."""
    dest = tmp_path / "partial"
    interrupted_generation(dest, 3, monkeypatch)  # config.json and two of four parts, then ENOSPC
    assert (dest / "checkpoint_rank0_part0001.pt").exists()  # it did get half-way
    assert not (dest / MANIFEST_NAME).exists()
    assert not list(dest.glob("*.partial"))
    assert_one_line_error(restore_cli(dest), MANIFEST_NAME, "did not finish")


def test_a_checkpoint_being_written_names_its_writer(tmp_path, monkeypatch):
    """A restore of a DEST another ckptprof run holds (a generation under way) names that
    run, rather than calling the generation unfinished and asking for --force."""
    from ckptprof.preflight import OutputClaim

    dest = tmp_path / "partial"
    interrupted_generation(dest, 3, monkeypatch)  # as a live generation has it so far
    with OutputClaim(dest, "DEST", "a checkpoint"):  # the writer, this test's own process
        line = assert_one_line_error(restore_cli(dest), "is being written now", "wait for")
    assert f"pid {os.getpid()}" in line and "--force" not in line, line
    assert_one_line_error(restore_cli(dest), "did not finish")  # the writer gone


@pytest.mark.slow
def test_a_path_that_cannot_be_written_is_refused_before_anything_is_written(tmp_path):
    dest = tmp_path / "blocked"
    # a directory where the third data file must go: refused before the first file
    (dest / "checkpoint_rank0_part0002.pt").mkdir(parents=True)
    result = run_cli("synth", "generate", str(dest), "--scale", str(TINY_SCALE), "--files", "4")
    assert_one_line_error(result, "checkpoint_rank0_part0002.pt", "is a folder")
    assert os.listdir(dest) == ["checkpoint_rank0_part0002.pt"]


def test_force_never_deletes_what_ckptprof_did_not_write(tmp_path):
    dest = tmp_path / "checkpoint"
    dest.mkdir()
    (dest / "my-training-run.pt").write_bytes(b"precious")
    result = run_cli("synth", "generate", str(dest), "--scale", str(TINY_SCALE), "--force")
    assert_one_line_error(result, "not a ckptprof checkpoint", "--force will not delete")
    assert (dest / "my-training-run.pt").read_bytes() == b"precious"


@pytest.mark.slow
def test_corrupt_bytes_of_the_right_size_name_the_file(ckpt_copy):
    target = ckpt_copy / "checkpoint_rank0.pt"
    data = bytearray(target.read_bytes())
    data[:64] = b"\0" * 64  # the zip header: torch.load cannot parse it
    target.write_bytes(bytes(data))
    result = restore_cli(ckpt_copy, "--verify", "size")  # pipelined: the index is parsed first
    assert_one_line_error(result, "checkpoint_rank0.pt", "corrupt", "regenerate")
    staged = restore_cli(ckpt_copy, "--verify", "size", "--strategy", "staged")
    assert_one_line_error(staged, "checkpoint_rank0.pt", "corrupt", "--verify full")


def test_other_url_schemes_are_refused_without_echoing_secrets(tmp_path):
    url = "https://bucket.s3.amazonaws.com/ckpt?X-Amz-Signature=abc123&X-Amz-Credential=AKIA"
    line = assert_one_line_error(restore_cli_url(url, tmp_path), "https://", "s3://bucket/prefix")
    assert "abc123" not in line and "AKIA" not in line


def restore_cli_url(url, tmp_path):
    return run_cli("synth", "restore", url, "--out", str(tmp_path / "o"), "--no-report")


def _limit_files(soft: int, hard: int):
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.slow
def test_more_files_than_open_files_allowed_restore(checkpoints):
    """Fetched bytes hold no descriptor: 301 files restore under a hard limit of 128
    (this was refused with "raise ulimit -n to 730", beyond the hard limit)."""
    many = checkpoints("torch", 1, optimizer=False, files=300)
    capped = restore_cli(many, "--verify", "full", preexec_fn=_limit_files(128, 128))
    assert capped.returncode == 0, capped.stderr
    assert "hot  x2" in capped.stdout


@pytest.mark.slow
def test_concurrency_beyond_the_open_file_limit_names_one_that_fits(checkpoints):
    many = checkpoints("torch", 1, optimizer=False, files=300)
    capped = restore_cli(many, "--concurrency", "200", preexec_fn=_limit_files(128, 128))
    line = assert_one_line_error(capped, "--concurrency 200", "ulimit -n", "hard limit 128")
    fits = line.split("use --concurrency ")[1].split()[0]
    followed = restore_cli(many, "--concurrency", fits, preexec_fn=_limit_files(128, 128))
    assert followed.returncode == 0, followed.stderr  # the advice can be followed


def _edit_manifest(path, change) -> None:
    doc = json.loads((path / MANIFEST_NAME).read_text())
    change(doc)
    (path / MANIFEST_NAME).write_text(json.dumps(doc))


def _set_size(doc, value):
    doc["files"]["checkpoint_rank0.pt"]["size"] = value


@pytest.mark.parametrize(
    "change,needles",
    [
        (lambda d: d["spec"].update(scale="0.0005"), ["spec: scale", "'0.0005' (a string)"]),
        (lambda d: d["spec"].update(ranks=None), ["spec: ranks", "got null"]),
        (lambda d: d["spec"].update(model="gpt-9"), ["spec: model", "llama2-7b"]),
        (lambda d: d.update(files=list(d["files"])), ["files: expected an object, got a list"]),
        (lambda d: d.update(spec=None), ["spec: expected an object, got null"]),
        # once "is 343 bytes but the manifest says 343"
        (lambda d: _set_size(d, "343"), ["['checkpoint_rank0.pt'].size", "'343' (a string)"]),
        (lambda d: _set_size(d, True), ["['checkpoint_rank0.pt'].size", "got true"]),
        (lambda d: d["files"]["checkpoint_rank0.pt"].pop("xxh3"), ["xxh3", "missing"]),
    ],
)
def test_manifest_with_wrong_types_is_one_line(ckpt_copy, change, needles):
    _edit_manifest(ckpt_copy, change)
    result = restore_cli(ckpt_copy)
    assert_one_line_error(result, str(ckpt_copy / MANIFEST_NAME), *needles, "regenerate")


@pytest.mark.slow
def test_sample_verify_passes_a_flip_outside_its_ranges_and_says_so(checkpoints, tmp_path):
    """By design `--verify sample` misses a byte outside its ranges; the report must say
    how much it checked, while `--verify full` catches the same byte."""
    from ckptprof.manifest import sample_ranges

    dest = tmp_path / "ckpt"
    shutil.copytree(checkpoints("torch"), dest)
    target = dest / "checkpoint_rank0.pt"
    data = bytearray(target.read_bytes())
    sampled = sample_ranges(len(data))
    gap = sampled[1][0] - 4096  # between the first and second sampled range
    assert all(not (start <= gap < start + n) for start, n in sampled)
    data[gap] ^= 0x01
    target.write_bytes(bytes(data))
    args = ["--verify", "sample", "--report"]
    sample = restore_cli(dest, *args)
    assert sample.returncode == 0, sample.stderr
    text = " ".join(sample.stdout.split())
    entries = json.loads((dest / MANIFEST_NAME).read_text())["files"].values()
    total = sum(e["size"] for e in entries)
    checked = sum(n for _, n in sampled) + (total - len(data))  # config.json is hashed whole
    assert f"verify sample: {checked / 1e6:.2f} MB of {total / 1e6:.2f} MB hashed" in text
    assert "a corrupt byte outside them passes" in text and "--verify full" in text
    full = restore_cli(dest, "--verify", "full")
    assert_one_line_error(full, "checkpoint_rank0.pt", "does not match")


def test_demo_checks_its_options_before_generating(tmp_path):
    for args, needle in ((["--ranks", "0"], "--ranks"), (["--repeat", "0"], "--repeat")):
        result = run_cli("demo", "--dir", str(tmp_path / "demo"), "--scale", "0.0005", *args)
        assert_one_line_error(result, needle, "'0'", "at least 1")
        assert not (tmp_path / "demo").exists()  # no checkpoint was written first


def test_unexpected_errors_are_one_line_with_the_debug_hint(tmp_path, monkeypatch, capsys):
    """A failure nobody anticipated (here: a bug planted in the interruption report's
    story builder) is one line, the hint and a non-zero exit; the traceback only with
    CKPTPROF_DEBUG=1. Run in-process: the planted bug cannot reach a subprocess."""
    from ckptprof.cli import main
    from ckptprof.report import interruptions

    def planted(spans):
        raise ValueError("planted: not-a-time")

    monkeypatch.setattr(interruptions, "build_stories", planted)
    monkeypatch.delenv("CKPTPROF_DEBUG", raising=False)
    (tmp_path / "t.jsonl").write_text("")
    code = main(["report", "--interruptions", str(tmp_path)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code != 0 and len(err) == 1, err
    assert "unexpected ValueError" in err[0] and "not-a-time" in err[0]
    assert err[0].endswith("re-run with CKPTPROF_DEBUG=1 for the traceback.")
    monkeypatch.setenv("CKPTPROF_DEBUG", "1")
    with pytest.raises(ValueError, match="planted"):
        main(["report", "--interruptions", str(tmp_path)])


@pytest.mark.slow
def test_the_ceiling_probe_reads_enough_and_names_requests_the_files_hold(checkpoints, tmp_path):
    """Once, with 2000 files the probe read 578 kB and called it "one 16.78 MB
    request"; with --part-size 1G on a 66 MB file, "one 1.07 GB request"."""
    from ckptprof.storage.posix import PosixStorage
    from ckptprof.synth import ceiling

    many = checkpoints("torch", files=2000)
    storage = PosixStorage(str(many))
    infos = [i for i in storage.list() if not i.path.endswith(".json")]
    total = sum(i.size for i in infos)
    found = ceiling.probe(storage, infos, part_size=16 << 20, concurrency=4)
    read = sum(sorted((i.size for i in infos), reverse=True))  # everything: under the budget
    assert f"cold reads of {read / 1e6:.2f} MB" in found.source and total == read
    assert found.part_size <= max(i.size for i in infos)  # a request the files can hold
    assert "too few bytes for a steady figure" in found.source  # and it says so
    one = checkpoints("torch")
    storage = PosixStorage(str(one))
    infos = [i for i in storage.list() if i.path.endswith(".pt")]
    big = ceiling.probe(storage, infos, part_size=1 << 30, concurrency=2)
    assert big.part_size == max(i.size for i in infos)
    assert f"one {big.part_size / 1e6:.2f} MB request" in big.describe()


@pytest.mark.slow
def test_a_corrupt_header_under_full_verify_does_not_advise_full_verify(checkpoints, tmp_path):
    """Once, a corrupt safetensors header under --verify full said "re-run with
    --verify full"."""
    dest = tmp_path / "st"
    shutil.copytree(checkpoints("safetensors"), dest)
    target = sorted(dest.glob("model-*.safetensors"))[0]
    data = bytearray(target.read_bytes())
    data[:8] = (2**62).to_bytes(8, "little")  # the header length: far past the file
    target.write_bytes(bytes(data))
    for strategy in ("pipelined", "staged"):
        result = restore_cli(dest, "--verify", "full", "--strategy", strategy)
        line = assert_one_line_error(result, target.name)
        assert "--verify full" not in line and ("regenerate" in line or "manifest" in line)
    weaker = restore_cli(dest, "--verify", "size", "--strategy", "staged")
    assert "re-run with --verify full" in assert_one_line_error(weaker, target.name)


@pytest.mark.slow
def test_memory_advice_never_names_the_strategy_in_use(checkpoints, tmp_path):
    """Once, --memory-budget 100G with pipelined advised "use --strategy pipelined"."""
    result = restore_cli(checkpoints("torch"), "--strategy", "pipelined", "--memory-budget",
                         "100G")  # fmt: skip
    line = assert_one_line_error(result, "of memory", "smaller --memory-budget")
    assert "use --strategy pipelined" not in line
    both = restore_cli(checkpoints("torch"), "--strategy", "staged,pipelined",
                       "--memory-budget", "100G")  # fmt: skip
    line = assert_one_line_error(both, "of memory", "smaller --memory-budget")
    assert "use --strategy pipelined" not in line


@pytest.mark.slow
def test_a_scale_below_the_shapes_floor_says_what_was_written(tmp_path):
    """Once, --scale 1e-9 wrote 5.7 MB labelled "x1e-09" without a word."""
    done = run_cli("synth", "generate", str(tmp_path / "tiny"), "--scale", "1e-9")
    assert done.returncode == 0, done.stderr
    assert "x1e-09 (floored to x8.1e-05" in done.stdout and "larger than asked" in done.stdout
    plain = run_cli("synth", "generate", str(tmp_path / "plain"), "--scale", str(TINY_SCALE),
                    "--dry-run")  # fmt: skip
    assert "floored" not in plain.stdout


@pytest.mark.slow
def test_two_restores_into_one_out_refuse_the_second(checkpoints, tmp_path):
    """Of two restores writing one --out, the second is refused at once, naming the
    holder (once both ran, and the overwritten one printed that path as its results)."""
    import subprocess
    import sys

    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from ckptprof.preflight import OutputClaim; "
        f"c = OutputClaim(__import__('pathlib').Path({str(out)!r}), '--out'); "
        "print('held', flush=True); sys.stdin.read()")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"  # another run holds --out
        second = restore_cli(checkpoints("torch"), "--out", str(out))
        assert_one_line_error(
            second, f"--out {out}", "another ckptprof run", f"pid {holder.pid}", "is writing"
        )
        assert not (out / "results.json").exists()
    finally:
        holder.communicate("", timeout=30)
    assert restore_cli(checkpoints("torch"), "--out", str(out)).returncode == 0  # released


def _indexed_layouts() -> list[str]:
    from ckptprof.synth.layouts import LAYOUT_NAMES, get_layout

    return [name for name in LAYOUT_NAMES if get_layout(name).index_file]


@pytest.mark.slow
@pytest.mark.parametrize("layout", _indexed_layouts())
def test_a_bad_index_file_is_named_where_it_is(layout, checkpoints, tmp_path):
    """Every layout's own index (`latest`, DCP's `.metadata`, the HF index json), its bytes
    replaced by others of the same size, is one line naming the file where it is and the
    fix, with the exit status of its kind: a corrupt file's (3), or a tag that is not the
    manifest's (2)."""
    from ckptprof.synth.layouts import get_layout

    dest = tmp_path / layout
    shutil.copytree(checkpoints(layout), dest)
    index = dest / get_layout(layout).index_file
    size = index.stat().st_size
    if layout == "deepspeed":  # a readable tag, but not the one the manifest describes
        index.write_bytes(b"global_step" + b"9" * (size - len("global_step")))
    else:
        index.write_bytes(b"\x00garbage" * (size // 8) + b"\x00" * (size % 8))
    result = restore_cli(dest, "--verify", "none")
    line = assert_one_line_error(result, str(index), "regenerate")
    assert result.returncode == (2 if layout == "deepspeed" else 3), line


@pytest.mark.parametrize(
    "args, says",
    [
        (["--full", "--scale", "0.002"], "--scale would do nothing: --full"),
        (["--rank", "1"], "--rank 1 is not a rank of the 1 saved"),
        (["--strategy", "runai"], "--layout safetensors"),
        (["--strategy", "s3torchconnector"], "reads s3:// checkpoints"),
    ],
)
def test_what_the_demos_restore_would_refuse_is_refused_before_its_saves(
    args, says, tmp_path, capsys
):
    """Known from the options alone: one line before anything is built, saved or timed
    (each was refused after three timed saves, or --scale silently overridden)."""
    from ckptprof.cli import main

    folder = tmp_path / "demo"
    assert main(["demo", "--dir", str(folder), "--scale", "0.001", *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
    assert captured.out == "" and not folder.exists()


def test_the_demo_never_replaces_what_no_demo_wrote(tmp_path, capsys):
    """A --dir of the user's own with a report.png or results/ in it: refused before any
    work, the files as they were; an earlier demo's folder (its checkpoint holds a
    ckptprof manifest) is the demo's to replace."""
    from ckptprof.cli import main
    from ckptprof.cli.demo import _check_dir

    folder = tmp_path / "mine"
    (folder / "results").mkdir(parents=True)
    (folder / "report.png").write_bytes(b"my figure")
    assert main(["demo", "--dir", str(folder), "--scale", "0.001"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "results, report.png" in line and "new or empty folder" in line, line
    assert sorted(p.name for p in folder.iterdir()) == ["report.png", "results"]
    assert (folder / "report.png").read_bytes() == b"my figure"
    (folder / "results").rmdir()
    _check_dir(folder, plot=False)  # the plot not written: its name is not in the way
    (folder / "checkpoint").mkdir()
    (folder / "checkpoint" / MANIFEST_NAME).write_text("{}")
    _check_dir(folder, plot=True)  # an earlier demo's


@pytest.mark.parametrize(
    "argv, says",
    [
        (["synth", "save", "--strategy", "framework", "--ceiling-gbps", "1", "--part-size",
          "4M"], "--part-size would do nothing: --strategy framework"),
        (["synth", "save", "--strategy", "framework", "--ceiling-gbps", "1", "--concurrency",
          "4"], "--concurrency would do nothing"),
        (["synth", "generate", "--bandwidth-gbps", "5"], "--bandwidth-gbps would do nothing"),
    ],
)  # fmt: skip
def test_an_option_the_others_leave_without_effect_is_refused_before_writing(
    argv, says, tmp_path, capsys
):
    from ckptprof.cli import main

    dest, out = tmp_path / "ckpt", tmp_path / "out"
    extra = ["--out", str(out)] if argv[1] == "save" else []
    assert main([*argv, str(dest), "--scale", str(TINY_SCALE), *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
    assert not dest.exists() and not out.exists()


@pytest.mark.parametrize(
    "args, says",
    [
        (["--world-size", "2", "--rank", "0"], "drop --world-size/--rank"),
        (["--world-size", "4"], "drop --world-size/--rank"),
        (["--simulate-interruption"], "--simulate-interruption runs in one process"),
    ],
)
def test_what_each_launched_rank_would_refuse_is_said_once_before_launching(
    args, says, checkpoints, tmp_path, capsys
):
    from ckptprof.cli import main

    out = tmp_path / "out"
    argv = ["synth", "restore", str(checkpoints("torch")), "--nproc-per-node", "2", "--out",
            str(out), "--cache", "hot", *args]  # fmt: skip
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
    assert not out.exists()


@pytest.mark.slow
def test_a_cold_run_the_cache_cannot_give_says_the_fix_that_is_left(checkpoints, tmp_path):
    """Pages another process maps stay resident through fadvise: the advice was "re-run
    as root with --drop-caches", to root too."""
    import contextlib
    import mmap

    ckpt = checkpoints("torch")
    touched = []
    with contextlib.ExitStack() as held:
        for path in sorted(ckpt.rglob("*")):
            if path.is_file() and path.stat().st_size:
                handle = held.enter_context(open(path, "rb"))
                view = held.enter_context(mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ))
                touched.append(sum(view[i] for i in range(0, len(view), mmap.PAGESIZE)))
        argv = ["synth", "restore", str(ckpt), "--cache", "cold", "--repeat", "1",
                "--no-first-step", "--ceiling-gbps", "1", "--out", str(tmp_path / "o")]  # fmt: skip
        line = assert_one_line_error(run_cli(*argv), "still in the page cache")
    root = os.geteuid() == 0  # (--drop-caches itself is not tried: it is machine-wide)
    assert ("re-run with --drop-caches" if root else "re-run as root") in line, line
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").rglob("*.json"))
