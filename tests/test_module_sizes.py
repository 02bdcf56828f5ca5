"""Small modules with one job: no module of ``ckptprof/`` or ``integrations/`` runs past
about 450 lines, and no function past about 80 unless its docstring says why (a
paragraph beginning "Long because"). Enumerated from the tree, so a module grown
tomorrow meets the rule the day it grows."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(p for d in ("ckptprof", "integrations") for p in (ROOT / d).rglob("*.py"))
MAX_MODULE_LINES = 460
MAX_FUNCTION_LINES = 85
REASON = "Long because"


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("module", MODULES, ids=_name)
def test_a_module_has_one_job(module):
    lines = len(module.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{_name(module)}: {lines} lines; split it by its jobs"


@pytest.mark.parametrize("module", MODULES, ids=_name)
def test_a_long_function_says_why(module):
    tree = ast.parse(module.read_text())
    unexplained = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
        and REASON not in (ast.get_docstring(node) or "")
    ]
    assert not unexplained, f"{_name(module)}: {unexplained}"
