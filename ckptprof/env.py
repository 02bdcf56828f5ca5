"""The environment every result carries (versions, machine, storage, limits)."""

from __future__ import annotations

import os
import platform
import resource
import time
from importlib import metadata

import psutil

PACKAGES = (
    "ckptprof",
    "torch",
    "numpy",
    "safetensors",
    "xxhash",
    "opentelemetry-sdk",
    "lightning",
    "pytorch-lightning",
    "transformers",
    "accelerate",
    "deepspeed",
    "boto3",
)


def package_versions() -> dict[str, str]:
    """Installed versions, read from metadata (nothing is imported)."""
    out = {}
    for name in PACKAGES:
        try:
            out[f"version.{name}"] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def capture(storage_description: dict[str, str] | None = None) -> dict[str, str | int | float]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    env: dict[str, str | int | float] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host.name": platform.node(),
        "version.python": platform.python_version(),
        "os.kernel": platform.release(),
        "cpu.count": os.cpu_count() or 0,
        "cpu.model": _cpu_model(),
        "memory.total_bytes": psutil.virtual_memory().total,
        "memory.available_bytes": psutil.virtual_memory().available,
        "ulimit.nofile": f"{soft}/{hard}",
    }
    env.update(package_versions())
    env.update(storage_description or {})
    return env


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
