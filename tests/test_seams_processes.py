"""Processes meeting at a seam: a signal in every phase of a save and a restore, a
second writer of the same place, a reader of stdout that leaves early.

Everything runs in this process through :func:`ckptprof.cli.main` (it installs and puts
back its own signal handlers): a test-side gate wraps the tracer's phases, and when the
chosen phase of the chosen operation begins it sends this process the signal, or runs
the second command while the first is inside that phase. The phases and the writing
options are read from the code, so a new phase or a new place to write meets the same
rules the day it is added.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptprof.cli import main
from ckptprof.cli import options as opt
from ckptprof.manifest import MANIFEST_NAME
from ckptprof.phases import RESTORE_PHASES, SAVE_PHASES, Phase
from ckptprof.tracing.recorder import Operation
from tests.conftest import TINY_SCALE
from tests.test_seams_options import _commands, _parser

#: for each phase, the save or restore arguments that produce it
SAVE_FOR = {
    Phase.STAGE: ["--layout", "dcp", "--strategy", "async"],
    Phase.SERIALIZE: ["--strategy", "parallel"],
    Phase.WRITE: [],
    Phase.FSYNC: [],
    Phase.COMMIT: ["--strategy", "parallel"],
}
RESTORE_FOR = {
    Phase.LIST: [],
    Phase.FETCH: [],
    Phase.VERIFY: [],
    Phase.DESERIALIZE: ["--strategy", "staged"],
    Phase.RESHARD: [],
    Phase.FIRST_STEP: ["--first-step"],
}
SIGNALS = {signal.SIGINT: 130, signal.SIGTERM: 143}


@contextlib.contextmanager
def gate(monkeypatch, phase: Phase, nth: int, action: Callable[[], None]):
    """Run ``action`` once, when ``phase`` first begins in the ``nth`` operation that
    enters it (1: the first save or restore); yields the operations seen so far."""
    running = Operation.running
    seen: list[Operation] = []  # held, not their ids: a finished one's id can be reused

    @contextlib.contextmanager
    def gated(self, name):
        with running(self, name):
            if str(getattr(name, "value", name)) == phase.value and not any(
                op is self for op in seen
            ):
                seen.append(self)
                if len(seen) == nth:
                    action()
            yield

    monkeypatch.setattr(Operation, "running", gated)
    yield seen


def _save(dest: Path, out: Path, *extra: str) -> list[str]:
    return ["synth", "save", str(dest), "--scale", str(TINY_SCALE), "--ceiling-gbps", "1",
            "--out", str(out), "--stall-after", "off", *extra]  # fmt: skip


def _restore(ckpt: Path, out: Path, *extra: str) -> list[str]:
    first = [] if "--first-step" in extra else ["--no-first-step"]
    extra = tuple(e for e in extra if e != "--first-step")
    return ["synth", "restore", str(ckpt), "--cache", "hot", "--concurrency", "1",
            "--ceiling-gbps", "1", "--no-report", "--out", str(out), "--stall-after", "off",
            *first, *extra]  # fmt: skip


def _leftovers(folder: Path) -> list[str]:
    """Temporary files a write may leave (ckptprof's ``*.partial``, DCP's ``.tmp``)."""
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.name.endswith((".partial", ".tmp")) or ".partial." in p.name
    )


def test_every_phase_is_on_trial():
    assert set(SAVE_FOR) == set(SAVE_PHASES), "a save phase without a way to reach it"
    assert set(RESTORE_FOR) == set(RESTORE_PHASES), "a restore phase without a way to reach it"


@pytest.mark.parametrize("phase", SAVE_PHASES, ids=[p.value for p in SAVE_PHASES])
def test_a_signal_in_each_save_phase_stops_it_cleanly(phase, tmp_path, monkeypatch, capsys):
    """The second save is stopped inside ``phase``: exit 130/143 with "interrupted", no
    temporary file, no manifest (the location does not look complete), the first save
    kept in save.json marked partial."""
    signum = list(SIGNALS)[list(SAVE_PHASES).index(phase) % 2]
    dest, out = tmp_path / "ckpt", tmp_path / "out"
    with gate(monkeypatch, phase, 2, lambda: os.kill(os.getpid(), signum)) as seen:
        code = main(_save(dest, out, "--repeat", "2", *SAVE_FOR[phase]))
    err = capsys.readouterr().err
    assert len(seen) == 2, f"{phase.value} was reached in {len(seen)} saves"
    assert code == SIGNALS[signum], err
    assert f"interrupted ({signal.Signals(signum).name})" in err
    assert "Traceback" not in err and "unexpected" not in err
    assert not (dest / MANIFEST_NAME).exists()
    assert _leftovers(dest) == []
    saved = json.loads((out / "save.json").read_text())
    assert saved["partial"] is True and len(saved["saves"]) == 1


@pytest.mark.parametrize("phase", RESTORE_PHASES, ids=[p.value for p in RESTORE_PHASES])
def test_a_signal_in_each_restore_phase_stops_it_cleanly(
    phase, checkpoints, tmp_path, monkeypatch, capsys
):
    """The second restore is stopped inside ``phase``: exit 130/143, the checkpoint as it
    was, the first restore kept in results.json marked partial."""
    signum = list(SIGNALS)[list(RESTORE_PHASES).index(phase) % 2]
    ckpt, out = checkpoints("torch"), tmp_path / "out"
    before = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in ckpt.iterdir())
    with gate(monkeypatch, phase, 2, lambda: os.kill(os.getpid(), signum)) as seen:
        code = main(_restore(ckpt, out, "--repeat", "2", *RESTORE_FOR[phase]))
    err = capsys.readouterr().err
    runs = json.loads((out / "results.json").read_text())["runs"] if code == 0 else []
    modes = [(r.get("first_step"), r.get("first_step_estimate_s")) for r in runs]
    assert len(seen) == 2, f"{phase.value} was reached in {len(seen)} restores: {modes} {err}"
    assert code == SIGNALS[signum], err
    assert f"interrupted ({signal.Signals(signum).name})" in err
    assert "Traceback" not in err and "unexpected" not in err
    after = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in ckpt.iterdir())
    assert after == before
    results = json.loads((out / "results.json").read_text())
    assert results.get("partial") is True and len(results["runs"]) == 1


def _writing_folders():
    """(command, option) of every folder a command writes into."""
    for words, parser in _commands(_parser()):
        for action in parser._actions:
            role = getattr(action.type, "role", None)
            if role in (opt.OUTPUT_FOLDER, opt.CHECKPOINT_OUT):
                name = action.option_strings[-1] if action.option_strings else action.metavar
                yield " ".join(words), name


#: folders two runs may share by design, and why
SHARED = {
    ("synth restore", "--trace-dir"): "each process writes its own <run>-<pid>.jsonl",
}
#: how a second writer of each place is put beside a first one held inside a phase
SECOND_WRITER = {
    ("synth generate", "DEST"): "generate",
    ("synth save", "DEST"): "save-dest",
    ("synth save", "--out"): "save-out",
    ("synth restore", "--out"): "restore-out",
    ("synth restore", "--stage"): "restore-stage",
    ("demo", "--dir"): "demo",  # the demo saves and restores into DIR/checkpoint, DIR/results
    ("predict", "--check"): "check",  # its saves claim each checkpoint under DEST
    ("predict", "--out"): "check",
}


def test_every_writing_folder_is_claimed_or_shared_on_purpose():
    places = set(_writing_folders())
    assert places == set(SHARED) | set(SECOND_WRITER), places ^ (set(SHARED) | set(SECOND_WRITER))


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
@pytest.mark.parametrize(
    "place", ["generate", "save-dest", "save-out", "restore-out", "restore-stage"]
)
def test_a_second_writer_of_one_place_is_refused_at_once(
    place, force, checkpoints, tmp_path, monkeypatch, capsys
):
    """While the first run is inside a phase, a second one naming the same place is
    refused (exit 2, one line naming the place and the holder's pid) and writes nothing;
    the first then ends as if alone."""
    dest, out, other = tmp_path / "ckpt", tmp_path / "out", tmp_path / "other"
    forced = ["--force"] if force else []
    ckpt = checkpoints("torch")
    staged = ("--stage", str(other), "--strategy", "staged")
    first, second, phase = {
        "generate": (None, ["synth", "generate", str(dest), "--scale", str(TINY_SCALE),
                            *forced], None),
        "save-dest": (_save(dest, out), _save(dest, other, *forced), Phase.WRITE),
        "save-out": (_save(dest, out), _save(other, out, *forced), Phase.WRITE),
        "restore-out": (_restore(ckpt, out), _restore(ckpt, out), Phase.FETCH),
        "restore-stage": (_restore(ckpt, out, *staged), _restore(ckpt, tmp_path / "o2", *staged),
                          Phase.FETCH),
    }[place]  # fmt: skip
    results = []

    def run_second():
        results.append(main(second))
        results.append(capsys.readouterr().err)

    if first is None:  # generate is not traced: held inside its first file's write
        from ckptprof.synth import generate as gen

        write_one = gen._write_one

        def held(*args):
            if not results:
                run_second()
            return write_one(*args)

        monkeypatch.setattr(gen, "_write_one", held)
        code = main(second)  # the first generation, holding DEST while the second tries
    else:
        with gate(monkeypatch, phase, 1, run_second):
            code = main(first + ["--repeat", "1"])
    assert code == 0, capsys.readouterr().err
    refused, line = results
    assert refused == 2, line
    lines = [text for text in line.splitlines() if text.strip()]
    assert len(lines) == 1 and "another ckptprof run" in lines[0], line
    assert f"pid {os.getpid()}" in lines[0], lines[0]
    if place.startswith("save-out") or place == "restore-out":
        assert not (other / "save.json").exists() and not (tmp_path / "o2").exists()


@pytest.mark.slow
def test_a_reader_that_leaves_early_ends_nothing(checkpoints, tmp_path):
    """`ckptprof synth restore … | head -1`: exit 0, quiet, and the results written."""
    argv = [sys.executable, "-m", "ckptprof", *_restore(checkpoints("torch"), tmp_path / "o")]
    argv.remove("--no-report")
    pipeline = subprocess.run(
        f"{' '.join(argv)} | head -1; echo rc=${{PIPESTATUS[0]}}",
        shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "rc=0" in pipeline.stdout, pipeline.stderr
    assert "Broken pipe" not in pipeline.stderr and "error" not in pipeline.stderr
    assert (tmp_path / "o" / "results.json").is_file()
