"""Every option of every command, fed its kind's boundary values: accepted exactly
where its range says, or refused with exit 2 and one line naming it, before any work.

The options are read from the parser itself (:func:`ckptprof.cli.build_parser`): an
option added tomorrow is fed the same values the day it is added, and one whose value
has no kind the matrix knows fails here until it gets one (a type from
:mod:`ckptprof.cli.options`).
"""

from __future__ import annotations

import argparse
import functools
import math
import re

import pytest

from ckptprof.cli import build_parser
from ckptprof.cli.options import OFF_WORDS

#: the units a person writes, with their values as the test knows them (not the code's table)
SIZES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50, "E": 1 << 60}
DURATIONS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86_400}

#: what every option that takes a value is fed, whatever its kind
GARBAGE = ("", "   ", "garbage", "nan", "inf", "-inf", "-1", "1e308", "1e999", "0x10", "１")
#: values that must be refused by every option of these kinds (no number is unbounded)
NEVER_NUMBERS = ("nan", "inf", "-inf", "1e308", "1e999", "garbage", "")


def _commands(parser: argparse.ArgumentParser, prefix=()):
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*prefix, name))


def _value_actions():
    """(command words, the subparser, action) for every option that takes a value."""
    skip = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
    for words, parser in _commands(_parser()):
        for action in parser._actions:
            if isinstance(action, skip) or action.nargs == 0 or not action.option_strings:
                continue
            yield words, parser, action


def _required_options(parser: argparse.ArgumentParser, trial=None) -> list[str]:
    """Valid values for a command's required options other than ``trial``."""
    values = []
    for action in parser._actions:
        if action.required and action.option_strings and action is not trial:
            if not action.choices:
                pytest.fail(f"required {action.option_strings[-1]}: give the matrix a value")
            values += [action.option_strings[-1], next(iter(action.choices))]
    return values


def _positional_values(parser: argparse.ArgumentParser, tmp_path, trial=None) -> list[str]:
    """Valid values for a command's positionals and required options, so that only the
    option on ``trial`` is."""
    values = _required_options(parser, trial)
    for action in parser._actions:
        if action.option_strings or isinstance(action, argparse._SubParsersAction):
            continue
        role = getattr(action.type, "role", None)
        if role == "checkpoint to write":
            values.append(str(tmp_path / "new-checkpoint"))
        elif role in ("checkpoint to read", "input"):
            values.append(str(tmp_path))
        else:
            pytest.fail(f"positional {action.dest} has no role the matrix knows ({role})")
    return values


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """One parser for the whole matrix (parse_args leaves it as it was), its moot rules off:
    the matrix holds each value to its range alone, where an option others leave without
    effect (``--deadline`` without ``--simulate-interruption``) is refused whatever its
    value; the rules have their own test (:func:`test_every_moot_rule_refuses_each_option`)."""
    parser = build_parser()
    for _, command in _commands(parser):
        command.moot_rules = ()
    return parser


def _parse(words, parser, tmp_path, option: str, value: str, capsys):
    trial = next(a for a in parser._actions if option in a.option_strings)
    argv = [*words, *_positional_values(parser, tmp_path, trial), f"{option}={value}"]
    try:
        namespace = _parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code, None, capsys.readouterr().err
    return 0, namespace, capsys.readouterr().err


def _assert_refused(code, err: str, option: str, value: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, f"{option}={value!r} accepted"
    assert len(lines) == 1, f"{option}={value!r}: {err}"
    assert option in lines[0] and "--help" in lines[0], lines[0]
    assert "Traceback" not in err and "unexpected" not in err, err


def _cases(kind: str, action) -> list[str]:
    """The boundary values of one kind of option."""
    if kind == "size":
        return [f"1{unit}" for unit in SIZES] + ["16M", "1.5G", "0", "-1K", "1KiB", "2MB"]
    if kind == "duration":
        return [f"1{unit}" for unit in DURATIONS] + ["6h", "0s", "-1h"]
    if kind == "real-or-off":
        return [*OFF_WORDS, "1", "0.5"]
    if kind in ("choice-list",):
        return [",".join(action.type.choices), ",", "bogus", action.type.choices[0] + ",bogus"]
    if kind in ("whole", "whole-list", "real"):
        return ["0", "1", "2", "1.5", "10**3"] + (["1,2", ",1"] if kind == "whole-list" else [])
    return []


OPTIONS = list(_value_actions())


def _id(case) -> str:
    words, _, action = case
    return f"{' '.join(words)} {action.option_strings[-1]}"


@pytest.mark.parametrize("case", OPTIONS, ids=[_id(c) for c in OPTIONS])
def test_every_option_takes_exactly_what_its_range_allows(case, tmp_path, capsys):
    words, parser, action = case
    option = action.option_strings[-1]
    kind = getattr(action.type, "kind", None)
    if kind is None and action.choices is None:
        pytest.fail(f"{option}: its value has no kind (give it a type from cli.options)")
    if kind == "path":
        return  # every path option: tests/test_seams_paths.py
    for value in GARBAGE + tuple(_cases(kind or "choices", action)):
        code, namespace, err = _parse(words, parser, tmp_path, option, value, capsys)
        if code != 0:
            _assert_refused(code, err, option, value)
            continue
        assert not err.strip(), f"{option}={value!r}: {err}"
        parsed = getattr(namespace, action.dest)
        if isinstance(parsed, list):  # append actions
            parsed = parsed[-1]
        items = parsed if isinstance(parsed, tuple) else (parsed,)
        for item in items:
            if isinstance(item, float):
                assert math.isfinite(item), f"{option}={value!r} gave {item}"
            check = getattr(action.type, "check", None)
            if check is not None and not (kind == "real-or-off" and item == 0):
                assert check(item) is None, f"{option}={value!r} gave {item}, out of range"
        if kind in ("whole", "real", "size", "duration", "whole-list", "real-or-off"):
            assert value not in NEVER_NUMBERS, f"{option} accepted {value!r}: no ceiling"


@pytest.mark.parametrize("case", OPTIONS, ids=[_id(c) for c in OPTIONS])
def test_a_value_in_range_is_accepted_in_every_unit(case, tmp_path, capsys):
    """What the range allows is accepted however it is written (``--memory-budget 1T``
    was refused while its message named 1 PiB as the maximum)."""
    words, parser, action = case
    kind = getattr(action.type, "kind", None)
    if kind not in ("size", "duration"):
        return
    option = action.option_strings[-1]
    for unit, worth in (SIZES if kind == "size" else DURATIONS).items():
        for count in (1, 2, 16, 512):
            value = count * worth
            allowed = action.type.check(value if kind == "size" else float(value)) is None
            code, namespace, err = _parse(words, parser, tmp_path, option, f"{count}{unit}", capsys)
            assert (code == 0) == allowed, f"{option}={count}{unit}: {err or 'accepted'}"
            if code == 0:
                assert getattr(namespace, action.dest) == value, f"{option}={count}{unit}"


def test_stall_after_off_turns_the_watchdog_off(tmp_path, capsys):
    from ckptprof.cli.synth_options import stall_after_s, stall_option

    for command in ("save", "restore"):
        for word in ("0", "off", "OFF", "no"):
            args = build_parser().parse_args(
                ["synth", command, str(tmp_path), "--stall-after", word]
            )
            assert args.stall_after == 0.0
            assert stall_after_s(stall_option(args.stall_after)) is None
        args = build_parser().parse_args(["synth", command, str(tmp_path)])
        assert stall_option(args.stall_after) is True  # the environment's, or the default


def test_huge_prices_and_intervals_are_refused_not_printed(tmp_path, capsys):
    """`--mtbi 1e99` printed a 96-digit interval, `--price-per-hour 1e308` 300-digit
    costs; an interval of a second makes Young/Daly's formula meaningless."""
    report = dict(_commands(build_parser()))[("report",)]
    for option, value in (("--mtbi", "1e99"), ("--price-per-hour", "1e308"), ("--mtbi", "1s")):
        code, _, err = _parse(("report",), report, tmp_path, option, value, capsys)
        _assert_refused(code, err, option, value)


#: a value other than the default for every option of ``predict`` that only --check, or
#: only a prediction from PATHs, uses
PREDICT_VALUES = {
    "paths": ["results.json"], "nodes": ["--nodes", "2"],
    "ranks_per_node": ["--ranks-per-node", "4"], "sharding": ["--sharding", "zero1"],
    "optimizer": ["--no-optimizer"], "master_weights": ["--master-weights"],
    "files_per_rank": ["--files-per-rank", "2"], "storage_gbps": ["--storage-gbps", "10"],
    "node_gbps": ["--node-gbps", "10"], "cores_per_node": ["--cores-per-node", "8"],
    "get_rate": ["--get-rate", "100"], "put_rate": ["--put-rate", "100"],
    "mtbi": ["--mtbi", "24h"], "price_per_hour": ["--price-per-hour", "3"],
    "format": ["--format", "json"], "plot": ["--plot", "p.png"], "direct_io": ["--direct-io"],
    "cases": ["--cases", "ranks"], "scale": ["--scale", "0.004"], "repeat": ["--repeat", "3"],
    "out": ["--out", "elsewhere"],
}  # fmt: skip


def _moot_cases() -> list[tuple[tuple[str, ...], str, list[str], list[str]]]:
    """(command, the option's dest, a command line under which the option does nothing, the
    option's own words): each line is this test's claim, not read from the rules."""
    from ckptprof.cli.predict import CHECK_ONLY, PREDICTION_ONLY

    restore, save, generate = ("synth", "restore"), ("synth", "save"), ("synth", "generate")
    framework = ["ck", "--strategy", "framework", "--ceiling-gbps", "1"]
    dcp = ["ck", "--layout", "dcp", "--ceiling-gbps", "1"]  # DCP's default writer: framework
    tokens, check = ["--first-step-tokens", "64"], ["--check", "chk"]
    return [
        (restore, "first_step_s", ["ck", "--no-first-step"], ["--first-step-s", "1"]),
        (restore, "first_step_tokens", ["ck", "--no-first-step"], tokens),
        (restore, "first_step_tokens", ["ck", "--first-step-s", "1"], tokens),
        (restore, "deadline", ["ck"], ["--deadline", "30"]),
        (restore, "drop_caches", ["ck", "--cache", "hot"], ["--drop-caches"]),
        (restore, "stage", ["ck", "--strategy", "pipelined,framework"], ["--stage", "st"]),
        (save, "concurrency", framework, ["--concurrency", "4"]),
        (save, "part_size", framework, ["--part-size", "4M"]),
        (save, "part_size", dcp, ["--part-size", "4M"]),
        (generate, "bandwidth_gbps", ["ck"], ["--bandwidth-gbps", "5"]),
        (generate, "force", ["ck", "--dry-run"], ["--force"]),
        (restore, "memory_budget", ["ck", "--strategy", "staged"], ["--memory-budget", "1G"]),
        (("demo",), "scale", ["--full"], ["--scale", "0.1"]),
        (("demo",), "memory_budget", ["--strategy", "staged"], ["--memory-budget", "1G"]),
        (("export",), "output", ["--otlp", "results.json"], ["-o", "spans.jsonl"]),
        *[(("predict",), dest, check, PREDICT_VALUES[dest]) for dest in PREDICTION_ONLY],
        *[(("predict",), dest, [], PREDICT_VALUES[dest]) for dest in CHECK_ONLY],
    ]  # fmt: skip


def test_every_moot_rule_refuses_each_option(tmp_path, capsys, monkeypatch):
    """An option others leave without effect is one line naming it (and why, and the fix),
    at parse time, before any work; the same line without it passes. The rules are read
    from every command's parser: each option of each rule must be exercised by a case here,
    and every flag a rule's text names must be one of its command's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results.json").write_text("{}")
    commands = dict(_commands(build_parser()))
    exercised, defaults_named = set(), set()
    for words, dest, base, given in _moot_cases():
        command = commands[words]
        try:
            namespace = build_parser().parse_args([*words, *base])
        except SystemExit:
            pytest.fail(f"{' '.join([*words, *base])}: refused without {given}")
        rules = [(i, rule) for i, rule in enumerate(command.moot_rules) if dest in rule.dests]
        holding = [i for i, rule in rules if rule.when(namespace)]
        assert holding, f"{words} {given}: no rule of the command holds under {base}"
        exercised.update((words, i, dest) for i in holding)
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args([*words, *base, *given])
        lines = capsys.readouterr().err.strip().splitlines()
        flag = next(a for a in command._actions if a.dest == dest)
        name = flag.option_strings[-1] if flag.option_strings else flag.metavar
        assert exc.value.code == 2 and len(lines) == 1, (words, given, lines)
        assert f"{name} would do nothing" in lines[0] and "--help" in lines[0], lines[0]
        if flag.option_strings and flag.nargs is None and flag.default not in (None, False):
            text = flag.default  # as --help shows it
            text = ",".join(map(str, text)) if isinstance(text, (list, tuple)) else str(text)
            at_default = [name, text]  # naming the default is giving it too
            with pytest.raises(SystemExit):
                build_parser().parse_args([*words, *base, *at_default])
            assert f"{name} would do nothing" in capsys.readouterr().err, at_default
            defaults_named.add((words, dest))
    for words, command in commands.items():
        flags = {f for a in command._actions for f in a.option_strings}
        for i, rule in enumerate(getattr(command, "moot_rules", ())):
            for dest in rule.dests:
                assert (words, i, dest) in exercised, f"{words} rule {i}: {dest} has no case"
            text = f"{rule.fix} {rule.why if isinstance(rule.why, str) else ''}"
            named = set(re.findall(r"--[a-z][a-z-]*[a-z]", text))
            assert named <= flags, (words, named - flags)
    assert defaults_named, "no case names an option's default value"
