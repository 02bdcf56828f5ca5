"""``ckptprof report``: traces written by the real recorder, a results.json fixture, hints."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pytest

from ckptprof.errors import CkptprofError
from ckptprof.phases import Attr, Phase
from ckptprof.report import aggregate, load, render_json, render_text, write_plot
from ckptprof.report import hints as H
from ckptprof.report import hints_group as HG
from ckptprof.report import hints_sweep as HS
from ckptprof.report.breakdown import Breakdown, PhaseRow, SweepRow
from ckptprof.report.comparison import MIN_REPEATS
from ckptprof.report.records import RecordedCeiling
from ckptprof.tracing import CheckpointTracer, setup_telemetry
from ckptprof.tracing import recorder as recorder_module
from tests.conftest import run_cli

MB = 1_000_000
MiB = 1024 * 1024


# --------------------------------------------------------------------- recording helpers
class Clock:
    """Stands in for the recorder's ``time`` module so wall times are exact."""

    def __init__(self) -> None:
        self.ns = 1_800_000_000 * 10**9

    def time_ns(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += round(seconds * 1e9)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(recorder_module, "time", fake)
    return fake


def ns(seconds: float) -> int:
    return round(seconds * 1e9)


def record_restore(tracer, clock, attrs, wall, phases, files=(), kind="restore"):
    """One operation: ``phases`` are (phase, start offset s, duration s) intervals."""
    with getattr(tracer, kind)(attrs) as op:
        t0 = clock.ns
        for phase, start, duration in phases:
            op.add_interval(phase, t0 + ns(start), t0 + ns(start + duration))
        for phase, nbytes, seconds in files:
            op.add_file(phase, f"shard-{nbytes}-{seconds}", nbytes, seconds)
        clock.advance(wall)


def write_trace(directory: Path, record, run_id="run-a", per_file_spans=False) -> Path:
    telemetry = setup_telemetry(directory, run_id=run_id, otlp=False)
    tracer = CheckpointTracer(telemetry.provider, run_id=run_id, per_file_spans=per_file_spans)
    record(tracer)
    telemetry.shutdown()
    assert telemetry.trace_file is not None and telemetry.trace_file.exists()
    return telemetry.trace_file


COLD = {Attr.CACHE: "cold", Attr.CONCURRENCY: 8, Attr.FORMAT: "torch", Attr.STORAGE_KIND: "posix"}


@pytest.fixture
def three_restores(tmp_path, clock) -> Path:
    """Fetch 0.1/0.3/0.2 s, walls 1/3/2 s; phases recorded out of canonical order."""

    def record(tracer):
        for repeat, (fetch, wall) in enumerate([(0.1, 1.0), (0.3, 3.0), (0.2, 2.0)]):
            record_restore(
                tracer,
                clock,
                {**COLD, Attr.REPEAT: repeat},
                wall,
                [(Phase.FIRST_STEP, 0.5, 0.1), (Phase.FETCH, 0.02, fetch), (Phase.LIST, 0.0, 0.02)],
                files=[(Phase.FETCH, 100 * MB, fetch / 3)] * 3,
            )

    return write_trace(tmp_path / "traces", record, per_file_spans=True)


# --------------------------------------------------------------------- traces
def test_trace_group_medians_and_canonical_phase_order(three_restores):
    report = aggregate(load([three_restores]))
    assert len(report.groups) == 1
    group = report.groups[0]
    b = group.breakdown
    assert group.kind == "restore"
    assert group.config == {
        "framework": "synthetic",
        "format": "torch",
        "storage": "posix",
        "cache": "cold",
        "concurrency": 8,
    }
    assert b.repeats == 3
    assert (b.wall_min_s, b.wall_median_s, b.wall_max_s) == (1.0, 2.0, 3.0)
    assert [r.phase for r in b.phases] == ["list", "fetch", "first_step"]
    fetch = b.phase(Phase.FETCH)
    assert fetch.busy_s == pytest.approx(0.2)
    assert fetch.share == pytest.approx(0.1)
    assert fetch.nbytes == 300 * MB
    assert fetch.files == 3  # ckpt.file child spans are not phases
    assert fetch.gbps == pytest.approx(1.5)  # median of 3.0, 1.0, 1.5 GB/s

    text = render_text(report)
    rows = [
        line.split()[0]
        for line in text.splitlines()
        if re.match(r"  (list|fetch|first_step) ", line)
    ]
    assert rows == ["list", "fetch", "first_step"]
    flat = " ".join(text.split())  # a synthetic restore: its time to state first
    assert "3 restores, time to state (list -> reshard) median" in flat
    assert "RTO median 2.000 s (min 1.000, max 3.000)" in flat
    assert re.search(r"fetch\s+0\.200\s+10\.0%\s+300\.00 MB\s+1\.50\s+3", text)
    assert "sum of phases 0.320 s vs wall (critical path) 2.000 s" in text
    assert "overlapped" not in text
    assert all(len(line) <= 100 for line in text.splitlines())


def test_overlapping_phases_are_reported_not_summed(tmp_path, clock):
    def record(tracer):
        record_restore(
            tracer,
            clock,
            COLD,
            1.0,
            [(Phase.FETCH, 0.0, 0.8), (Phase.DESERIALIZE, 0.2, 0.8)],
        )

    report = aggregate(load([write_trace(tmp_path, record)]))
    b = report.groups[0].breakdown
    assert b.phase_sum_s == pytest.approx(1.6)
    assert b.overlapped
    text = render_text(report)
    assert "sum of phases 1.600 s vs wall (critical path) 1.000 s: phases overlapped" in text


def test_time_outside_phases_is_named(tmp_path, clock):
    def record(tracer):
        record_restore(tracer, clock, COLD, 2.0, [(Phase.FETCH, 0.0, 1.0)])

    text = render_text(aggregate(load([write_trace(tmp_path, record)])))
    assert "1.000 s (50% of RTO) outside any phase" in text


def test_slowest_rank_is_named_and_sets_the_rto(tmp_path, clock):
    walls = {0: 1.0, 1: 1.2, 2: 2.5, 3: 1.1}

    def record(tracer):
        for rank, wall in walls.items():
            record_restore(
                tracer,
                clock,
                {**COLD, Attr.RANK: rank, Attr.WORLD_SIZE: 4},
                wall,
                [(Phase.FETCH, 0.0, wall / 2)],
            )

    report = aggregate(load([write_trace(tmp_path, record, run_id="job-7")]))
    group = report.groups[0]
    assert group.ranks is not None
    assert (group.ranks.slowest_rank, group.ranks.slowest_wall_s) == (2, 2.5)
    assert (group.ranks.fastest_rank, group.ranks.ranks) == (0, 4)
    # one restore of four ranks: its RTO is the slowest rank's, its phases that rank's
    assert group.breakdown.repeats == 1
    assert group.breakdown.wall_median_s == 2.5
    assert group.breakdown.phase("fetch").busy_s == pytest.approx(1.25)
    assert "slowest rank 2: RTO 2.500 s; fastest rank 0: 1.000 s (4 ranks" in render_text(report)


def test_single_rank_runs_name_no_slowest_rank(three_restores):
    report = aggregate(load([three_restores]))
    assert report.groups[0].ranks is None
    assert "slowest rank" not in render_text(report)


def test_groups_split_by_configuration_and_kind(tmp_path, clock):
    def record(tracer):
        record_restore(tracer, clock, {**COLD, Attr.CACHE: "hot"}, 0.5, [(Phase.FETCH, 0, 0.1)])
        record_restore(tracer, clock, COLD, 2.0, [(Phase.FETCH, 0, 1.0)])
        record_restore(
            tracer,
            clock,
            {Attr.FORMAT: "torch"},
            0.4,
            [(Phase.COMMIT, 0.3, 0.1), (Phase.SERIALIZE, 0.0, 0.1), (Phase.WRITE, 0.1, 0.2)],
            kind="save",
        )

    report = aggregate(load([write_trace(tmp_path, record)]))
    assert [(g.kind, g.config.get("cache")) for g in report.groups] == [
        ("restore", "cold"),
        ("restore", "hot"),
        ("save", None),
    ]
    save = report.groups[2].breakdown
    assert [r.phase for r in save.phases] == ["serialize", "write", "commit"]
    text = render_text(report)
    assert "1 save, save time median 0.400 s" in text


def test_failed_restore_is_counted_but_not_in_medians(tmp_path, clock):
    def record(tracer):
        record_restore(tracer, clock, COLD, 1.0, [(Phase.FETCH, 0, 0.5)])
        with pytest.raises(OSError), tracer.restore(COLD) as op:
            op.add_interval(Phase.FETCH, clock.ns, clock.ns + ns(0.1))
            clock.advance(9.0)
            raise OSError("disk gone")

    report = aggregate(load([write_trace(tmp_path, record)]))
    group = report.groups[0]
    assert (group.failed, group.breakdown.repeats, group.breakdown.wall_median_s) == (1, 1, 1.0)
    assert "1 failed, not counted: OSError: disk gone" in render_text(report)


def test_malformed_lines_are_skipped_with_one_warning(three_restores, capsys):
    with open(three_restores, "a", encoding="utf-8") as handle:
        handle.write('{"name": "ckpt.fetch", trunc\n')
        handle.write("not json at all\n")
    data = load([three_restores.parent])
    assert len(data.operations) == 3
    assert len(data.warnings) == 1
    assert "skipped 2 malformed lines in 1 trace file" in data.warnings[0]

    from ckptprof.cli.report import run

    assert run(argparse.Namespace(paths=[str(three_restores)], by="phase", format="table")) == 0
    captured = capsys.readouterr()
    assert captured.err.count("ckptprof: warning:") == 1
    assert "skipped 2 malformed lines" in captured.err
    assert "3 restores" in captured.out


def test_file_that_is_not_json_lines_raises_naming_it(tmp_path):
    bad = tmp_path / "notes.jsonl"
    bad.write_text("this is a log file\nnot spans\n")
    with pytest.raises(CkptprofError, match=r"notes\.jsonl: not a ckptprof trace file.*pass"):
        load([bad])


def test_missing_path_raises_naming_it(tmp_path):
    with pytest.raises(CkptprofError, match=r"nowhere: no such file or directory"):
        load([tmp_path / "nowhere"])


def test_directory_without_traces_raises(tmp_path):
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(CkptprofError, match=r"no trace files"):
        load([tmp_path])


def test_by_run_lists_each_operation(three_restores):
    text = render_text(aggregate(load([three_restores])), by="run")
    walls = re.findall(r"^  \S+\s+cold\s+8\s+\d\s+(\d\.\d{3})", text, flags=re.M)
    assert walls == ["1.000", "3.000", "2.000"]


# --------------------------------------------------------------------- results.json
def results_doc() -> dict:
    def run(cache, conc, repeat, wall, fetch, verify=0.1, resident=0.0):
        return {
            "cache": cache,
            "concurrency": conc,
            "repeat": repeat,
            "wall_s": wall,
            "bytes": 1_200 * MB,
            "resident_fraction": resident,
            "cache_method": "posix_fadvise(DONTNEED)" if cache == "cold" else "read",
            "trace_id": f"0x{repeat:032x}",
            "phases": {
                "list": {"busy_s": 0.01, "bytes": 0, "files": 12},
                "fetch": {"busy_s": fetch, "bytes": 1_200 * MB, "files": 12, "gbps": 1.2 / fetch},
                "verify": {"busy_s": verify, "bytes": 1_200 * MB, "files": 12},
                "deserialize": {"busy_s": 0.2},
                "reshard": {"busy_s": 0.05},
                "first_step": {"busy_s": 0.1, "emulated": False},
            },
        }

    runs = [
        run("cold", 1, 0, 4.0, 3.0),
        run("cold", 1, 1, 4.4, 3.4),
        run("cold", 1, 2, 4.2, 3.2),
        run("cold", 16, 0, 1.5, 1.0, resident=0.02),
        run("cold", 16, 1, 1.7, 1.2, resident=0.03),
        run("hot", 16, 0, 0.6, 0.2, resident=1.0),
    ]
    return {
        "ckptprof_version": "0.1.0",
        "created": "2026-11-29T22:19:51Z",
        "spec": {"model": "llama2-7b", "layout": "torch", "scale": 0.01, "ranks": 1},
        "environment": {
            "date": "2026-11-29T22:19:51Z",
            "host.name": "vm",
            "version.python": "3.11.7",
            "os.kernel": "6.1.0",
            "cpu.count": 16,
            "memory.total_bytes": 128_000_000_000,
            "version.ckptprof": "0.1.0",
            "version.torch": "2.13.0",
            "storage.kind": "posix",
            "storage.uri": "/data/ckpt",
            "storage.fs_type": "ext4",
            "storage.mount_options": "rw,relatime",
        },
        "ceiling": {
            "read_gbps": 1.5,
            "source": "probe",
            "request_latency_s": 0.004,
            "part_size": 16 * MiB,
            "littles_law_inflight": 6.2,
            "lower_bound_fetch_s": 0.8,
            "bytes": 1_200 * MB,
        },
        "runs": runs,
        "summary": [
            {
                "cache": "cold",
                "concurrency": 1,
                "repeats": 3,
                "rto_s": {"min": 4.0, "median": 4.2, "max": 4.4},
                "fetch_gbps_median": 0.375,
                "fraction_of_ceiling": 0.25,
                "phases": {"fetch": {"min_s": 3.0, "median_s": 3.2, "max_s": 3.4}},
            }
        ],
    }


@pytest.fixture
def results_dir(tmp_path) -> Path:
    folder = tmp_path / "run1"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(results_doc(), indent=2))
    return folder


def test_results_sweep_table(results_dir):
    report = aggregate(load([results_dir / "results.json"]))
    (sweep,) = report.sweeps
    cells = [(r.breakdown.cache, r.breakdown.concurrency, r.breakdown.repeats) for r in sweep.rows]
    assert cells == [("cold", 1, 3), ("cold", 16, 2), ("hot", 16, 1)]
    cold1, cold16, hot16 = sweep.rows
    assert cold1.breakdown.wall_median_s == 4.2
    assert cold1.fraction_of_ceiling == pytest.approx(0.25)  # from its runs
    assert cold16.breakdown.wall_median_s == pytest.approx(1.6)
    assert cold16.fetch_gbps == pytest.approx((1.2 + 1.0) / 2)  # median of 1.2 and 1.0 GB/s
    assert cold16.fraction_of_ceiling == pytest.approx(1.1 / 1.5)
    assert cold16.breakdown.resident_fraction == 0.03

    text = render_text(report)
    lines = text.splitlines()
    ceiling = next(i for i, line in enumerate(lines) if "ceiling:" in line)
    table = next(i for i, line in enumerate(lines) if line.lstrip().startswith("cache"))
    assert ceiling < table
    assert "read 1.50 GB/s (probe)" in text
    assert "lower-bound fetch 0.800 s" in text
    assert "Little's Law: 6.2 requests of 16.78 MB in flight" in text
    first = next(i for i, line in enumerate(lines) if line.startswith("  env: "))
    env = " ".join(line.strip() for line in lines[first : first + 2])
    assert env.startswith("env: storage posix at /data/ckpt, fs ext4 (rw,relatime), 16 CPUs")
    assert "128.00 GB RAM" in env and "python 3.11.7, torch 2.13.0" in env
    assert hot16.fraction_of_ceiling is None  # page cache is not bounded by the storage ceiling
    # a synthetic sweep's headline is its time to state (the RTO less the first step); the
    # first step and the RTO beside it
    assert re.search(r"cold\s+1\s+(3\s+)?4\.100 ±\d+%\s+0\.010\s+3\.200.*\s0\.100\s+4\.200\s", text)
    assert re.search(r"cold\s+16\s+(2\s+)?1\.500 .*\s1\.600\s+1\.10\s+73%$", text, flags=re.M)
    assert "to state: list -> reshard" in text
    assert all(len(line) <= 100 for line in lines)


def test_directory_with_results_json_uses_it_not_its_traces(results_dir, clock):
    def record(tracer):
        record_restore(tracer, clock, COLD, 1.0, [(Phase.FETCH, 0, 0.5)])

    write_trace(results_dir / "traces", record)
    data = load([results_dir])
    assert len(data.results) == 1 and data.operations == []


def test_results_hints_fire_on_the_fixture(results_dir):
    (sweep,) = aggregate(load([results_dir])).sweeps
    codes = [h.code for h in sweep.hints]
    assert codes == ["low-concurrency"]
    assert "use concurrency 7 or more" in sweep.hints[0].message
    assert "c=1 cold: 25%" in sweep.hints[0].message


def test_results_file_that_is_not_json_raises(tmp_path):
    bad = tmp_path / "results.json"
    bad.write_text('{"runs": [')
    with pytest.raises(CkptprofError, match=r"results\.json: not valid JSON"):
        load([bad])


def test_json_format_prints_the_aggregate(results_dir, three_restores, capsys):
    from ckptprof.cli.report import run

    assert (
        run(argparse.Namespace(paths=[str(results_dir), str(three_restores)], format="json")) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["groups"][0]["breakdown"]["wall_median_s"] == 2.0
    assert doc["groups"][0]["breakdown"]["overlapped"] is False
    assert doc["sweeps"][0]["ceiling"]["read_gbps"] == 1.5
    assert doc["sweeps"][0]["hints"][0]["code"] == "low-concurrency"
    assert json.loads(render_json(aggregate(load([results_dir]))))["groups"] == []


# --------------------------------------------------------------------- CLI and plot
def test_cli_parser_help_and_defaults(three_restores, capsys):
    from ckptprof.cli import report as report_cli

    parser = argparse.ArgumentParser(prog="ckptprof")
    report_cli.add_parser(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit):
        parser.parse_args(["report", "--help"])
    help_text = capsys.readouterr().out
    assert "ckptprof report ckptprof-traces/" in help_text and "--plot" in help_text
    args = parser.parse_args(["report", str(three_restores)])
    assert (args.by, args.format, args.plot, args.func) == ("phase", "table", None, report_cli.run)
    assert args.func(args) == 0
    assert "RTO median 2.000 s" in capsys.readouterr().out


def bar_chart(ax) -> dict:
    """What a phase-bars axes shows, read back from its artists: the bars' labels (top
    to bottom), each phase's stacked bars (widths and where they start), each bar's black
    tick (the figure it is ranked and labelled by), the repeats' min–max lines of that
    figure, each bar's RTO diamond (None where none is drawn) and the notes."""
    marks: dict[str, dict[int, list[float]]] = {"ranked": {}, "spread": {}, "rto": {}}
    for line in ax.lines:
        kind, _, index = (line.get_gid() or "").rpartition("-")
        if kind in marks:
            marks[kind][int(index)] = [float(x) for x in line.get_xdata()]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    return {
        "title": ax.get_title(),
        "labels": labels,
        "legend": [t.get_text() for t in ax.get_legend().get_texts()],
        "widths": {c.get_label(): [p.get_width() for p in c.patches] for c in ax.containers},
        "lefts": {c.get_label(): [p.get_x() for p in c.patches] for c in ax.containers},
        "ranked": [marks["ranked"].get(i, [None])[0] for i in range(len(labels))],
        "spread": [tuple(marks["spread"][i]) for i in sorted(marks["spread"])],
        "rto": [marks["rto"][i][0] if i in marks["rto"] else None for i in range(len(labels))],
        "notes": [t.get_text() for t in ax.texts],
    }


def test_a_traced_synthetic_restore_heads_with_its_time_to_state(tmp_path, clock):
    """Traces of synthetic restores (no results.json): the time to state first, the RTO
    with its first step beside it; a callback's traces keep the RTO alone."""

    def record(tracer):
        for step in (2.0, 9.0):  # a first step that swings; the read does not
            phases = [(Phase.FETCH, 0, 0.5), (Phase.FIRST_STEP, 0.5, step)]
            record_restore(tracer, clock, COLD, 0.5 + step, phases)  # the tracer's: synthetic
        resume = [(Phase.FETCH, 0, 0.5), (Phase.FIRST_STEP, 0.5, 2.5)]
        record_restore(tracer, clock, {**COLD, Attr.FRAMEWORK: "lightning"}, 3.0, resume)

    text = render_text(aggregate(load([write_trace(tmp_path, record)])))
    flat = " ".join(text.split())
    assert ("2 restores, time to state (list -> reshard) median 0.500 s (min 0.500, max "
            "0.500), the first step beside it: RTO median 6.000 s") in flat  # fmt: skip
    assert "1 restore, RTO median 3.000 s" in flat


def test_every_phase_of_a_save_and_a_restore_is_drawn_in_its_own_colour(tmp_path, clock):
    """fetch and fsync were both the default blue; an adapter's own phase took a colour of
    the cycle too."""
    pytest.importorskip("matplotlib")
    from ckptprof.report.plot import bars_figure

    def record(tracer):
        restore = [
            (p, i * 0.1, 0.1)
            for i, p in enumerate(Phase)
            if p.value in ("list", "fetch", "verify", "deserialize", "reshard", "first_step")
        ]
        record_restore(tracer, clock, COLD, 1.0, restore)
        save = [
            (p, i * 0.1, 0.1)
            for i, p in enumerate(("stage", "serialize", "write", "fsync", "commit", "rotate"))
        ]
        record_restore(tracer, clock, {Attr.FORMAT: "torch"}, 1.0, save, kind="save")

    report = aggregate(load([write_trace(tmp_path, record)]))
    ax = bars_figure(report).axes[0]
    colours = {c.get_label(): c.patches[0].get_facecolor() for c in ax.containers}
    assert len(colours) == 12  # 6 restore phases, 5 save phases and rotate
    assert len(set(colours.values())) == len(colours), colours


def assert_stacked(chart: dict) -> None:
    """Every phase's bar starts where the phases before it (in legend order) end."""
    ends = [0.0] * len(chart["labels"])
    for phase in chart["legend"]:
        assert chart["lefts"][phase] == pytest.approx(ends), phase
        ends = [a + w for a, w in zip(ends, chart["widths"][phase], strict=True)]


def png_size(path: Path) -> tuple[int, int]:
    """(height, width) in pixels of the image at ``path`` (a real PNG, read back)."""
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return imread(path).shape[:2]


def drawn_at(fig, dpi: int = 110) -> tuple[int, int]:
    width, height = fig.get_size_inches()
    return round(height * dpi), round(width * dpi)


def test_plot_writes_a_png(results_dir, three_restores, tmp_path, monkeypatch):
    """The PNG is the figure drawn from the report: one bar per sweep setting and per
    trace group, phases stacked at their medians, RTO ticks and min–max lines at the
    repeats' wall times, and fetch GB/s against concurrency with the ceiling."""
    pytest.importorskip("matplotlib")
    from ckptprof.cli.report import print_report
    from ckptprof.report import plot

    figures, draw = [], plot.summary_figure
    monkeypatch.setattr(plot, "summary_figure", lambda r: figures.append(draw(r)) or figures[-1])
    out = tmp_path / "report.png"
    written = write_plot(aggregate(load([results_dir, three_restores])), out)
    assert written == out
    (fig,) = figures
    assert png_size(out) == drawn_at(fig)  # the file is this figure
    top, bottom = fig.axes
    bars = bar_chart(top)
    assert bars["title"] == "Where the time goes, per configuration"
    # results.json's sweep (medians of its repeats), then the traces' group of 3 restores
    assert bars["labels"] == ["cold c=1", "cold c=16", "hot c=16", "restore torch posix cold c=8"]
    assert bars["legend"] == ["list", "fetch", "verify", "deserialize", "reshard", "first_step"]
    assert bars["widths"] == {
        "list": pytest.approx([0.01, 0.01, 0.01, 0.02]),
        "fetch": pytest.approx([3.2, 1.1, 0.2, 0.2]),
        "verify": pytest.approx([0.1, 0.1, 0.1, 0.0]),  # the traces recorded no verify
        "deserialize": pytest.approx([0.2, 0.2, 0.2, 0.0]),
        "reshard": pytest.approx([0.05, 0.05, 0.05, 0.0]),
        "first_step": pytest.approx([0.1, 0.1, 0.1, 0.1]),
    }
    assert_stacked(bars)
    # a synthetic restore is headed by its time to state (the RTO less its 0.1 s first
    # step), with its min–max, as the text report heads it; the RTO beside it
    assert bars["ranked"] == pytest.approx([4.1, 1.5, 0.5, 1.9])
    spread = [(3.9, 4.3), (1.4, 1.6), (0.9, 2.9)]  # hot c=16 ran once
    assert bars["spread"] == [pytest.approx(line) for line in spread]
    assert bars["rto"] == pytest.approx([4.2, 1.6, 0.6, 2.0])
    assert bars["notes"] == ["to state 4.100 s (3.900–4.300)\nRTO 4.200 s",
                             "to state 1.500 s (1.400–1.600)\nRTO 1.600 s",
                             "to state 0.500 s\nRTO 0.600 s",
                             "to state 1.900 s (0.900–2.900)\nRTO 2.000 s"]  # fmt: skip
    assert "diamond: the RTO, first step included" in top.get_xlabel()
    assert bottom.get_title() == "Fetch throughput vs concurrency"
    assert [t.get_text() for t in bottom.get_xticklabels()] == ["1", "16"]
    curves = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
              for line in bottom.lines}  # fmt: skip
    assert curves.keys() == {"cold", "hot", "ceiling 1.50 GB/s"}
    assert curves["cold"][0] == [1, 16] and curves["cold"][1] == pytest.approx([1.2 / 3.2, 1.1])
    assert curves["hot"][0] == [16] and curves["hot"][1] == pytest.approx([1.2 / 0.2])
    assert curves["ceiling 1.50 GB/s"][1] == [1.5, 1.5]
    # the CLI's path draws the same way: the sweep alone, three bars
    print_report([str(results_dir)], plot=str(tmp_path / "again.png"))
    again = figures[-1]
    assert png_size(tmp_path / "again.png") == drawn_at(again)
    assert bar_chart(again.axes[0])["labels"] == ["cold c=1", "cold c=16", "hot c=16"]
    assert not list(tmp_path.glob(".report.png.*"))  # no temp file left behind


def test_plot_without_matplotlib_says_how_to_install(results_dir, tmp_path, monkeypatch):
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    missing = "matplotlib is not installed — pip install matplotlib"
    with pytest.raises(CkptprofError, match=missing):
        write_plot(aggregate(load([results_dir])), tmp_path / "x.png")


# --------------------------------------------------------------------- hints (no files)
def breakdown(rto=10.0, cache="cold", resident=None, concurrency=8, **phases) -> Breakdown:
    """``phases``: name=(busy_s, bytes, files, emulated)."""
    rows = []
    for name, (busy, nbytes, files, emulated) in phases.items():
        rows.append(PhaseRow(name, busy, busy / rto, nbytes, files, None, emulated, None))
    return Breakdown("cell", "restore", 3, rto, rto, rto, rows, cache, concurrency, resident)


def codes(b: Breakdown) -> list[str]:
    return [h.code for h in H.breakdown_hints(b)]


def test_verify_hint_fires_only_above_its_threshold():
    assert codes(breakdown(verify=(2.5, None, None, False))) == []  # exactly 25%
    assert codes(breakdown(verify=(2.6, None, None, False))) == ["verify-dominates"]
    assert (
        "--verify sample" in H.verify_dominates(breakdown(verify=(3.0, None, None, False))).message
    )


def test_deserialize_hint_fires_only_above_its_threshold():
    assert codes(breakdown(deserialize=(3.5, None, None, False))) == []
    hint = H.deserialize_dominates(breakdown(deserialize=(3.6, None, None, False)))
    assert hint is not None and "mmap" in hint.message and "safetensors" in hint.message


def test_small_files_hint_by_count_size_and_list_share():
    small = 1 * MiB
    assert codes(breakdown(fetch=(1.0, 256 * small, 256, False))) == []  # not more than 256
    assert codes(breakdown(fetch=(1.0, 257 * small, 257, False))) == ["many-small-files"]
    big = H.SMALL_FILE_MAX_BYTES
    assert codes(breakdown(fetch=(1.0, 300 * big, 300, False))) == []  # files not small
    assert codes(breakdown(list=(1.0, None, None, False))) == []  # exactly 10%
    hint = H.many_small_files(breakdown(list=(1.1, None, 4, False)))
    assert hint is not None and "list takes 11%" in hint.message and "pack" in hint.message


def test_emulated_phase_hint():
    assert codes(breakdown(first_step=(1.0, None, None, False))) == []
    hint = H.emulated_phases(breakdown(first_step=(1.0, None, None, True)))
    assert hint is not None and "first_step was emulated" in hint.message
    assert "estimates" in hint.message


def test_not_really_cold_hint():
    assert codes(breakdown(resident=0.05)) == []
    assert codes(breakdown(resident=0.06)) == ["not-cold"]
    assert codes(breakdown(resident=0.96, cache="hot")) == []


def test_a_hot_row_partly_read_from_the_storage_says_so():
    """A hot row's residency is its least cached repeat's (two of three at 30% read from
    the storage: "100%" before), and below 95% a hint says so."""
    from ckptprof.report.medians import build_breakdown

    b = build_breakdown(label="hot c=4", kind="restore", walls=[1.0, 1.1, 1.2],
                        samples=[{}, {}, {}], cache="hot", concurrency=4,
                        residency=[1.0, 0.3, 0.3], cache_method="read every byte")  # fmt: skip
    assert b.resident_fraction == 0.3
    hint = H.not_really_hot(b)
    assert hint is not None and "only 30%" in hint.message
    assert codes(breakdown(resident=0.9, cache="hot")) == ["not-hot"]


def sweep_row(concurrency, fraction, cache="cold") -> SweepRow:
    b = breakdown(concurrency=concurrency, cache=cache)
    return SweepRow(b, None if fraction is None else fraction * 1.5, fraction)


CEILING = RecordedCeiling(read_gbps=1.5, request_latency_s=0.004, littles_law_inflight=6.2)


def test_low_concurrency_hint_thresholds():
    assert HS.low_concurrency([sweep_row(4, 0.60)], CEILING) is None  # at 60%
    assert HS.low_concurrency([sweep_row(8, 0.10)], CEILING) is None  # 8 > 6.2 in flight
    assert HS.low_concurrency([sweep_row(4, 0.30, "hot")], CEILING) is None
    assert HS.low_concurrency([sweep_row(4, 0.30)], None) is None
    hint = HS.low_concurrency([sweep_row(1, 0.2), sweep_row(4, 0.59), sweep_row(8, 0.9)], CEILING)
    assert hint is not None
    assert "c=1 cold: 20%, c=4 cold: 59%" in hint.message
    assert "use concurrency 7 or more" in hint.message


def test_fetch_far_below_ceiling_hint_thresholds():
    assert HS.fetch_below_ceiling([sweep_row(16, 0.50)], CEILING) is None
    assert HS.fetch_below_ceiling([sweep_row(16, 0.40, "hot")], CEILING) is None
    # low concurrency explains it: that hint, not this one
    assert HS.fetch_below_ceiling([sweep_row(4, 0.40)], CEILING) is None
    hint = HS.fetch_below_ceiling([sweep_row(16, 0.49), sweep_row(32, 0.30)], CEILING)
    assert hint is not None and "only 30%" in hint.message and "concurrency 32" in hint.message


def test_merge_names_the_worst_cell_and_the_others():
    rows = [
        Breakdown(label, "restore", 1, 1.0, 1.0, 1.0, [PhaseRow("verify", v, v, None, None, None)])
        for label, v in (("cold c=1", 0.3), ("cold c=8", 0.5), ("hot c=8", 0.1))
    ]
    merged = HS.merge([h for b in rows for h in H.breakdown_hints(b)], total=3)
    assert len(merged) == 1
    assert merged[0].message.startswith("cold c=8: verify takes 50%")
    assert merged[0].message.endswith("(also cold c=1)")


def test_results_show_success_rate_retries_and_partial(tmp_path):
    doc = results_doc()
    doc.update(
        success_rate=0.75,
        failures=[
            {
                "cache": "cold",
                "concurrency": 1,
                "repeat": 2,
                "error": "s3://b/ckpt/x.pt: InternalError after 3 attempts",
            }
        ],
        requests={"requests": 120, "retries": 7, "errors": 9},
        partial=True,
    )
    (tmp_path / "results.json").write_text(json.dumps(doc))
    text = " ".join(render_text(aggregate(load([tmp_path / "results.json"]))).split())
    assert "PARTIAL: the sweep was interrupted" in text
    assert "success rate 75% (1 runs failed)" in text
    assert "120 requests, 7 retries, 9 failed attempts" in text
    assert "first failure: s3://b/ckpt/x.pt: InternalError" in text
    clean = results_doc()
    (tmp_path / "results.json").write_text(json.dumps(clean))
    assert "reliability:" not in render_text(aggregate(load([tmp_path / "results.json"])))


def strategy_row(strategy, walls, peak=None, cache="cold", concurrency=8, **phases) -> SweepRow:
    """A sweep cell of one strategy: ``walls`` its repeats' RTOs, phases name=busy_s."""
    median = sorted(walls)[len(walls) // 2]
    rows = [PhaseRow(n, s, s / median, None, None, None) for n, s in phases.items()]
    b = Breakdown(
        "cell", "restore", len(walls), median, min(walls), max(walls), rows, cache, concurrency
    )
    b.strategy, b.peak_rss_bytes = strategy, peak
    return SweepRow(b, None, None)


def test_better_strategy_names_the_gain_the_phases_and_the_memory():
    staged = strategy_row("staged", [9.0, 10.0, 11.0], 6.9e9, fetch=4.0, deserialize=5.0)
    pipelined = strategy_row("pipelined", [5.5, 6.0, 6.5], 3.7e9, fetch=5.5, deserialize=0.2)
    hint = HS.better_strategy([staged, pipelined])
    assert hint is not None and hint.code == "strategy"
    assert hint.message.startswith("pipelined would cut this restore from 10.00 s (staged)")
    assert "to 6.00 s (cold c=8, 40% less)" in hint.message
    assert "staged spends more in deserialize 5.00 s vs 0.20 s" in hint.message
    assert "fetch" not in hint.message.split("spends more in")[1]  # pipelined fetched longer
    assert "peak memory 3.70 GB vs 6.90 GB" in hint.message
    assert "but" not in hint.message
    # where the other strategy wins beyond the spread, the hint says so: it is no answer
    # for every setting (hot c=8, staged every repeat faster there)
    hot = [strategy_row("staged", [1.0, 1.1, 1.2], cache="hot"),
           strategy_row("pipelined", [1.5, 1.6, 1.7], cache="hot")]  # fmt: skip
    hint = HS.better_strategy([staged, pipelined, *hot])
    assert hint is not None and hint.message.startswith("pipelined would cut")
    assert hint.message.endswith("; but staged is faster at hot c=8, beyond the spread.")


def test_better_strategy_stays_silent_on_noise_small_gains_and_lone_strategies():
    overlapping = strategy_row("staged", [5.0, 10.0, 11.0])
    assert HS.better_strategy([overlapping, strategy_row("pipelined", [5.5, 6.0, 6.5])]) is None
    small = strategy_row("staged", [6.6, 6.65, 6.7])  # 6.0 vs 6.65: under STRATEGY_GAIN
    assert HS.better_strategy([small, strategy_row("pipelined", [5.9, 6.0, 6.1])]) is None
    other_cell = strategy_row("pipelined", [1.0, 1.0, 1.0], cache="hot")
    assert HS.better_strategy([strategy_row("staged", [9.0, 10, 11]), other_cell]) is None
    once = [strategy_row("staged", [10.0]), strategy_row("pipelined", [6.0])]
    assert HS.better_strategy(once) is None  # one repeat a side: compare would not judge it


def test_better_strategy_ranks_by_time_to_state_as_compare_does():
    """A first step that differed (the model's compute, the same for every loader) does
    not name a strategy; the time to state does, in the words the table uses."""
    staged = strategy_row("staged", [9.0, 10.0, 11.0], fetch=4.0, first_step=6.0)
    pipelined = strategy_row("pipelined", [5.5, 6.0, 6.5], fetch=4.0, first_step=2.0)
    staged.breakdown.state_s = pipelined.breakdown.state_s = (4.0, 3.9, 4.1)
    assert HS.better_strategy([staged, pipelined]) is None
    staged.breakdown.state_s = (5.0, 4.9, 5.1)
    hint = HS.better_strategy([staged, pipelined])
    assert hint is not None and hint.message.startswith(
        "pipelined would cut the time to state (list -> reshard) from 5.00 s (staged) to 4.00 s"
    ), hint.message
    assert "first_step" not in hint.message


def test_job_hints_name_read_amplification_and_the_straggler():
    rank = {"node": 0, "host": "node-a", "read_bytes": 5e9, "fetch_s": 1.0}
    job = {
        "world_size": 4, "read_amplification": 2.0, "read_bytes_all_ranks": 20e9,
        "checkpoint_bytes": 10e9,
        "per_rank": [{**rank, "rank": r, "wall_s": w} for r, w in enumerate((2.0, 2.1, 2.0, 3.0))],
    }  # fmt: skip
    hint = HS.read_amplification(job)
    assert hint is not None and "4 ranks read 2.0× the checkpoint (20.00 GB for 10.00 GB)" in (
        hint.message
    )
    slow = HS.straggler(job)
    assert slow is not None and slow.message.startswith(
        "rank 3 on node 0 (node-a) is the straggler: 3.00 s against a median rank's 2.05 s"
    )
    even = {**job, "read_amplification": 1.1, "per_rank": job["per_rank"][:3]}
    assert HS.read_amplification(even) is None and HS.straggler(even) is None


# ---------------------------------------------------------------------- compare
def slowed(doc: dict, factor: float, fetch_by: float = 1.0) -> dict:
    """``doc`` with every run's RTO scaled (and its fetch phase by ``fetch_by``)."""
    out = json.loads(json.dumps(doc))
    for run in out["runs"]:
        run["wall_s"] *= factor
        run["phases"]["fetch"]["busy_s"] *= fetch_by
    return out


def write_results(folder: Path, doc: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(doc))
    return folder


def test_compare_ranks_like_settings_and_prices_them(tmp_path):
    from ckptprof.report.compare import compare
    from ckptprof.report.compare_text import render_text

    base = write_results(tmp_path / "ext4", results_doc())
    fast = write_results(tmp_path / "fsx", slowed(results_doc(), 0.5, 0.4))
    result = compare([str(base), str(fast)], cost_per_hour=36.0, instances=2)
    text = render_text(result)
    block = text.split("\ncold c=1\n")[1].split("\n\n")[0].splitlines()
    # a synthetic restore is ranked by its time to state: 2.0 s (RTO 2.1 less its 0.1 s
    # first step) against 4.1 s
    assert "time to state s (min-max)" in block[0]
    assert "fsx" in block[1] and "2.000 (1.900-2.100)" in block[1] and "-51%" in block[1]
    assert "ext4 (base)" in block[2]
    # cost of one restore (what the job pays: its RTO): 4.2 s at $36/h x 2 instances
    assert block[2].rstrip().endswith("0.0840")
    assert result.regressions == []  # faster is never a regression
    by_rto = render_text(compare([str(base), str(fast)], by="rto"))
    block = by_rto.split("\ncold c=1\n")[1].split("\n\n")[0].splitlines()
    assert "RTO s (min-max)" in block[0] and "-50%" in block[1]  # half the RTO
    assert "restores by RTO (--by rto" in by_rto.splitlines()[0]


def test_a_fetch_above_its_ceiling_is_flagged_in_compare_and_in_the_html(tmp_path):
    """fsx's cold c=16 fetch (0.44 s for 1.2 GB: 2.7 GB/s) against its 1.5 GB/s probe:
    marked in the table, explained below it, and on the page's storage view."""
    pytest.importorskip("matplotlib")
    from ckptprof.report.compare import compare
    from ckptprof.report.compare_text import render_text
    from ckptprof.report.html import render_html

    base = write_results(tmp_path / "ext4", results_doc())
    fast = write_results(tmp_path / "fsx", slowed(results_doc(), 0.5, 0.4))
    text = render_text(compare([str(base), str(fast)], ["ext4", "fsx"]))
    block = text.split("\ncold c=16\n")[1].split("\n\n")[0]
    assert "183%!" in block and "73%" in block
    note = ("above the ceiling (!): fsx cold c=16: its fetch read at 183% of the probed "
            "ceiling; the probe underestimated the storage")  # fmt: skip
    assert note in text
    page = render_html(aggregate(load([str(base), str(fast)])), paths=[str(base), str(fast)])
    assert note in page and "183%!" in page.split('data-view="storage"')[1]


@pytest.mark.slow
def test_compare_plot_draws_one_bar_per_source_and_setting(tmp_path):
    from ckptprof.report.compare import compare
    from ckptprof.report.plot import compare_figure

    base = write_results(tmp_path / "ext4", results_doc())
    fast = write_results(tmp_path / "fsx", slowed(results_doc(), 0.5, 0.4))
    target = tmp_path / "compare.png"
    done = run_cli("compare", str(base), str(fast), "--plot", str(target))
    assert done.returncode == 0, done.stderr
    assert f"plot written to {target}" in done.stderr
    fig = compare_figure(compare([str(base), str(fast)]))
    assert png_size(target) == drawn_at(fig)  # the CLI wrote this figure: 6 bars tall
    bars = bar_chart(fig.axes[0])
    assert bars["title"] == ("Compared: median seconds per phase, fastest first within each "
                             "setting by time to state")  # fmt: skip
    # per setting, one bar per source, fastest first (fsx: half the RTO), the base marked
    assert bars["labels"] == [
        f"{setting}: {source}"
        for setting in ("cold c=1", "cold c=16", "hot c=16")
        for source in (fast, f"{base} (base)")
    ]
    assert bars["legend"] == ["list", "fetch", "verify", "deserialize", "reshard", "first_step"]
    # fsx's fetch is 0.4 of the base's median fetch in every setting; the rest the same
    assert bars["widths"]["fetch"] == pytest.approx([1.28, 3.2, 0.44, 1.1, 0.08, 0.2])
    for phase, seconds in (("list", 0.01), ("verify", 0.1), ("deserialize", 0.2),
                           ("reshard", 0.05), ("first_step", 0.1)):  # fmt: skip
        assert bars["widths"][phase] == pytest.approx([seconds] * 6), phase
    assert_stacked(bars)
    # drawn and labelled by what ranks them, the time to state (the RTO less its 0.1 s
    # first step), with its min–max; the RTO beside it
    assert bars["ranked"] == pytest.approx([2.0, 4.1, 0.7, 1.5, 0.2, 0.5])
    spread = [(1.9, 2.1), (3.9, 4.3), (0.65, 0.75), (1.4, 1.6)]  # hot c=16 ran once
    assert bars["spread"] == [pytest.approx(line) for line in spread]
    assert bars["rto"] == pytest.approx([2.1, 4.2, 0.8, 1.6, 0.3, 0.6])
    assert bars["notes"][:2] == ["to state 2.000 s (1.900–2.100)\nRTO 2.100 s",
                                 "to state 4.100 s (3.900–4.300)\nRTO 4.200 s"]  # fmt: skip
    assert bars["notes"][4:] == ["to state 0.200 s\nRTO 0.300 s", "to state 0.500 s\nRTO 0.600 s"]
    missing = tmp_path / "none" / "c.png"
    bad = run_cli("compare", str(base), str(fast), "--plot", str(missing))
    assert bad.returncode != 0 and f"folder {missing.parent} does not exist" in bad.stderr


@pytest.mark.slow
def test_the_gate_fails_only_beyond_the_limit_and_the_spread(tmp_path):
    base = write_results(tmp_path / "base", results_doc())
    slower = write_results(tmp_path / "slower", slowed(results_doc(), 1.3, 1.3))
    done = run_cli("compare", str(base), str(slower), "--fail-if-slower", "10%")
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("ckptprof: slower than the base: ")
    # a synthetic restore is judged by its time to state: the RTO less the 0.1 s first step
    assert ("cold c=1 time to state 5.360 s vs 4.100 s (+31%, beyond the repeats' spread; "
            "limit 10%)") in line  # fmt: skip
    assert "cold c=16" in done.stdout and "not judged" in done.stdout  # hot c=16: 1 repeat
    # the same +30% within a 40% limit passes; so does noise within the repeats' spread
    assert run_cli("compare", str(base), str(slower), "--fail-if-slower", "40%").returncode == 0
    noisy = results_doc()
    for run, wall in zip(noisy["runs"][:3], (6.0, 4.3, 4.5), strict=True):
        run["wall_s"] = wall  # median +7%, but one repeat is as fast as the base's slowest
    noise = write_results(tmp_path / "noise", noisy)
    assert run_cli("compare", str(base), str(noise), "--fail-if-slower", "1%").returncode == 0


def test_compare_json_has_a_schema_version(tmp_path):
    base = write_results(tmp_path / "a", results_doc())
    other = write_results(tmp_path / "b", slowed(results_doc(), 1.3))
    done = run_cli("compare", str(base), str(other), "--format", "json", "--label", "old",
                   "--label", "new", "--fail-if-slower", "0.1")  # fmt: skip
    doc = json.loads(done.stdout)
    assert doc["schema_version"] == 1 and doc["base"] == "old"
    assert [e["source"] for e in doc["settings"]["cold c=1"]] == ["old", "new"]
    assert {r["what"] for r in doc["regressions"]} >= {"time to state"}
    bad = run_cli("compare", str(base), str(other), "--label", "only-one")
    assert bad.returncode != 0 and "--label was given 1 times for 2 paths" in bad.stderr


def test_reshard_first_step_and_noise_hints():
    assert codes(breakdown(reshard=(4.0, None, None, False))) == []  # exactly 40%
    assert "pinned" in H.reshard_dominates(breakdown(reshard=(4.1, None, None, False))).message
    hint = H.first_step_dominates(breakdown(first_step=(5.1, None, None, False)))
    assert hint is not None and "ignore_data_skip" in hint.message
    steady = breakdown()
    steady.wall_min_s, steady.wall_max_s = 8.0, 12.5  # ±25% of 10 s: still steady
    assert "noisy" not in codes(steady)
    steady.wall_max_s = 16.6
    (noise,) = [h for h in H.breakdown_hints(steady) if h.code == "noisy"]
    assert "RTO 8.00-16.60 s around a median of 10.00 s, ±66%" in noise.message


def test_a_synthetic_first_step_is_this_machines_compute_never_a_data_fast_forward(tmp_path):
    """A synthetic sweep whose first step (a real step on this CPU) is most of the RTO:
    the hint says so and points at the time to state; no Hugging Face Trainer advice."""
    doc = results_doc()
    for run in doc["runs"]:
        run["wall_s"] += 10.0
        run["phases"]["first_step"]["busy_s"] += 10.0
    report = aggregate(load([write_results(tmp_path / "run", doc)]))
    (sweep,) = report.sweeps
    (hint,) = [h for h in sweep.hints if "first_step" in h.message]
    assert hint.code == "first-step-synthetic"
    assert "a real step on this machine's CPU" in hint.message
    assert hint.message.startswith("hot c=16: ")  # the row its figures are from
    assert "time to state (0.5 s)" in hint.message  # hot c=16: its RTO less its first step
    text = render_text(report)
    assert "ignore_data_skip" not in text and "HF Trainer" not in text
    # the same numbers from a callback's real resume keep the advice about the job
    b = sweep.rows[0].breakdown
    b.synthetic = False
    assert "ignore_data_skip" in H.first_step_dominates(b).message
    # the step's time given with --first-step-s: no step ran here, and the hint says so
    for run in doc["runs"]:
        run["first_step"] = "user"
    given = aggregate(load([write_results(tmp_path / "given", doc)]))
    (hint,) = [h for h in given.sweeps[0].hints if "first_step" in h.message]
    assert "the step time given with --first-step-s" in hint.message
    assert "this machine's CPU" not in hint.message


@pytest.mark.slow
def test_the_runner_writes_what_the_report_reads_with_one_summary_rule(checkpoints, tmp_path):
    """results.json as the restore writes it passes the schema the report reads, and a
    file without its summary reports the same medians: both come from results_schema."""
    from ckptprof import schema
    from ckptprof.results_schema import RESULTS_SCHEMA, fraction_of_ceiling, summarize

    out = tmp_path / "run"
    done = run_cli("synth", "restore", str(checkpoints("torch")), "--out", str(out),
                   "--cache", "cold,hot", "--concurrency", "1,2", "--repeat", "2",
                   "--ceiling-gbps", "1", "--no-report")  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "results.json").read_text())
    schema.require(doc, RESULTS_SCHEMA, "results.json", "")
    assert doc["summary"] == summarize(doc["runs"], doc["ceiling"]["read_gbps"])
    hot = [e for e in doc["summary"] if e["cache"] == "hot"]
    assert hot and all("fraction_of_ceiling" not in e for e in hot)  # page cache: unbounded
    assert fraction_of_ceiling(2.0, 1.0, "mixed") is None
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "results.json").write_text(json.dumps({**doc, "summary": []}))
    with_summary = render_text(aggregate(load([str(out / "results.json")])))
    without = render_text(aggregate(load([str(bare / "results.json")])))
    assert without.replace(str(bare), str(out)) == with_summary


def test_group_hints_for_reads_and_resume_memory():
    from ckptprof.report.breakdown import OperationGroup, Reads, ResumeMemory

    def group(**kw):
        b = Breakdown("x", "restore", 1, 1.0, 1.0, 1.0, [])
        return OperationGroup("restore", {}, b, [], **kw)

    every = HG.ranks_read_everything(group(reads=Reads(4, 4 * 1000, 1000)))
    assert every is not None and "each of the 4 ranks read the whole checkpoint" in every.message
    assert HG.ranks_read_everything(group(reads=Reads(4, 1100, 1000))) is None  # sharded reads
    assert HG.ranks_read_everything(group(reads=Reads(1, 2000, 1000))) is None
    big = HG.resume_memory(group(memory=ResumeMemory(3 * 10**9, 2 * 10**9)))
    assert big is not None and "1.50x the 2.00 GB the job held while training" in big.message
    assert HG.resume_memory(group(memory=ResumeMemory(2 * 10**9, 2 * 10**9))) is None


def test_the_gate_fails_on_a_phase_beyond_its_spread_while_the_rto_is_within_its_own(tmp_path):
    """docs/reports.md's example: the RTO moves less than its spread, fetch moves beyond its
    own (and beyond the limit) → exit 1 naming the phase; the RTO is never named."""
    base_doc = results_doc()
    new_doc = json.loads(json.dumps(base_doc))
    for run in new_doc["runs"]:
        if run["cache"] == "cold" and run["concurrency"] == 1:
            run["phases"]["fetch"]["busy_s"] *= 1.5  # 3.0-3.4 s → 4.5-5.1 s: beyond
            run["phases"]["reshard"]["busy_s"] = 0.01  # faster elsewhere: RTO
            run["wall_s"] += 0.1  # 4.0-4.4 → 4.1-4.5: overlaps the base's spread
    base = write_results(tmp_path / "base", base_doc)
    new = write_results(tmp_path / "new", new_doc)
    done = run_cli("compare", str(base), str(new), "--fail-if-slower", "10%")
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "cold c=1 fetch 4.800 s vs 3.200 s (+50%, beyond the repeats' spread" in line
    assert " RTO " not in line
    from ckptprof.report.compare import compare

    found = compare([str(base), str(new)], limit=0.1)
    rto = next(f for f in found.findings if f.setting == "cold c=1" and f.what == "time to state")
    assert not rto.beyond_spread and not rto.slower
    assert [f.what for f in found.regressions] == ["fetch"]


def test_a_phase_that_moves_less_than_the_floor_is_never_judged(tmp_path):
    """A phase is judged only when it moves by PHASE_FLOOR of the base RTO: a tiny phase
    doubling (list: 0.01 s → 0.02 s of a 4 s restore) is no regression."""
    from ckptprof.report.compare import PHASE_FLOOR, compare

    doc = results_doc()
    for run in doc["runs"]:
        run["phases"]["list"]["busy_s"] *= 2
    base = write_results(tmp_path / "base", results_doc())
    new = write_results(tmp_path / "new", doc)
    found = compare([str(base), str(new)], limit=0.1)
    assert PHASE_FLOOR * 4.2 > 0.01  # the move is below the floor
    assert not any(f.what == "list" for f in found.findings)
    assert run_cli("compare", str(base), str(new), "--fail-if-slower", "10%").returncode == 0


def test_a_gate_that_compared_nothing_fails_naming_each_sides_settings(tmp_path, capsys):
    """Once, two results with no common setting printed "gate: nothing slower" and
    exited 0."""
    from ckptprof.cli import main

    other = results_doc()
    for run in other["runs"]:
        run["concurrency"] = 64
    base = write_results(tmp_path / "base", results_doc())
    new = write_results(tmp_path / "new", other)
    assert main(["compare", str(base), str(new), "--fail-if-slower", "10%"]) == 1
    out, err = capsys.readouterr()
    (line,) = err.strip().splitlines()
    assert f"the gate compared nothing for {new}: no setting in common" in line
    assert "base: cold c=1, cold c=16, hot c=16" in line and "cold c=64, hot c=64" in line
    assert "gate: FAILED" in out and "nothing slower" not in out
    # one repeat a side of the only shared setting: nothing was judged either
    single = results_doc()
    single["runs"] = [r for r in single["runs"] if r["cache"] == "hot"]
    lone = write_results(tmp_path / "lone", single)
    assert main(["compare", str(lone), str(lone), "--fail-if-slower", "10%"]) == 1
    assert f"fewer than {MIN_REPEATS} repeats" in capsys.readouterr().err
    # without a gate a comparison of nothing is only a table: exit 0
    assert main(["compare", str(base), str(new)]) == 0


def test_a_gate_given_only_the_base_fails_once_saying_so(tmp_path, capsys):
    """`compare base/results.json --fail-if-slower 10%` (an empty $NEW in CI) said "gate:
    nothing slower" and exited 0; a failure's line was printed twice (stdout and stderr);
    `--fail-if-slower 10` said "at most 1" without the 10% it meant."""
    from ckptprof.cli import main

    base = write_results(tmp_path / "base", results_doc())
    assert main(["compare", str(base), "--fail-if-slower", "10%"]) == 1
    out, err = capsys.readouterr()
    (line,) = err.strip().splitlines()
    assert "the gate compared nothing" in line and "only the base" in line and str(base) in line
    assert "nothing slower" not in out and "compared nothing" not in out  # said once
    assert "gate: FAILED" in out
    assert main(["compare", str(base)]) == 0  # no gate: the table alone
    assert main(["compare", str(base), str(base), "--fail-if-slower", "10"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--fail-if-slower" in line and "write 10%" in line
    assert main(["compare", str(base), str(base), "--fail-if-slower", "1"]) == 0  # a share


def test_compare_says_when_the_sources_restored_different_checkpoints(tmp_path, capsys):
    from ckptprof.cli import main

    other = results_doc()
    other["spec"] = {**other["spec"], "layout": "safetensors", "scale": 0.05}
    base = write_results(tmp_path / "base", results_doc())
    new = write_results(tmp_path / "new", other)
    assert main(["compare", str(base), str(new)]) == 0
    out = capsys.readouterr().out
    assert "note: the sources restored different checkpoints" in out
    assert "llama2-7b torch x0.01" in out and "llama2-7b safetensors x0.05" in out
    assert main(["compare", str(base), str(base)]) == 0
    assert "different checkpoints" not in capsys.readouterr().out


def test_a_limit_is_printed_as_given(tmp_path, capsys):
    """Once, `--fail-if-slower 5.5%` was printed as "6%"."""
    from ckptprof.cli import main

    base = write_results(tmp_path / "base", results_doc())
    assert main(["compare", str(base), str(base), "--fail-if-slower", "5.5%"]) == 0
    assert "more than 5.5%" in capsys.readouterr().out


def test_export_skips_a_cut_last_line_as_report_does(three_restores, tmp_path, capsys):
    """Once, a job killed mid-write leaves a cut last line: report skipped it with a
    warning, export refused the whole file."""
    from ckptprof.cli import main

    lines = three_restores.read_text().splitlines()
    trace = tmp_path / "cut.jsonl"
    trace.write_text("\n".join(lines) + "\n" + lines[0][: len(lines[0]) // 2])  # cut mid-line
    assert main(["report", str(trace)]) == 0
    report_err = capsys.readouterr().err
    out = tmp_path / "out.json"
    assert main(["export", str(trace), "--format", "otlp-json", "-o", str(out)]) == 0
    export_err = capsys.readouterr().err
    warning = f"skipped 1 malformed line in 1 trace file (first: {trace} line {len(lines) + 1})"
    assert warning in report_err and warning in export_err
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    spans = [s for doc in exported for rs in doc["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"]]  # fmt: skip
    assert len(spans) == len(lines)  # every whole line, none lost with the cut one


def test_results_and_their_own_traces_count_each_restore_once(results_dir, clock, capsys):
    """Once, a results.json given with its own traces showed every configuration
    twice (one row per source) and each hint once per source."""
    from ckptprof.cli import main

    def record(tracer):
        for _ in range(3):
            record_restore(tracer, clock, COLD, 4.2, [(Phase.FETCH, 0, 3.2)])

    trace = write_trace(results_dir / "traces", record)
    doc = json.loads((results_dir / "results.json").read_text())
    ids = [json.loads(line)["context"]["trace_id"] for line in trace.read_text().splitlines()]
    for run, trace_id in zip(doc["runs"], dict.fromkeys(ids), strict=False):
        run["trace_id"] = trace_id.removeprefix("0x")  # results.json's spelling of the id
    (results_dir / "results.json").write_text(json.dumps(doc))
    data = load([results_dir / "results.json", trace])
    assert data.results and data.operations == []  # the traces' restores are the results'
    assert main(["report", str(results_dir / "results.json"), str(trace)]) == 0
    text = capsys.readouterr().out
    assert "restore group" not in text and text.count("ceiling:") == 1


@pytest.mark.slow
def test_output_degrades_to_ascii_where_the_stream_cannot_encode(tmp_path):
    """Once, `LC_ALL=C PYTHONUTF8=0 ckptprof report out` crashed on '…'."""
    folder = write_results(tmp_path / "run", results_doc())
    env = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}
    done = run_cli("report", str(folder), env=env)
    assert done.returncode == 0, done.stderr
    assert "UnicodeEncodeError" not in done.stderr
    done.stdout.encode("ascii")  # every character degraded to ASCII
    helped = run_cli("synth", "generate", "--help", env=env)
    assert helped.returncode == 0 and "UnicodeEncodeError" not in helped.stderr


def test_a_stalled_request_is_named_by_a_hint():
    """Once, a 12 s stall below the read timeout showed as RTO 15.7 s, no word."""
    stalled = breakdown(rto=15.7, fetch=(13.0, None, None, False))
    assert "stall" not in codes(stalled)  # no request time recorded: no verdict
    stalled.phase("fetch").details["slowest_request_s"] = 12.0
    hint = H.stalled_request(stalled)
    assert hint is not None and "one fetch request waited 12 s (76% of the RTO)" in hint.message
    assert "stall" in codes(stalled)
    steady = breakdown(rto=15.7, fetch=(13.0, None, None, False))
    steady.phase("fetch").details["slowest_request_s"] = 0.4
    assert "stall" not in codes(steady)


# --------------------------------------------------------------------- fused and lazy phases
def test_a_fused_deserialize_and_a_lazy_fetch_are_marked_in_text_and_json(tmp_path, clock):
    """A phase span carrying ckpt.fused is shown as the phases it stands for; a fetch
    carrying ckpt.fetch.lazy is said to be lazy, in the table and in the JSON."""

    def record(tracer):
        with tracer.restore(COLD) as op:
            t0 = clock.ns
            op.add_interval(Phase.FETCH, t0, t0 + ns(0.5))
            op.add_interval(Phase.DESERIALIZE, t0 + ns(0.5), t0 + ns(1.7))
            op.add_bytes(Phase.FETCH, 1200 * MB)
            op.set_phase_attributes(Phase.FETCH, **{Attr.FETCH_LAZY: True})
            op.set_phase_attributes(
                Phase.DESERIALIZE, **{Attr.FUSED: "deserialize+reshard (dcp.load)"}
            )
            clock.advance(2.0)

    trace = write_trace(tmp_path, record)
    spans = {s["name"]: s for s in map(json.loads, trace.read_text().splitlines())}
    assert spans["ckpt.deserialize"]["attributes"]["ckpt.fused"] == "deserialize+reshard (dcp.load)"
    assert spans["ckpt.fetch"]["attributes"]["ckpt.fetch.lazy"] is True
    report = aggregate(load([trace]))
    text = render_text(report)
    deserialize = next(line for line in text.splitlines() if line.startswith("  deserialize "))
    assert re.search(r"deserialize\s+1\.200\s.*\(fused: deserialize\+reshard, dcp\.load\)$",
                     deserialize)  # fmt: skip
    fetch = next(line for line in text.splitlines() if line.startswith("  fetch "))
    assert re.search(r"fetch\s+0\.500\s.*\(lazy: pages read on demand", fetch)
    phases = {p["phase"]: p for p in json.loads(render_json(report))["groups"][0]["breakdown"]
              ["phases"]}  # fmt: skip
    assert phases["deserialize"]["fused"] == "deserialize+reshard (dcp.load)"
    assert phases["deserialize"]["fused_phases"] == ["deserialize", "reshard"]
    assert phases["deserialize"]["lazy"] is False
    assert phases["fetch"]["lazy"] is True and phases["fetch"]["fused"] is None
    assert "fused_phases" not in phases["fetch"]


def fused_and_lazy_doc() -> dict:
    """The fixture with a lazy fetch at cold c=1 (the runner's summary still says 25%), a
    deserialize fused with fetch at hot c=16, and a 0.9 GB/s ceiling that cold c=16's
    1.1 GB/s fetch exceeds."""
    doc = results_doc()
    doc["ceiling"]["read_gbps"] = 0.9
    for run in doc["runs"]:
        if (run["cache"], run["concurrency"]) == ("cold", 1):
            run["phases"]["fetch"]["lazy"] = True
        if run["cache"] == "hot":
            run["phases"]["deserialize"]["fused"] = "fetch+deserialize (the reader's own)"
    return doc


def test_a_lazy_fetch_has_no_fraction_of_the_ceiling_and_one_above_it_is_capped(tmp_path):
    from ckptprof import schema
    from ckptprof.results_schema import RESULTS_SCHEMA, summarize

    doc = fused_and_lazy_doc()
    schema.require(doc, RESULTS_SCHEMA, "results.json", "")  # fused and lazy are valid
    folder = write_results(tmp_path / "run", doc)
    report = aggregate(load([folder]))
    (sweep,) = report.sweeps
    cold1, cold16, hot16 = sweep.rows
    assert (cold1.fraction_of_ceiling, cold1.ceiling_mark) == (None, "lazy")  # not the 25%
    assert cold1.breakdown.phase("fetch").lazy
    assert cold16.fraction_of_ceiling == 1.0 and cold16.ceiling_mark == "capped"
    assert cold16.fraction_above_ceiling == pytest.approx(1.1 / 0.9)
    assert hot16.breakdown.phase("deserialize").fused_phases == ("fetch", "deserialize")
    assert hot16.fraction_of_ceiling is None and hot16.ceiling_mark is None  # hot: no ceiling
    text = render_text(report)
    assert re.search(r"^  cold\s+1\s.*\s0\.37\s+lazy$", text, flags=re.M)  # 0.37499… from runs
    assert re.search(r"^  cold\s+16\s.*\s1\.10\s+100%\+$", text, flags=re.M)
    assert "122%" not in text.replace("cold c=16 122%", "")  # only in the note
    flat = " ".join(text.split())
    assert "fetch is lazy: the loader reads pages on demand (mmap)" in flat
    assert "100%+: fetch measured above the storage ceiling (cold c=16 122%), shown capped" in flat
    assert "deserialize is fused: one interval for fetch+deserialize (the reader's own)" in flat
    assert all(len(line) <= 100 for line in text.splitlines())
    rows = json.loads(render_json(report))["sweeps"][0]["rows"]
    assert [(r["fraction_of_ceiling"], r["ceiling_mark"]) for r in rows] == [
        (None, "lazy"),
        (1.0, "capped"),
        (None, None),
    ]
    assert rows[1]["fraction_above_ceiling"] == pytest.approx(1.1 / 0.9)
    # the runner's own summary leaves the lazy cell's fraction out, by the same rule
    cells = {(e["cache"], e["concurrency"]): e for e in summarize(doc["runs"], 0.9)}
    assert "fraction_of_ceiling" not in cells[("cold", 1)]
    assert cells[("cold", 16)]["fraction_of_ceiling"] == pytest.approx(1.1 / 0.9)


def test_the_html_report_marks_fused_lazy_and_capped_fetches(tmp_path, clock):
    pytest.importorskip("matplotlib")
    from ckptprof.report.html import render_html

    def record(tracer):
        with tracer.restore(COLD) as op:
            t0 = clock.ns
            op.add_interval(Phase.DESERIALIZE, t0, t0 + ns(1.2))
            op.set_phase_attributes(
                Phase.DESERIALIZE, **{Attr.FUSED: "deserialize+reshard (dcp.load)"}
            )
            clock.advance(1.5)

    folder = write_results(tmp_path / "run", fused_and_lazy_doc())
    page = render_html(aggregate(load([folder, write_trace(tmp_path / "t", record)])))
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", page)
    assert "lazy" in cells and "100%+" in cells and "133%" not in page
    assert "0.200 (fused)" in cells  # hot c=16's deserialize
    assert "deserialize 1.200 (fused: deserialize+reshard, dcp.load)" in page
    assert "fetch is lazy: the loader reads pages on demand (mmap)" in page
