"""Local disk and any POSIX mount (NVMe, EBS, EFS, FSx, 3FS …)."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ckptprof.storage import pagecache
from ckptprof.storage.base import CacheState, ObjectInfo, Storage


def mount_of(path: Path) -> dict[str, str]:
    """Filesystem type and mount options of the mount holding ``path`` (/proc/mounts)."""
    best: tuple[str, str, str, str] | None = None
    target = str(path.resolve())
    try:
        with open("/proc/mounts") as handle:
            for line in handle:
                device, mnt, fstype, opts = line.split()[:4]
                mnt = mnt.replace("\\040", " ")
                inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
                if inside and (best is None or len(mnt) > len(best[1])):
                    best = (device, mnt, fstype, opts)
    except OSError:
        return {}
    if best is None:
        return {}
    return {
        "storage.device": best[0],
        "storage.mount_point": best[1],
        "storage.fs_type": best[2],
        "storage.mount_options": best[3],
    }


DIRECT_ALIGN = 4096


class PosixStorage(Storage):
    kind = "posix"
    has_local_cache = True

    def __init__(self, location: str, direct_io: bool = False) -> None:
        super().__init__(location)
        self.root = Path(location).expanduser()
        #: read with O_DIRECT (no page cache); switched off if the filesystem refuses it
        self.direct_io = direct_io

    @property
    def uri(self) -> str:
        return str(self.root.resolve())

    def _full(self, path: str) -> Path:
        return self.root / path

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = self._full(prefix) if prefix else self.root
        if not base.exists():
            raise FileNotFoundError(str(base))
        if not base.is_dir():
            raise NotADirectoryError(str(base))
        infos = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                full = Path(dirpath) / name
                rel = full.relative_to(self.root).as_posix()
                infos.append(ObjectInfo(rel, full.stat().st_size))
        self.stats.count(requests=1)
        return sorted(infos, key=lambda i: i.path)

    def location_exists(self) -> bool:
        return self.root.is_dir()

    def stat(self, path: str) -> ObjectInfo:
        try:
            return ObjectInfo(path, self._full(path).stat().st_size)
        except FileNotFoundError:
            raise FileNotFoundError(str(self._full(path))) from None

    def read_into(self, path: str, offset: int, buffer: memoryview) -> None:
        full = self._full(path)
        want = len(buffer)
        # O_DIRECT moves whole blocks into block-aligned memory: the aligned head of the
        # range that way, any tail (end of file) through the page cache
        direct = self.direct_io and offset % DIRECT_ALIGN == 0 and want >= DIRECT_ALIGN
        head = want - want % DIRECT_ALIGN if direct else 0
        if head:  # what O_DIRECT could not take (unaligned memory, no support) goes buffered
            head = self._read_range(full, offset, buffer[:head], os.O_DIRECT)
        if head < want:
            self._read_range(full, offset + head, buffer[head:], 0)
        self.stats.count(requests=1)

    def _read_range(self, full: Path, offset: int, buffer: memoryview, flags: int) -> int:
        try:
            fd = os.open(full, os.O_RDONLY | flags)
        except FileNotFoundError:
            raise FileNotFoundError(str(full)) from None
        except OSError as exc:
            if flags and exc.errno == errno.EINVAL:  # e.g. tmpfs: no O_DIRECT
                self.direct_io = False
                return 0
            raise
        try:
            done, want = 0, len(buffer)
            while done < want:
                try:
                    n = os.preadv(fd, [buffer[done:]], offset + done)  # releases the GIL
                except OSError as exc:
                    if flags and exc.errno == errno.EINVAL:  # memory not block-aligned
                        return done
                    raise
                if n == 0:
                    raise EOFError(
                        f"{full}: expected {offset + want} bytes, file ends at {offset + done}"
                    )
                done += n
        finally:
            os.close(fd)
        return done

    @contextmanager
    def staging_file(self, path: str) -> Iterator[Path]:
        final = self._full(path)
        final.parent.mkdir(parents=True, exist_ok=True)
        partial = final.with_name(final.name + ".partial")
        try:
            yield partial
            fd = os.open(partial, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(partial, final)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise

    def write_bytes(self, path: str, data: bytes) -> None:
        with self.staging_file(path) as tmp:
            tmp.write_bytes(data)
        _fsync_dir(self._full(path).parent)

    def delete(self, path: str) -> None:
        self._full(path).unlink(missing_ok=True)

    def free_bytes(self) -> int | None:
        probe = self.root
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        return shutil.disk_usage(probe).free

    def evict(self, paths: list[str]) -> CacheState:
        full = [self._full(p) for p in paths]
        pagecache.evict(full)
        return CacheState("posix_fadvise(DONTNEED) per file", pagecache.resident_fraction(full))

    def warm(self, paths: list[str]) -> CacheState:
        full = [self._full(p) for p in paths]
        pagecache.warm(full)
        return CacheState("read every byte", pagecache.resident_fraction(full))

    def resident_fraction(self, paths: list[str]) -> float:
        return pagecache.resident_fraction([self._full(p) for p in paths])

    def describe(self) -> dict[str, str]:
        info = super().describe()
        info.update(mount_of(self.root if self.root.exists() else self.root.parent))
        return info


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
