"""The README's first screen gives exactly the two set-up commands, and CI runs the second."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    first_screen = "\n".join(text.splitlines()[:40])
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", first_screen, flags=re.S)
    return [line.strip() for b in blocks for line in b.splitlines() if line.strip()]


def test_first_screen_has_exactly_two_commands():
    commands = readme_commands()
    assert len(commands) == 2, commands
    main_job, tests = commands
    assert "python3 -m venv .venv" in main_job and "ckptprof demo" in main_job
    assert "python3 -m venv .venv" in tests and "pytest" in tests


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in [line.strip() for line in ci]


@pytest.mark.slow
def test_the_main_job_runs_on_a_fresh_base_install(tmp_path):
    """The README's main-job command on a fresh venv with only the base install (no dev
    extra): it must end with its report and its picture. The same install and command,
    with ``--scale`` and ``--repeat`` added so that the sweep is short."""
    import os
    import subprocess

    main_job = readme_commands()[0]
    venv = tmp_path / "venv"
    install, run = main_job.rsplit(" && ", 1)
    assert run == ".venv/bin/ckptprof demo"
    install = install.replace(".venv", str(venv)).replace(" -e .", f" -e {ROOT}")
    # the same install, less byte-compiling every module of every package (torch's
    # thousands): the demo compiles the ones it imports, as a first run would anyway
    install = install.replace("pip install ", "pip install --no-compile ")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run(install, shell=True, capture_output=True, text=True, env=env, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    demo = subprocess.run(
        [str(venv / "bin" / "ckptprof"), "demo", "--scale", "0.0005", "--repeat", "1"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "== report" in demo.stdout and "RTO" in demo.stdout
    assert "== save" in demo.stdout  # the save is timed, and set beside its restores:
    assert "save vs restore of the same checkpoint" in demo.stdout
    assert (tmp_path / "ckptprof-demo" / "report.png").stat().st_size > 10_000
    freeze = subprocess.run([str(venv / "bin" / "pip"), "freeze"], capture_output=True,
                            text=True, env=env).stdout.lower()  # fmt: skip
    assert "pytest" not in freeze and "lightning" not in freeze  # the base install only
