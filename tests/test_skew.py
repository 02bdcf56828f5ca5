"""Rank skew (report/skew.py) on hand-made spans: the real recorder under a fake clock, so
each rank's start, state in place and end are exact; text, JSON and HTML say the same."""

from __future__ import annotations

import json

import pytest

from ckptprof.errors import CkptprofError
from ckptprof.phases import Attr, Phase
from ckptprof.report import aggregate, load, render_json, render_text
from ckptprof.report.html import render_html
from ckptprof.tracing import recorder as recorder_module
from tests.test_report import COLD, Clock, ns, record_restore, write_trace

START = 1_800_000_000 * 10**9


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(recorder_module, "time", fake)
    return fake


def job_trace(tmp_path, clock, ranks: dict[int, tuple[float, float, float]], step=None):
    """One restore of several ranks: ``rank: (began, loaded, ended)`` seconds after START;
    loading is a fetch, then the first step until it ended (a collective's end)."""

    def record(tracer):
        for rank, (began, loaded, ended) in ranks.items():
            clock.ns = START + ns(began)
            attrs = {**COLD, Attr.RANK: rank, Attr.WORLD_SIZE: len(ranks)}
            if step is not None:
                attrs[Attr.STEP] = step
            phases = [(Phase.FETCH, 0.0, loaded - began)]
            if ended > loaded:
                phases.append((Phase.FIRST_STEP, loaded - began, ended - loaded))
            record_restore(tracer, clock, attrs, ended - began, phases)

    return write_trace(tmp_path, record, run_id="job-9")


def test_the_rank_that_began_last_is_named_and_the_job_waited_on_it(tmp_path, clock):
    # rank 2 began 3 s late; the first step (a collective) ends every rank together, so
    # rank 0 has the longest RTO, though the job waited on rank 2
    trace = job_trace(tmp_path, clock, {0: (0.0, 0.5, 3.6), 1: (0.2, 1.2, 3.6), 2: (3.0, 3.5, 3.6)})
    report = aggregate(load([trace]))
    (group,) = report.groups
    (found,) = group.skews
    assert (found.first_rank, found.last_rank, found.waited_on) == (0, 2, 2)
    assert found.arrival_skew_s == pytest.approx(3.0)
    assert found.ready_skew_s == pytest.approx(3.0)
    assert [(r.rank, r.began_s, r.ready_s, r.ended_s) for r in found.ranks] == [
        (0, pytest.approx(0.0), pytest.approx(0.5), pytest.approx(3.6)),
        (1, pytest.approx(0.2), pytest.approx(1.2), pytest.approx(3.6)),
        (2, pytest.approx(3.0), pytest.approx(3.5), pytest.approx(3.6)),
    ]
    sentence = "rank 2 began loading 3.00 s after rank 0; the job waited on rank 2"
    text = render_text(report)
    assert sentence in text and "    2    +3.00     +3.50    +3.60" in text
    (doc,) = json.loads(render_json(report))["groups"][0]["skews"]
    assert doc["waited_on"] == 2 and sentence in doc["line"]
    assert sentence in render_html(report)


def test_ranks_a_collective_released_together_name_the_one_that_began_last(tmp_path, clock):
    # no first step: rank 0 waited inside its load for rank 1, released with it (a hair
    # after it: the last done is not the one the job waited on)
    trace = job_trace(tmp_path, clock, {0: (0.0, 3.52, 3.52), 1: (3.0, 3.5, 3.5)})
    (found,) = aggregate(load([trace])).groups[0].skews
    assert (found.last_rank, found.waited_on) == (1, 1)
    # ranks that began together: the one done last, however late its number
    trace = job_trace(tmp_path / "b", clock, {0: (0.0, 2.0, 2.0), 1: (0.0, 0.4, 0.4)})
    (found,) = aggregate(load([trace])).groups[0].skews
    assert found.arrival_skew_s == 0.0 and found.waited_on == 0


def test_several_restores_each_have_their_skew_and_the_worst_is_told(tmp_path, clock):
    first = job_trace(tmp_path / "a", clock, {0: (0.0, 1.0, 1.0), 1: (0.1, 1.0, 1.0)}, step=3)
    second = job_trace(tmp_path / "b", clock, {0: (10.0, 12.0, 12.0), 1: (11.5, 12, 12)}, step=6)
    report = aggregate(load([first, second]))
    assert sorted(s.label for s in report.groups[0].skews) == ["step 3", "step 6"]
    told = "rank skew (step 6, the most skewed of 2 restores; median arrival skew 0.80 s): "
    told += "rank 1 began loading 1.50 s after rank 0"
    assert told in " ".join(render_text(report).split())


def test_one_rank_has_no_skew(tmp_path, clock):
    report = aggregate(load([job_trace(tmp_path, clock, {0: (0.0, 1.0, 1.0)})]))
    assert report.groups[0].skews == []
    assert "rank skew" not in render_text(report)


def test_a_synthetic_jobs_results_tell_each_runs_skew_the_same_way(tmp_path):
    """``rank_runs`` of a results.json (each rank's start and wall time) go through the
    same computation: rank 1 began with rank 0 and loaded 1.5 s later; its first step
    (its own, after its state was in place) is not loading."""

    def run(rank, start, wall, step_s):
        phases = {"fetch": {"busy_s": wall - step_s}, "first_step": {"busy_s": step_s}}
        cell = {"repeat": 0, "cache": "cold", "concurrency": 2, "strategy": "window"}
        return {"rank": rank, "start_s": 1.8e9 + start, "wall_s": wall, "phases": phases, **cell}

    slow = run(1, 0.0, 2.0, 0.2)
    doc = {"runs": [slow], "rank_runs": [run(0, 0.0, 0.6, 0.3), slow]}
    (tmp_path / "results.json").write_text(json.dumps(doc))
    report = aggregate(load([tmp_path / "results.json"]))
    (found,) = report.sweeps[0].skews
    assert found.label == "window cold c=2 repeat 0"
    assert (found.last_rank, found.waited_on) == (1, 1)
    assert found.ready_skew_s == pytest.approx(1.5)
    assert "the job waited on rank 1 (the last loaded, 1.50 s after the first)" in " ".join(
        render_text(report).split()
    )
    bad = {**doc, "rank_runs": [{**doc["rank_runs"][0], "start_s": "soon"}]}
    (tmp_path / "results.json").write_text(json.dumps(bad))
    with pytest.raises(CkptprofError, match="start_s"):
        load([tmp_path / "results.json"])
