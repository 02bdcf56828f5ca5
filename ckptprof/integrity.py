"""A checkpoint file's own integrity data, for files no ckptprof manifest describes.

Checks what each format carries about itself, reading as little as it can:

* ``torch.save`` (zip): the end-of-central-directory record and the central directory
  (every member must end before it: a truncated file has lost its tail); ``deep`` adds
  every member's CRC-32 (reads the whole file). A file the caller knows ``torch.load``
  reads must be such a zip, or a legacy pickle opening with torch's magic number.
* safetensors: the header length and JSON header; the largest tensor end must fit the file.
* DCP (a folder with ``.metadata``): every ``.distcp`` file must hold the byte ranges the
  metadata says it holds.
* JSON (trainer state, indexes): it must parse.

Other formats carry nothing to check; :func:`check` says so rather than guessing.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile
from dataclasses import dataclass

ZIP_MAGIC = b"PK\x03\x04"


@dataclass(frozen=True)
class Integrity:
    """What was checked (``method``) and what is wrong (``problem``, None when nothing)."""

    method: str
    problem: str | None = None
    checked_bytes: int = 0


def check(path: str, deep: bool = False, torch_save: bool = False) -> Integrity:
    """Check ``path`` (a file, or a DCP folder) against its format's own integrity data;
    ``torch_save``: ``torch.load`` reads it (its framework says so), so bytes that are no
    ``torch.save`` file are a problem, not a format without integrity data."""
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, ".metadata")):
            return _dcp(path)
        return Integrity("none (a folder without DCP metadata)")
    with open(path, "rb") as handle:
        head = handle.read(8)
    if head[:4] == ZIP_MAGIC:
        return _zip(path, deep)
    if torch_save:
        return _legacy_torch_save(path)
    if path.endswith(".safetensors"):
        return _safetensors(path, head)
    if path.endswith(".json"):
        return _json(path)
    return Integrity("none (the format carries no integrity data)")


def _zip(path: str, deep: bool) -> Integrity:
    method = "zip crc32" if deep else "zip central directory"
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            directory_start = archive.start_dir
            for info in members:
                if info.header_offset + info.compress_size > directory_start:
                    return Integrity(method, f"member {info.filename} runs past the zip directory")
            if not deep:
                return Integrity(method)
            broken = archive.testzip()
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        return Integrity(method, f"not a complete zip archive ({exc}): truncated or overwritten")
    if broken is not None:
        return Integrity(method, f"member {broken} fails its CRC-32: the bytes are corrupt")
    return Integrity(method, None, os.path.getsize(path))


LEGACY_METHOD = "torch.save legacy magic"
LEGACY_HEAD = 64  # bytes: the magic number's pickle, in any protocol, fits


class _PlainData(pickle.Unpickler):
    """Unpickles plain data only: a checkpoint's bytes never run code while checked."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"{module}.{name}: not the legacy magic number")


def _legacy_torch_save(path: str) -> Integrity:
    """A ``torch.save`` file that is no zip: the legacy format opens with a pickled magic
    number (anything else fails ``torch.load`` too)."""
    from torch.serialization import MAGIC_NUMBER

    with open(path, "rb") as handle:
        head = handle.read(LEGACY_HEAD)
    try:
        magic = _PlainData(io.BytesIO(head)).load()
    except Exception:  # noqa: BLE001 - any bytes that do not unpickle are the finding
        magic = None
    if magic == MAGIC_NUMBER:
        return Integrity(LEGACY_METHOD)
    size = os.path.getsize(path)
    return Integrity(
        LEGACY_METHOD,
        f"{size} bytes, neither a zip archive nor a legacy torch.save pickle: "
        "truncated or overwritten",
    )


def _safetensors(path: str, head: bytes) -> Integrity:
    method = "safetensors header"
    size = os.path.getsize(path)
    if len(head) < 8:
        return Integrity(method, f"{size} bytes: too short for a safetensors header")
    (header_len,) = struct.unpack("<Q", head)
    if 8 + header_len > size:
        return Integrity(method, f"header says {header_len} bytes; the file has {size}: truncated")
    try:
        with open(path, "rb") as handle:
            handle.seek(8)
            header = json.loads(handle.read(header_len))
        ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        return Integrity(method, f"unreadable header ({exc})")
    need = 8 + header_len + max(ends, default=0)
    if size < need:
        return Integrity(method, f"tensors need {need} bytes; the file has {size}: truncated")
    return Integrity(method)


def _json(path: str) -> Integrity:
    try:
        with open(path, "rb") as handle:
            json.load(handle)
    except ValueError as exc:
        return Integrity("json", f"not valid JSON ({exc}): truncated or overwritten")
    return Integrity("json")


def _dcp(folder: str) -> Integrity:
    try:
        from torch.distributed.checkpoint import FileSystemReader

        storage_data = FileSystemReader(folder).read_metadata().storage_data or {}
    except Exception as exc:  # noqa: BLE001 - any unreadable metadata is the finding
        return Integrity(DCP_METHOD, f".metadata is unreadable ({type(exc).__name__}: {exc})")
    return check_dcp(folder, storage_data)


DCP_METHOD = "dcp metadata"


def check_dcp(folder: str, storage_data: dict) -> Integrity:
    """A DCP folder's data files against the byte ranges its metadata's ``storage_data``
    (already read) says they hold."""
    method = DCP_METHOD
    need: dict[str, int] = {}
    for info in storage_data.values():
        end = info.offset + info.length
        need[info.relative_path] = max(need.get(info.relative_path, 0), end)
    for name, end in sorted(need.items()):
        try:
            size = os.path.getsize(os.path.join(folder, name))
        except FileNotFoundError:
            return Integrity(method, f"{name} is missing")
        if size < end:
            return Integrity(method, f"{name} has {size} bytes; the metadata needs {end}")
    return Integrity(method)


__all__ = ["Integrity", "check", "check_dcp"]
