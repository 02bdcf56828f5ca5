"""Every path a command is given × every kind of place a person can name: one line up
front (exit 2, naming the option and the place) or a place the command can use; the
check itself touches nothing.

The path options are read from the parser (each path option's type carries its role:
:mod:`ckptprof.cli.options`), so a writing option added tomorrow meets every kind of
place below the day it is added; an option that takes a path as plain text fails
:func:`test_every_path_option_has_a_role`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptprof.cli import options as opt
from tests.test_full_disk import fill, small_fs
from tests.test_seams_options import _commands, _parser, _positional_values, _required_options

# --------------------------------------------------------------------- kinds of place


def new_in_folder(root: Path) -> Path:
    return root / "new"


def missing_parent(root: Path) -> Path:
    return root / "missing" / "deeper" / "new"


def existing_folder(root: Path) -> Path:
    (root / "folder").mkdir()
    return root / "folder"


def existing_file(root: Path) -> Path:
    (root / "file.txt").write_text("not ckptprof's\n")
    return root / "file.txt"


def under_a_file(root: Path) -> Path:
    return existing_file(root) / "new"


def link_to_folder(root: Path) -> Path:
    (root / "link").symlink_to(existing_folder(root))
    return root / "link"


def link_to_file(root: Path) -> Path:
    (root / "link").symlink_to(existing_file(root))
    return root / "link"


def symlink_loop(root: Path) -> Path:
    (root / "a").symlink_to(root / "b")
    (root / "b").symlink_to(root / "a")
    return root / "a"


def under_a_loop(root: Path) -> Path:
    return symlink_loop(root) / "new"


def dangling_link(root: Path) -> Path:
    (root / "dangling").symlink_to(root / "nowhere")
    return root / "dangling"


def fifo(root: Path) -> Path:
    os.mkfifo(root / "fifo")
    return root / "fifo"


def unix_socket(root: Path) -> Path:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "sock"))
    server.close()
    return root / "sock"


def device_node(root: Path) -> Path:
    return Path("/dev/null")


#: a place and, per role, whether a command may use it (True) or must refuse it (False)
USE, REFUSE = True, False
KINDS: dict[Callable[[Path], Path], dict[str, bool]] = {
    # role:                 output folder, output file, input, checkpoint to write, to read
    # a missing checkpoint to read passes: the command itself says how to make one
    new_in_folder: {"output folder": USE, "output file": USE, "input": REFUSE,
                    "checkpoint to write": USE, "checkpoint to read": USE},
    missing_parent: {"output folder": USE, "output file": REFUSE, "input": REFUSE,
                     "checkpoint to write": USE, "checkpoint to read": USE},
    existing_folder: {"output folder": USE, "output file": REFUSE, "input": USE,
                      "checkpoint to write": USE, "checkpoint to read": USE},
    existing_file: {"output folder": REFUSE, "output file": USE, "input": USE,
                    "checkpoint to write": REFUSE, "checkpoint to read": REFUSE},
    under_a_file: {role: REFUSE for role in ("output folder", "output file", "input",
                                             "checkpoint to write", "checkpoint to read")},
    link_to_folder: {"output folder": USE, "output file": REFUSE, "input": USE,
                     "checkpoint to write": USE, "checkpoint to read": USE},
    link_to_file: {"output folder": REFUSE, "output file": USE, "input": USE,
                   "checkpoint to write": REFUSE, "checkpoint to read": REFUSE},
    symlink_loop: {role: REFUSE for role in ("output folder", "output file", "input",
                                             "checkpoint to write", "checkpoint to read")},
    under_a_loop: {role: REFUSE for role in ("output folder", "output file", "input",
                                             "checkpoint to write", "checkpoint to read")},
    dangling_link: {role: REFUSE for role in ("output folder", "output file", "input",
                                              "checkpoint to write", "checkpoint to read")},
    # a FIFO or a device where a file goes is written through (`--html /dev/stdout`)
    fifo: {"output folder": REFUSE, "output file": USE, "input": REFUSE,
           "checkpoint to write": REFUSE, "checkpoint to read": REFUSE},
    unix_socket: {role: REFUSE for role in ("output folder", "output file", "input",
                                            "checkpoint to write", "checkpoint to read")},
    device_node: {"output folder": REFUSE, "output file": USE, "input": REFUSE,
                  "checkpoint to write": REFUSE, "checkpoint to read": REFUSE},
}  # fmt: skip
ROLES = (opt.OUTPUT_FOLDER, opt.OUTPUT_FILE, opt.INPUT, opt.CHECKPOINT_OUT, opt.CHECKPOINT_IN)


def _path_actions():
    for words, parser in _commands(_parser()):
        for action in parser._actions:
            if getattr(action.type, "kind", None) == "path":
                yield words, parser, action


PATH_OPTIONS = list(_path_actions())


def _name(action) -> str:
    return action.option_strings[-1] if action.option_strings else action.metavar or action.dest


def _argv(words, parser, action, place: Path, tmp_path: Path) -> list[str]:
    """The command with ``place`` in the option on trial and usable values elsewhere."""
    if action.option_strings:
        others = _positional_values(parser, tmp_path / "others", action)
        return [*words, *others, action.option_strings[-1], str(place)]
    return [*words, *_required_options(parser), str(place)]


def _snapshot(root: Path) -> set[tuple[str, bool]]:
    found = set()
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = Path(folder) / name
            found.add((str(path.relative_to(root)), path.is_symlink()))
    return found


def test_every_path_option_has_a_role():
    """Options whose value is a place are typed by what the command does with it; a
    plain-text option is a label or a choice (listed here on purpose)."""
    text_options = set()
    for words, parser in _commands(_parser()):
        for action in parser._actions:
            if (
                isinstance(
                    action,
                    (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction),
                )
                or action.nargs == 0
            ):
                continue  # fmt: skip
            if getattr(action.type, "kind", None) == "path":
                assert action.type.role in ROLES, (words, action.dest)
            elif action.type is None and action.choices is None:
                text_options.add((words, _name(action)))
    assert text_options == set(), f"untyped option values: {sorted(text_options)}"
    roles = {action.type.role for _, _, action in PATH_OPTIONS}
    assert roles == set(ROLES), roles  # every role is on trial below


@pytest.mark.parametrize(
    "case", PATH_OPTIONS, ids=[f"{' '.join(w)} {_name(a)}" for w, _, a in PATH_OPTIONS]
)
def test_every_path_option_meets_every_kind_of_place(case, tmp_path, capsys):
    words, parser, action = case
    role, name = action.type.role, _name(action)
    (tmp_path / "others").mkdir()  # where the other arguments point
    for kind, expected in KINDS.items():
        root = tmp_path / kind.__name__
        root.mkdir()
        place = kind(root)
        before = _snapshot(tmp_path)
        try:
            _parser().parse_args(_argv(words, parser, action, place, tmp_path))
            code = 0
        except SystemExit as exc:
            code = exc.code
        err = capsys.readouterr().err
        assert _snapshot(tmp_path) == before, f"{name} {kind.__name__}: the check touched it"
        if expected[role] is USE:
            assert code == 0, f"{name} {kind.__name__}: refused a usable place: {err}"
            continue
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2, f"{name} {kind.__name__} ({place}): accepted"
        assert len(lines) == 1 and name in lines[0], err
        assert str(place) in lines[0] or place.name in lines[0], lines[0]
        assert "Traceback" not in err and "unexpected" not in err


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "full"])
def test_places_on_a_read_only_or_full_filesystem_are_refused_up_front(read_only, tmp_path, capsys):
    """Every writing option, on a real read-only or full tmpfs (root: it mounts one)."""
    writing = [c for c in PATH_OPTIONS if c[2].type.role in (opt.OUTPUT_FOLDER, opt.OUTPUT_FILE,
                                                             opt.CHECKPOINT_OUT)]  # fmt: skip
    fs = "read-only" if read_only else "full"
    (tmp_path / "others").mkdir()
    with small_fs(tmp_path / "fs", "1m", read_only=read_only) as mount:
        if not read_only:
            fill(mount)
        for words, parser, action in writing:
            place = mount / "place"
            with contextlib.suppress(SystemExit):
                _parser().parse_args(_argv(words, parser, action, place, tmp_path))
                pytest.fail(f"{_name(action)} {place}: accepted on a {fs} filesystem")
            line = capsys.readouterr().err.strip()
            assert _name(action) in line and str(mount) in line, line
            assert ("read-only" if read_only else "bytes free") in line, line


def test_usable_places_are_used(checkpoints, tmp_path, capsys):
    """Accepted through a symlink is written through it: a real restore's --out and a
    report's --html land where the links point (the links stay links)."""
    from ckptprof.cli import main

    out, page = tmp_path / "real" / "out", tmp_path / "real" / "page.html"
    page.parent.mkdir()
    page.write_text("old")
    (tmp_path / "folder-link").symlink_to(page.parent)
    (tmp_path / "page-link").symlink_to(page)
    through = str(tmp_path / "folder-link" / "out")
    restored = main(["synth", "restore", str(checkpoints("torch")), "--cache", "hot",
                     "--concurrency", "1", "--repeat", "1", "--no-first-step", "--ceiling-gbps",
                     "1", "--no-report", "--out", through])  # fmt: skip
    assert restored == 0, capsys.readouterr().err
    assert (out / "results.json").is_file()
    assert main(["report", str(out), "--html", str(tmp_path / "page-link")]) == 0
    assert (tmp_path / "page-link").is_symlink() and "<html" in page.read_text().lower()


READ_FILES = ("results.json", "save.json", "traces/run.jsonl")


@pytest.mark.parametrize(
    "case",
    [c for c in PATH_OPTIONS if c[2].type.role == opt.OUTPUT_FILE
     and any(getattr(a.type, "role", None) == opt.INPUT for a in c[1]._actions)],
    ids=lambda c: f"{' '.join(c[0])} {_name(c[2])}",
)  # fmt: skip
def test_no_output_replaces_a_file_the_command_reads(case, tmp_path, capsys):
    """Every output file option of a command that reads PATHs, aimed at each kind of file
    those PATHs hold (``report out --html out/results.json``): one line before any work,
    the file as it was; a new file beside them is written as usual."""
    words, parser, action = case
    others = tmp_path / "others"
    for name in READ_FILES:
        (others / name).parent.mkdir(parents=True, exist_ok=True)
        (others / name).write_text(f"{name}\n")
    for name in READ_FILES:
        place = others / name
        in_folder = _argv(words, parser, action, place, tmp_path)  # PATH: the folder
        named = [str(place) if word == str(others) else word for word in in_folder]  # the file
        for argv in (in_folder, named):
            with pytest.raises(SystemExit) as stopped:
                _parser().parse_args(argv)
            err = capsys.readouterr().err
            lines = [line for line in err.splitlines() if line.strip()]
            assert stopped.value.code == 2 and len(lines) == 1, err
            assert _name(action) in lines[0] and str(place) in lines[0], lines[0]
            assert "reads" in lines[0] and "write it elsewhere" in lines[0], lines[0]
            assert place.read_text() == f"{name}\n"
    _parser().parse_args(_argv(words, parser, action, others / "new.png", tmp_path))


def _with(checkpoint, line: list[str], ck: Path) -> list[str]:
    """``line`` with the checkpoint option given (``ck``), where it is an option left out."""
    flag = checkpoint.option_strings[-1] if checkpoint.option_strings else None
    return line + [flag, str(ck)] if flag and flag not in line else line


def _roles(parser, *roles: str) -> list:
    return [a for a in parser._actions if getattr(a.type, "role", None) in roles]


@pytest.mark.parametrize(
    "case",
    [c for c in PATH_OPTIONS if c[2].type.role in (opt.OUTPUT_FOLDER, opt.OUTPUT_FILE)
     and _roles(c[1], opt.CHECKPOINT_OUT, opt.CHECKPOINT_IN)],
    ids=lambda c: f"{' '.join(c[0])} {_name(c[2])}",
)  # fmt: skip
def test_no_output_is_written_into_a_checkpoint_the_command_names(case, tmp_path, capsys):
    """Every output option against every checkpoint the same command reads or writes:
    the checkpoint's own folder, or a folder inside it, is one line before any work
    (``synth restore ck --out ck/sub`` wrote its results and traces into the checkpoint,
    and ``synth save ck --out ck`` blamed its own lock on "another run"); beside it is
    used as usual."""
    words, parser, action = case
    (tmp_path / "others").mkdir()
    for checkpoint in _roles(parser, opt.CHECKPOINT_OUT, opt.CHECKPOINT_IN):
        try:
            line = _argv(words, parser, action, tmp_path / "beside", tmp_path)
            line = _with(checkpoint, line, tmp_path / "ck")
            ck = Path(getattr(_parser().parse_args(line), checkpoint.dest))
        except SystemExit:  # the two never go together (an option moot with it)
            assert "would do nothing" in capsys.readouterr().err
            continue
        ck.mkdir(parents=True, exist_ok=True)  # an output file's folder must exist
        folder = action.type.role == opt.OUTPUT_FOLDER  # a file option at a folder: refused
        for place in (ck, ck / "sub") if folder else (ck / "sub",):
            line = _with(checkpoint, _argv(words, parser, action, place, tmp_path), ck)
            with pytest.raises(SystemExit) as stopped:
                _parser().parse_args(line)
            lines = capsys.readouterr().err.strip().splitlines()
            assert stopped.value.code == 2 and len(lines) == 1, lines
            assert f"{_name(action)} {place}: inside the checkpoint" in lines[0], lines[0]
            assert f"{_name(checkpoint)} {ck}" in lines[0], lines[0]


IMAGE_OPTIONS = [c for c in PATH_OPTIONS if c[2].dest == "plot"]


@pytest.mark.parametrize("case", IMAGE_OPTIONS, ids=lambda c: f"{' '.join(c[0])} {_name(c[2])}")
def test_an_image_format_matplotlib_cannot_write_is_refused_before_the_work(case, tmp_path, capsys):
    """Every image option: ``--plot r.txt`` is one line before the command reads or prints
    anything (it printed the whole report, then failed)."""
    from ckptprof.cli import main

    words, parser, action = case
    (tmp_path / "others").mkdir()
    place = tmp_path / "r.txt"
    assert main(_argv(words, parser, action, place, tmp_path)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1, captured
    assert "--plot" in lines[0] and "'.txt'" in lines[0] and ".png" in lines[0], lines[0]
    assert not place.exists()


def test_an_mtbi_with_no_save_to_set_an_interval_for_is_refused(tmp_path, capsys):
    """``report --mtbi`` over restores alone would print no interval without a word."""
    from ckptprof.cli import main

    doc = {"runs": [{"strategy": "staged", "cache": "cold", "concurrency": 1, "wall_s": 1.0,
                     "phases": {"fetch": {"busy_s": 0.5, "bytes": 10**8}}}]}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(doc))
    assert main(["report", str(tmp_path), "--mtbi", "6h"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--mtbi" in captured.err and "no finished save" in captured.err
    assert len(captured.err.strip().splitlines()) == 1
