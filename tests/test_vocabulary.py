"""Every ``ckpt.*`` span attribute key and span name is spelled once, in
``ckptprof.phases`` (``Attr``, ``Phase``, the ``*_SPAN`` names): the code refers to the
constants, so a key cannot drift into two spellings (``ckpt.fused`` / ``ckpt.fused_fetch``)
that no report reads."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ckptprof.phases import (
    FUSED_SEPARATOR,
    NAMESPACE,
    Attr,
    Phase,
    fused_detail,
    fused_phases,
    fused_value,
    span_name,
)

#: paths (a file, or a folder ending in "/") not converted to the constants yet: their
#: owner empties this list as they switch to ``Attr`` (the test then covers them too)
NOT_YET_CONVERTED: list[str] = []

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("ckptprof", "integrations")
VOCABULARY = "ckptprof/phases.py"
#: a key or a span name: "ckpt." then a name (dots allowed), no spaces or prose
KEY = re.compile(r"ckpt\.[A-Za-z0-9_.]*")
#: Attr constants whose value is not in the ckpt. namespace, each with why (none today)
NON_CKPT_KEYS: dict[str, str] = {}


def _skipped(relative: str) -> bool:
    return relative == VOCABULARY or any(
        relative.startswith(p) if p.endswith("/") else relative == p for p in NOT_YET_CONVERTED
    )


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def stray_literals(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: literal`` of each ckpt.* key written out in ``path`` (docstrings aside):
    a string constant that is a key, or an f-string that builds one."""
    relative = path.relative_to(root).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            head = node.values[0] if node.values else None
            if isinstance(head, ast.Constant) and str(head.value).startswith(NAMESPACE):
                found.append((node.lineno, ast.unparse(node)))
            docs.update(id(v) for v in node.values)  # its parts are not keys on their own
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docs
            and KEY.fullmatch(node.value)
        ):
            found.append((node.lineno, repr(node.value)))
    return [f"{relative}:{line}: {text}" for line, text in sorted(found)]


def test_no_ckpt_key_is_spelled_outside_the_vocabulary():
    files = sorted(p for top in SCANNED for p in (ROOT / top).rglob("*.py"))
    assert len(files) > 20  # the scan found the source
    stray = [
        hit
        for path in files
        if not _skipped(path.relative_to(ROOT).as_posix())
        for hit in stray_literals(path)
    ]
    assert not stray, (
        "ckpt.* literals outside ckptprof/phases.py — use (or add) an Attr constant, "
        "Attr.phase_key() for a key built at run time, or a span-name constant:\n"
        + "\n".join(stray)
    )


def test_the_scan_finds_keys_and_f_strings_but_not_docstrings_or_prose(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        '"""Module: writes ``ckpt.fetch.lazy``."""\n'
        'A = {"ckpt.fetch.lazy": True}\n'
        'B = f"ckpt.{phase}.bytes"\n'
        'C = "no ckpt.restore or ckpt.save spans found"\n'
        'D = "ckpt.restore"\n'
    )
    assert stray_literals(source, tmp_path) == [
        "sample.py:2: 'ckpt.fetch.lazy'",
        "sample.py:3: f'ckpt.{phase}.bytes'",
        "sample.py:5: 'ckpt.restore'",
    ]


def attr_constants() -> dict[str, str]:
    return {
        name: value
        for name, value in vars(Attr).items()
        if name.isupper() and not name.startswith("_")
    }


def test_every_attr_constant_is_a_unique_ckpt_key():
    constants = attr_constants()
    assert len(constants) > 100
    for name, value in constants.items():
        assert isinstance(value, str), name
        assert value.startswith(NAMESPACE) or name in NON_CKPT_KEYS, (name, value)
        assert KEY.fullmatch(value) or name in NON_CKPT_KEYS, (name, value)
    by_value: dict[str, list[str]] = {}
    for name, value in constants.items():
        by_value.setdefault(value, []).append(name)
    assert not {v: n for v, n in by_value.items() if len(n) > 1}, "one key, several names"
    phase_spans = {p.span_name for p in Phase}
    assert not phase_spans & set(constants.values()), "an attribute key is also a span name"


def test_one_spelling_of_fused_and_its_parser():
    assert Attr.FUSED == "ckpt.fused"
    assert Attr.FETCH_LAZY == "ckpt.fetch.lazy"
    assert "ckpt.fused_fetch" not in attr_constants().values()
    assert fused_phases("fetch+deserialize (the reader's own)") == ("fetch", "deserialize")
    assert fused_phases("deserialize+reshard (dcp.load)") == ("deserialize", "reshard")
    value = "fetch+deserialize+reshard (dcp.load, S3StorageReader)"
    assert fused_phases(value) == ("fetch", "deserialize", "reshard")
    assert fused_detail(value) == "dcp.load, S3StorageReader"
    assert fused_phases("serialize+write") == ("serialize", "write")
    assert fused_detail("serialize+write") is None
    assert fused_phases("") == ()
    built = fused_value((Phase.FETCH, Phase.DESERIALIZE), "Strategy.load_checkpoint")
    assert built == "fetch+deserialize (Strategy.load_checkpoint)"
    assert fused_phases(built) == ("fetch", "deserialize")
    assert FUSED_SEPARATOR.join(fused_phases(built)) == "fetch+deserialize"


def test_keys_built_at_run_time_and_span_names():
    assert Attr.phase_key(Phase.WRITE, "model_s") == "ckpt.write.model_s"
    assert Attr.phase_key("fetch", "slowest_request_s") == Attr.FETCH_SLOWEST_REQUEST_S
    assert Attr.phase_prefix(Phase.FIRST_STEP) == "ckpt.first_step."
    assert span_name("rotate") == "ckpt.rotate"
    assert span_name(Phase.FETCH) == Phase.FETCH.span_name == "ckpt.fetch"


def test_a_fused_or_lazy_fetch_is_not_held_against_the_ceiling():
    from ckptprof.results_schema import fetch_unbounded

    assert fetch_unbounded({"fetch": {"busy_s": 1.0}, "deserialize": {"busy_s": 1.0}}) is None
    fused = {"deserialize": {"fused": "fetch+deserialize (the reader's own)"}}
    assert fetch_unbounded(fused) == "fused"
    assert fetch_unbounded({"deserialize": {"fused": "deserialize+reshard"}}) is None
    assert fetch_unbounded({"fetch": {"lazy": True}}) == "lazy"


# ------------------------------------------------------------------ design.md §3's table
DESIGN = ROOT / "docs" / "design.md"
TABLE_HEAD = "| constant | key | note |\n| --- | --- | --- |\n"


def _prose(text: str) -> str:
    """A source comment as Markdown: ``x`` and :role:`x` to `x`, a table's pipes escaped."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    return text.replace("|", "\\|")


def attribute_table() -> str:
    """design.md §3's table, from ``Attr``'s source: each group (``# ---- title``), each
    constant with its key and the comment on or above its line."""
    source = (ROOT / VOCABULARY).read_text()
    body = source[source.index("class Attr:") :]
    body = body[: re.search(r"\n(?=\S)", body[1:]).start() + 1]  # to the class's end
    rows, note = [], []
    for line in body.splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("# ----"):
            rows.append(f"| **{_prose(stripped.removeprefix('# ----').strip())}** | | |")
        elif stripped.startswith("#:"):
            note.append(stripped.removeprefix("#:").strip())
        elif found := re.match(r'([A-Z][A-Z0-9_]*) = "([^"]+)"(?:\s+#\s*(.*))?$', stripped):
            name, key, inline = found.groups()
            text = " ".join([*note, inline] if inline else note)
            rows.append(f"| `{name}` | `{key}` | {_prose(text)} |".replace(" |  |", " |  |"))
            note = []
        elif not stripped.startswith("#"):
            note = []
    return TABLE_HEAD + "\n".join(rows) + "\n"


def test_the_design_documents_every_attribute_as_the_source_states_it():
    """Regenerate with ``python -m tests.test_vocabulary``."""
    design = DESIGN.read_text()
    start = design.index(TABLE_HEAD)
    written = design[start : design.index("\n\n", start) + 1]
    assert written == attribute_table(), "run: python -m tests.test_vocabulary"


if __name__ == "__main__":  # rewrite design.md §3's table from the source
    text = DESIGN.read_text()
    start = text.index(TABLE_HEAD)
    DESIGN.write_text(text[:start] + attribute_table() + text[text.index("\n\n", start) + 1 :])
