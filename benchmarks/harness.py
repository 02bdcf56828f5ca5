"""What the benchmarks share: a checkpoint to measure, cold caches, fio as the reference,
interleaved repeats and medians, and the environment printed with every result.

Built on the product's own modules (generation, eviction and residency, environment
capture), so a benchmark measures the same code paths users run.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptprof.manifest import MANIFEST_NAME, Manifest  # noqa: E402
from ckptprof.storage import PosixStorage  # noqa: E402


def checkpoint(
    directory: Path, model: str, layout: str, scale: float, *, force: bool = False, **spec
) -> Manifest:
    """The synthetic checkpoint in ``directory``, generated when it is not there yet; a
    folder with other files and no manifest is left alone unless ``force``."""
    from ckptprof.synth.generate import generate
    from ckptprof.synth.plan import SynthSpec

    if not (directory / MANIFEST_NAME).exists():
        if directory.is_dir() and any(directory.iterdir()) and not force:
            raise SystemExit(
                f"{directory} has files but no {MANIFEST_NAME}; generating would replace them. "
                "Pass --force to do that, or choose an empty or new --dir."
            )
        print(f"generating {model} {layout} x{scale:g} in {directory} …", flush=True)
        generate(str(directory), SynthSpec(model, layout, scale, **spec), force=True)
    return Manifest.from_json((directory / MANIFEST_NAME).read_bytes(), str(directory))


def cold(directory: Path, manifest: Manifest) -> float:
    """Evict every file (fsync + fadvise), return the measured resident fraction."""
    storage = PosixStorage(str(directory))
    state = storage.evict(sorted(manifest.files))
    return state.resident_fraction or 0.0


def fio_read(
    directory: Path, manifest: Manifest, queue_depth: int, block: str = "16M", direct: bool = True
) -> dict:
    """fio reading every file of the checkpoint once, in order: direct I/O (libaio), or
    through the page cache (io_uring, so the queue depth holds); GB/s and seconds."""
    require_fio()
    names = ":".join(str(directory / p).replace(":", "\\:") for p in sorted(manifest.files))
    command = [
        "fio", "--name=read", "--rw=read", f"--direct={int(direct)}",
        f"--ioengine={'libaio' if direct else 'io_uring'}",
        f"--bs={block}", f"--iodepth={queue_depth}", "--numjobs=1",
        "--file_service_type=sequential", f"--filename={names}", "--output-format=json",
    ]  # fmt: skip
    out = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    job = out["jobs"][0]["read"]
    seconds = job["runtime"] / 1000
    return {"bytes": job["io_bytes"], "seconds": seconds, "gbps": job["io_bytes"] / seconds / 1e9}


def require_fio() -> None:
    """Stop with the fix when fio, every storage benchmark's reference, is missing."""
    if shutil.which("fio") is None:
        raise SystemExit("fio is not installed: apt-get install fio")


def fio_version() -> str:
    found = shutil.which("fio")
    if found is None:
        return "not installed"
    return subprocess.run([found, "--version"], capture_output=True, text=True).stdout.strip()


def interleaved(methods: dict[str, Callable[[], dict]], repeats: int, warmup: bool = True):
    """Every method once per repeat, the order rotated each repeat; returns name -> runs."""
    names = list(methods)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for repeat in range(repeats + int(warmup)):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            result = methods[name]()
            if repeat or not warmup:
                runs[name].append(result)
    return runs


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def environment(directory: Path) -> dict:
    """Versions, CPU, memory, kernel, filesystem and mount options (ckptprof.env), and
    how busy the machine was outside this process over a second as they were taken."""
    from machine import background_load, describe_load

    from ckptprof.env import capture

    return {
        **capture(PosixStorage(str(directory)).describe()),
        "fio": fio_version(),
        "machine.load": describe_load(background_load()),
    }


def scratch(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


__all__ = [
    "checkpoint",
    "cold",
    "environment",
    "fio_read",
    "interleaved",
    "median",
    "require_fio",
    "scratch",
]
