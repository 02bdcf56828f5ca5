"""What a boto error means, as the exception a storage caller handles: a missing object
or bucket, refused credentials, an endpoint that cannot be reached or stopped answering
(with the timeout to raise), each naming the object and never a credential.
"""

from __future__ import annotations

from ckptprof.errors import CkptprofError, StorageError, UnreachableError
from ckptprof.storage.s3_client import (
    CONNECT_TIMEOUT_ENV,
    INSTANCE_CREDENTIALS_ENV,
    READ_TIMEOUT_ENV,
)

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_DENIED = {
    "403",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AllAccessDisabled",
}


def stalled(exc: BaseException | None) -> bool:
    """A timeout or a refused connection: the endpoint is not answering."""
    from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

    # TimeoutError: a body read that timed out (socket.timeout)
    stalls = (ReadTimeoutError, ConnectTimeoutError, EndpointConnectionError, TimeoutError)
    return isinstance(exc, stalls)


def translate(exc: Exception, where: str, bucket: str, endpoint: str, config) -> Exception:
    """boto errors → builtin exceptions naming the object ``where`` (fsspec style), in
    ``bucket`` at ``endpoint`` (a client's botocore ``Config``: its timeouts)."""
    from botocore.exceptions import (
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
    )

    if isinstance(exc, NoCredentialsError):
        return CkptprofError(
            f"{where}: no AWS credentials found; set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
            f"or AWS_PROFILE (for an EC2/ECS role, set {INSTANCE_CREDENTIALS_ENV}=1)."
        )
    if isinstance(exc, EndpointConnectionError):
        return UnreachableError(
            f"{where}: cannot reach the S3 endpoint {endpoint}; check AWS_ENDPOINT_URL."
        )
    if stalled(exc):
        connecting = isinstance(exc, ConnectTimeoutError)
        seconds = config.connect_timeout if connecting else config.read_timeout
        env = CONNECT_TIMEOUT_ENV if connecting else READ_TIMEOUT_ENV
        return UnreachableError(
            f"{where}: the S3 endpoint {endpoint} did not answer within {seconds:g} s "
            f"({type(exc).__name__}); check that it is up, or raise {env} (seconds) for a "
            "slow one."
        )
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        attempts = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
        if code == "NoSuchBucket":
            return FileNotFoundError(f"s3://{bucket} (the bucket does not exist)")
        if code in _NOT_FOUND:
            return FileNotFoundError(where)
        if code in _DENIED:
            return PermissionError(f"{where} ({code}: access denied for these credentials)")
        if code == "InvalidRange":
            return EOFError(f"{where}: object is shorter than expected")
        return StorageError(
            f"{where}: {code or 'error'} {error.get('Message', '')} "
            f"after {attempts + 1} attempts".strip()
        )
    return StorageError(f"{where}: {type(exc).__name__}: {exc}")
