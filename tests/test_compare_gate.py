"""``ckptprof compare``'s gate judges only the new runs against the base: a source's runs
of one setting are pooled where they did the same work (a base folder of two sweeps),
refused in one line where they did not (two checkpoints under one --label), and a base
setting the new run lacks is named in every view and fails the gate. Real tiny sweeps,
and documents made from them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckptprof.cli import main
from ckptprof.errors import CkptprofError
from ckptprof.report.compare import compare
from ckptprof.report.compare_json import render_json
from ckptprof.report.compare_text import render_text
from tests.conftest import TINY_SCALE

C1, C2 = "pipelined cold c=1", "pipelined cold c=2"
RESTORE = ["--strategy", "pipelined", "--cache", "cold", "--no-first-step", "--ceiling-gbps",
           "1.5", "--repeat", "3", "--no-report"]  # fmt: skip


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, checkpoints) -> dict[str, Path]:
    """Real cold restores, each sweep into its own folder: "mon" at 1 and 2 in flight,
    "tue" at 2 of the same checkpoint, "big" at 2 of one twice the scale."""
    root = tmp_path_factory.mktemp("sweeps")
    small = checkpoints("safetensors")
    big = checkpoints("safetensors", scale=TINY_SCALE * 2)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CKPTPROF_STATE_DIR", str(root / "state"))
        for name, ckpt, conc in (("mon", small, "1,2"), ("tue", small, "2"), ("big", big, "2")):
            assert main(["synth", "restore", str(ckpt), *RESTORE, "--concurrency", conc,
                         "--out", str(root / name)]) == 0  # fmt: skip
    return {name: root / name for name in ("mon", "tue", "big")}


def results(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def write(folder: Path, doc: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(doc))
    return folder


def slowed(doc: dict) -> dict:
    """``doc`` with every run slower than every run of it was, whatever the spread: its
    times scaled by three times the ratio of its slowest run to its fastest."""
    out = json.loads(json.dumps(doc))
    walls = [r["wall_s"] for r in out["runs"]]
    factor = 3 * max(walls) / min(walls)
    for run in out["runs"]:
        run["wall_s"] *= factor
        if run.get("time_to_state_s") is not None:
            run["time_to_state_s"] *= factor
        for phase in run["phases"].values():
            phase["busy_s"] *= factor
    return out


def without(doc: dict, concurrency: int) -> dict:
    out = json.loads(json.dumps(doc))
    out["runs"] = [r for r in out["runs"] if r["concurrency"] != concurrency]
    out["summary"] = []
    return out


def test_a_base_folder_of_two_sweeps_is_one_source_and_never_judged(sweeps, tmp_path, capsys):
    """Once, `compare base/ new/` with base/ holding two sweeps listed "base (base)" twice
    at the setting both ran and judged one against the other: a base sweep much slower
    than the other failed the gate, blaming the base."""
    base = tmp_path / "base"
    for name in ("mon", "tue"):
        shutil.copytree(sweeps[name], base / name)
    write(base / "zz-slow", slowed(results(sweeps["mon"])))  # read after mon: judged by it
    new = write(tmp_path / "new", results(sweeps["mon"]))  # mon's numbers again
    found = compare([str(base), str(new)], limit=0.1)
    assert found.sources == [str(base), str(new)]
    for setting, entries in found.entries.items():
        assert sorted(e.source for e in entries) == sorted(found.sources), setting
    [pooled] = [e for e in found.entries[C2] if e.source == str(base)]
    assert len(pooled.values) == 9 and len(pooled.origins) == 3  # mon, tue, zz-slow: 3 each
    assert {f.source for f in found.findings} == {str(new)}  # never the base against itself
    assert found.regressions == [] and found.gate_failure() is None
    assert main(["compare", str(base), str(new), "--fail-if-slower", "10%"]) == 0
    out = capsys.readouterr().out
    block = out.split(f"\n{C2}\n")[1].split("\n\n")[0]
    assert block.count(f"{base} (base)") == 1 and f"{base}:" not in block
    assert f"note: {base} pools the runs of 3 files" in out
    doc = json.loads(render_json(found))
    assert [len(e["files"]) for e in doc["settings"][C2] if e["source"] == str(base)] == [3]

    # the same runs named twice under one label (the folder and its results.json, or the
    # results and their own traces) are counted once
    mon = sweeps["mon"]
    for twice in ([mon, mon / "results.json"], [mon, mon / "traces"]):
        once = compare([str(p) for p in twice], ["a", "a"])
        assert [len(e.values) for e in once.entries[C2]] == [3], twice


def test_a_new_run_lacking_a_base_setting_fails_the_gate_in_every_view(sweeps, tmp_path, capsys):
    """Once, a new run with no c=1 restore passed the gate ("nothing slower", exit 0) on
    c=2 alone, and nothing said that c=1 was never compared."""
    base = sweeps["mon"]
    new = write(tmp_path / "new", without(results(base), 1))  # c=2: the base's own numbers
    assert main(["compare", str(base), str(new), "--fail-if-slower", "10%"]) == 1
    out, err = capsys.readouterr()
    (line,) = err.strip().splitlines()
    assert f"did not judge every setting of the base for {new} ({C1}: no run of it)" in line
    assert f"(no {new} run of this setting: not judged, the gate fails)" in out.split(C1)[1]
    assert f"not judged (no run of the base's setting): {new}: {C1}" in out
    assert "gate: FAILED" in out and "nothing slower" not in out
    doc = json.loads(render_json(compare([str(base), str(new)], limit=0.1)))
    assert doc["not_judged"] == [
        {"source": str(new), "setting": C1, "why": "no run of it", "guarded": True,
         "fails_gate": True}
    ]  # fmt: skip
    assert doc["gate_failure"] == line.removeprefix("ckptprof: ")
    # c=1 in two repeats where the base has three: not judged, no pass either
    short = results(base)
    short["runs"] = [r for r in short["runs"] if r["concurrency"] != 1 or r["repeat"] != 0]
    fewer = write(tmp_path / "fewer", short)
    assert main(["compare", str(base), str(fewer), "--fail-if-slower", "10%"]) == 1
    assert f"{C1}: fewer than 3 repeats on a side" in capsys.readouterr().err
    # without a gate, the table still says so; a setting only the new run has is no gap
    assert main(["compare", str(base), str(new)]) == 0
    assert f"(no {new} run of this setting: not judged)" in capsys.readouterr().out
    assert main(["compare", str(new), str(base), "--fail-if-slower", "10%"]) == 0
    assert "(no " + str(new) + " run of this setting: nothing to judge against)" in (
        capsys.readouterr().out
    )
    # a setting the base itself ran too few times to judge is named, never fails the gate
    lone = results(base)
    lone["runs"] = [r for r in lone["runs"] if r["concurrency"] != 1 or r["repeat"] == 0]
    thin = write(tmp_path / "thin", lone)
    assert main(["compare", str(thin), str(new), "--fail-if-slower", "10%"]) == 0
    assert f"not judged (no run of the base's setting): {new}: {C1}" in capsys.readouterr().out


def test_runs_of_different_checkpoints_are_never_pooled(sweeps, tmp_path, capsys):
    """Once, `--label new` given to runs of two checkpoints pooled them into one sample
    (six runs of two sizes, no word); a folder of both pooled them the same way."""
    mon, tue, big = sweeps["mon"], sweeps["tue"], sweeps["big"]
    argv = ["compare", str(mon), str(tue), str(big), "--label", "base", "--label", "new",
            "--label", "new", "--fail-if-slower", "10%"]  # fmt: skip
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"ckptprof: error: {tue / 'results.json'} and {big / 'results.json'}")
    assert f"runs of {C2} for one source (new), but they restored different checkpoints" in line
    assert f"x{TINY_SCALE:g}" in line and f"x{TINY_SCALE * 2:g}" in line
    assert f"give {tue} and {big} a --label each" in line
    # one folder holding both sweeps: its own PATHs
    both = tmp_path / "both"
    shutil.copytree(tue, both / "tue")
    shutil.copytree(big, both / "big")
    with pytest.raises(CkptprofError, match=r"pass each as its own PATH \(both are under"):
        compare([str(mon), str(both)])
    # the HTML report of the same PATHs says why its storages are not side by side
    # (the section was dropped without a word)
    page = tmp_path / "report.html"
    assert main(["report", str(mon), str(both), "--html", str(page)]) == 0
    html = page.read_text()
    assert "<h2>Storages side by side</h2>" in html and "not shown: " in html
    assert "pass each as its own PATH" in html
    # their traces alone (no scale recorded): told apart by the bytes each restore read
    traces = tmp_path / "traces"
    for name in ("tue", "big"):
        shutil.copytree(sweeps[name] / "traces", traces / name)
    with pytest.raises(CkptprofError, match="restored different checkpoints") as refused:
        compare([str(mon), str(traces)])
    assert str(traces / "big") in str(refused.value) and str(traces / "tue") in str(refused.value)
    # runs of the same checkpoint under one label pool: six at c=2
    pooled = compare([str(mon), str(mon), str(tue)], ["base", "new", "new"], limit=0.1)
    assert [len(e.values) for e in pooled.entries[C2]] == [3, 6]


def test_runs_of_one_checkpoint_at_two_places_are_never_pooled(sweeps, tmp_path, capsys):
    """Two storages are what compare tells apart: a label (or a folder) holding runs of one
    checkpoint read at two places would make one sample of both."""
    tue = sweeps["tue"]
    doc = results(tue)
    here = doc["environment"]["storage.uri"]
    doc["environment"]["storage.uri"] = "s3://bucket/ck"
    for run in doc["runs"]:
        run.pop("trace_id")  # other runs than tue's own
    moved = write(tmp_path / "moved", doc)
    argv = ["compare", str(sweeps["mon"]), str(tue), str(moved), "--label", "base", "--label",
            "new", "--label", "new"]  # fmt: skip
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"but they were stored in different places ({here}; s3://bucket/ck)" in line, line
    # their traces alike: the place each restore's spans name
    traces = tmp_path / "traces"
    shutil.copytree(tue / "traces", traces / "here")
    shutil.copytree(sweeps["mon"] / "traces", traces / "there")
    for f in (traces / "there").rglob("*.jsonl"):
        f.write_text(f.read_text().replace(json.dumps(here)[1:-1], "s3://bucket/ck"))
    with pytest.raises(CkptprofError, match="stored in different places"):
        compare([str(sweeps["mon"]), str(traces)])
    # the same place: pooled as before
    pooled = compare([str(sweeps["mon"]), str(tue), str(tue / "traces")], ["base", "new", "new"])
    assert [len(e.values) for e in pooled.entries[C2]] == [3, 3]


def scaled(doc: dict, concurrency: int, factor: float) -> dict:
    """``doc`` with its runs at ``concurrency`` ``factor`` times as long, as other runs."""
    out = json.loads(json.dumps(doc))
    out["summary"] = []
    for run in out["runs"]:
        run.pop("trace_id", None)
        if run["concurrency"] == concurrency:
            for key in ("wall_s", "time_to_state_s"):
                if run.get(key) is not None:
                    run[key] *= factor
    return out


def test_the_storage_table_shows_one_setting_whichever_path_comes_first(sweeps, tmp_path):
    """The setting the storage table reads GB/s at was the base's fastest: `compare a b`
    showed one, `compare b a` another, each the first source's best case."""
    from ckptprof.report.compare_storage import storage_rows

    doc = results(sweeps["mon"])
    a = write(tmp_path / "a", scaled(doc, 1, 0.5))  # c=1 its best
    b = write(tmp_path / "b", scaled(doc, 1, 10.0))  # c=1 its worst by far
    heads = {storage_rows(compare([str(x), str(y)]))[0] for x, y in ((a, b), (b, a))}
    assert heads == {f"storage: read GB/s by time to state: {C2}"}


def test_the_storage_tables_verdict_names_the_seconds_it_is_judged_on(sweeps, capsys):
    """Once, "read: overlaps" sat beside read GB/s of 0.244 and 0.498: judged on the time
    to state of two different checkpoints, and saying neither."""
    assert main(["compare", str(sweeps["tue"]), str(sweeps["big"])]) == 0
    table = capsys.readouterr().out.split("\nstorage: ")[1].split("\n\n")[0].splitlines()
    row = next(r for r in table if r.split()[0] == str(sweeps["big"]))
    verdict = row.split(" 3 ", 1)[1]  # after the saves and restores columns
    assert verdict.strip().startswith("read (time to state, another checkpoint): "), row
    same = render_text(compare([str(sweeps["mon"]), str(sweeps["tue"])]))
    row = next(r for r in same.splitlines() if r.strip().startswith(str(sweeps["tue"])))
    assert "read (time to state): " in row and "another checkpoint" not in row


def test_the_same_path_twice_is_two_sources():
    """`compare X X` (a sanity check): two sources, the second told apart by name."""
    from ckptprof.report.compare import _labels

    assert _labels(["a", "a"]) == ["a", "a#2"]
    assert _labels(["a/results.json", "a", "b"]) == ["a/results.json", "a", "b"]
    assert _labels(["x/run", "y/run"]) == ["x/run", "y/run"]
