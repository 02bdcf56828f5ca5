"""Where the restored state lives: host memory, or a CUDA device where one is here.

A GPU job's restore ends with the state on the device, so with CUDA the targets are
allocated there and ``reshard`` includes the real host→device copies (from pinned
window buffers where the pipelined strategy stages reads). Without CUDA the state stays
in host memory and the span says so (``ckpt.device.note``): no device copy was timed.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ckptprof.errors import CkptprofError
from ckptprof.phases import Attr

if TYPE_CHECKING:
    import torch

DEVICES = "auto, cpu, cuda or cuda:N"
_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
DEVICE = Attr.DEVICE
DEVICE_NOTE = Attr.DEVICE_NOTE


def check_device(name: str) -> str | None:
    """What is wrong with ``name`` as a --device value (None: nothing)."""
    return None if _PATTERN.match(name) else f"{name!r} is not one of {DEVICES}"


def check_job_device(name: str, processes: int) -> None:
    """Refuse one GPU named for every rank of a job (each rank takes its LOCAL_RANK's)."""
    if processes > 1 and re.match(r"^cuda:\d+$", name):
        raise CkptprofError(
            f"--device {name}: every one of the job's {processes} ranks would restore onto "
            "that one GPU; use --device cuda (each rank takes its own, by LOCAL_RANK)."
        )


def resolve_device(name: str) -> torch.device:
    """``auto``: the current CUDA device where CUDA works, else the host."""
    import torch

    problem = check_device(name)
    if problem is not None:
        raise CkptprofError(f"--device {problem}.")
    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CkptprofError(
                f"--device {name}: no CUDA device here (torch {torch.__version__}); "
                "use --device cpu (or auto)."
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise CkptprofError(
                f"--device {name}: this machine has {torch.cuda.device_count()} CUDA "
                f"device(s); use cuda:0 to cuda:{torch.cuda.device_count() - 1}."
            )
    return device


def device_attributes(device: torch.device) -> dict:
    """``ckpt.device`` (with the GPU's name), and a note where no device copy is timed."""
    import torch

    if device.type != "cuda":
        note = (
            "no CUDA device here: the state is restored into host memory, no host→device copy"
            if not torch.cuda.is_available()
            else "--device cpu: the state is restored into host memory, no host→device copy"
        )
        return {DEVICE: "cpu", DEVICE_NOTE: note}
    index = device.index if device.index is not None else torch.cuda.current_device()
    return {DEVICE: f"cuda:{index} ({torch.cuda.get_device_name(index)})"}


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a phase ends when its copies have landed."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


class PinnedBuffer:
    """A page-locked host buffer (the shape of :class:`~ckptprof.io.buffers.HostBuffer`): reads
    land in it and go to the device by DMA."""

    def __init__(self, size: int, name: str = "ckptprof-pinned") -> None:
        import torch

        self.size = size
        self.name = name
        try:
            self._tensor = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        except RuntimeError as exc:  # page-locked memory is limited (ulimit -l, the driver)
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CkptprofError(
                f"could not pin {size} bytes of host memory for host→device copies ({first}); "
                "lower --memory-budget or --concurrency."
            ) from None
        self.view = memoryview(self._tensor.numpy())

    def close(self) -> None:
        self.view.release()
        self._tensor = None


__all__ = [
    "DEVICES",
    "PinnedBuffer",
    "check_device",
    "check_job_device",
    "device_attributes",
    "resolve_device",
    "synchronize",
]
