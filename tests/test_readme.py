"""The README's first screen gives exactly the two set-up commands, and CI runs the second."""

from __future__ import annotations

import re
from pathlib import Path

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
