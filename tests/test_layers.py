"""The package's layering, as written in pyproject.toml's [tool.importlinter] contracts, holds.

``ckptprof.integrations`` lives in ``integrations/`` (setuptools' package-dir), where
grimp, which import-linter builds its graph with, does not look: it walks ``ckptprof/``
only. So lint-imports runs over a copy of the package with ``integrations/`` in place,
the tree an installed wheel has. The layers contract requires an ``integrations`` layer,
so a copy without it fails rather than passes unchecked.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "pyproject.toml"
LINT = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"


def package_tree(into: Path) -> Path:
    """``ckptprof/`` with ``integrations/`` as ``ckptprof/integrations``, under ``into``."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "ckptprof", into / "ckptprof", ignore=skip)
    shutil.copytree(ROOT / "integrations", into / "ckptprof" / "integrations", ignore=skip)
    return into


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports with the project's contracts over ``tree`` (its copy of the package
    comes first on sys.path: lint-imports puts the working directory there)."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-c", LINT, str(CONFIG), "--no-cache", "--no-logo"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def contract_count() -> int:
    """How many contracts pyproject.toml writes (tomllib is 3.11+: their table headers)."""
    lines = CONFIG.read_text().splitlines()
    return sum(line.strip() == "[[tool.importlinter.contracts]]" for line in lines)


def test_the_contracts_are_kept(tmp_path):
    result = lint_imports(package_tree(tmp_path))
    report = result.stdout + result.stderr
    assert result.returncode == 0, f"lint-imports: contracts broken\n{report}"
    assert f"Contracts: {contract_count()} kept, 0 broken." in report, report


def test_an_upward_import_and_a_cycle_are_caught(tmp_path):
    """The contracts are a real check: tracing importing the report layer (a layer above
    it, which imports tracing: a cycle), storage importing the package root, a layout
    doing I/O and a codec knowing a layout fail."""
    tree = package_tree(tmp_path)
    synth = tree / "ckptprof" / "synth"
    (tree / "ckptprof" / "tracing" / "_upward.py").write_text("import ckptprof.report.text\n")
    (tree / "ckptprof" / "storage" / "_root.py").write_text("import ckptprof\n")
    (synth / "layouts" / "_io.py").write_text("import ckptprof.storage.posix\n")
    (synth / "codecs" / "_layout.py").write_text("import ckptprof.synth.layouts.dcp\n")
    result = lint_imports(tree)
    report = result.stdout + result.stderr
    assert result.returncode != 0, report
    assert f"Contracts: 0 kept, {contract_count()} broken." in report, report
    assert "ckptprof.tracing._upward -> ckptprof.report.text" in report, report
    assert "ckptprof.storage._root -> ckptprof" in report, report
    assert "ckptprof.synth.layouts._io -> ckptprof.storage.posix" in report, report
    assert "ckptprof.synth.codecs._layout -> ckptprof.synth.layouts.dcp" in report, report


def test_the_design_documents_the_layers_the_contract_states():
    """docs/design.md §4's layer list is the contract's, line for line."""
    import re

    config = CONFIG.read_text()  # (tomllib is 3.11's; the list is one TOML array)
    listed = config[
        config.index("\nlayers = [") : config.index("\n]", config.index("\nlayers = ["))
    ]
    layers = re.findall(r'^\s*"([^"]+)",', listed, flags=re.M)
    design = (ROOT / "docs" / "design.md").read_text()
    section = design[design.index("## 4. The layering") : design.index("## 5.")]
    block = section[section.index("```\n") + 4 : section.index("\n```", section.index("```\n") + 4)]
    documented = [re.match(r'"([^"]+)"', line.strip()).group(1) for line in block.splitlines()]
    assert documented == layers


def test_only_a_dcp_restore_or_save_loads_torch_distributed_checkpoint():
    """torch.distributed.checkpoint takes ~0.8 s to import: every restore paid it before
    its first read, because the strategies imported DCP's paths for their handler table.
    Each strategy and saver of the registries loads without it now."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from ckptprof.synth.strategies import registry\n"
        "from ckptprof.synth.savers import registry as savers\n"
        "for name in registry.BUILTIN: registry.get_strategy(name)\n"
        "for name in savers.NAMES:\n"
        "    if name != 'async': savers.get_saver(name)\n"  # async is dcp.async_save's
        "print(sorted(m for m in sys.modules if m.startswith('torch.distributed.checkpoint')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_package_of_the_tree_is_installed():
    """pyproject.toml lists the packages a wheel holds; a package folder it leaves out is
    missing from every non-editable install (an editable one finds it anyway, so nothing
    else here would notice)."""
    text = CONFIG.read_text()
    listed = text[text.index("[tool.setuptools]") :]
    listed = listed[listed.index("packages = [") :]
    listed = listed[: listed.index("]")]
    installed = set(re.findall(r'"([\w.]+)"', listed))
    tree = {
        ".".join(("ckptprof", "integrations", *init.parent.relative_to(top).parts))
        if top.name == "integrations"
        else ".".join(init.parent.relative_to(ROOT).parts)
        for top in (ROOT / "ckptprof", ROOT / "integrations")
        for init in top.rglob("__init__.py")
    }
    assert tree == installed, (
        f"not installed: {sorted(tree - installed)}; gone: {sorted(installed - tree)}"
    )
