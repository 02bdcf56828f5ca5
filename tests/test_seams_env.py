"""Every environment variable ckptprof reads, set to nonsense: a real save still ends
with exit 0 (the variable's default, said once naming it) or one line naming it.

The variables are found in the package's own source (every ``"CKPTPROF_…"`` and
``"OTEL_…"`` name it reads), so one added tomorrow is on trial the day it is added.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ckptprof
from ckptprof.cli import DEBUG_ENV, main
from tests.conftest import TINY_SCALE

ROOT = Path(ckptprof.__file__).parent
#: read by the test suite's own fault injection, or by one process for another
NOT_SETTINGS = {DEBUG_ENV, "CKPTPROF_LAUNCHER_QUOTES_ERRORS", "CKPTPROF_RUN_ID"}


def read_variables() -> set[str]:
    names = set()
    for source in [*ROOT.rglob("*.py"), *(ROOT.parent / "integrations").rglob("*.py")]:
        names |= set(re.findall(r"\"((?:CKPTPROF|OTEL)_[A-Z0-9_]+)\"", source.read_text()))
    return {n for n in names if not n.startswith("CKPTPROF_TEST_")} - NOT_SETTINGS


def test_the_variables_are_found():
    found = read_variables()
    assert {"CKPTPROF_STALL_AFTER", "OTEL_TRACES_EXPORTER", "CKPTPROF_COST_PER_HOUR"} <= found


@pytest.mark.parametrize("nonsense", ["bogus value", "-1", "1e308"])
def test_a_save_survives_every_variable_set_to_nonsense(
    nonsense, tmp_path, monkeypatch, capsys, caplog
):
    for name in read_variables():
        monkeypatch.setenv(name, nonsense)
    monkeypatch.setenv("OTEL_SDK_DISABLED", "false")  # else nothing else is read
    monkeypatch.setenv("CKPTPROF_TRACE_DIR", str(tmp_path / "traces"))  # a place, not on trial
    out = str(tmp_path / "out")
    code = main(["synth", "save", str(tmp_path / "ckpt"), "--scale", str(TINY_SCALE),
                 "--repeat", "1", "--ceiling-gbps", "1", "--out", out])  # fmt: skip
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unexpected" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    if code != 0:
        assert len(lines) == 1 and re.search(r"(CKPTPROF|OTEL)_[A-Z_]+", lines[0]), err
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    for line in lines + said:  # each complaint names its variable
        assert re.search(r"(CKPTPROF|OTEL)_[A-Z_]+|OTLP", line), line
    if nonsense == "bogus value":  # not numbers, not names: each reader says so
        for name in ("CKPTPROF_STALL_AFTER", "OTEL_TRACES_EXPORTER"):
            assert any(name in line for line in said), (name, said)


def test_an_unknown_exporter_is_said_once(tmp_path, monkeypatch, capsys):
    """`OTEL_TRACES_EXPORTER=bogus` sent the spans nowhere but the file without a word."""
    import logging

    from ckptprof.tracing import export, otel_settings

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "bogus")
    monkeypatch.setattr(otel_settings, "_settings_warned", set())
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("ckptprof").addHandler(handler)
    try:
        for _ in range(2):
            export.setup_telemetry(tmp_path).shutdown()
    finally:
        logging.getLogger("ckptprof").removeHandler(handler)
    said = [r.getMessage() for r in records if "OTEL_TRACES_EXPORTER" in r.getMessage()]
    assert len(said) == 1 and "bogus" in said[0] and "otlp, console, none" in said[0]
