"""``ckptprof compare`` choosing storage: a real local disk against real S3 (SeaweedFS)
made deterministically slower by the fault proxy, saves and restores in every mix."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from pathlib import Path

import pytest

from ckptprof.cli import main
from ckptprof.report.compare import compare
from ckptprof.report.compare_json import render_json
from ckptprof.report.compare_text import render_text
from ckptprof.report.comparison import TTS
from tests.conftest import TINY_SCALE

SETTING = "pipelined cold c=2"
#: the first step given to the local restores: far beyond any storage difference here
#: (appended to the RTO, not slept: it costs no test time)
LOCAL_FIRST_STEP_S = 30.0


def synth(*args: str) -> None:
    assert main(["synth", *args]) == 0


def save_and_restore(location: str, out: Path, first_step_s: float) -> None:
    """A real ``synth save`` (three saves, by the default writer: the same on every
    storage) and three cold restores of what it wrote, into ``out/save`` and ``out/restore``."""
    synth("save", location, "--layout", "torch", "--scale", str(TINY_SCALE), "--repeat", "3",
          "--ceiling-gbps", "2", "--out", str(out / "save"))  # fmt: skip
    synth("restore", location, "--strategy", "pipelined", "--cache", "cold", "--concurrency",
          "2", "--repeat", "3", "--first-step-s", str(first_step_s), "--ceiling-gbps", "1",
          "--no-report", "--out", str(out / "restore"))  # fmt: skip


def times(out: Path) -> tuple[list[float], list[float], list[float]]:
    """(save seconds, time to state, RTO) per run, from the files the runs wrote."""
    saves = [r["wall_s"] for r in json.loads((out / "save" / "save.json").read_text())["saves"]]
    runs = json.loads((out / "restore" / "results.json").read_text())["runs"]
    tts = [r["wall_s"] - r["phases"]["first_step"]["busy_s"] for r in runs]
    return saves, tts, [r["wall_s"] for r in runs]


@pytest.fixture
def local_and_s3(tmp_path, s3_bucket, s3_env, fault_proxy) -> tuple[Path, Path]:
    """The same checkpoint saved and restored on the local disk, then on S3 through a
    proxy that delays every request by half the local disk's slowest save or time to
    state: an S3 save (create, part, complete) and restore (list, manifest, part) each
    wait at least three such delays in a row, so S3 is slower in every repeat by
    construction."""
    local, s3 = tmp_path / "local", tmp_path / "s3"
    save_and_restore(str(local / "ckpt"), local, LOCAL_FIRST_STEP_S)
    saves, tts, _ = times(local)
    s3_env(endpoint_url=fault_proxy.endpoint_url)
    fault_proxy.latency_s = max(max(saves), max(tts), 0.05) / 2
    save_and_restore(f"s3://{s3_bucket.name}/ckpt", s3, 0.1)
    fault_proxy.latency_s = 0.0
    return local, s3


def test_the_local_disk_ranks_first_by_time_to_state_though_the_first_step_says_otherwise(
    local_and_s3, tmp_path, capsys
):
    local, s3 = local_and_s3
    local_saves, local_tts, local_rto = times(local)
    s3_saves, s3_tts, s3_rto = times(s3)
    # the premise: by RTO, the (given) first step would rank S3 first in every repeat
    assert max(s3_rto) < min(local_rto)
    assert max(local_tts) < min(s3_tts) and max(local_saves) < min(s3_saves)

    found = compare([str(local), str(s3)], ["local", "s3"])
    text = render_text(found)
    assert text.splitlines()[0].startswith("compare: base local; s3; ranked: synthetic restores "
                                           "by time to state")  # fmt: skip
    block = text.split(f"\n{SETTING}\n")[1].split("\n\n")[0].splitlines()
    assert "time to state s (min-max)" in block[0]
    assert block[1].split()[:2] == ["1", "local"] and block[2].split()[:2] == ["2", "s3"]
    [tts] = [f for f in found.findings if f.setting == SETTING and f.what == TTS]
    assert tts.beyond_spread and tts.change > 0 and tts.verdict == "slower"
    assert tts.new_s == pytest.approx(statistics.median(s3_tts))
    assert tts.base_s == pytest.approx(statistics.median(local_tts))
    # the first step is this machine's compute: never judged, whatever it did
    assert not [f for f in found.findings if f.what == "first_step"]
    assert found.writers == {}  # the default writer, the same on both storages
    [save] = [f for f in found.findings if f.setting == "save" and f.what == "save time"]
    assert save.beyond_spread and save.change > 0

    # the storage table: one row per source, write and read GB/s from the files' numbers
    table = text.split("\nstorage: ")[1].split("\n\n")[0].splitlines()
    assert table[0] == f"read GB/s by time to state: {SETTING}; write: save"
    row = dict(zip(["local", "s3"], (table[2].split(), table[3].split()), strict=True))
    for name, out in (("local", local), ("s3", s3)):
        doc = json.loads((out / "save" / "save.json").read_text())
        write = doc["saves"][0]["bytes"] / statistics.median(s["wall_s"] for s in doc["saves"])
        runs = json.loads((out / "restore" / "results.json").read_text())["runs"]
        read = runs[0]["bytes"] / statistics.median(times(out)[1])
        assert row[name][1:4] == [f"{write / 1e9:.3f}", f"{read / 1e9:.3f}", f"{write / read:.2f}"]
    assert row["local"][-1] == "base"
    # each verdict names the seconds it is judged on (the gate's), not the GB/s beside it
    verdict = (f"read (time to state): slower (+{tts.change:.0%}); "
               f"write (save time): slower (+{save.change:.0%})")  # fmt: skip
    assert " ".join(row["s3"]).endswith(verdict)

    # by RTO (asked for), the first step decides: S3 first, and compare says so
    by_rto = render_text(compare([str(local), str(s3)], ["local", "s3"], by="rto"))
    assert "restores by RTO (--by rto" in by_rto.splitlines()[0]
    block = by_rto.split(f"\n{SETTING}\n")[1].split("\n\n")[0].splitlines()
    assert block[1].split()[:2] == ["1", "s3"]

    # the gate: S3 after the local disk is slower (restores and saves); the reverse passes
    assert main(["compare", str(local), str(s3), "--fail-if-slower", "10%"]) == 1
    err = capsys.readouterr().err
    assert f"{s3}: {SETTING} time to state" in err and "beyond the repeats' spread" in err
    # (the CPU's phases, deserialize or the first step, decide nothing on their own)
    assert main(["compare", str(s3), str(local), "--fail-if-slower", "10%"]) == 0
    doc = json.loads(render_json(compare([str(local), str(s3)], ["local", "s3"], limit=0.1)))
    assert {(r["setting"], r["what"]) for r in doc["regressions"]} >= {
        (SETTING, TTS),
        ("save", "save time"),
    }
    assert_every_mix_compares(local, s3, tmp_path)

    # the HTML page of both folders sets the two storages side by side first, as compare
    from ckptprof.report import aggregate, load
    from ckptprof.report.html import render_html

    page = render_html(aggregate(load([str(local), str(s3)])), paths=[str(local), str(s3)])
    view = page.split('<table data-view="storage">')[1].split("</table>")[0]
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", r) for r in view.split("<tr>")[2:]]
    assert [c[:4] for c in cells] == [[n, *row[n][1:4]] for n in ("local", "s3")]
    assert page.index("Storages side by side") < page.index("What to look at")


def assert_every_mix_compares(local: Path, s3: Path, tmp_path: Path) -> None:
    """save.json against save traces, a folder of restore traces without its results.json
    against a results.json, save-only sources: each setting is matched and judged."""
    traces_only = tmp_path / "local-traces"  # the restore's traces, no results.json
    shutil.copytree(local / "restore" / "traces", traces_only)
    mixes = {
        "save.json vs save traces": [local / "save" / "save.json", s3 / "save" / "traces"],
        "save traces vs save.json": [local / "save" / "traces", s3 / "save" / "save.json"],
        "restore traces vs results.json": [traces_only, s3 / "restore" / "results.json"],
        "results.json vs restore traces": [local / "restore", s3 / "restore" / "traces"],
        "save + restore traces vs save.json + results": [
            local / "save" / "traces", traces_only, s3 / "save" / "save.json", s3 / "restore"],
    }  # fmt: skip
    for name, paths in mixes.items():
        half = len(paths) // 2
        labels = ["local"] * half + ["s3"] * half
        found = compare([str(p) for p in paths], labels, limit=0.1)
        judged = {(f.setting, f.what) for f in found.regressions}
        expect = set()
        if any("save" in str(p) for p in paths):
            expect.add(("save", "save time"))
        if any("restore" in str(p) or p == traces_only for p in paths):
            expect.add((SETTING, TTS))
        assert judged >= expect and found.gate_failure() is None, (name, judged)
        assert "different checkpoints" not in render_text(found), name


@pytest.mark.slow
def test_saves_by_different_writers_are_named_and_never_ranked(tmp_path, capsys):
    """The same checkpoint saved by the layout's own writer and by the parallel one: the
    comparison names both writers and renders no verdict; the gate says why it failed."""
    for strategy in ("parallel", "framework"):
        synth("save", str(tmp_path / strategy / "ckpt"), "--layout", "torch", "--scale",
              str(TINY_SCALE), "--strategy", strategy, "--repeat", "2", "--ceiling-gbps", "2",
              "--out", str(tmp_path / strategy / "save"))  # fmt: skip
    paths = [str(tmp_path / "parallel"), str(tmp_path / "framework")]
    found = compare(paths, ["a", "b"], limit=0.1)
    assert found.writers == {"save": {"a": "parallel", "b": "framework"}}
    assert found.regressions == [] and not any(f.comparable for f in found.findings)
    text = render_text(found)
    assert "not ranked: written by different writers (a: parallel, b: framework)" in text
    assert main(["compare", *paths, "--fail-if-slower", "10%"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "written by different writers" in line and "the same --strategy" in line


@pytest.mark.slow
def test_a_save_json_reads_as_its_saves_and_a_bad_one_is_one_line(tmp_path, capsys):
    """``report`` and ``compare`` read a save.json alone (it used to be "not a ckptprof
    results file"); a damaged or newer one is one line naming the file and the fix."""
    synth("save", str(tmp_path / "ckpt"), "--layout", "torch", "--scale", str(TINY_SCALE),
          "--repeat", "2", "--ceiling-gbps", "2", "--out", str(tmp_path / "out"))  # fmt: skip
    good = tmp_path / "out" / "save.json"
    doc = json.loads(good.read_text())
    assert doc["schema_version"] == 1
    capsys.readouterr()
    assert main(["report", str(good)]) == 0
    out = capsys.readouterr().out
    assert "2 saves, save time median" in out and "strategy=parallel" in out
    wrong = {
        "newer": ({**doc, "schema_version": 2}, "written by a newer ckptprof"),
        "bad": ({**doc, "saves": [{**doc["saves"][0], "wall_s": "slow"}]}, "saves[0].wall_s"),
    }
    for name, (content, words) in wrong.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(content))
        assert main(["compare", str(path), str(good)]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"ckptprof: error: {path}: ") and words in line, line


def test_the_same_runs_compared_with_themselves_have_no_difference_to_separate():
    """A results.json against its own traces: rounding apart, the same numbers; no
    verdict asks for billions of repeats."""
    from ckptprof.report.compare import repeats_to_separate

    walls = [1.2345678, 1.3, 1.25]
    assert repeats_to_separate(walls, [w + 1e-9 for w in walls]) is None
    assert repeats_to_separate(walls, [w + 0.01 for w in walls]) > len(walls)


def test_the_gate_fails_when_every_repeat_is_slower_by_more_than_the_limit():
    """Medians 14% apart with repeats that do not overlap is what two runs of the same
    code give at a 10% spread: no failure. A regression whose fastest repeat is slower
    than the base's slowest by more than the limit fails; two repeats a side are not
    enough to judge."""
    from ckptprof.report.compare import judge
    from ckptprof.report.comparison import Entry

    def entry(source, walls):
        return Entry(source, "cold c=8", walls)

    base = entry("base", [1.0, 1.05, 1.1])
    (noise,) = judge(base, entry("new", [1.15, 1.2, 1.25]), 0.10)
    assert noise.beyond_spread and noise.change > 0.10 and not noise.slower
    (regression,) = judge(base, entry("new", [1.25, 1.3, 1.4]), 0.10)
    assert regression.slower and regression.verdict == "slower"
    (few,) = judge(entry("base", [1.0, 1.05]), entry("new", [2.0, 2.1]), 0.10)
    assert not few.judged and not few.slower


def test_one_ranks_restore_reads_at_its_share_of_the_checkpoint(tmp_path):
    """A restore of rank 0 of 4 read a quarter of the checkpoint: its read GB/s is that
    quarter over its time to state, in the storage table and the save-vs-restore pair
    (the checkpoint's whole size made it 4x too fast)."""
    from ckptprof.report import load
    from ckptprof.report.compare import compare

    run = {"strategy": "pipelined", "cache": "cold", "concurrency": 8, "wall_s": 1.0,
           "bytes": 4 * 10**8, "read_bytes": 10**8,
           "phases": {"fetch": {"busy_s": 0.5, "bytes": 10**8}}}  # fmt: skip
    doc = {"spec": {"model": "llama2-7b", "layout": "torch", "scale": 0.01},
           "environment": {"storage.uri": str(tmp_path / "ckpt")}, "runs": [run] * 3}  # fmt: skip
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(doc))
    found = compare([str(tmp_path / "a"), str(tmp_path / "b")])
    [entry, _] = next(iter(found.entries.values()))
    assert entry.gbps == pytest.approx(0.1)  # 10^8 bytes in 1 s
    from ckptprof.report.checkpoint_cost import _restores

    [(seconds, nbytes, _)] = _restores([], load([str(tmp_path / "a")]).results).values()
    assert (seconds, nbytes) == (1.0, 10**8)  # what the save beside it is set against
