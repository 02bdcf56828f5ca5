"""Storage backends behind one interface; picked from the location by :mod:`.registry`."""

from __future__ import annotations

from ckptprof.storage.base import CacheState, ObjectInfo, RequestStats, Storage
from ckptprof.storage.posix import PosixStorage
from ckptprof.storage.registry import is_object_store, is_path, open_storage

__all__ = [
    "CacheState",
    "ObjectInfo",
    "PosixStorage",
    "RequestStats",
    "Storage",
    "is_object_store",
    "is_path",
    "open_storage",
]
