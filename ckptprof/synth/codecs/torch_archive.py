"""The ``torch.save`` archive codec: writing real archives without holding their tensors
in memory, serializing real ones without copying their tensors, and loading fetched ones
in place.

``torch.serialization.skip_data`` writes the archive (pickle, records, zip
directory) around fake tensors and leaves each storage's bytes as a hole; we
then fill the holes with random bytes and patch each record's CRC-32 in the
zip headers, so the result is byte-for-byte a valid torch.save file.
:func:`torch_save_segments` runs the real ``torch.save`` into a sink that keeps each
tensor record as a view of the tensor's own memory (the zip writer hands it the
storage's pointer), so the archive is its small parts plus views: the same bytes.
"""

from __future__ import annotations

import io
import os
import struct
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ckptprof.io.reader import RangeReader
from ckptprof.io.sparse import INDEX_BLOCK
from ckptprof.synth.codecs.base import Codec
from ckptprof.synth.fill import RandomFiller

if TYPE_CHECKING:
    from ckptprof.io.buffers import HostBuffer


def fake_tensor(shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return torch.empty(shape, dtype=getattr(torch, dtype))


def load_fetched(buffer: HostBuffer) -> Any:
    """``torch.load(path, mmap=True, weights_only=True)`` of fetched bytes, in place.

    The bytes are in memory with no path (fetch holds no file descriptor per file), and
    torch.load maps only paths, so this takes torch.load's own mmap steps on the buffer:
    its zip reader, its weights-only unpickler, and one storage over the whole archive
    that every tensor is a slice of (no copy, as with mmap). Private torch API, stable
    since mmap loading arrived (2.1); tests check the tensors alias the buffer.
    """
    from torch import serialization

    whole = torch.frombuffer(buffer.view, dtype=torch.uint8).untyped_storage()
    with serialization._open_zipfile_reader(buffer.reader()) as archive:
        return serialization._load(
            archive, "cpu", serialization._weights_only_unpickler, overall_storage=whole
        )


class _FileRange(RangeReader):
    """A read-only view of ``[start, end)`` of an open file, for the zip readers."""

    def __init__(self, fd: int, start: int, end: int) -> None:
        super().__init__(end - start)
        self._fd, self._start = fd, start

    def read_at(self, offset: int, into: memoryview) -> int:
        data = os.pread(self._fd, len(into), self._start + offset)
        into[: len(data)] = data
        return len(data)


def write_torch_save(
    path: Path, obj: Mapping[str, Any] | Any, filler: RandomFiller, append: bool = False
) -> tuple[int, int]:
    """torch.save ``obj`` (fake tensors inside) to ``path`` and fill its storages.

    Returns the (start, end) byte range of the archive in the file; with
    ``append`` the archive goes after the file's current end (DCP items).
    """
    # not "ab": append mode ignores the seeks skip_data uses to leave holes
    if not append or not os.path.exists(path):
        open(path, "wb").close()
    with open(path, "r+b") as handle:
        start = handle.seek(0, os.SEEK_END)
        with torch.serialization.skip_data(materialize_fake_tensors=True):
            torch.save(obj, handle)
        handle.flush()
        end = handle.tell()
    fd = os.open(path, os.O_RDWR)
    try:
        window = _FileRange(fd, start, end)
        with zipfile.ZipFile(window) as archive:
            infos = archive.infolist()
            start_dir = archive.start_dir
        reader = torch._C.PyTorchFileReader(_FileRange(fd, start, end))
        crcs = {}
        for info in infos:
            record = info.filename.split("/", 1)[1]
            if record.startswith("data/") and info.file_size:
                offset = start + reader.get_record_offset(record)
                crcs[info.filename] = filler.fill_fd(fd, offset, info.file_size, crc=True)
        _patch_crcs(fd, start, start_dir, infos, crcs)
    finally:
        os.close(fd)
    return start, end


def _patch_crcs(fd: int, start: int, start_dir: int, infos, crcs: dict[str, int]) -> None:
    """Write the real CRC-32 of filled records into local and central zip headers."""
    pos = start + start_dir
    for info in infos:
        header = os.pread(fd, 46, pos)
        if header[:4] != b"PK\x01\x02":
            raise ValueError("unexpected zip central directory layout")
        name_len, extra_len, comment_len = struct.unpack("<HHH", header[28:34])
        crc = crcs.get(info.filename)
        if crc is not None:
            packed = struct.pack("<I", crc)
            os.pwrite(fd, packed, pos + 16)
            os.pwrite(fd, packed, start + info.header_offset + 14)
        pos += 46 + name_len + extra_len + comment_len


# one zip local header: at least the sparse reader's read-ahead, so reading a header stays
# inside its hint
ZIP_HEADER_BLOCK = INDEX_BLOCK
ZIP_TAIL = 64 << 10  # where a zip archive's end record and (mostly) its directory are


def zip_hints(sparse) -> list[tuple[int, int]]:
    """Where a ``torch.save`` archive's loader will read: its directory says where each
    record's local header is (``torch.load`` reads every one of them)."""
    sparse.ensure(max(0, sparse.size - ZIP_TAIL), ZIP_TAIL)
    with zipfile.ZipFile(sparse.reader()) as archive:
        infos = archive.infolist()
    # every record's local header, and the whole of the records that are not tensor data
    # (the pickle, the version and byte-order records)
    return [
        (i.header_offset, ZIP_HEADER_BLOCK + (0 if "/data/" in i.filename else i.compress_size))
        for i in infos
    ]


class _SegmentSink(io.RawIOBase):
    """What ``torch.save`` writes, as segments: copies of the small writes (headers, the
    pickle, the directory) and, for a write that is exactly a known tensor's storage, a
    view of that tensor instead of a copy; each handed to ``emit`` once final (kept in
    ``segments`` without one)."""

    def __init__(self, tensors, emit: Callable[[Any], object] | None = None) -> None:
        import numpy as np

        self._np = np
        self.segments: list = []
        self.emit = emit or self.segments.append
        self.storages = {}
        for tensor in tensors:
            storage = tensor.untyped_storage()
            whole = tensor.is_contiguous() and tensor.storage_offset() == 0
            if whole and tensor.numel() * tensor.element_size() == storage.nbytes():
                self.storages[storage.data_ptr()] = tensor
        self.small = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data)
        if view.nbytes >= 4096 and self.storages:
            tensor = self.storages.get(self._np.frombuffer(view, dtype=self._np.uint8).ctypes.data)
            if tensor is not None and tensor.untyped_storage().nbytes() == view.nbytes:
                self._flush_small()
                self.emit(tensor.reshape(-1).view(torch.uint8).numpy())
                return view.nbytes
        self.small += view
        return view.nbytes

    def _flush_small(self) -> None:
        if self.small:
            self.emit(bytes(self.small))
            self.small = bytearray()

    def done(self) -> list:
        self._flush_small()
        return self.segments


class _Measure(io.RawIOBase):
    """A seekable sink that keeps no bytes, only how far the writes reach."""

    def __init__(self) -> None:
        self.pos = self.end = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        self.pos += n
        self.end = max(self.end, self.pos)
        return n

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.end}[whence]
        self.pos = base + offset
        self.end = max(self.end, self.pos)
        return self.pos

    def tell(self) -> int:
        return self.pos


def torch_save_segments(obj: Any, tensors) -> list:
    """``torch.save(obj)``'s bytes as segments in order, ``tensors``' records as views of
    their memory (nothing copied; the zip writer's CRC-32 is the only pass over them)."""
    sink = _SegmentSink(tensors)
    torch.save(obj, sink)
    return sink.done()


class TorchArchive(Codec):
    """A ``torch.save`` zip archive: a job's ``.pt`` files, Lightning's ``.ckpt``,
    DeepSpeed's model and optimizer states, the Trainer's ``optimizer.pt``."""

    name = "torch"

    def generate(self, dest: Path, obj: Any, filler: RandomFiller) -> dict:
        write_torch_save(dest, obj, filler)
        return {}

    def save(self, dest: Path, obj: Any) -> None:
        with open(dest, "wb") as handle:
            torch.save(obj, handle)

    def serialize(self, obj: Any, tensors: list) -> list:
        return torch_save_segments(obj, tensors)

    def serialized_size(self, obj: Any) -> int:
        """The archive laid out with its tensors' bytes skipped (a few ms, nothing kept):
        the zip writer records their sizes and seeks past them, so its end is the
        archive's."""
        measure = _Measure()
        with torch.serialization.skip_data():
            torch.save(obj, measure)
        return measure.end

    def serialize_into(self, obj: Any, tensors: list, emit: Callable[[Any], object]) -> None:
        """Each record handed on once the zip writer has made it (its CRC-32 taken): the
        records before it are written while the next ones are checksummed."""
        sink = _SegmentSink(tensors, emit)
        torch.save(obj, sink)
        sink.done()

    def read(self, buffer: HostBuffer) -> Any:
        return load_fetched(buffer)

    def load(self, path: str) -> Any:
        """``torch.load(mmap=True)``: the pages are read as the tensors are used."""
        return torch.load(path, mmap=True, weights_only=True)

    def index_hints(self, sparse) -> list[tuple[int, int]]:
        return zip_hints(sparse)
