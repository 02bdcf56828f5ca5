"""What the machine was doing around a benchmark's runs, read from /proc and /sys: CPU
busy and who used it, the block device's counters and queue settings, the price of
fresh memory, a memory balloon. A benchmark on a shared or virtual machine reports them
beside its figures, so a slow run can be told from a slow machine."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

from ckptprof.io.buffers import HostBuffer


def read_first_line(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.readline().strip()
    except OSError:
        return "?"


def cpu_times() -> tuple[int, int, int]:
    """(busy, iowait, total) jiffies over all CPUs, from /proc/stat."""
    fields = [int(x) for x in read_first_line("/proc/stat").split()[1:]]
    idle, iowait = fields[3], fields[4]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return total - idle - iowait, iowait, total


def disk_stats(dev: str | None) -> tuple[int, int, int, int] | None:
    """(reads completed, sectors read, ms spent reading, ms busy) of ``dev``."""
    if not dev:
        return None
    try:
        with open("/proc/diskstats") as handle:
            for line in handle:
                parts = line.split()
                if parts[2] == dev:
                    return int(parts[3]), int(parts[5]), int(parts[6]), int(parts[12])
    except (OSError, IndexError, ValueError):
        return None
    return None


CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu() -> dict[int, tuple[str, int]]:
    """pid -> (name, utime + stime in ticks) of every process now."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as handle:
                data = handle.read()
        except OSError:
            continue
        name = data[data.index("(") + 1 : data.rindex(")")]
        rest = data[data.rindex(")") + 2 :].split()
        out[int(entry.name)] = (name, int(rest[11]) + int(rest[12]))
    return out


def background_load(seconds: float = 1.0) -> dict:
    """CPU busy on the machine over ``seconds`` while this script sleeps, and who used it."""
    cpu0, procs0 = cpu_times(), process_cpu()
    time.sleep(seconds)
    cpu1, procs1 = cpu_times(), process_cpu()
    busy = (cpu1[0] - cpu0[0]) / CLK_TCK / seconds
    top = sorted(
        (
            ((ticks - procs0[pid][1]) / CLK_TCK / seconds, f"{name}[{pid}]")
            for pid, (name, ticks) in procs1.items()
            if pid in procs0 and pid != os.getpid()
        ),
        reverse=True,
    )
    return {"busy_cores": busy, "top": [(who, round(c, 2)) for c, who in top[:3] if c >= 0.05]}


def describe_load(load: dict) -> str:
    who = ", ".join(f"{name} {cores:.2f}" for name, cores in load["top"]) or "nobody"
    return f"{load['busy_cores']:.2f} cores busy while idle (top: {who})"


FRESH_PROBE = 256 << 20


def fresh_memory_gbps(size: int = FRESH_PROBE) -> float:
    """GB/s of one thread writing a new anonymous mapping: the price of fresh memory right now.

    fetch() lands every byte in fresh anonymous pages (a fault and a zeroed page per 4 KiB);
    fio reuses one buffer. On a VM this price moves with the host (the dev VM has shown
    0.6-1.9 GB/s). Runs after each qd group, never between an eviction and a timed run.
    """
    buf = HostBuffer(size, "fio-vs-fetch-memprobe")
    chunk = bytes(4 << 20)
    try:
        t0 = time.perf_counter()
        for offset in range(0, size, len(chunk)):
            buf.view[offset : offset + len(chunk)] = chunk
        return size / (time.perf_counter() - t0) / 1e9
    finally:
        buf.close()


class Probe:
    """CPU and block-device counters around one timed run."""

    def __init__(self, dev: str | None) -> None:
        self.dev = dev

    def __enter__(self) -> Probe:
        self._cpu0 = cpu_times()
        self._disk0 = disk_stats(self.dev)
        self._ru0 = resource.getrusage(resource.RUSAGE_SELF)
        self._ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self._t0
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        self.proc_sys_s = ru1.ru_stime - self._ru0.ru_stime
        self.proc_cpu_s = ru1.ru_utime - self._ru0.ru_utime + self.proc_sys_s
        self.proc_minflt = ru1.ru_minflt - self._ru0.ru_minflt
        cpu1, disk1 = cpu_times(), disk_stats(self.dev)
        busy, iowait, total = (b - a for a, b in zip(self._cpu0, cpu1, strict=True))
        self.cpu_busy = busy / total if total else None
        self.cpu_iowait = iowait / total if total else None
        # CPU not charged to this script or its fio child: other processes, kernel threads
        ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        own = (
            self.proc_cpu_s
            + (ch1.ru_utime - self._ch0.ru_utime)
            + (ch1.ru_stime - self._ch0.ru_stime)
        )
        self.other_cores = max(0.0, busy / CLK_TCK - own) / self.wall if self.wall else None
        if self._disk0 and disk1:
            self.dev_reads, sectors, self.dev_read_ms, self.dev_busy_ms = (
                b - a for a, b in zip(self._disk0, disk1, strict=True)
            )
            self.dev_bytes = sectors * 512
        else:
            self.dev_reads = self.dev_bytes = self.dev_read_ms = self.dev_busy_ms = None


def block_device(mount: dict[str, str]) -> str | None:
    """Kernel name of the block device under the mount (``vda``), when there is one."""
    device = mount.get("storage.device", "")
    if not device.startswith("/dev/"):
        return None
    try:
        name = Path(os.path.realpath(device)).name
    except OSError:
        return None
    return name if Path("/sys/class/block", name).exists() else None


def queue_settings(dev: str | None) -> dict[str, str]:
    if not dev:
        return {}
    sysdir = Path("/sys/class/block", dev)
    if not (sysdir / "queue").exists() and (sysdir / "partition").exists():
        sysdir = sysdir.resolve().parent  # a partition: the queue is the disk's
    out = {}
    for key in ("read_ahead_kb", "max_sectors_kb", "nr_requests", "scheduler", "rotational"):
        out[key] = read_first_line(str(sysdir / "queue" / key))
    return out


def balloon_page_reporting() -> str:
    """Whether a virtio balloon with free page reporting is present (bit 5 of features).

    With it, memory the guest frees is handed back to the host, and the next first touch
    of that memory costs a host-side fault: fresh memory is slow, which ckptprof's
    fetch pays for and fio (one reused buffer, no page cache) does not.
    """
    for dev in Path("/sys/bus/virtio/devices").glob("*"):
        if read_first_line(str(dev / "device")) == "0x0005":
            features = read_first_line(str(dev / "features"))
            on = len(features) > 5 and features[5] == "1"
            return "virtio-balloon, free page reporting " + ("ON" if on else "off")
    return "no virtio balloon"
