"""The boto3 client an S3 storage talks through, set up ckptprof's way.

Configuration is boto3's own: credentials from the standard chain, the endpoint
from ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``, the region from
``AWS_REGION``/``AWS_DEFAULT_REGION``, retries from ``AWS_RETRY_MODE`` /
``AWS_MAX_ATTEMPTS``; ckptprof sizes the connection pool to the concurrency and
bounds every wait: connect and read timeouts (``CKPTPROF_S3_CONNECT_TIMEOUT``,
``CKPTPROF_S3_READ_TIMEOUT``, seconds), so an endpoint that stops answering shows
within seconds. It never calls a metadata address on its own, and names an endpoint
only without its user info or query string.
"""

from __future__ import annotations

import contextlib
import os
from urllib.parse import urlsplit

from ckptprof.errors import CkptprofError
from ckptprof.redact import strip_url_secrets

CONNECT_TIMEOUT_ENV = "CKPTPROF_S3_CONNECT_TIMEOUT"
READ_TIMEOUT_ENV = "CKPTPROF_S3_READ_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT_S = 5.0
# longest silence while a request waits for its answer or its next bytes; a healthy
# store under load answers a 16 MiB ranged GET well within it
DEFAULT_READ_TIMEOUT_S = 20.0


def timeout_from_env(name: str, default: float) -> float:
    """A timeout in seconds from ``name``, or ``default``; a bad value is one clear error."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise CkptprofError(f"{name}={text!r}: expected a number of seconds above 0, e.g. 20.")
    return value


INSTANCE_CREDENTIALS_ENV = "CKPTPROF_S3_INSTANCE_CREDENTIALS"


def _session(boto3):
    """boto3's standard credential chain, minus the metadata-address providers.

    The EC2 instance role (169.254.169.254) and ECS task role (169.254.170.2) are
    found by calling a metadata address; ckptprof never does that on its own.
    Set ``CKPTPROF_S3_INSTANCE_CREDENTIALS=1`` to allow them on EC2/ECS.
    """
    import botocore.session

    core = botocore.session.get_session()
    if os.environ.get(INSTANCE_CREDENTIALS_ENV) != "1":
        resolver = core.get_component("credential_provider")
        for name in ("iam-role", "container-role"):
            with contextlib.suppress(Exception):
                resolver.remove(name)
    return boto3.session.Session(botocore_session=core)


def safe_endpoint(url: str | None) -> str:
    """An endpoint URL without user info or query string (nothing secret)."""
    if not url:
        return "aws default"
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port that is no number (an unexpanded ${PORT}): never raised
        return strip_url_secrets(url)
    return f"{parts.scheme}://{parts.hostname or ''}{port}"


def new_client(location: str, uri: str, max_concurrency: int):
    """A boto3 S3 client for ``location`` (``uri`` in its errors) and its configuration
    (a botocore ``Config``): the pool sized to ``max_concurrency``, the timeouts from
    the environment. A missing boto3 or a configuration mistake is one clear error."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise CkptprofError(f"{location}: S3 needs boto3; pip install 'ckptprof[s3]'.") from None
    config = Config(
        max_pool_connections=max(10, max_concurrency),
        tcp_keepalive=True,
        connect_timeout=timeout_from_env(CONNECT_TIMEOUT_ENV, DEFAULT_CONNECT_TIMEOUT_S),
        read_timeout=timeout_from_env(READ_TIMEOUT_ENV, DEFAULT_READ_TIMEOUT_S),
    )
    try:
        client = _session(boto3).client("s3", config=config)
    except Exception as exc:  # noqa: BLE001 - boto3 configuration mistakes
        raise CkptprofError(
            f"{uri}: cannot configure the S3 client ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200]}); check AWS_PROFILE, AWS_ENDPOINT_URL, "
            "AWS_RETRY_MODE and AWS_MAX_ATTEMPTS."
        ) from None
    return client, config
