"""Storage backends behind one interface; picked from the location."""

from __future__ import annotations

from ckptprof.storage.base import CacheState, ObjectInfo, RequestStats, Storage
from ckptprof.storage.posix import PosixStorage


def open_storage(location: str, max_concurrency: int = 64, direct_io: bool = False) -> Storage:
    """``s3://bucket/prefix`` → the S3 backend (boto3, imported lazily); else a POSIX path."""
    if location.startswith("s3://") and direct_io:
        from ckptprof.errors import CkptprofError

        raise CkptprofError("--direct-io applies to POSIX paths only, not s3:// locations.")
    if location.startswith("s3://"):
        from ckptprof.storage.s3 import S3Storage

        return S3Storage(location, max_concurrency=max_concurrency)
    if "://" in location:
        from ckptprof.errors import CkptprofError

        scheme = location.split("://", 1)[0]
        raise CkptprofError(
            f"{scheme}:// locations are not supported; use a local or mounted path, or "
            "s3://bucket/prefix (presigned URLs are not accepted)."
        )
    return PosixStorage(location, direct_io=direct_io)


__all__ = ["CacheState", "ObjectInfo", "PosixStorage", "RequestStats", "Storage", "open_storage"]
