"""Typed option values: argparse checks types and ranges before any work is done.

Each type function parses the text and checks it against the same ranges the library
uses (:mod:`ckptprof.synth.ranges`); :class:`Parser` prints argparse's complaint as the
one line every ckptprof error is (``ckptprof: error: --ranks: expected …``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from ckptprof import schema


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written, each prose paragraph (lines not indented,
    up to a blank or indented line) refilled to the terminal (an indented line, an example
    command, is kept whole to be copied); and each option's
    default shown where its help does not already say it (a flag's False and an unset
    None say nothing)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        lines: list[str] = []
        prose: list[str] = []  # the paragraph's lines so far, refilled as one

        def refill() -> None:
            joined = " ".join(prose)
            if len(prose) == 1 and len(joined) <= width:
                lines.append(indent + joined)
            elif prose:
                lines.extend(textwrap.wrap(joined, width, initial_indent=indent,
                                           subsequent_indent=indent))  # fmt: skip
            prose.clear()

        for line in text.splitlines():
            if line.strip() and not line[:1].isspace():
                prose.append(line)
                continue
            refill()
            lines.append(indent + line if line.strip() else "")
        refill()
        return "\n".join(lines)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        quiet = default is None or default is False or default == argparse.SUPPRESS
        if quiet or "default" in text or action.option_strings == []:
            return text
        if default is True:
            shown = "on"
        elif isinstance(default, (list, tuple)):
            shown = ",".join(map(str, default))
        else:
            shown = default
        return f"{text} (default {str(shown).replace('%', '%%')})"  # text's own %(…)s stay


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors that name the option and point at its help."""

    def error(self, message: str) -> NoReturn:
        text = message.removeprefix("argument ")
        self.exit(2, f"ckptprof: error: {text} (see `{self.prog} --help`)\n")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._given: set[str] = set()
        namespace, extras = super().parse_known_args(args, namespace)
        self._refuse_moot(namespace)
        self._refuse_writing_what_is_read(namespace)
        self._refuse_writing_into_a_checkpoint(namespace)
        return namespace, extras

    def _refuse_moot(self, namespace: argparse.Namespace) -> None:
        """Every option of a :class:`Moot` rule of this command given while its rule holds:
        one line naming them, before any work (:func:`refuse_moot` declares the rules)."""
        for rule in getattr(self, "moot_rules", ()):
            given = [
                _option_name(action)
                for action in self._actions
                if action.dest in rule.dests and action.dest in self._given
            ]
            if given and rule.when(namespace):
                reason = rule.reason(namespace)
                self.error(f"{', '.join(given)} would do nothing: {reason}; {rule.fix}.")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        """argparse's one call per argument on the command line: it records which were
        given, so that naming an option's default value (``--part-size 16M``) still counts
        as giving it (a ``nargs="*"`` positional with no words is not given)."""
        if action.option_strings or arg_strings:
            self._given.add(action.dest)
        return super()._get_values(action, arg_strings)

    def _refuse_writing_into_a_checkpoint(self, namespace: argparse.Namespace) -> None:
        """An output (``--out``, ``--html``) that is a checkpoint folder the command reads
        or writes, or inside one (``synth restore ck --out ck/results``): its files would
        become the checkpoint's (a later ``generate --force`` refuses them, ``predict``
        reads them as measurements). Refused before any work, every output option
        against every checkpoint option of the command; ``s3://`` places never meet."""
        from ckptprof.storage.registry import is_path

        outputs, checkpoints = [], []
        for action in self._actions:
            value = getattr(namespace, action.dest, None)
            role = getattr(action.type, "role", None)
            if value is None or not is_path(str(value)):
                continue
            if role in (OUTPUT_FOLDER, OUTPUT_FILE):
                outputs.append((_option_name(action), Path(value)))
            elif role in (CHECKPOINT_OUT, CHECKPOINT_IN):
                checkpoints.append((_option_name(action), Path(value)))
        for option, out in outputs:
            for named, ck in checkpoints:
                if out.expanduser().resolve().is_relative_to(ck.expanduser().resolve()):
                    self.error(
                        f"{option} {out}: inside the checkpoint {named} {ck} (what it writes "
                        "would become files of the checkpoint); write it outside that folder"
                    )

    def _refuse_writing_what_is_read(self, namespace: argparse.Namespace) -> None:
        """An output file that is one of the files the command's inputs name (``report
        out --html out/results.json``) would replace what it reads: refused before any
        work, for every output option against every input option of the command."""
        outputs, inputs = [], []
        for action in self._actions:
            value = getattr(namespace, action.dest, None)
            role = getattr(action.type, "role", None)
            if value is None or role not in (OUTPUT_FILE, INPUT):
                continue
            values = value if isinstance(value, list) else [value]
            (outputs if role == OUTPUT_FILE else inputs).extend(
                (_option_name(action), str(v)) for v in values
            )
        if not outputs or not inputs:
            return
        from ckptprof.report.load import files_read

        read = files_read(path for _, path in inputs)
        for option, path in outputs:
            if Path(path).expanduser().resolve() in read:
                named = ", ".join(p for _, p in inputs)
                self.error(
                    f"{option} {path}: it is one of the files the command reads (from "
                    f"{named}); write it elsewhere"
                )


@dataclass(frozen=True)
class Moot:
    """Options (their ``dests``) that have no effect while ``when`` holds of the parsed
    arguments: given then, they are refused, never silently ignored. ``why`` says why (a
    text that may name the arguments' values, ``--check {check}``, or made from them);
    ``fix`` what to give or drop."""

    dests: tuple[str, ...]
    when: Callable[[argparse.Namespace], bool]
    why: str | Callable[[argparse.Namespace], str]
    fix: str

    def reason(self, args: argparse.Namespace) -> str:
        return self.why(args) if callable(self.why) else self.why.format_map(vars(args))


def refuse_moot(parser: argparse.ArgumentParser, *rules: Moot) -> None:
    """Declare a command's :class:`Moot` rules: its :class:`Parser` checks them after each
    parse, so that every command refuses a moot option the one way."""
    parser.moot_rules = (*getattr(parser, "moot_rules", ()), *rules)


def _option_name(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.metavar or action.dest


def _checked(
    parse: Callable[[str], Any], check: schema.Check, kind: str = "text"
) -> Callable[[str], Any]:
    """An argparse ``type``: ``parse(text)``, then ``check``; the message quotes the text.

    The type carries ``kind`` and ``check`` so that the option matrix in the tests can
    feed every option the boundary values of its kind."""

    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except (ValueError, OverflowError):
            value = text
        problem = check(value)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"expected {problem.expected}, got {text!r}")
        return value

    convert.kind, convert.check = kind, check  # type: ignore[attr-defined]
    return convert


def whole(check: schema.Check) -> Callable[[str], int]:
    """A whole number in ``check``'s range (``--ranks 8``)."""
    return _checked(int, check, "whole")


def real(check: schema.Check) -> Callable[[str], float]:
    """A finite number in ``check``'s range (``--bandwidth-gbps 2.5``)."""
    return _checked(float, check, "real")


#: binary units up to the largest any option takes (``--memory-budget`` to 1P)
SIZE_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def parse_size(text: str) -> int:
    """``16M``, ``16MiB``, ``512k``, ``1T`` or plain bytes; ``ValueError``/``OverflowError``
    if not."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    if t and t[-1] in SIZE_UNITS:
        return int(float(t[:-1]) * SIZE_UNITS[t[-1]])
    return int(t)


def size_text(nbytes: int) -> str:
    """A size as the size options take it (``16M`` for 16 MiB): defaults shown in --help."""
    for unit, factor in sorted(SIZE_UNITS.items(), key=lambda item: -item[1]):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor}{unit.upper()}"
    return str(nbytes)


DURATION_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``6h``, ``30m``, ``90s``, ``2d`` or plain seconds; ``ValueError`` if not."""
    t = text.strip().lower()
    for unit in sorted(DURATION_UNITS, key=len, reverse=True):
        if t.endswith(unit):
            return float(t[: -len(unit)]) * DURATION_UNITS[unit]
    return float(t)


def _with_unit(parse: Callable[[str], Any], example: str, unit: str, kind: str):
    """An option type: ``parse``, then ``check``; a refusal shows the example and the unit."""

    def make(check: schema.Check) -> Callable[[str], Any]:
        def in_unit(value: Any) -> schema.Problem | None:
            problem = check(value)
            if problem is None:
                return None
            return schema.Problem("", f"{example}: {problem.expected} {unit}", value)

        convert = _checked(parse, in_unit, kind)
        convert.check = check  # type: ignore[attr-defined]
        return convert

    return make


#: a length of time like ``6h`` (s, m, h, d), in seconds, in the check's range
duration = _with_unit(parse_duration, "a duration like 6h or 30m", "seconds", "duration")
#: a byte count like ``16M`` in the check's range
size = _with_unit(parse_size, "a size like 16M", "bytes", "size")

OFF_WORDS = ("0", "off", "no", "false")


def seconds_or_off(check: schema.Check) -> Callable[[str], float]:
    """Seconds in ``check``'s range, or ``0``/``off`` for 0.0: the feature turned off."""
    seconds = _checked(float, check, "real")

    def convert(text: str) -> float:
        if text.strip().lower() in OFF_WORDS:
            return 0.0
        try:
            return seconds(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{exc} (or 0/off to turn it off)") from None

    convert.kind, convert.check = "real-or-off", check  # type: ignore[attr-defined]
    return convert


def int_list(check: schema.Check) -> Callable[[str], tuple[int, ...]]:
    """Comma-separated whole numbers, each in ``check``'s range (``1,8,16``)."""

    def convert(text: str) -> tuple[int, ...]:
        items = [v.strip() for v in text.split(",") if v.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected at least one value, e.g. 1,8,16")
        return tuple(whole(check)(item) for item in items)

    convert.kind, convert.check = "whole-list", check  # type: ignore[attr-defined]
    return convert


def choice_list(choices: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """Comma-separated names, each one of ``choices`` (``cold,hot``)."""
    one = _checked(str, schema.text(choices=choices))

    def convert(text: str) -> tuple[str, ...]:
        items = [v.strip() for v in text.split(",") if v.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected one or more of {', '.join(choices)}")
        return tuple(one(item) for item in items)

    convert.kind, convert.choices = "choice-list", choices  # type: ignore[attr-defined]
    return convert


def text_value(expected: str) -> Callable[[str], str]:
    """Free text that is not a path (a label): not empty, no NUL."""
    return _checked(str, schema.text(pattern=_PLACE, expected=expected), "text")


# not empty or blank (an empty path would mean the current folder), no NUL
_PLACE = r"[^\0]*\S[^\0]*"
_nonblank = schema.text(pattern=_PLACE, expected="a path")


def _place(role: str, problem_of: Callable[[str], str | None]) -> Callable[[str], Any]:
    """A path option's type: not blank, then ``problem_of`` (:mod:`ckptprof.cli.places`),
    all before any work, without touching the path. ``role`` says what the command does
    with it (the path matrix in the tests finds every writing option by it)."""

    def convert(text: str) -> str:
        if _nonblank(text) is not None:
            raise argparse.ArgumentTypeError(f"expected {_EXPECTED[role]}, got {text!r}")
        problem = problem_of(text)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return text

    convert.kind, convert.role = "path", role  # type: ignore[attr-defined]
    return convert


#: roles of path options: where a command writes, and what it reads
OUTPUT_FOLDER, OUTPUT_FILE, INPUT, CHECKPOINT_OUT, CHECKPOINT_IN = (
    "output folder", "output file", "input", "checkpoint to write", "checkpoint to read",
)  # fmt: skip


_EXPECTED = {
    OUTPUT_FOLDER: "a folder",
    OUTPUT_FILE: "a file",
    INPUT: "a file or folder",
    CHECKPOINT_OUT: "a folder or s3://bucket/prefix",
    CHECKPOINT_IN: "a folder or s3://bucket/prefix",
}


def _output_folder(text: str) -> Path:
    from ckptprof.cli import places

    return Path(_place(OUTPUT_FOLDER, places.output_folder_problem)(text))


def _output_file(text: str) -> str:
    from ckptprof.cli import places

    return _place(OUTPUT_FILE, places.output_file_problem)(text)


def _input(text: str) -> str:
    from ckptprof.cli import places

    return _place(INPUT, places.input_problem)(text)


def _checkpoint_out(text: str) -> str:
    from ckptprof.cli import places

    return _place(CHECKPOINT_OUT, places.location_problem(write=True))(text)


def _checkpoint_in(text: str) -> str:
    from ckptprof.cli import places

    return _place(CHECKPOINT_IN, places.location_problem(write=False))(text)


for _convert, _role in (
    (_output_folder, OUTPUT_FOLDER), (_output_file, OUTPUT_FILE), (_input, INPUT),
    (_checkpoint_out, CHECKPOINT_OUT), (_checkpoint_in, CHECKPOINT_IN),
):  # fmt: skip
    _convert.kind, _convert.role = "path", _role  # type: ignore[attr-defined]

#: a folder the command creates (with its parents) and writes into
directory = _output_folder
#: a file the command writes (its folder must exist)
output_file = _output_file
#: a trace file, results file or a folder of them, read
input_path = _input
#: a checkpoint location the command writes (a folder or ``s3://bucket/prefix``)
location = _checkpoint_out
#: a checkpoint location the command reads
checkpoint = _checkpoint_in


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """``--device``: where the restored state lives (shared by ``synth restore`` and ``demo``)."""

    def device(text: str) -> str:
        from ckptprof.synth.device import check_device

        problem = check_device(text)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return text

    device.kind = "device"  # type: ignore[attr-defined]

    parser.add_argument(
        "--device",
        type=device,
        default="auto",
        help="where the restored state lives: auto (a CUDA device if there is one, else "
        "host memory), cpu, cuda or cuda:N; on a GPU, reshard includes the host→device "
        "copies and the first step runs there",
    )
