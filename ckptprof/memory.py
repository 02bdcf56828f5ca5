"""Host (and device) memory while a restore runs: its peak, and the peak within each phase.

Out-of-memory on resume is one of the most reported resume problems, so every restore
span says how much memory it took. A sampler thread reads this process's resident set
(``/proc/self/statm``) every few milliseconds while the operation runs; each phase gets
the largest sample inside its intervals (``ckpt.memory.peak_rss_bytes``), the root the
largest of all, plus the kernel's own high-water mark where ckptprof may reset it (its
own process: ``reset_peak=True``; never in a training job, whose numbers it would
disturb). With CUDA in use, the device's allocated and reserved bytes are sampled the
same way (``ckpt.memory.device_peak_bytes``, ``ckpt.memory.device_reserved_peak_bytes``:
the caching allocator keeps freed blocks, so reserved is what the device lost to the
restore), on the device the restore runs on; its peak counters are reset only where
ckptprof owns the process, too.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from array import array

from ckptprof.phases import Attr

PAGE = os.sysconf("SC_PAGE_SIZE")
SAMPLE_S = 0.005
PEAK_RSS = Attr.MEMORY_PEAK_RSS_BYTES
START_RSS = Attr.MEMORY_START_RSS_BYTES
DEVICE_PEAK = Attr.MEMORY_DEVICE_PEAK_BYTES
DEVICE_RESERVED_PEAK = Attr.MEMORY_DEVICE_RESERVED_PEAK_BYTES
#: on a restore: the resident memory of the process that saved, while it trained
TRAINING_RSS = Attr.MEMORY_TRAINING_RSS_BYTES


def rss_bytes() -> int:
    """This process's resident set now."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


def _high_water_mark() -> int | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_high_water_mark() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def cuda_in_use() -> bool:
    """CUDA initialized in this process already (never initialized by asking)."""
    import sys

    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized())


class MemoryWatch:
    """Samples memory while an operation runs; see the module docstring.

    Samples are kept as two flat arrays (16 bytes each): an hour at the default rate is
    about 12 MB.
    """

    def __init__(
        self, reset_peak: bool = False, cuda: bool | None = None, interval_s: float = SAMPLE_S
    ) -> None:
        self.times = array("q")
        self.rss = array("q")
        self.device = array("q")
        self.reserved = array("q")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reset = reset_peak
        self._hwm_reset = False
        self._cuda = cuda_in_use() if cuda is None else cuda
        self._interval = interval_s
        self.start_rss = 0
        self.kernel_peak: int | None = None
        self.device_peak: int | None = None
        self.device_reserved_peak: int | None = None
        self._device_index = 0

    def start(self) -> MemoryWatch:
        self._hwm_reset = self._reset and _reset_high_water_mark()
        if self._cuda:
            import torch

            # the current device is the starting thread's: the sampler thread's would be
            # GPU 0 whichever GPU this rank restores onto
            self._device_index = torch.cuda.current_device()
            if self._reset:
                torch.cuda.reset_peak_memory_stats(self._device_index)
        self.start_rss = rss_bytes()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="ckptprof-memory", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        self.times.append(time.time_ns())
        self.rss.append(rss_bytes())
        if self._cuda:
            import torch

            self.device.append(int(torch.cuda.memory_allocated(self._device_index)))
            self.reserved.append(int(torch.cuda.memory_reserved(self._device_index)))

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    @property
    def running(self) -> bool:
        return self._thread is not None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._sample()
        if self._hwm_reset:
            self.kernel_peak = _high_water_mark()
        if self._cuda:
            import torch

            index = self._device_index
            self.device_peak = max(self.device)
            self.device_reserved_peak = max(self.reserved)
            if self._reset:  # the counters saw what fell between two samples
                self.device_peak = max(
                    self.device_peak, int(torch.cuda.max_memory_allocated(index))
                )
                self.device_reserved_peak = max(
                    self.device_reserved_peak, int(torch.cuda.max_memory_reserved(index))
                )

    @property
    def peak(self) -> int:
        return max(max(self.rss), self.kernel_peak or 0)

    def peak_within(self, intervals: list[tuple[int, int]]) -> int | None:
        """The largest sample inside any of ``intervals`` (None when none fell inside)."""
        best = None
        for start, end in intervals:
            lo = bisect.bisect_left(self.times, start)
            hi = bisect.bisect_right(self.times, end)
            if hi > lo:
                top = max(self.rss[lo:hi])
                best = top if best is None else max(best, top)
        return best

    def record(self, op) -> None:
        """Put the peaks on the operation's spans (before it finishes)."""
        attrs = {PEAK_RSS: self.peak, START_RSS: self.start_rss}
        if self.device_peak is not None:
            attrs[DEVICE_PEAK] = self.device_peak
            attrs[DEVICE_RESERVED_PEAK] = self.device_reserved_peak
        op.set_attributes(attrs)
        for name, stats in op.phase_stats().items():
            peak = self.peak_within(stats.intervals)
            if peak is not None:
                op.set_phase_attributes(name, **{PEAK_RSS: peak})


__all__ = [
    "DEVICE_PEAK",
    "DEVICE_RESERVED_PEAK",
    "MemoryWatch",
    "PEAK_RSS",
    "START_RSS",
    "TRAINING_RSS",
    "cuda_in_use",
    "rss_bytes",
]
