"""Lightning's sharded checkpoints (ModelParallelStrategy / FSDP's ``state_dict_type=
"sharded"``: a folder written and read through torch.distributed.checkpoint) are traced
phase by phase by the same ``CkptProf`` callback: DCP's list / fetch / reshard /
deserialize inside Lightning's restore, serialize / write / commit inside its save.

A real 2-rank job on CPU (tests/lightning_mp_job.py): FSDP2 over gloo. Lightning refuses
its FSDP1 strategy without a GPU, but both strategies save and load through the same
``torch.distributed.checkpoint.save`` / ``load`` calls.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import LOOPBACK_ENV, RESTORE_PHASES, children, ours_in, spans_in
from tests.test_dcp import SAVE_PHASES

pytestmark = pytest.mark.slow  # real jobs in fresh processes

JOB = Path(__file__).with_name("lightning_mp_job.py")


def lightning_job(steps: int, root: Path, ckpt: Path | None, traces: Path | None) -> str:
    command = [sys.executable, str(JOB), str(steps), str(root),
               str(ckpt) if ckpt else "-", str(traces) if traces else "-"]  # fmt: skip
    env = {**os.environ, **LOOPBACK_ENV}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def folder_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def checksums(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"rank (\d) step \d+ checksum (\S+)", stdout))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """Save at step 4, then the same resume to step 6 with and without ckptprof."""
    base = tmp_path_factory.mktemp("lightning-sharded")
    lightning_job(4, base / "first", None, base / "save-traces")
    (ckpt,) = (base / "first" / "checkpoints").iterdir()
    before = folder_digest(ckpt)
    traced = lightning_job(6, base / "traced", ckpt, base / "restore-traces")
    after_traced = folder_digest(ckpt)
    plain = lightning_job(6, base / "plain", ckpt, None)
    return {"base": base, "ckpt": ckpt, "before": before, "after_traced": after_traced,
            "traced": traced, "plain": plain}  # fmt: skip


def test_a_sharded_save_is_traced_through_dcp(sharded):
    ckpt = sharded["ckpt"]
    assert sorted(p.name for p in ckpt.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    spans = spans_in(sharded["base"] / "save-traces")
    saves = {s["attributes"]["ckpt.rank"]: s for s in spans if s["name"] == "ckpt.save"}
    assert sorted(saves) == [0, 1]
    assert set(children(spans, saves[0])) == SAVE_PHASES  # DCP's coordinator commits
    assert set(children(spans, saves[1])) == SAVE_PHASES - {"ckpt.commit"}
    written = 0
    for save in saves.values():
        assert save["attributes"]["ckpt.format"] == "dcp"
        assert save["attributes"]["ckpt.framework"] == "lightning"
        write = children(spans, save)["ckpt.write"]["attributes"]
        assert write["ckpt.files"] == 1  # each rank its own .distcp
        written += write["ckpt.bytes"]
    assert written == sum(p.stat().st_size for p in ckpt.glob("*.distcp"))


def test_a_sharded_resume_has_every_phase_and_each_rank_reads_its_part(sharded):
    spans = spans_in(sharded["base"] / "restore-traces")
    restores = {s["attributes"]["ckpt.rank"]: s for s in spans if s["name"] == "ckpt.restore"}
    assert sorted(restores) == [0, 1]
    data = sum(p.stat().st_size for p in sharded["ckpt"].glob("*.distcp"))
    fetched = 0
    for restore in restores.values():
        assert restore["status"]["status_code"] != "ERROR"
        assert restore["attributes"]["ckpt.format"] == "dcp"
        assert restore["attributes"]["ckpt.strategy"] == "ModelParallelStrategy"
        phases = children(spans, restore)
        assert set(phases) == RESTORE_PHASES  # not one fused deserialize
        deserialize = phases["ckpt.deserialize"]["attributes"]
        assert "ckpt.fused" not in deserialize  # DCP's reads are measured
        assert deserialize["ckpt.loader"] == "ModelParallelStrategy.load_checkpoint"
        rank_bytes = phases["ckpt.fetch"]["attributes"]["ckpt.bytes"]
        assert 0 < rank_bytes <= data
        fetched += rank_bytes
    assert fetched >= data  # together the ranks read every saved item


def test_a_sharded_resume_trains_the_same_with_and_without_ckptprof(sharded):
    assert sharded["after_traced"] == sharded["before"]  # the checkpoint's bytes untouched
    assert checksums(sharded["traced"]) == checksums(sharded["plain"])
    assert len(checksums(sharded["plain"])) == 2
    assert "dcp patched after fit: True" not in sharded["traced"]  # put back after each call
    assert "dcp patched after fit: False" in sharded["traced"]
    plain, traced = sharded["base"] / "plain", sharded["base"] / "traced"
    assert sorted(p.name for p in (traced / "checkpoints").iterdir()) == sorted(
        p.name for p in (plain / "checkpoints").iterdir()
    )
    assert ours_in(sharded["base"]) == []  # no files of ckptprof's in the job's folders
