"""Host (and device) memory while a restore runs: its peak, and the peak within each phase.

Out-of-memory on resume is one of the most reported resume problems, so every restore
span says how much memory it took. A sampler thread reads this process's resident set
(``/proc/self/statm``) every few milliseconds while the operation runs; each phase gets
the largest sample inside its intervals (``ckpt.memory.peak_rss_bytes``), the root the
largest of all, plus the kernel's own high-water mark where ckptprof may reset it (its
own process: ``reset_peak=True``; never in a training job, whose numbers it would
disturb). With CUDA in use, the device's peak allocation too.
"""

from __future__ import annotations

import os
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")
SAMPLE_S = 0.005
PEAK_RSS = "ckpt.memory.peak_rss_bytes"
START_RSS = "ckpt.memory.start_rss_bytes"


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


class MemoryWatch:
    """Samples memory while an operation runs; see the module docstring."""

    def __init__(self, reset_peak: bool = False, cuda: bool = False) -> None:
        self.samples: list[tuple[int, int]] = []  # (time_ns, rss bytes)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reset = reset_peak
        self._cuda = cuda
        self.start_rss = 0
        self.kernel_peak: int | None = None
        self.device_peak: int | None = None

    def start(self) -> MemoryWatch:
        self._hwm_reset = self._reset and _reset_high_water_mark()
        if self._cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
        self.start_rss = rss_bytes()
        self.samples.append((time.time_ns(), self.start_rss))
        self._thread = threading.Thread(target=self._run, name="ckptprof-memory", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.samples.append((time.time_ns(), rss_bytes()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.samples.append((time.time_ns(), rss_bytes()))
        if self._hwm_reset:
            self.kernel_peak = _high_water_mark()
        if self._cuda:
            import torch

            self.device_peak = int(torch.cuda.max_memory_allocated())

    @property
    def peak(self) -> int:
        sampled = max(rss for _, rss in self.samples)
        return max(sampled, self.kernel_peak or 0)

    def peak_within(self, intervals: list[tuple[int, int]]) -> int | None:
        """The largest sample inside any of ``intervals`` (None when none fell inside)."""
        inside = [r for t, r in self.samples if any(s <= t <= e for s, e in intervals)]
        return max(inside) if inside else None

    def record(self, op) -> None:
        """Put the peaks on the operation's spans (before it finishes)."""
        attrs = {PEAK_RSS: self.peak, START_RSS: self.start_rss}
        if self.device_peak is not None:
            attrs["ckpt.memory.device_peak_bytes"] = self.device_peak
        op.set_attributes(attrs)
        for name, stats in op.phase_stats().items():
            peak = self.peak_within(stats.intervals)
            if peak is not None:
                op.set_phase_attributes(name, **{PEAK_RSS: peak})


__all__ = ["MemoryWatch", "PEAK_RSS", "START_RSS", "rss_bytes"]
