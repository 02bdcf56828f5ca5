"""Storage backends by location scheme: the one place that reads a location's scheme.

A location without ``scheme://`` is a local or mounted path (POSIX); every other scheme
names its backend here, imported only when used (fsspec's registry is the model). Code
elsewhere asks a backend for what it can do (:class:`~ckptprof.storage.base.Storage`'s
capabilities), never for its scheme.
"""

from __future__ import annotations

import importlib

from ckptprof.errors import CkptprofError
from ckptprof.storage.base import Storage

#: scheme → "module:Class"; a backend imports its client library only when opened
SCHEMES: dict[str, str] = {"s3": "ckptprof.storage.s3:S3Storage"}
POSIX = "ckptprof.storage.posix:PosixStorage"


def scheme_of(location: str) -> str | None:
    """``s3`` for ``s3://bucket/prefix``; None for a local or mounted path."""
    scheme, sep, _ = location.partition("://")
    return scheme if sep else None


def storage_class(location: str) -> type[Storage]:
    """The backend that serves ``location``; an unknown scheme is one line naming the known."""
    scheme = scheme_of(location)
    target = POSIX if scheme is None else SCHEMES.get(scheme)
    if target is None:
        known = ", ".join(f"{s}://bucket/prefix" for s in sorted(SCHEMES))
        raise CkptprofError(
            f"{scheme}:// locations are not supported; use a local or mounted path, or "
            f"{known} (presigned URLs are not accepted)."
        )
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def is_path(location: str) -> bool:
    """Whether ``location`` is a local or mounted path, opened as files."""
    return scheme_of(location) is None


def is_object_store(location: str) -> bool:
    """Whether ``location``'s backend is an object store (requests, multipart uploads)."""
    return storage_class(location).object_store


def open_storage(location: str, max_concurrency: int = 64, direct_io: bool = False) -> Storage:
    """The backend for ``location``, opened: ``s3://bucket/prefix`` → S3 (boto3, imported
    lazily); a path → POSIX."""
    cls = storage_class(location)
    if direct_io and not cls.files_by_path:
        raise CkptprofError(
            f"--direct-io applies to local or mounted paths only, not {scheme_of(location)}://"
            " locations."
        )
    if cls.files_by_path:
        return cls(location, direct_io=direct_io)
    return cls(location, max_concurrency=max_concurrency)
