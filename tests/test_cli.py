"""The command line end to end: generate, restore, report on the traces it wrote."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.conftest import TINY_SCALE, read_spans, run_cli


def test_help_reads_well(monkeypatch):
    """Every command's --help, at a terminal's width: its prose wrapped to it (a line of
    236 characters once ran off the screen), examples kept whole."""
    from ckptprof.cli import build_parser

    monkeypatch.setenv("COLUMNS", "80")
    for path, parser in _commands(build_parser()):
        text = parser.format_help()
        assert text.startswith("usage: ckptprof"), path
        long = [line for line in text.splitlines() if len(line) > 80 and not line[:1].isspace()]
        assert not long, (path, long)
    result = run_cli("synth", "restore", "--help")
    assert result.returncode == 0 and "examples:" in result.stdout


def _commands(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from (((name, *path), p) for path, p in _commands(sub))
    yield (), parser


def test_every_option_with_a_default_shows_it_in_help():
    from ckptprof.cli import build_parser

    for path, parser in _commands(build_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if not action.option_strings or action.help == "==SUPPRESS==":
                continue
            if action.default is None or action.default is False or action.nargs == 0 and \
                    action.default is not True:  # fmt: skip
                continue
            shown = formatter._get_help_string(action)
            where = f"ckptprof {' '.join(path)} {action.option_strings[0]}"
            assert "default" in shown, f"{where}: help does not show its default"


HELP = {"-h", "--help"}


def _declaration(action):
    """What one declaration of an option fixes: its kind of action, names, help, value
    type and choices (its default is each command's own)."""
    convert = action.type
    typed = tuple(getattr(convert, name, None) for name in ("__code__", "kind", "check", "role"))
    choices = action.choices or getattr(convert, "choices", None)
    return (type(action), tuple(action.option_strings), action.help, action.metavar,
            action.nargs, action.const, action.required, typed, choices)  # fmt: skip


def test_the_demo_restores_through_synth_restores_own_option_declarations():
    """The demo's restore options are ``synth restore``'s, declared once: every option of
    the demo's restore group, and every option string the two commands share, is the same
    declaration (names, help, type, choices); a default differs only where the demo sets
    its own (``DEMO_DEFAULTS``)."""
    from ckptprof.cli import build_parser
    from ckptprof.cli.demo import DEMO_DEFAULTS

    commands = dict(_commands(build_parser()))
    demo, restore = commands[("demo",)], commands[("synth", "restore")]
    by_name = {name: a for a in restore._actions for name in a.option_strings}
    group = next(g for g in demo._action_groups if (g.title or "").startswith("the restore"))
    assert group._group_actions, "the demo's restore group is empty"
    for action in group._group_actions:
        name = action.option_strings[-1]
        assert name in by_name, f"demo {name}: not an option of synth restore"
    shared = [a for a in demo._actions if set(a.option_strings) & (by_name.keys() - HELP)]
    assert set(group._group_actions) <= set(shared)
    for action in shared:
        theirs = by_name[action.option_strings[-1]]
        name = action.option_strings[-1]
        assert action.dest == theirs.dest, name
        assert _declaration(action) == _declaration(theirs), f"demo {name}: declared apart"
        own = action.dest in DEMO_DEFAULTS
        assert own or action.default == theirs.default, f"demo {name}: a default of its own"
    assert DEMO_DEFAULTS.keys() <= {a.dest for a in group._group_actions}


@pytest.mark.slow
def test_dry_run_plans_without_writing(tmp_path):
    dest = tmp_path / "plan"
    result = run_cli(
        "synth",
        "generate",
        str(dest),
        "--model",
        "llama3-70b",
        "--layout",
        "deepspeed",
        "--ranks",
        "64",
        "--dry-run",
        "--bandwidth-gbps",
        "5",
    )
    assert result.returncode == 0, result.stderr
    assert "70.55 B params" in result.stdout
    assert "zero_pp_rank_63_mp_rank_00_optim_states.pt" in result.stdout or "64 optim" in (
        result.stdout
    )
    assert "s at 5 GB/s" in result.stdout
    assert not dest.exists()
    # the size people read is the tensors'; the disk space beside it is an upper bound
    from ckptprof.synth.generate import plan_checkpoint
    from ckptprof.synth.plan import SynthSpec

    plan = plan_checkpoint(SynthSpec(model="llama3-70b", layout="deepspeed", ranks=64))
    assert f"bytes: {plan.payload_bytes / 1e9:.2f} GB of tensors" in result.stdout
    seconds = plan.payload_bytes / 5e9
    assert f"{seconds:.1f} s at 5 GB/s" in result.stdout


@pytest.mark.slow
def test_generate_restore_report_through_the_cli(tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    gen = run_cli(
        "synth", "generate", str(ckpt), "--layout", "safetensors", "--scale", str(TINY_SCALE)
    )
    assert gen.returncode == 0, gen.stderr
    assert "wrote" in gen.stdout
    res = run_cli(
        "synth",
        "restore",
        str(ckpt),
        "--concurrency",
        "2",
        "--repeat",
        "2",
        "--verify",
        "sample",
        "--per-file-spans",
        "--out",
        str(out),
    )
    assert res.returncode == 0, res.stderr
    assert "ceiling" in res.stdout and "cold x2" in res.stdout and "hot  x2" in res.stdout
    # the report printed at the end (its header as wide as the terminal allows)
    assert re.search(r"^\s*cache\s+(conc|c)\s+(runs|n)\s", res.stdout, flags=re.M), res.stdout
    results = json.loads((out / "results.json").read_text())
    assert {(s["cache"], s["repeats"]) for s in results["summary"]} == {("cold", 2), ("hot", 2)}
    traces = list((out / "traces").glob("*.jsonl"))
    assert len(traces) == 1
    spans = read_spans(traces[0])
    assert any(s["name"] == "ckpt.file" for s in spans)
    rep = run_cli("report", str(out / "traces"))
    assert rep.returncode == 0, rep.stderr
    for phase in ("list", "fetch", "verify", "deserialize", "reshard", "first_step"):
        assert f"\n  {phase}" in rep.stdout
    assert "2 restores" in rep.stdout  # cold and hot are two groups of two repeats
    as_json = json.loads(run_cli("report", str(out), "--format", "json").stdout)
    assert "cold" in json.dumps(as_json) and "fetch" in json.dumps(as_json)


def test_no_help_text_shows_a_placeholder():
    """Once, `synth generate --help` showed a literal `%(choices)s`."""
    from ckptprof.cli import build_parser

    for path, parser in _commands(build_parser()):
        text = parser.format_help()
        assert "%(" not in text and "%%" not in text, f"ckptprof {' '.join(path)} --help"
    from ckptprof.synth.presets import PRESETS

    generate_help = next(p for path, p in _commands(build_parser()) if path == ("synth",
                         "generate")).format_help()  # fmt: skip
    assert all(name in generate_help for name in PRESETS) and "dcp, deepspeed" in generate_help


def test_a_stop_signal_while_a_failure_is_said_ends_as_stopped_without_a_traceback(
    tmp_path, monkeypatch, capsys
):
    """A launcher stops a rank (SIGTERM) just as the rank reports its own failure (the
    collective's error when another rank died): the signal raised inside the handler of
    that failure, out of ``main``, and the rank printed a traceback (CI saw it once)."""
    import signal

    import ckptprof.cli as cli

    said = cli.one_line

    def stopped_while_saying(exc):
        os.kill(os.getpid(), signal.SIGTERM)  # handled here, in the main thread
        return said(exc)

    monkeypatch.setattr(cli, "one_line", stopped_while_saying)
    (tmp_path / "empty").mkdir()
    assert cli.main(["report", str(tmp_path / "empty")]) == 143
    assert "ckptprof: interrupted (SIGTERM)" in capsys.readouterr().err


def test_a_restore_into_an_earlier_runs_out_says_it_replaces_its_results(
    checkpoints, tmp_path, capsys
):
    """An interrupted run's partial results.json was replaced by the next run into the
    same --out without a word."""
    from ckptprof.cli import main

    out = tmp_path / "out"
    argv = ["synth", "restore", str(checkpoints("torch")), "--cache", "hot", "--concurrency",
            "1", "--repeat", "1", "--no-first-step", "--ceiling-gbps", "1", "--no-report",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "an earlier run's" not in capsys.readouterr().out
    doc = json.loads((out / "results.json").read_text())
    (out / "results.json").write_text(json.dumps({**doc, "partial": True}))  # as a stop leaves
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert f"{out / 'results.json'}: an earlier run's partial results (that run was " in said
    assert json.loads((out / "results.json").read_text())["partial"] is False
    # a save into an earlier save's --out says so the same way (one rule, every writer)
    saves = tmp_path / "saves"
    save = ["synth", "save", str(tmp_path / "ck"), "--scale", str(TINY_SCALE), "--repeat", "1",
            "--ceiling-gbps", "1", "--force", "--out", str(saves)]  # fmt: skip
    assert main(save) == 0 and "an earlier run's" not in capsys.readouterr().out
    assert main(save) == 0
    assert f"{saves / 'save.json'}: an earlier run's results; this run replaces them" in (
        capsys.readouterr().out
    )
