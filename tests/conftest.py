"""Shared fixtures: small real checkpoints and fresh telemetry per test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptprof.synth.generate import generate
from ckptprof.synth.plan import SynthSpec

# real tensor names and counts of llama2-7b, widths shrunk: ~140 MB with Adam state
SMALL_SCALE = 0.002
TINY_SCALE = 0.0005


def read_spans(trace_file: Path) -> list[dict]:
    return [json.loads(line) for line in Path(trace_file).read_text().splitlines() if line]


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """Generate each layout once per session; tests must not modify these."""
    cache: dict[tuple, Path] = {}

    def get(layout: str, ranks: int = 1, scale: float = TINY_SCALE, **kw) -> Path:
        key = (layout, ranks, scale, tuple(sorted(kw.items())))
        if key not in cache:
            dest = tmp_path_factory.mktemp(f"ckpt-{layout}-{ranks}")
            generate(
                str(dest),
                SynthSpec(model="llama2-7b", layout=layout, scale=scale, ranks=ranks, **kw),
                force=True,
                progress=False,
            )
            cache[key] = dest
        return cache[key]

    return get


def run_cli(
    *args: str, env: dict | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run the real ``ckptprof`` command in a subprocess."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("CKPTPROF_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "ckptprof", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
