"""S3 and S3-compatible stores (MinIO, Ceph, SeaweedFS …) as a :class:`Storage`:
objects named under an ``s3://bucket/prefix`` location, read with ranged GETs straight
into the caller's buffers, written whole or part by part.

The client is boto3's, set up in :mod:`ckptprof.storage.s3_client` (its timeouts bound
every wait, so an endpoint that stops answering names itself and stops a sweep instead
of stalling every run). Every attempt (request) and every failed one (5xx, throttling,
timeouts, connection errors) is counted in :attr:`Storage.stats`, and every retry as it
starts, whether or not the call finally succeeds. Nothing that identifies a credential
is ever put in a span, log or result.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ckptprof import activity
from ckptprof.errors import CkptprofError, StorageError
from ckptprof.storage import multipart
from ckptprof.storage.base import DEFAULT_PART_SIZE, CacheState, ObjectInfo, Storage
from ckptprof.storage.s3_client import new_client, safe_endpoint
from ckptprof.storage.s3_errors import stalled, translate
from ckptprof.storage.s3_writer import S3FileWriter

log = logging.getLogger("ckptprof")


def split_s3_uri(location: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` → (``bucket``, ``a/b/``); the prefix always ends in ``/`` if set.

    The key is kept whole (``#`` is a key character, not a URL fragment); a ``?`` is
    refused, since what follows it is a query string (a presigned URL's signature, often)
    that no S3 location takes and that must never be printed or traced.
    """
    bucket, _, key = location.removeprefix("s3://").partition("/")
    if not location.startswith("s3://") or not bucket or "?" in bucket:
        raise CkptprofError(
            f"{location.split('?')[0]!r} is not an S3 location; expected s3://bucket/prefix."
        )
    if "?" in key:
        raise CkptprofError(
            f"s3://{bucket}/{key.split('?')[0]}?…: an S3 location takes no query string "
            "(presigned URLs are not accepted); give s3://bucket/prefix."
        )
    prefix = key.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def _direct_readinto(body):
    """The fastest way to fill a caller's buffer from a GET body.

    botocore's ``StreamingBody.readinto`` goes through urllib3, whose ``readinto``
    reads into a new bytes object and copies it; the ``http.client`` response under it
    receives straight into the buffer (measured here: +15-20% GB/s on loopback).
    botocore never decodes Content-Encoding, so both see the same bytes; the caller
    checks the length. Falls back to the public method when the layout differs.
    """
    raw = getattr(body, "_raw_stream", None)
    fp = getattr(raw, "_fp", None)
    if fp is not None and callable(getattr(fp, "readinto", None)):
        return fp.readinto
    return body.readinto


def _release(body) -> None:
    """Hand a fully read connection back to urllib3's pool (the direct read bypassed it)."""
    raw = getattr(body, "_raw_stream", None)
    with contextlib.suppress(Exception):
        raw.release_conn()


def _check_range(resp: dict, offset: int, where: str) -> None:
    """A server that ignores Range returns the whole object: refuse, don't misplace bytes."""
    content_range = resp.get("ContentRange") or ""
    if not content_range.startswith(f"bytes {offset}-"):
        raise StorageError(
            f"{where}: asked for bytes from {offset} but the server answered "
            f"{content_range or 'without a Content-Range'}; the endpoint does not honour "
            "ranged GETs."
        )


def _counted(exc: Exception) -> bool:
    """ClientErrors were already counted by the per-attempt hook."""
    from botocore.exceptions import ClientError

    return isinstance(exc, ClientError)


class S3Storage(Storage):
    kind = "s3"
    object_store = True
    s3_api = True

    def __init__(self, location: str, max_concurrency: int = 64) -> None:
        super().__init__(location)
        self.bucket, self.prefix = split_s3_uri(location)
        self.client, self._config = new_client(location, self.uri, max_concurrency)
        self.connect_timeout_s = self._config.connect_timeout
        self.read_timeout_s = self._config.read_timeout
        self._warned_stall = False
        self.client.meta.events.register("request-created.s3", self._on_request)
        self.client.meta.events.register_first("needs-retry.s3", self._on_attempt)

    # ------------------------------------------------------------ accounting
    def _on_request(self, request=None, **_):
        """Runs as each attempt is built: a request, and a retry when it is not the first
        (counted here, so calls that finally fail still count their retries)."""
        attempt = ((getattr(request, "context", None) or {}).get("retries") or {}).get("attempt")
        self.stats.count(requests=1, retries=1 if attempt and attempt > 1 else 0)

    def _on_attempt(self, response=None, caught_exception=None, **_):
        """Runs after every attempt, before botocore decides to retry; counts failures."""
        failed = caught_exception is not None
        if response is not None and not failed:
            http, parsed = response
            code = (parsed or {}).get("Error", {}).get("Code", "")
            failed = http.status_code >= 500 or code in ("SlowDown", "Throttling", "RequestTimeout")
        if failed:
            self.stats.count(errors=1)
        if stalled(caught_exception):
            self._warn_stall(caught_exception)
        return None  # never changes botocore's decision

    def _warn_stall(self, exc: BaseException) -> None:
        """The first stall is shown at once (a dead endpoint must not look like a slow run)."""
        if not self._warned_stall:
            self._warned_stall = True
            log.warning(
                "ckptprof: warning: the S3 endpoint %s is not answering (%s); retrying "
                "while botocore's retries last.",
                self.endpoint,
                type(exc).__name__,
            )

    # ------------------------------------------------------------ naming
    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def _key(self, path: str) -> str:
        return self.prefix + path

    def _where(self, path: str) -> str:
        return f"s3://{self.bucket}/{self._key(path)}"

    @property
    def endpoint(self) -> str:
        return safe_endpoint(self.client.meta.endpoint_url)

    def _translate(self, exc: Exception, path: str) -> Exception:
        """What ``exc`` means for the object ``path``, as the exception naming it."""
        return translate(exc, self._where(path), self.bucket, self.endpoint, self._config)

    # ------------------------------------------------------------ reading
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        infos = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._key(prefix)
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    infos.append(ObjectInfo(obj["Key"][len(self.prefix) :], obj["Size"]))
        except Exception as exc:  # noqa: BLE001 - translated below
            raise self._translate(exc, prefix) from None
        return sorted(infos, key=lambda i: i.path)

    def stat(self, path: str) -> ObjectInfo:
        try:
            with activity.request(self._where(path), 0):
                head = self.client.head_object(Bucket=self.bucket, Key=self._key(path))
        except Exception as exc:  # noqa: BLE001
            raise self._translate(exc, path) from None
        return ObjectInfo(path, head["ContentLength"])

    def read_into(self, path: str, offset: int, buffer: memoryview) -> None:
        self.read_into_views(path, offset, [buffer])

    def read_into_views(self, path: str, offset: int, views: list[memoryview]) -> None:
        """One ranged GET for the whole range, its body received into each view in turn
        (no bytes copied aside)."""
        want = sum(len(v) for v in views)
        with activity.request(self._where(path), want):  # what the stall watchdog sees
            self._get_into_views(path, offset, views, want)

    def _get_into_views(self, path: str, offset: int, views: list[memoryview], want: int) -> None:
        started = time.perf_counter()
        try:
            resp = self.client.get_object(
                Bucket=self.bucket,
                Key=self._key(path),
                Range=f"bytes={offset}-{offset + want - 1}",
            )
            _check_range(resp, offset, self._where(path))
            body = resp["Body"]
            readinto = _direct_readinto(body)
            done = 0
            with contextlib.closing(body):
                for view in views:
                    filled = 0
                    while filled < len(view):
                        n = readinto(view[filled:])
                        if not n:
                            break
                        filled += n
                    done += filled
                    if filled < len(view):
                        break
                if done == want:
                    _release(body)  # keep the connection alive for the next request
        except Exception as exc:  # noqa: BLE001
            if not _counted(exc):  # body read failures never reach the retry hook
                self.stats.count(errors=1)
            raise self._translate(exc, path) from None
        if done != want:
            self.stats.count(errors=1)
            raise EOFError(
                f"{self._where(path)}: expected {want} bytes from offset {offset}, got {done}"
            )
        self.stats.observe(self._where(path), time.perf_counter() - started)

    def location_exists(self) -> bool:
        try:
            resp = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)
        except Exception as exc:  # noqa: BLE001
            translated = self._translate(exc, "")
            if isinstance(translated, FileNotFoundError):
                return False
            raise translated from None
        return bool(resp.get("KeyCount"))

    # ------------------------------------------------------------ writing
    @contextmanager
    def staging_file(self, path: str) -> Iterator[Path]:
        """Write locally, then upload with multipart and concurrency."""
        from boto3.s3.transfer import TransferConfig

        with tempfile.TemporaryDirectory(prefix="ckptprof-upload-") as tmp:
            local = Path(tmp) / Path(path).name
            yield local
            size = local.stat().st_size
            transfer = TransferConfig(
                multipart_threshold=DEFAULT_PART_SIZE,
                # the fetch phase's default part, or the smallest S3 takes for this size
                multipart_chunksize=multipart.part_size_for(size, DEFAULT_PART_SIZE),
                max_concurrency=min(16, self._config.max_pool_connections),
            )
            try:
                self.client.upload_file(str(local), self.bucket, self._key(path), Config=transfer)
            except Exception as exc:  # noqa: BLE001
                raise self._translate(getattr(exc, "last_exception", None) or exc, path) from None

    def open_writer(self, path: str, size: int, part_size: int) -> S3FileWriter:
        """Refuses a part size S3 would refuse for ``size`` bytes before the upload starts."""
        multipart.check_part_size(size, part_size, self._where(path))
        return S3FileWriter(
            self.client, self.bucket, self._key(path), self._where(path),
            lambda exc: self._translate(exc, path), multipart=size > part_size,
        )  # fmt: skip

    def write_bytes(self, path: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(path), Body=data)
        except Exception as exc:  # noqa: BLE001
            raise self._translate(exc, path) from None

    def delete(self, path: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(path))
        except Exception as exc:  # noqa: BLE001
            raise self._translate(exc, path) from None

    def free_bytes(self) -> int | None:
        return None

    def abort_uploads(self) -> int:
        """Abort every unfinished multipart upload under the prefix (and only there): a
        killed save's or a crashed server's, whose parts would otherwise be kept (and
        billed) until a lifecycle rule ends them. Returns how many."""
        aborted = 0
        try:
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=self.prefix
            )
            for page in pages:
                for upload in page.get("Uploads", []):
                    if not upload["Key"].startswith(self.prefix):
                        continue  # a store that ignores Prefix: never another location's
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                    aborted += 1
        except Exception as exc:  # noqa: BLE001 - translated below
            raise self._translate(exc, "") from None
        return aborted

    # ------------------------------------------------------------ cache
    def evict(self, paths: list[str]) -> CacheState:
        return CacheState("none: object storage, nothing cached locally", None)

    def warm(self, paths: list[str]) -> CacheState:
        return CacheState("none: object storage, nothing cached locally", None)

    def describe(self) -> dict[str, str]:
        info = super().describe()
        retries = self.client.meta.config.retries or {}
        info.update(
            {
                "s3.endpoint": self.endpoint,
                "s3.region": self.client.meta.region_name or "",
                "s3.addressing_style": (self.client.meta.config.s3 or {}).get(
                    "addressing_style", "auto"
                ),
                "s3.retry_mode": str(retries.get("mode", os.environ.get("AWS_RETRY_MODE", ""))),
                "s3.max_attempts": str(
                    retries.get("total_max_attempts", os.environ.get("AWS_MAX_ATTEMPTS", ""))
                ),
                "s3.max_pool_connections": str(self._config.max_pool_connections),
                "s3.connect_timeout_s": str(self.connect_timeout_s),
                "s3.read_timeout_s": str(self.read_timeout_s),
            }
        )
        return info
