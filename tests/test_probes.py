"""The ceiling probes cost little beside the run they serve and say so before they start:
measured as the bytes this process really read (its read calls) and wrote to the disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptprof.cli import main
from ckptprof.storage.posix import PosixStorage
from ckptprof.synth import ceiling

MiB = 1 << 20
SLACK = 2 * MiB  # file system metadata, and this process's other small reads


def disk_bytes() -> tuple[int, int]:
    """(read, written) bytes of this process: what its read calls returned (read-ahead
    aside), and what it sent to the block device."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"]), int(fields["write_bytes"])


def test_a_write_probe_moves_at_most_its_share_of_the_run_and_says_so_first(tmp_path):
    checkpoint, saves = 8 * MiB, 3
    budget = ceiling.probe_budget(checkpoint * saves)
    assert budget == checkpoint * saves * ceiling.PROBE_SHARE  # a quarter: 6 MiB
    said: list[tuple[str, int]] = []
    _, before = disk_bytes()
    found = ceiling.probe_write(PosixStorage(str(tmp_path)), checkpoint, MiB, 4, fsync=True,
                                budget=budget, echo=lambda line: said.append(
                                    (line, disk_bytes()[1])))  # fmt: skip
    _, after = disk_bytes()
    [(line, at)] = said
    assert line.startswith("probing the write ceiling: ") and "--ceiling-gbps skips it" in line
    assert at == before  # the line came before the first byte
    assert found.bytes <= after - before <= budget + SLACK  # forced to the device, bounded
    assert found.write_gbps > 0 and not list(tmp_path.iterdir())  # nothing left behind


def test_a_write_probe_on_an_object_store_is_one_multipart_upload_at_the_least():
    # a budget too small for two passes at two levels: one write of two parts
    levels, passes, each = ceiling.write_plan(10 * MiB, 100 * MiB, 8 * MiB, 8, True)
    assert (levels, passes, each) == ([8], 1, 16 * MiB)
    # enough for everything: one at a time and 8 at a time, the best of two each
    assert ceiling.write_plan(400 * MiB, 50 * MiB, 8 * MiB, 8, True) == ([1, 8], 2, 50 * MiB)


@pytest.mark.slow
def test_a_read_probe_reads_at_most_its_share_of_the_sweep_and_says_so_first(
    checkpoints, tmp_path, capsys
):
    """A one-run sweep of a small checkpoint: the probe's passes and latency samples read
    at most a quarter of what the sweep reads (before: the whole checkpoint, 3 times)."""
    path = checkpoints("torch")
    out = tmp_path / "out"
    sweep = ["synth", "restore", str(path), "--cache", "cold", "--concurrency", "2",
             "--repeat", "1", "--no-first-step", "--no-report", "--out", str(out)]  # fmt: skip
    assert main(sweep) == 0
    lines = capsys.readouterr().out.splitlines()
    probing = next(i for i, line in enumerate(lines) if line.startswith("probing the read"))
    assert lines[probing + 1].startswith("ceiling ")  # said before, the figure after
    storage = PosixStorage(str(path))
    infos = [i for i in storage.list() if i.path.endswith(".pt")]
    total = sum(i.size for i in infos)
    budget = ceiling.probe_budget(total)  # the sweep above: one run of the checkpoint
    before, _ = disk_bytes()
    found = ceiling.probe(storage, infos, 16 * MiB, 2, budget // (ceiling.PROBE_PASSES + 1))
    read, _ = disk_bytes()
    assert 0 < read - before <= budget + SLACK < total
    assert "too few bytes for a steady figure" in found.source


def test_a_read_probe_calls_its_reads_cold_only_where_the_cache_let_go(tmp_path):
    """Files in memory (tmpfs: /dev/shm) stay cached whatever is evicted: the probe says
    its reads were not cold, with how much was cached, instead of "cold reads" of the
    cache's speed. On a disk the same probe's reads are cold."""
    import shutil
    import tempfile

    shm = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        for folder in (shm, tmp_path):
            (folder / "a.bin").write_bytes(b"\x01" * (4 * MiB))
        on_disk, in_memory = (ceiling.probe(PosixStorage(str(f)),
                                            list(PosixStorage(str(f)).list()), MiB, 2)
                              for f in (tmp_path, shm))  # fmt: skip
    finally:
        shutil.rmtree(shm)
    assert "cold reads" in on_disk.source
    assert "cold reads" not in in_memory.source
    assert "100% still in the page cache" in in_memory.source
