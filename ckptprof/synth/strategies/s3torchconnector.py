"""``--strategy s3torchconnector``: AWS's ``s3torchconnector`` (PyPI, the ``[bench]``
extra) reading an ``s3://`` checkpoint, so its client sits in the same report as
ckptprof's own fetch, against any S3 endpoint (``AWS_ENDPOINT_URL``).

* DCP layout: its ``S3StorageReader`` (with its DCP-optimized ranged reader) under
  ``dcp.load`` into the target rank's tensors: reads, parsing and copies are one
  ``deserialize`` interval, marked fused (``ckpt.fused``); ``--verify full|sample`` reads the
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

from ckptprof.errors import CkptprofError
from ckptprof.io.buffers import HostBuffer
from ckptprof.io.requests import Request
from ckptprof.io.window import Window
from ckptprof.phases import Attr, Phase, fused_value
from ckptprof.storage.s3_client import INSTANCE_CREDENTIALS_ENV
from ckptprof.synth.strategies.base import (
    ANY,
    RunContext,
    Strategy,
    env_for_run,
    load_from_buffers,
    verify_all,
)
from ckptprof.synth.strategies.registry import install_hint

LOADER = "s3torchconnector"
INSTALL = install_hint(LOADER)


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
        if not storage.s3_api:
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

    def handlers(self):
        return {ANY: self.restore, "dcp": self.restore_dcp}

    def restore(self, ctx: RunContext) -> None:
        """Each file read whole through the client, then as the staged strategy does."""
        client = _Client(ctx)
        with _no_instance_credentials():
            load_from_buffers(ctx, client.read_all(ctx, ctx.files))
        ctx.op.set_attributes({Attr.LOADER: LOADER, Attr.LOADER_VERSION: _version()})

    def restore_dcp(self, ctx: RunContext) -> None:
        """``dcp.load`` through the connector's own S3StorageReader."""
        client = _Client(ctx)
        with _no_instance_credentials():
            self._dcp(ctx, client)
        ctx.op.set_attributes({Attr.LOADER: LOADER, Attr.LOADER_VERSION: _version()})

    def _dcp(self, ctx: RunContext, client: _Client) -> None:
        from s3torchconnector.dcp import S3FileSystem, S3StorageReader

        from ckptprof.synth.strategies.dcp import load_targets

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
        phases = (Phase.FETCH, Phase.DESERIALIZE, Phase.RESHARD)
        fused = {Attr.FUSED: fused_value(phases, "dcp.load, S3StorageReader")}
        with ctx.op.phase(Phase.DESERIALIZE, **fused):
            load_targets(ctx, reader, reader.read_metadata(), timed=False)


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
        """``files`` read whole into memory through the client's reader, ``concurrency``
        objects at a time (the client splits each into its own part-size GETs): fetch."""
        buffers = {f.path: HostBuffer(ctx.size(f.path), f.path) for f in files}

        def read(request: Request, view: memoryview) -> memoryview:
            try:
                got = read_whole(self.native, self.bucket, self.prefix + request.path, view)
            except Exception as exc:  # noqa: BLE001 - the client's errors, named
                raise CkptprofError(
                    f"{ctx.where(request.path)}: s3torchconnector could not read it "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
                ) from None
            if got != len(view):
                raise CkptprofError(
                    f"{ctx.where(request.path)}: s3torchconnector read {got} of {len(view)} "
                    "bytes; was the object replaced or truncated? Generate it again."
                )
            return view

        requests = [Request(path, 0, buf.size) for path, buf in buffers.items()]
        try:
            window = Window(ctx.storage, ctx.op, ctx.concurrency, progress=ctx.progress,
                            desc=LOADER)  # fmt: skip
            window.run(requests, into=lambda r: buffers[r.path].view, read=read)
        except BaseException:
            for buffer in buffers.values():
                buffer.close()
            raise
        ctx.op.set_phase_attributes(
            Phase.FETCH,
            **{Attr.CONCURRENCY: ctx.concurrency, Attr.LOADER: LOADER,
               Attr.LOADER_PART_SIZE: self.config.part_size},
        )  # fmt: skip
        return buffers


__all__ = ["S3TorchConnector", "read_whole"]
