"""Storage is chosen by scheme in one place (``storage/registry.py``); the rest of the
code asks a backend what it can do, never which one it is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckptprof.errors import CkptprofError
from ckptprof.storage import PosixStorage, Storage, registry

PACKAGE = Path(__file__).resolve().parents[1] / "ckptprof"
CAPABILITIES = ("object_store", "files_by_path", "s3_api", "has_local_cache")


@pytest.mark.parametrize("scheme", sorted(registry.SCHEMES))
def test_every_scheme_names_a_backend_with_its_capabilities(scheme):
    cls = registry.storage_class(f"{scheme}://bucket/prefix")
    assert issubclass(cls, Storage) and cls is not PosixStorage
    assert not cls.files_by_path  # a scheme is never a path
    assert registry.is_object_store(f"{scheme}://b/p") is cls.object_store
    assert not registry.is_path(f"{scheme}://b/p")


def test_a_path_is_posix_and_an_unknown_scheme_is_one_line_naming_the_known(tmp_path):
    assert registry.storage_class(str(tmp_path)) is PosixStorage
    assert registry.open_storage(str(tmp_path), direct_io=True).mappable is False
    assert registry.open_storage(str(tmp_path)).mappable is True
    with pytest.raises(CkptprofError) as refused:
        registry.open_storage("gs://bucket/ckpt")
    message = str(refused.value)
    assert "gs:// locations are not supported" in message and "s3://bucket/prefix" in message
    assert "\n" not in message
    with pytest.raises(CkptprofError, match="--direct-io applies to local or mounted paths"):
        registry.open_storage("s3://bucket/ckpt", direct_io=True)


def test_no_module_outside_storage_reads_a_scheme_or_a_backend_kind():
    """A new backend is one line in ``SCHEMES``: nothing else tests ``"s3://"`` or a
    backend's ``kind`` to decide what to do."""
    rules = [
        re.compile(r"""\.startswith\(\s*["'][a-z0-9]+://"""),
        re.compile(r"""["'][a-z0-9]*://["']\s+in\s"""),
        re.compile(r"""storage\.kind\s*[!=]="""),
    ]
    found = []
    for source in sorted(PACKAGE.rglob("*.py")):
        if source.parent.name == "storage":
            continue
        for number, line in enumerate(source.read_text().splitlines(), 1):
            if any(rule.search(line) for rule in rules):
                found.append(f"{source.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert found == [], "ask storage.registry or a capability instead:\n" + "\n".join(found)
