"""The README and the pages under docs/ stay true to the code: every page is reachable from
the index, every relative link lands on a file, and every command they show — in code
blocks and inline — is accepted by the parser of the program it names (ckptprof's own, or
a script's under benchmarks/ or examples/), so an option renamed or removed fails here
until the pages say so."""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import re
import shlex
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), ROOT / "benchmarks" / "README.md"]
README_MAX_BYTES = 16_000  # "about 15 KB": what it is, two commands, three uses, where to read

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```", flags=re.S | re.M)
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_SEPARATORS = {"&&", "||", "|", ";"}
_REDIRECTS = {">", ">>", "<", "2>", "&>"}


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _blocks(text: str) -> list[str]:
    return _BLOCK.findall(text)


def _prose(text: str) -> str:
    return _BLOCK.sub("", text)


def _lines_of_blocks(text: str) -> list[str]:
    """Each shell line of the code blocks, continuations joined, prompts and YAML's
    ``- run:`` taken off."""
    lines = []
    for block in _blocks(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            for prefix in ("$ ", "- run: ", "run: "):
                if line.startswith(prefix):
                    line = line[len(prefix) :]
            lines.append(line)
    return lines


def _segments(line: str) -> list[list[str]]:
    """A shell line as its commands (split at ``&&``, ``|``, ``;``), comments and
    redirections dropped;
    ``[`` ``]`` around optional parts are taken off, keeping what they hold."""
    try:
        tokens = shlex.split(line.replace("[", " ").replace("]", " "), comments=True)
    except ValueError:
        return []
    out, current = [], []
    tokens = iter(tokens)
    for token in tokens:
        if token in _REDIRECTS:  # the shell's, with the file it names
            next(tokens, None)
        elif token in _SEPARATORS:
            out.append(current)
            current = []
        else:
            current.append(token)
    return [*out, current]


def _program(tokens: list[str]) -> tuple[str, list[str]] | None:
    """(program, its arguments) for a ckptprof, benchmark or example command, else None.
    ``VAR=value`` prefixes, ``python -m``, ``torchrun … -m`` and a venv's bin/ are
    looked through."""
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):
        tokens = tokens[1:]
    if not tokens:
        return None
    if tokens[0] == "ckptprof" or tokens[0].endswith("/bin/ckptprof"):
        return "ckptprof", tokens[1:]
    if "-m" in tokens and tokens[0] in ("python", "python3", "torchrun", ".venv/bin/python"):
        at = tokens.index("-m")
        if tokens[at + 1 : at + 2] == ["ckptprof"]:
            return "ckptprof", tokens[at + 2 :]
    if tokens[0] in ("python", "python3", ".venv/bin/python") and len(tokens) > 1:
        tokens = tokens[1:]
    if re.fullmatch(r"(benchmarks|examples)/\w+\.py", tokens[0]):
        return tokens[0], tokens[1:]
    return None


def commands() -> list[tuple[str, str, list[str], bool]]:
    """(page, program, arguments, whether it is a mention in prose) for every command the
    pages show."""
    found = []
    for page in PAGES:
        text = page.read_text()
        candidates = [(line, False) for line in _lines_of_blocks(text)]
        candidates += [(span, True) for span in _INLINE.findall(_prose(text))]
        for line, mention in candidates:
            for tokens in _segments(line):
                program = _program(tokens)
                if program is not None:
                    found.append((_rel(page), *program, mention))
    for where, epilog in _epilogs(_ckptprof_parser(), "ckptprof"):
        for line in _lines_of_blocks(f"```\n{epilog}\n```\n"):
            for tokens in _segments(line):
                program = _program(tokens)
                if program is not None:
                    found.append((f"`{where} --help`", *program, False))
    return found


def _epilogs(parser: argparse.ArgumentParser, where: str):
    """(command, its --help's epilog) for ckptprof and every command under it: the examples
    --help shows are checked like the pages'."""
    if parser.epilog:
        yield where, parser.epilog
    for name, sub in _subparsers(parser).items():
        yield from _epilogs(sub, f"{where} {name}")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(
        (a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {}
    )


def _loosened(parser: argparse.ArgumentParser, mention: bool) -> None:
    """Path options take the text as written: the places the pages name are examples
    (``/mnt/fsx/ckpt``, ``run/``); their options and values are what is checked here.
    For a mention in prose (`ckptprof report --goodput`) the positionals may be left out
    too."""
    for action in parser._actions:
        if getattr(action.type, "kind", None) == "path":
            action.type = str
        if mention and not action.option_strings and action.dest != "command":
            action.required = False
    for sub in _subparsers(parser).values():
        _loosened(sub, mention)


@cache
def _ckptprof_parser(mention: bool = False) -> argparse.ArgumentParser:
    from ckptprof.cli import build_parser

    parser = build_parser()
    _loosened(parser, mention)
    return parser


def _ckptprof_refusal(argv: list[str], mention: bool) -> str | None:
    """None when ckptprof's own parser accepts ``argv``, or when ``argv`` only names a
    command (prose's `ckptprof synth restore`); else what the parser said."""
    parser, words = _ckptprof_parser(), list(argv)
    while words and words[0] in _subparsers(parser):
        parser = _subparsers(parser)[words.pop(0)]
    if not words and mention:
        return None
    said = io.StringIO()
    with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
        try:
            _ckptprof_parser(mention).parse_args(argv)
        except SystemExit as exc:
            if exc.code not in (0, None):
                return said.getvalue().strip() or f"exit {exc.code}"
    return None


@cache
def _script_options(script: str) -> frozenset[str]:
    """Every ``--option`` a script's argparse calls declare, read from its source."""
    tree = ast.parse((ROOT / script).read_text())
    options = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("-"):
                    options.add(arg.value)
    return frozenset(options)


def _script_refusal(script: str, argv: list[str]) -> str | None:
    if not (ROOT / script).is_file():
        return f"{script} does not exist"
    declared = _script_options(script) | {"-h", "--help"}
    unknown = [a.split("=")[0] for a in argv if a.startswith("-")]
    unknown = [a for a in unknown if a not in declared]
    return f"{script} has no option {', '.join(unknown)}" if unknown else None


def test_the_readme_is_short_and_points_at_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= README_MAX_BYTES, "the README's reference belongs in docs/"
    assert "](docs/index.md)" in readme


def test_every_page_is_in_the_index():
    index = (DOCS / "index.md").read_text()
    linked = {m for m in _LINK.findall(index)}
    missing = [p.name for p in DOCS.glob("*.md") if p.name != "index.md" and p.name not in linked]
    assert not missing, f"docs/index.md does not list {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_lands(page):
    text = _prose(page.read_text())
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (page.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{_rel(page)}: links to nothing: {broken}"


def test_the_pages_show_commands_of_every_kind():
    """The extraction itself is checked, so that a change to how pages are written cannot
    make the command test below pass by finding nothing."""
    found = commands()
    programs = {program for _, program, _, _ in found}
    assert "ckptprof" in programs and any(p.startswith("benchmarks/") for p in programs)
    assert any(p.startswith("examples/") for p in programs)
    assert any(page.startswith("`ckptprof synth save") for page, *_ in found)
    subcommands = {argv[0] for _, program, argv, _ in found if program == "ckptprof" and argv}
    every = set(_subparsers(_ckptprof_parser()))
    assert every <= subcommands, f"no page shows {sorted(every - subcommands)}"


def test_every_command_in_the_pages_parses():
    refused = []
    for page, program, argv, mention in commands():
        if program == "ckptprof":
            said = _ckptprof_refusal(argv, mention)
        else:
            said = _script_refusal(program, argv)
        if said:
            refused.append(f"{page}: {program} {shlex.join(argv)}\n    {said}")
    assert not refused, "\n".join(refused)


_CODE_REF = re.compile(r"`((?:[\w.-]+/)*\w+\.py)(?::([A-Za-z_][\w.]*))?`")
_SOURCES = sorted(
    p.relative_to(ROOT)
    for d in ("ckptprof", "integrations", "tests", "benchmarks", "examples")
    for p in (ROOT / d).rglob("*.py")
)


def _defined(path: Path) -> set[str]:
    """Every name a module defines at its top level, and ``Class.member``."""
    return _defined_in(ast.parse(path.read_text()).body)


def _defined_in(body: list[ast.stmt]) -> set[str]:
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names |= {f"{node.name}.{member}" for member in _defined_in(node.body)}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_code_reference_lands(page):
    """`path.py` and `path.py:name` in the pages name a file of the repository (by its
    path from the root or a package, or its tail) and a name it defines: code moved or
    renamed takes its pages along."""
    broken = []
    for path, name in _CODE_REF.findall(page.read_text()):
        found = [s for s in _SOURCES if str(s) == path or str(s).endswith(f"/{path}")]
        if not found:
            broken.append(f"{path} (no such file)")
        elif name and not any(name in _defined(ROOT / s) for s in found):
            broken.append(f"{path}:{name} (not defined there)")
    for dotted in _DOTTED_REF.findall(page.read_text()):
        problem = _dotted_problem(dotted)
        if problem:
            broken.append(f"{dotted} ({problem})")
    assert not broken, f"{_rel(page)}: {broken}"


_DOTTED_REF = re.compile(r"`(ckptprof(?:\.[A-Za-z_]\w*)+)[`(]")


def _module_file(parts: list[str]) -> Path | None:
    """The file of module ``ckptprof.a.b`` (``ckptprof.integrations`` is integrations/)."""
    if parts[:2] == ["ckptprof", "integrations"]:
        base = ROOT / "integrations" / Path(*parts[2:]) if parts[2:] else ROOT / "integrations"
    else:
        base = ROOT / Path(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _dotted_problem(dotted: str) -> str | None:
    """None when ``ckptprof.module[.Name[.attr]]`` is a module and a name it defines."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(parts[:cut])
        if module is not None:
            rest = ".".join(parts[cut:])
            if not rest or rest in _defined(module):
                return None
            return f"{module.relative_to(ROOT)} defines no {rest}"
    return "no such module"


def test_the_layout_of_the_code_names_every_module():
    """docs/development.md's layout names each module of the package (by its file name,
    under its folder's line), so a module added tomorrow is placed in the picture too."""
    text = (DOCS / "development.md").read_text()
    layout = _blocks(text[text.index("## Layout of the code") :])[0]
    words = set(re.findall(r"[A-Za-z_][\w]*", layout))
    unnamed = [
        str(p.relative_to(ROOT))
        for d in ("ckptprof", "integrations")
        for p in sorted((ROOT / d).rglob("*.py"))
        if p.stem not in ("__init__", "__main__") and p.stem not in words
    ]
    assert not unnamed, f"docs/development.md's layout does not name {unnamed}"
