"""Every reader × every kind of input: a correct view, or one line saying why.

The readers are enumerated from the parser (``report``'s views and formats and the files
it writes, ``compare`` and its gate, each ``export`` format), so a new view or format is
read over every input the day it is added. The inputs come from real small runs, made
once per session in this process: ``synth save`` and ``synth restore`` at a tiny scale,
and jobs traced by the real session code every adapter runs (``traced_job``), then
damaged the ways files are (a trace cut mid-line, one without its root spans, garbage,
two jobs in one folder, clocks that cannot be, an ``--out`` a second run wrote into, a
results.json of a newer schema).
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptprof.cli import build_parser, main
from tests.conftest import TINY_SCALE, traced_job

#: the kinds of input every reader is given (each one PATH), built by ``inputs``
KINDS = (
    "restore results",
    "save results",
    "restore traces",
    "save traces",
    "all mixed",
    "trace cut mid-line",
    "trace without its root span",
    "empty folder",
    "garbage",
    "two jobs",
    "broken clocks",
    "reused out",
    "newer results",
)


def _command(name: str) -> argparse.ArgumentParser:
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices[name]


def _option(command: str, flag: str) -> argparse.Action:
    (action,) = [a for a in _command(command)._actions if flag in a.option_strings]
    return action


def _flags(command: str) -> list[argparse.Action]:
    """The command's options (not its help, not its PATHs)."""
    return [a for a in _command(command)._actions if a.option_strings and a.dest != "help"]


def _views() -> list[str | None]:
    """``report``'s views: the plain report, and each flag that switches to another."""
    return [None] + [a.option_strings[0] for a in _flags("report") if a.nargs == 0]


def readers() -> dict[str, Callable[[Path, Path], tuple[list[str], Path | None]]]:
    """Each reader by name: (PATH, a scratch folder) → (argv, the file it writes)."""
    out: dict[str, Callable] = {}
    formats = _option("report", "--format").choices
    for view in _views():
        for fmt in formats:
            out[f"report {view or ''} {fmt}".replace("  ", " ")] = (
                lambda p, t, v=view, f=fmt: (["report", *([v] if v else []), str(p),
                                             "--format", f], None)
            )  # fmt: skip
    by = _option("report", "--by")
    for choice in by.choices:
        if choice != by.default:
            out[f"report --by {choice}"] = lambda p, t, c=choice: (
                ["report", str(p), "--by", c],
                None,
            )
    for flag, suffix in (("--plot", "png"), ("--html", "html")):
        out[f"report {flag}"] = lambda p, t, f=flag, s=suffix: (
            ["report", str(p), f, str(t / f"report.{s}")],
            t / f"report.{s}",
        )
    for fmt in _option("compare", "--format").choices:
        out[f"compare {fmt}"] = lambda p, t, f=fmt: (
            ["compare", str(p), str(p), "--label", "a", "--label", "b", "--format", f],
            None,
        )
    out["compare gate"] = lambda p, t: (
        ["compare", str(p), str(p), "--label", "a", "--label", "b", "--fail-if-slower", "10%"],
        None,
    )
    for fmt in _option("export", "--format").choices:
        out[f"export {fmt}"] = lambda p, t, f=fmt: (
            ["export", "--format", f, str(p), "-o", str(t / f"export.{f}")],
            t / f"export.{f}",
        )
    return out


def _swap_run_clocks(path: Path) -> None:
    spans = [json.loads(line) for line in path.read_text().splitlines() if line]
    for span in spans:
        if span["name"] == "ckpt.run":
            span["start_time"], span["end_time"] = span["end_time"], span["start_time"]
    path.write_text("".join(json.dumps(s) + "\n" for s in spans))


@pytest.fixture(scope="session")
def inputs(tmp_path_factory, checkpoints) -> dict[str, Path]:
    """One PATH per kind of input, from real tiny runs (made once)."""
    root = tmp_path_factory.mktemp("inputs")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CKPTPROF_STATE_DIR", str(root / "state"))
        fast = ["--repeat", "2", "--ceiling-gbps", "1"]
        assert main(["synth", "save", str(root / "ckpt"), "--scale", str(TINY_SCALE),
                     "--no-fsync", "--out", str(root / "save"), *fast]) == 0  # fmt: skip
        assert main(["synth", "restore", str(checkpoints("torch")), "--cache", "hot",
                     "--concurrency", "1", "--verify", "size", "--no-first-step",
                     "--no-report", "--out", str(root / "restore"), *fast]) == 0  # fmt: skip
        traced_job(root / "job" / "traces", root / "job" / "ckpt", notice=True)
        traced_job(root / "jobs" / "traces", root / "jobs" / "ckpt-a")
        traced_job(root / "jobs" / "traces", root / "jobs" / "ckpt-b")
        traced_job(root / "clocks" / "traces", root / "clocks" / "ckpt")
        for concurrency in ("1", "2"):  # the second sweep into the same --out
            assert main(["synth", "restore", str(checkpoints("torch")), "--cache", "hot",
                         "--concurrency", concurrency, "--verify", "size", "--no-first-step",
                         "--no-report", "--out", str(root / "reused"), "--repeat", "1",
                         "--ceiling-gbps", "1"]) == 0  # fmt: skip
    [restore_trace] = (root / "restore" / "traces").glob("*.jsonl")
    lines = restore_trace.read_text().splitlines(keepends=True)
    cut = root / "cut" / "cut.jsonl"
    cut.parent.mkdir()
    cut.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    rootless = root / "rootless" / "rootless.jsonl"
    rootless.parent.mkdir()
    rootless.write_text("".join(x for x in lines if '"name":"ckpt.restore"' not in x))
    assert rootless.read_text() != restore_trace.read_text()
    (root / "empty").mkdir()
    garbage = root / "garbage" / "garbage.jsonl"
    garbage.parent.mkdir()
    garbage.write_bytes(b"\x00\xff not a span {\n" * 4)
    mixed = root / "mixed"
    for name in ("save", "restore", "job"):
        shutil.copytree(root / name, mixed / name)
    _swap_run_clocks(sorted((root / "clocks" / "traces").glob("*.jsonl"))[0])
    newer = root / "newer" / "results.json"
    newer.parent.mkdir()
    doc = json.loads((root / "restore" / "results.json").read_text())
    assert doc["schema_version"] == 1
    newer.write_text(json.dumps({**doc, "schema_version": 2, "runs": [{"wall_s": "later"}]}))
    return dict(zip(KINDS, (
        root / "restore" / "results.json", root / "save" / "save.json",
        root / "restore" / "traces", root / "save" / "traces", mixed, cut, rootless,
        root / "empty", garbage, root / "jobs" / "traces", root / "clocks" / "traces",
        root / "reused", newer,
    ), strict=True))  # fmt: skip


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """``ckptprof ARGV`` in this process: (exit status, stdout, stderr)."""
    try:
        code = main(argv)
    except SystemExit as stopped:  # argparse's refusal
        code = stopped.code
    out, err = capsys.readouterr()
    return code, out, err


def check_view_or_one_line(name: str, argv, written: Path | None, code, out, err) -> None:
    """The rule every reader keeps over every input."""
    assert "Traceback" not in err and "unexpected" not in err, err
    verdict = name == "compare gate" and code == 1  # the gate's "slower" is an answer
    if code != 0 and not verdict:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ckptprof: error: "), err
        assert written is None or not written.exists(), f"{written} left behind"
        return
    if "json" in argv:
        json.loads(out)
    elif written is not None:
        assert written.stat().st_size > 0
        if written.suffix == ".otlp-json":
            for line in written.read_text().splitlines():
                json.loads(line)
    else:
        assert out.strip()
    if verdict:
        (line,) = err.strip().splitlines()
        assert line.startswith("ckptprof: "), err


#: what a reader must say of an input, beyond the rule: (reader prefix, kind) → check
EXPECTED: dict[tuple[str, str], Callable[[int, str, str, Path], None]] = {
    ("report --goodput json", "two jobs"): lambda code, out, err, p: (
        len(json.loads(out)["jobs"]) == 2
    ),
    ("report --goodput", "broken clocks"): lambda code, out, err, p: (
        code == 2 and "impossible clocks" in err and str(p) in err
    ),
    ("report", "garbage"): lambda code, out, err, p: code == 2 and str(p) in err,
    ("report table", "trace cut mid-line"): lambda code, out, err, p: (
        code == 0 and "skipped 1 malformed line" in err and "restore" in out
    ),
    ("report table", "restore results"): lambda code, out, err, p: code == 0 and "RTO" in out,
    ("report table", "save traces"): lambda code, out, err, p: code == 0 and "save" in out,
    ("report --interruptions table", "all mixed"): lambda code, out, err, p: (
        code == 0 and "interruption 1: simulated notice" in out
    ),
    ("report", "empty folder"): lambda code, out, err, p: code == 2 and str(p) in err,
    ("export", "garbage"): lambda code, out, err, p: code == 2 and str(p) in err,
    # a results.json is exported as its runs' traces, as report reads it
    ("export", "restore results"): lambda code, out, err, p: code == 0,
    # what report shows of it (the second sweep), and the first one's traces left out in words
    ("report table", "reused out"): lambda code, out, err, p: (
        code == 0 and {r.split()[1] for r in out.splitlines() if r.split()[:1] == ["hot"]} == {"2"}
    ),
    # what to do is to upgrade, not to re-run (its fields may mean what this one cannot read)
    **{
        (reader, "newer results"): lambda code, out, err, p: code == 2 and "upgrade" in err
        for reader in ("report table", "report json", "report --html")
    },  # fmt: skip
    ("compare", "newer results"): lambda code, out, err, p: code == 2 and "upgrade" in err,
    ("export perfetto", "reused out"): lambda code, out, err, p: (
        code == 0 and "earlier run" in err and "wrote 1 operations" in err
    ),
}


def test_every_reader_over_every_input_gives_a_view_or_one_line(inputs, tmp_path, capsys):
    assert set(inputs) == set(KINDS)
    failures = []
    for name, make in readers().items():
        for kind, path in inputs.items():
            scratch = tmp_path / f"{name}-{kind}".replace(" ", "_")
            scratch.mkdir()
            argv, written = make(path, scratch)
            code, out, err = run(argv, capsys)
            try:
                check_view_or_one_line(name, argv, written, code, out, err)
                for (reader, which), expect in EXPECTED.items():
                    if name.startswith(reader) and which == kind:
                        assert expect(code, out, err, path), (reader, which)
            except (AssertionError, ValueError) as exc:
                failures.append(f"{name} × {kind}: exit {code}; {exc}; stderr: {err[-300:]}")
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------ a flag in each view
#: a value each of report's options is given (choices and flags are taken from the parser)
SAMPLES = {"price_per_hour": "36", "mtbi": "6h"}


def _differs(baseline: str, out: str, written: Path | None) -> bool:
    return out != baseline


#: per option, how its effect shows: (baseline stdout, stdout, the file it names) → bool
EFFECTS: dict[str, Callable[[str, str, Path | None], bool]] = {
    "by": _differs,
    "format": lambda baseline, out, written: isinstance(json.loads(out), (dict, list)),
    "plot": lambda baseline, out, written: written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n",
    "html": lambda baseline, out, written: "<html" in written.read_text(),
    "goodput": lambda baseline, out, written: "goodput of job " in out,
    "interruptions": lambda baseline, out, written: "interruption 1: simulated notice" in out,
    "price_per_hour": _differs,
    "mtbi": _differs,
}


def _given(action: argparse.Action, scratch: Path) -> tuple[list[str], Path | None]:
    """The option as a user gives it (a value other than its default), and its file."""
    flag = action.option_strings[-1]
    if action.nargs == 0:
        return [flag], None
    if action.choices:
        return [flag, next(c for c in action.choices if c != action.default)], None
    if action.metavar and action.metavar.startswith("FILE."):
        written = scratch / action.metavar.lower()
        return [flag, str(written)], written
    return [flag, SAMPLES[action.dest]], None


def test_each_option_in_each_view_is_honoured_or_refused(inputs, tmp_path, capsys):
    """`report --goodput --html F` and `--interruptions --html F` wrote nothing and said
    nothing; `--goodput --interruptions` printed only the goodput. Each of report's
    options, in each view, now shows its effect or is refused up front in one line; an
    option added without an effect to check here fails this test."""
    options = _flags("report")
    assert {a.dest for a in options} == set(EFFECTS), "an option without an effect checker"
    path = str(inputs["all mixed"])
    for view in _views():
        code, baseline, err = run(["report", *([view] if view else []), path], capsys)
        assert code == 0, err
        for action in options:
            if view in action.option_strings:
                continue
            scratch = tmp_path / f"{view}{action.dest}"
            scratch.mkdir()
            given, written = _given(action, scratch)
            argv = ["report", *([view] if view else []), path, *given]
            code, out, err = run(argv, capsys)
            assert "Traceback" not in err and "unexpected" not in err, (argv, err)
            if code == 0:
                assert written is None or written.exists(), f"{argv}: wrote no file"
                assert EFFECTS[action.dest](baseline, out, written), f"{argv}: ignored"
            else:
                lines = err.strip().splitlines()
                assert code == 2 and len(lines) == 1 and given[0] in lines[0], (argv, err)
                assert out == "" and (written is None or not written.exists()), argv
    # the cases of the issue are honoured: the page, which has both sections
    for view in ("--goodput", "--interruptions"):
        page = tmp_path / f"{view}.html"
        assert run(["report", view, path, "--html", str(page)], capsys)[0] == 0
        assert "Goodput across restarts" in page.read_text()
        assert "Interruptions" in page.read_text()


def test_interruptions_of_a_results_folder_are_read_from_its_traces(
    inputs, checkpoints, tmp_path, capsys
):
    """A folder holding a results.json is read from that file; its interruptions are in
    the traces beside it ("no interruptions" before). With none to tell, --html writes
    no page (it was written, then the view refused)."""
    run_dir = tmp_path / "run"
    assert main(["synth", "restore", str(checkpoints("torch")), "--cache", "hot",
                 "--concurrency", "1", "--repeat", "1", "--ceiling-gbps", "1", "--no-report",
                 "--simulate-interruption", "--out", str(run_dir)]) == 0  # fmt: skip
    capsys.readouterr()
    code, out, err = run(["report", "--interruptions", str(run_dir)], capsys)
    assert code == 0 and "interruption 1: simulated notice" in out, err
    page = tmp_path / "page.html"
    argv = ["report", "--interruptions", str(inputs["restore traces"]), "--html", str(page)]
    code, out, err = run(argv, capsys)
    assert code == 2 and "no interruptions" in err and not page.exists()


def test_a_restore_compared_from_its_traces_keeps_its_share_of_the_ceiling(
    checkpoints, tmp_path, capsys
):
    """The same cold runs read from results.json and from their traces: one share of the
    read ceiling (the traces carry the sweep's ceiling; "of ceil" was "-" from them)."""
    out = tmp_path / "cold"
    assert main(["synth", "restore", str(checkpoints("torch")), "--cache", "cold",
                 "--concurrency", "1", "--repeat", "1", "--verify", "size", "--no-first-step",
                 "--no-report", "--ceiling-gbps", "1", "--out", str(out)]) == 0  # fmt: skip
    capsys.readouterr()
    code, text, err = run(["compare", str(out / "results.json"), str(out / "traces"),
                           "--format", "json"], capsys)  # fmt: skip
    assert code == 0, err
    settings = json.loads(text)["settings"].values()
    shares = [e["of_ceiling"] for entries in settings for e in entries]
    assert len(shares) == 2 and shares[0] is not None
    assert shares[0] == pytest.approx(shares[1], rel=1e-3)
