"""``ckptprof compare``'s text, JSON and plot tell one story: a row with too few repeats
to judge is never ranked (the JSON's ``judged: false``), every judged move beyond the
spread the JSON lists is said in the text, and every view lists settings in the report's
order (c=8 before c=16). Real tiny sweeps,
and documents made from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptprof.cli import main
from ckptprof.report.compare import compare
from ckptprof.report.compare_json import render_json
from ckptprof.report.compare_text import render_text
from ckptprof.report.comparison import TTS, Finding
from ckptprof.report.plot import compare_figure
from tests.test_compare_gate import RESTORE, results, slowed, write

C1, C8, C16 = "pipelined cold c=1", "pipelined cold c=8", "pipelined cold c=16"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, checkpoints) -> Path:
    """Real cold restores at 1, 8 and 16 in flight, 3 repeats each."""
    root = tmp_path_factory.mktemp("views")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CKPTPROF_STATE_DIR", str(root / "state"))
        assert main(["synth", "restore", str(checkpoints("safetensors")), *RESTORE,
                     "--concurrency", "1,8,16", "--out", str(root / "base")]) == 0  # fmt: skip
    return root / "base"


def block(text: str, setting: str) -> list[str]:
    return text.split(f"\n{setting}\n")[1].split("\n\n")[0].splitlines()


def test_a_row_too_few_repeats_to_judge_is_never_ranked(sweep, tmp_path):
    """Once, a source's single run, far slower than the base, was ranked "2" (+%) in the
    text, the footer said "no setting moved beyond its repeats' spread" and no line said
    why, while the JSON held it beyond the spread and not judged."""
    doc = slowed(results(sweep))  # every run slower than every run of the sweep
    doc["runs"] = [r for r in doc["runs"] if r["concurrency"] == 8][:1]
    doc["summary"] = []
    new = write(tmp_path / "new", doc)
    found = compare([str(sweep), str(new)], ["base", "new"])
    [finding] = [f for f in json.loads(render_json(found))["findings"]
                 if f["setting"] == C8 and f["what"] == TTS]  # fmt: skip
    assert finding["beyond_spread"] and not finding["judged"]
    text = render_text(found)
    rows = block(text, C8)
    assert {r.split()[1]: r.split()[0] for r in rows[1:3]} == {"base": "1", "new": "-"}
    assert "  new: not judged: 1 run vs 3 (fewer than 3 repeats a side)" in rows
    assert f"not judged (fewer than 3 repeats on a side): new: {C8}" in text
    assert "no setting moved beyond its repeats' spread" not in text


@pytest.mark.parametrize("limit", [None, 0.1])
def test_every_judged_move_the_json_lists_is_in_the_text(sweep, tmp_path, limit, capsys):
    """Once, the text named only moves of what ranks a setting: a fetch judged faster
    beyond the spread (in the JSON's findings) went unsaid, with or without the gate,
    which passes on it as before (only slower fails it)."""
    doc = results(sweep)
    for run in (r for r in doc["runs"] if r["concurrency"] == 1):
        run["phases"]["fetch"]["busy_s"] += max(r["wall_s"] for r in doc["runs"])
    base = write(tmp_path / "base", doc)  # the same runs, each fetch far slower
    found = compare([str(base), str(sweep)], ["base", "new"], limit=limit)
    moved = [Finding(**f) for f in json.loads(render_json(found))["findings"]
             if f["judged"] and f["beyond_spread"]]  # fmt: skip
    assert [(f.setting, f.what, f.change < 0) for f in moved] == [(C1, "fetch", True)]
    text = render_text(found)
    for f in moved:
        assert f"phase moved: {f.line(limit)}" in text
    if limit is not None:
        assert found.regressions == [] and "gate: nothing slower" in text
        gate = ["compare", str(base), str(sweep), "--label", "base", "--label", "new"]
        assert main([*gate, "--fail-if-slower", "10%"]) == 0
        assert f"phase moved: new: {C1} fetch" in capsys.readouterr().out


def test_settings_come_in_the_reports_order_in_every_view(sweep, tmp_path):
    """Once, compare's text, JSON and plot sorted settings as text (c=1, c=16, c=8)
    where ``report`` sorts concurrency as a number (c=1, c=8, c=16)."""
    found = compare([str(sweep), str(write(tmp_path / "new", results(sweep)))])
    text = render_text(found)
    assert sorted((C1, C8, C16), key=lambda s: text.index(f"\n{s}\n")) == [C1, C8, C16]
    assert list(json.loads(render_json(found))["settings"]) == [C1, C8, C16]
    labels = [t.get_text() for t in compare_figure(found).axes[0].get_yticklabels()]
    assert list(dict.fromkeys(label.split(":")[0] for label in labels)) == [C1, C8, C16]
