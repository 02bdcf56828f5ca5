"""Writing an S3 object part by part: a multipart upload whose parts are sent as they
are ready (several in flight at once) and which exists under its key only once
completed; an aborted one leaves no parts behind where the server can drop them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ckptprof import activity
from ckptprof.storage.base import Part

log = logging.getLogger("ckptprof")


class S3FileWriter:
    """An object uploaded part by part (multipart upload, parts in flight at once); it
    exists under its key only once the upload is completed (the commit). A file of one
    part is one PUT at the commit."""

    direct = False  # no page cache to bypass: parts go out as they are

    def __init__(
        self,
        client,
        bucket: str,
        key: str,
        where: str,
        translate: Callable[[Exception], Exception],
        multipart: bool,
    ) -> None:
        """``where`` names the object in messages; ``translate`` turns a boto error into
        the exception that names it."""
        self.client, self.bucket, self.key = client, bucket, key
        self.where, self.translate = where, translate
        self.upload_id: str | None = None
        self.etags: dict[int, str] = {}
        self.single: bytes | None = None
        if multipart:
            try:
                self.upload_id = self.client.create_multipart_upload(
                    Bucket=self.bucket, Key=self.key
                )["UploadId"]
            except Exception as exc:  # noqa: BLE001
                raise translate(exc) from None

    def write_part(self, part: Part) -> None:
        body = b"".join(part.views)  # one part's copy: the HTTP body must be contiguous
        if self.upload_id is None:
            self.single = body
            return
        try:
            with activity.request(self.where, len(body)):
                resp = self._upload(part.number, body)
        except Exception as exc:  # noqa: BLE001
            raise self.translate(exc) from None
        self.etags[part.number] = resp["ETag"]

    def _upload(self, number: int, body: bytes) -> dict:
        return self.client.upload_part(
            Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
            PartNumber=number, Body=body,
        )  # fmt: skip

    def sync(self) -> None:
        """Nothing to force: a completed upload is durable (S3's guarantee)."""

    def commit(self) -> None:
        try:
            if self.upload_id is None:
                with activity.request(self.where, len(self.single or b"")):
                    self.client.put_object(
                        Bucket=self.bucket, Key=self.key, Body=self.single or b""
                    )
                return
            parts = [{"PartNumber": n, "ETag": e} for n, e in sorted(self.etags.items())]
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
                MultipartUpload={"Parts": parts},
            )  # fmt: skip
            self.upload_id = None
        except Exception as exc:  # noqa: BLE001
            raise self.translate(exc) from None

    def abort(self) -> None:
        """Drop the uploaded parts (best effort: what a server that is down keeps, a
        ``--force`` save or generate aborts later, or a bucket lifecycle rule)."""
        if self.upload_id is None:
            return
        try:
            self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=self.key, UploadId=self.upload_id
            )
        except Exception as exc:  # noqa: BLE001 - the save's own error is the one to raise
            log.warning(
                "ckptprof: warning: could not abort an unfinished upload (%s); a --force save "
                "or generate there aborts it.",
                self.translate(exc),
            )
        self.upload_id = None
