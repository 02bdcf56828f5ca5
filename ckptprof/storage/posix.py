"""Local disk and any POSIX mount (NVMe, EBS, EFS, FSx, 3FS …)."""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ckptprof import activity
from ckptprof.atomic import atomic_write, named, partial_path, replacing
from ckptprof.errors import CkptprofError
from ckptprof.preflight import OutputClaim
from ckptprof.schema import is_relative_path
from ckptprof.storage import pagecache
from ckptprof.storage.base import (
    DIRECT_ALIGN,
    CacheState,
    ObjectInfo,
    Part,
    Storage,
    whole_blocks,
)


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


#: filesystems whose files live in memory: there is no colder place to evict them to
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})


class PosixStorage(Storage):
    kind = "posix"
    has_local_cache = True
    files_by_path = True

    def __init__(self, location: str, direct_io: bool = False) -> None:
        super().__init__(location)
        self.root = Path(location).expanduser()
        #: read with O_DIRECT (no page cache); switched off if the filesystem refuses it
        self.direct_io = direct_io

    @property
    def mappable(self) -> bool:
        return not self.direct_io

    @property
    def uri(self) -> str:
        return str(self.root.resolve())

    def _full(self, path: str) -> Path:
        """``path`` under the root; a path that climbs out of it is refused."""
        if not is_relative_path(path):
            raise CkptprofError(
                f"{path!r} is not a path inside {self.uri}; ckptprof only touches files there."
            )
        return self.root / path

    def _writable(self, path: str) -> Path:
        """Where to write or delete ``path``: inside the root even after following any
        symbolic link in its folders, or refused (nothing outside is ever changed)."""
        full = self._full(path)
        folder, root = full.parent.resolve(), self.root.resolve()
        if folder != root and not folder.is_relative_to(root):
            raise CkptprofError(
                f"{full}: its folder leads to {folder}, outside {root} (a symbolic link); "
                "ckptprof writes and deletes only inside the location it was given."
            )
        return full

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every entry under the root that is not a folder: files, and symbolic links
        (dangling ones and links to folders included, so a tree holding only those is
        not "empty"). An unreadable folder is an error, not a silent gap."""
        base = self._full(prefix) if prefix else self.root
        if not base.exists():
            raise FileNotFoundError(str(base))
        if not base.is_dir():
            raise NotADirectoryError(str(base))
        infos = []
        for dirpath, dirs, files in os.walk(base, onerror=_raise):
            top = Path(dirpath)
            linked = [d for d in dirs if (top / d).is_symlink()]  # listed, never walked into
            for name in files + linked:
                full = top / name
                size = _entry_size(full)
                if size is not None:
                    infos.append(ObjectInfo(full.relative_to(self.root).as_posix(), size))
        self.stats.count(requests=1)
        return sorted(infos, key=lambda i: i.path)

    def location_exists(self) -> bool:
        return self.root.is_dir()

    def memory_filesystem(self) -> str | None:
        """The filesystem type when it keeps its files in memory (tmpfs, ramfs), else None."""
        fs_type = mount_of(self._nearest_existing()).get("storage.fs_type")
        return fs_type if fs_type in MEMORY_FILESYSTEMS else None

    def stat(self, path: str) -> ObjectInfo:
        try:
            return ObjectInfo(path, self._full(path).stat().st_size)
        except FileNotFoundError:
            raise FileNotFoundError(str(self._full(path))) from None

    def read_into(self, path: str, offset: int, buffer: memoryview) -> None:
        full = self._full(path)
        with activity.request(str(full), len(buffer)):  # what the stall watchdog sees
            self._read_into(full, offset, buffer)

    def _read_into(self, full: Path, offset: int, buffer: memoryview) -> None:
        started = time.perf_counter()
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
        self.stats.observe(str(full), time.perf_counter() - started)

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

    def claim(self) -> OutputClaim:
        self.root.mkdir(parents=True, exist_ok=True)
        return OutputClaim(self.root, "DEST", "a checkpoint")

    def writer(self) -> str | None:
        from ckptprof.preflight import lock_holder

        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return None
        try:
            return lock_holder(fd)
        finally:
            os.close(fd)

    @contextmanager
    def staging_file(self, path: str) -> Iterator[Path]:
        final = self._writable(path)
        final.parent.mkdir(parents=True, exist_ok=True)
        with replacing(final) as tmp:
            yield tmp

    def open_writer(self, path: str, size: int, part_size: int) -> PosixFileWriter:
        final = self._writable(path)
        final.parent.mkdir(parents=True, exist_ok=True)
        writer = PosixFileWriter(final, size, direct=self.direct_io)
        self.direct_io = writer.direct  # refused here once: buffered from now on, as reads
        return writer

    def write_bytes(self, path: str, data: bytes) -> None:
        final = self._writable(path)
        final.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(final, data)

    def delete(self, path: str) -> None:
        self._writable(path).unlink(missing_ok=True)

    def check_writable(self, path: str, removing: set[str] = frozenset()) -> None:
        full = self._writable(path)
        rel = Path(path)
        for folder in reversed(rel.parents[:-1]):  # a file where a folder must go
            there = self.root / folder
            if there.exists() and not there.is_dir() and folder.as_posix() not in removing:
                raise CkptprofError(
                    f"{there}: is a file where the checkpoint needs a folder; remove it, "
                    "or choose an empty location."
                )
        if full.is_symlink() and path not in removing:
            target = full.resolve()
            if not target.is_relative_to(self.root.resolve()):
                raise CkptprofError(
                    f"{full}: is a link to {target}, outside {self.uri}; ckptprof writes "
                    "only inside the location it was given. Remove the link."
                )
        if full.is_dir() and not full.is_symlink():
            raise CkptprofError(
                f"{full}: is a folder where the checkpoint writes a file; remove it, or "
                "choose an empty location."
            )

    def _nearest_existing(self) -> Path:
        """The root, or its nearest folder that exists (where it will be created)."""
        probe = self.root
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        return probe

    def free_bytes(self) -> int | None:
        return shutil.disk_usage(self._nearest_existing()).free

    def free_inodes(self) -> int | None:
        stats = os.statvfs(self._nearest_existing())
        return stats.f_favail if stats.f_files else None  # 0 total: not counted (btrfs)

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


IOV_MAX = 1024  # buffers one pwritev takes (Linux's limit)


class PosixFileWriter:
    """A file written at offsets by many threads (``pwritev``) under a temporary name,
    renamed into place on commit. With ``direct`` it is opened ``O_DIRECT`` (no page
    cache) where the filesystem takes it, and written from staged, aligned buffers
    (:meth:`write_staged`); where it refuses, the writer falls back to buffered writes."""

    def __init__(self, final: Path, size: int, direct: bool = False) -> None:
        self.final, self.partial = final, partial_path(final)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        self.direct = direct
        if direct:
            try:
                self.fd = os.open(self.partial, flags | os.O_DIRECT, 0o644)
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # e.g. tmpfs: no O_DIRECT; anything else is real
                    raise
                self.direct = False
        if not self.direct:
            self.fd = os.open(self.partial, flags, 0o644)
        self.size = size
        self._trimmed = not self.direct

    def write_part(self, part: Part) -> None:
        with activity.request(str(self.final), part.size):  # what the stall watchdog sees
            self._pwrite(part)

    def write_staged(self, buffer: memoryview, offset: int, size: int) -> None:
        """``size`` bytes staged at the start of ``buffer`` (aligned memory of at least
        ``size`` rounded up to the block), written at ``offset`` with O_DIRECT; the
        padding of a short last block is cut off again by :meth:`_trim`."""
        whole = whole_blocks(size)
        with activity.request(str(self.final), size):
            self._pwrite(Part(0, offset, (buffer[:whole],)))

    def _pwrite(self, part: Part) -> None:
        views, offset = list(part.views), part.offset
        try:
            while views:
                n = os.pwritev(self.fd, views[:IOV_MAX], offset)
                offset += n
                while views and n >= views[0].nbytes:  # a short write: resume where it ended
                    n -= views[0].nbytes
                    views.pop(0)
                if views and n:
                    views[0] = views[0][n:]
        except OSError as exc:
            raise named(exc, self.final) from None

    def _trim(self) -> None:
        """Direct writes end on a block boundary: the file cut back to its size."""
        if not self._trimmed:
            os.ftruncate(self.fd, self.size)
            self._trimmed = True

    def sync(self) -> None:
        try:
            self._trim()
            os.fsync(self.fd)
        except OSError as exc:
            raise named(exc, self.final) from None

    def commit(self) -> None:
        self._trim()
        os.close(self.fd)
        self.fd = -1
        os.replace(self.partial, self.final)

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.partial.unlink(missing_ok=True)


def _raise(exc: OSError) -> None:
    raise exc


def _entry_size(path: Path) -> int | None:
    """Size of a listed entry: its target's, or a symbolic link's own when the target is
    missing or loops; None when the entry vanished since it was listed."""
    try:
        return path.stat().st_size
    except OSError:
        try:
            return path.lstat().st_size
        except FileNotFoundError:
            return None
