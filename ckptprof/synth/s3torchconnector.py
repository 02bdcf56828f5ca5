"""``--strategy s3torchconnector``: AWS's ``s3torchconnector`` (PyPI, the ``[bench]``
extra) reading an ``s3://`` checkpoint, so its client sits in the same report as
ckptprof's own fetch, against any S3 endpoint (``AWS_ENDPOINT_URL``).

* DCP layout: its ``S3StorageReader`` (with its DCP-optimized ranged reader) under
  ``dcp.load`` into the target rank's tensors: reads, parsing and copies are one
  ``deserialize`` interval, marked ``ckpt.fused``; ``--verify full|sample`` reads the
  files through the same client first (sizes were checked by ``list``).
* every other layout: each file read whole through its S3 client's reader (what
  ``S3Checkpoint.reader`` hands out) into host memory, ``--concurrency`` files at a time
  (the CRT client splits each into its own ranged GETs of ``--part-size``): ``fetch``,
  per file; then verify, deserialize and reshard as the ``staged`` strategy does.

The CRT client has its own credential chain, which would ask the EC2 metadata address
when it finds nothing else; ckptprof never lets it: the run needs credentials in the
environment or a named profile, and ``AWS_EC2_METADATA_DISABLED=true`` is set for it
(``CKPTPROF_S3_INSTANCE_CREDENTIALS=1`` allows instance credentials, as for boto3).
"""

from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor

from ckptprof.errors import CkptprofError
from ckptprof.fetch import HostBuffer
from ckptprof.phases import Attr, Phase
from ckptprof.storage.s3 import INSTANCE_CREDENTIALS_ENV
from ckptprof.synth.strategies import (
    RunContext,
    Strategy,
    env_for_run,
    load_from_buffers,
    verify_all,
)

LOADER = "s3torchconnector"
INSTALL = "pip install 's3torchconnector[dcp]' (or ckptprof[bench])"


def _version() -> str:
    from importlib.metadata import version

    return version("s3torchconnector")


def _no_instance_credentials():
    """The CRT's credential chain without the metadata address, for the run only."""
    if os.environ.get(INSTANCE_CREDENTIALS_ENV) == "1":
        return contextlib.nullcontext()
    return env_for_run("AWS_EC2_METADATA_DISABLED", "true")


class S3TorchConnector(Strategy):
    name = "s3torchconnector"

    def check(self, storage) -> None:
        try:
            import s3torchconnector  # noqa: F401
        except ImportError:
            raise CkptprofError(
                f"--strategy s3torchconnector needs AWS's s3torchconnector: {INSTALL}"
            ) from None
        if storage.kind != "s3":
            raise CkptprofError(
                "--strategy s3torchconnector reads s3:// checkpoints; for a local or mounted "
                "path use pipelined, staged, framework or runai."
            )
        has_keys = os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY")
        if not (has_keys or os.environ.get("AWS_PROFILE")) and (
            os.environ.get(INSTANCE_CREDENTIALS_ENV) != "1"
        ):
            raise CkptprofError(
                "--strategy s3torchconnector: its client finds credentials itself; set "
                "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE (or "
                f"{INSTANCE_CREDENTIALS_ENV}=1 to let it ask the instance metadata)."
            )

    def generic(self, ctx: RunContext) -> None:
        client = _Client(ctx)
        with _no_instance_credentials():
            if ctx.layout.name == "dcp":
                self._dcp(ctx, client)
            else:  # then as the staged strategy does
                load_from_buffers(ctx, client.read_all(ctx, ctx.files))
        ctx.op.set_attributes({"ckpt.loader": LOADER, "ckpt.loader.version": _version()})

    def _dcp(self, ctx: RunContext, client: _Client) -> None:
        from s3torchconnector.dcp import S3FileSystem, S3StorageReader

        if ctx.verify in ("full", "sample"):  # through the same client, before the load
            buffers = client.read_all(ctx, ctx.files)
            try:
                verify_all(ctx, buffers)
            finally:
                for buffer in buffers.values():
                    buffer.close()
        reader = S3StorageReader(client.region, ctx.storage.uri, s3client_config=client.config)
        # its reader makes a client without an endpoint: give it one that has ours
        reader.fs = S3FileSystem(
            client.region, s3_client=client.native, reader_constructor=reader.fs._reader_constructor
        )
        fused = {"ckpt.fused": "fetch+deserialize+reshard (dcp.load, S3StorageReader)"}
        with ctx.op.phase(Phase.DESERIALIZE, **fused):
            ctx.layout.load_targets(ctx, reader, reader.read_metadata(), timed=False)


def read_whole(client, bucket: str, key: str, view: memoryview) -> int:
    """One object through the client's reader into ``view``; the bytes it gave."""
    reader = client.get_object(bucket, key)
    got = 0
    while got < len(view):
        n = reader.readinto(view[got:])
        if not n:
            break
        got += n
    return got


class _Client:
    """One s3torchconnector client for the run, on the storage's endpoint and region."""

    def __init__(self, ctx: RunContext) -> None:
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client

        meta = ctx.storage.client.meta
        self.region = meta.region_name or "us-east-1"
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self.config = S3ClientConfig(
            part_size=max(5 << 20, ctx.part_size),  # S3's smallest multipart part
            force_path_style=endpoint is not None,  # a custom endpoint: no bucket DNS names
        )
        self.native = S3Client(self.region, endpoint=endpoint, s3client_config=self.config)
        self.bucket, self.prefix = ctx.storage.bucket, ctx.storage.prefix

    def read_all(self, ctx: RunContext, files) -> dict[str, HostBuffer]:
        """``files`` read whole into memory, ``concurrency`` at a time: ``fetch``."""
        op = ctx.op
        sizes = {f.path: ctx.manifest.files[f.path].size for f in files}
        buffers = {path: HostBuffer(size, path) for path, size in sizes.items()}

        def one(path: str) -> None:
            start = time.time_ns()
            view = buffers[path].view
            try:
                got = read_whole(self.native, self.bucket, self.prefix + path, view)
            except Exception as exc:  # noqa: BLE001 - the client's errors, named
                raise CkptprofError(
                    f"{ctx.where(path)}: s3torchconnector could not read it "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
                ) from None
            end = time.time_ns()
            if got != len(view):
                raise CkptprofError(
                    f"{ctx.where(path)}: s3torchconnector read {got} of {len(view)} bytes; "
                    "was the object replaced or truncated? Generate it again."
                )
            op.add_interval(Phase.FETCH, start, end)
            op.add_file(Phase.FETCH, path, got, (end - start) / 1e9, start)

        try:
            with ThreadPoolExecutor(max(1, ctx.concurrency)) as pool:
                list(pool.map(one, sizes))
        except BaseException:
            for buffer in buffers.values():
                buffer.close()
            raise
        op.set_phase_attributes(
            Phase.FETCH,
            **{Attr.CONCURRENCY: ctx.concurrency, "ckpt.loader": LOADER,
               "ckpt.loader.part_size": self.config.part_size},
        )  # fmt: skip
        return buffers


__all__ = ["S3TorchConnector", "read_whole"]
