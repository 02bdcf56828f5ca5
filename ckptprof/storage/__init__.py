"""Storage backends behind one interface; picked from the location."""

from __future__ import annotations

from ckptprof.storage.base import CacheState, ObjectInfo, RequestStats, Storage
from ckptprof.storage.posix import PosixStorage


def open_storage(location: str) -> Storage:
    """``s3://bucket/prefix`` → the S3 backend; anything else → a POSIX path."""
    if location.startswith("s3://"):
        from ckptprof.errors import CkptprofError

        raise CkptprofError(
            f"{location}: the s3:// backend is not available in this version; "
            "use a local or mounted path."
        )
    return PosixStorage(location)


__all__ = ["CacheState", "ObjectInfo", "PosixStorage", "RequestStats", "Storage", "open_storage"]
