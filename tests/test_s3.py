"""s3:// works like a path: generate, restore, stage, retries, errors, no secrets leaked.

Everything runs against a real SeaweedFS S3 server on 127.0.0.1 (tests/s3infra.py),
through boto3 over HTTP, configured only by the standard AWS_* variables.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import uuid
from pathlib import Path

import pytest

from ckptprof.errors import StorageError
from ckptprof.io.requests import OBJECT_STORE_GAP
from ckptprof.io.transfer import fetch
from ckptprof.manifest import MANIFEST_NAME
from ckptprof.phases import RESTORE_PHASES
from ckptprof.storage import open_storage
from ckptprof.synth.generate import generate
from ckptprof.synth.options import RestoreOptions
from ckptprof.synth.plan import SynthSpec
from ckptprof.synth.restore import run_restore
from tests.conftest import TINY_SCALE, read_spans, run_cli, spans_in
from tests.test_bad_input import assert_one_line_error

LAYOUTS = ["torch", "safetensors", "dcp", "deepspeed"]


def s3_generate(bucket: str, layout: str = "torch", ranks: int = 1, **kw) -> str:
    location = f"s3://{bucket}/ckpt/{layout}-{uuid.uuid4().hex[:6]}"
    generate(
        location, SynthSpec("llama2-7b", layout, TINY_SCALE, ranks=ranks, **kw), progress=False
    )
    return location


def restore(location, tmp_path, **kw):
    options = RestoreOptions(
        caches=("cold",),
        concurrency=kw.pop("concurrency", (4,)),
        repeat=kw.pop("repeat", 1),
        progress=False,
        **kw,
    )
    return run_restore(location, options, tmp_path / "out", echo=lambda *_: None)


def phase_spans(payload):
    spans = read_spans(payload["trace_file"])
    roots = [s for s in spans if s["name"] == "ckpt.restore"]
    kids = {}
    for s in spans:
        if s["parent_id"]:
            kids.setdefault(s["parent_id"], {})[s["name"]] = s
    return roots, [kids[r["context"]["span_id"]] for r in roots]


def restored_here(location: str, traces: Path, **options):
    """One cold restore of ``location`` into one rank, in this process: its state's digest
    and its fetch span's attributes."""
    from ckptprof.synth.runner import RestoreRunner
    from ckptprof.tracing import CheckpointTracer, setup_telemetry

    options = RestoreOptions(
        strategies=("pipelined",), caches=("cold",), concurrency=(2,), repeat=1, verify="size",
        ceiling_gbps=1.0, first_step=False, progress=False, world_size=1, **options,
    )  # fmt: skip
    telemetry = setup_telemetry(traces)
    try:
        runner = RestoreRunner(location, options, CheckpointTracer(telemetry.provider))
        runner.run_once("pipelined", "cold", 2, 0)
    finally:
        telemetry.shutdown()
    [fetch] = [s for s in spans_in(traces) if s["name"] == "ckpt.fetch"]
    return runner.state.digest(), fetch["attributes"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_generate_and_restore_through_s3(layout, s3_bucket, s3_env, tmp_path, monkeypatch):
    s3_env()
    ranks = 2 if layout in ("dcp", "deepspeed") else 1
    location = s3_generate(s3_bucket.name, layout, ranks)
    manifest = json.loads(open_storage(location).read_bytes(MANIFEST_NAME))
    total = sum(f["size"] for f in manifest["files"].values())
    # restored into one rank (a reshard for dcp/deepspeed), so the first step runs for real
    payload = restore(location, tmp_path, world_size=1)
    roots, phases = phase_spans(payload)
    assert {p.span_name for p in RESTORE_PHASES} <= set(phases[0])
    assert phases[0]["ckpt.fetch"]["attributes"]["ckpt.bytes"] == total
    assert phases[0]["ckpt.list"]["attributes"]["ckpt.files"] == len(manifest["files"])
    attrs = roots[0]["attributes"]
    assert attrs["ckpt.storage.kind"] == "s3"
    assert attrs["ckpt.storage.uri"] == location
    env = payload["environment"]
    assert env["s3.endpoint"].startswith("http://127.0.0.1:")
    assert env["s3.region"] == "us-east-1" and env["s3.addressing_style"]
    assert env["fetch.part_size"] == str(16 << 20)
    # where each GET's bytes land: the same files copied to a local disk (read there in
    # requests cut at tensors, in place) restore the same state, byte for byte
    local, storage = tmp_path / "local", open_storage(location)
    for name in [*manifest["files"], MANIFEST_NAME]:
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(storage.read_bytes(name))
    with fetch_requests(monkeypatch) as requests:  # in parts of 256 KiB: several per file
        remote_digest, fetched = restored_here(location, tmp_path / "s3-traces", part_size=PART)
    assert remote_digest == restored_here(str(local), tmp_path / "local-traces")[0]
    assert_object_store_requests(requests, fetched, whole_parts=layout != "dcp")


PART = 256 << 10


@contextlib.contextmanager
def fetch_requests(monkeypatch):
    """Every GET the pipelined restore's fetch makes on S3 (not the index reads, which may
    run at the same time: those of a sparse file's blocks), as ``(path, offset, length)``,
    recorded where the storage is asked for them."""
    from ckptprof.io.sparse import SparseFile
    from ckptprof.storage.s3 import S3Storage
    from ckptprof.synth.strategies import dcp, pipelined

    seen: list[tuple[str, int, int]] = []
    fetching = threading.Event()
    indexing = threading.local()  # this thread is reading an index's blocks
    real_views, real_ensure = S3Storage.read_into_views, SparseFile.ensure

    def ensure(self, offset, length):
        indexing.on = True
        try:
            return real_ensure(self, offset, length)
        finally:
            indexing.on = False

    def fetches(real):  # the part of a restore that reads what the state needs
        def fetch(*args, **kwargs):
            fetching.set()
            try:
                return real(*args, **kwargs)
            finally:
                fetching.clear()

        return fetch

    def views(self, path, offset, buffers):
        if fetching.is_set() and not getattr(indexing, "on", False):
            seen.append((path, offset, sum(memoryview(b).nbytes for b in buffers)))
        return real_views(self, path, offset, buffers)

    monkeypatch.setattr(pipelined._Ranges, "run", fetches(pipelined._Ranges.run))
    monkeypatch.setattr(dcp, "load_targets", fetches(dcp.load_targets))  # after .metadata
    monkeypatch.setattr(S3Storage, "read_into_views", views)
    monkeypatch.setattr(SparseFile, "ensure", ensure)
    yield seen


def assert_object_store_requests(
    requests: list[tuple[str, int, int]], fetch: dict, whole_parts: bool
) -> None:
    """The object-store policy, as the requests went out: as many as the fetch span says;
    never two adjacent requests that one part would hold; with ``whole_parts`` (ranges
    cut anywhere; DCP's items must arrive whole instead) each a part, so a run of N
    adjacent bytes is ceil(N / part) GETs; runs of one file further apart than the gap
    they would have been read through; and less read beyond what the state needs than
    one gap."""
    gap = min(PART, OBJECT_STORE_GAP)
    assert requests and len(requests) == fetch["ckpt.fetch.requests"]
    assert sum(n for _, _, n in requests) == fetch["ckpt.fetch.request_bytes"]
    by_file: dict[str, list[tuple[int, int]]] = {}
    for path, offset, length in requests:
        by_file.setdefault(path, []).append((offset, length))
    for path, parts in by_file.items():
        parts.sort()
        runs = [[parts[0]]]
        for offset, length in parts[1:]:
            last_offset, last_length = runs[-1][-1]
            if offset == last_offset + last_length:
                runs[-1].append((offset, length))
            else:
                assert offset - (last_offset + last_length) > gap, path  # else read through
                runs.append([(offset, length)])
        for run in runs:
            lengths = [length for _, length in run]
            # never two requests where one part would do
            assert all(a + b > PART for a, b in itertools.pairwise(lengths)), (path, run)
            if whole_parts:
                span = run[-1][0] + run[-1][1] - run[0][0]
                assert len(run) == -(-span // PART), (path, run)
                assert all(length == PART for length in lengths[:-1]), (path, run)
    assert fetch["ckpt.fetch.read_beyond_bytes"] < gap


def test_generation_uses_multipart_upload(s3_bucket, s3_env):
    s3_env()
    location = s3_generate(s3_bucket.name, "torch")  # one ~35 MB object
    key = location.split("/", 3)[3] + "/checkpoint_rank0.pt"
    head = s3_bucket.client.head_object(Bucket=s3_bucket.name, Key=key)
    assert head["ContentLength"] > 16 << 20
    assert "-" in head["ETag"]  # a multipart ETag is "<md5>-<parts>"


def test_stage_mode_downloads_then_reads(s3_bucket, s3_env, tmp_path):
    s3_env()
    location = s3_generate(s3_bucket.name, "safetensors")
    payload = restore(location, tmp_path, strategies=("staged",), stage_dir=tmp_path / "stage")
    _, phases = phase_spans(payload)
    fetch_attrs = phases[0]["ckpt.fetch"]["attributes"]
    assert fetch_attrs["ckpt.fetch.stage_download_s"] > 0
    assert fetch_attrs["ckpt.fetch.stage_read_s"] > 0
    assert not (tmp_path / "stage" / "ckptprof-stage").exists()  # staged copy cleaned up


def test_injected_503s_are_retried_and_counted(s3_bucket, s3_env, fault_proxy, tmp_path):
    s3_env()
    location = s3_generate(s3_bucket.name, "torch", optimizer=False)
    s3_env(endpoint_url=fault_proxy.endpoint_url, max_attempts=5)
    fault_proxy.fail_every(4, status=503, code="SlowDown")
    payload = restore(location, tmp_path, concurrency=(2,), part_size=1 << 20, verify="full")
    injected = fault_proxy.failures_injected
    assert injected > 0
    # every injected 503 was seen as a failed attempt and retried (ceiling probe included)
    assert payload["requests"]["errors"] == injected
    assert payload["requests"]["retries"] == injected
    run = payload["runs"][0]
    assert run["retries"] > 0 and run["errors"] == run["retries"]
    roots, _ = phase_spans(payload)
    assert roots[0]["attributes"]["ckpt.retries"] == run["retries"] > 0
    assert payload["success_rate"] == 1.0


def test_ranged_gets_reuse_connections(s3_bucket, s3_env, fault_proxy):
    s3_env()
    location = s3_generate(s3_bucket.name, "torch", optimizer=False)
    s3_env(endpoint_url=fault_proxy.endpoint_url)
    storage = open_storage(location)
    infos = [i for i in storage.list() if i.path.endswith(".pt")]
    before = fault_proxy.connections
    buffers = fetch(storage, infos, 1, part_size=1 << 20, progress=False)
    for buf in buffers.values():
        buf.close()
    parts = sum(-(-i.size // (1 << 20)) for i in infos)
    assert parts >= 5 and fault_proxy.connections - before <= 1  # keep-alive, not one per GET


def test_littles_law_with_added_latency(s3_bucket, s3_env, fault_proxy, tmp_path):
    """20 ms per request: a fetch at concurrency 16 really has many requests in flight
    (what Little's Law turns into bytes per second at a fixed latency), never more than
    asked, and one at a time at concurrency 1; the bytes are the same either way. (How
    much faster 16 is than 1 is a speed claim: benchmarks/, not a test on a shared box.)"""
    import hashlib
    import threading

    from tests.s3infra import _ProxyHandler

    s3_env()
    location = s3_generate(s3_bucket.name, "torch", optimizer=False)
    s3_env(endpoint_url=fault_proxy.endpoint_url)
    fault_proxy.latency_s = 0.020
    lock = threading.Lock()
    state: dict = {"now": [], "most": 0, "first": True, "gate": None}

    class InFlight(_ProxyHandler):
        """Counts the distinct requests (method, path, Range) being answered at once (a
        client's retry of a request it gave up on is not one more in flight); with a
        gate, the fetch's first request is answered only once a second one has arrived
        (an event, not a race with the clock: a fetch that sends one at a time waits out
        the gate's 10 s, half the client's read timeout, so nothing is retried meanwhile)."""

        def _handle(self):
            key = (self.command, self.path, self.headers.get("Range", ""))
            with lock:
                state["now"].append(key)
                state["most"] = max(state["most"], len(set(state["now"])))
                first, state["first"] = state["first"], False
                gate = state["gate"]
                if gate is not None and len(set(state["now"])) >= 2:
                    gate.set()
            try:
                if first and gate is not None:
                    gate.wait(10)
                super()._handle()
            finally:
                with lock:
                    state["now"].remove(key)

    # this proxy only, before its first connection (a handler serves a whole connection)
    fault_proxy._server.RequestHandlerClass = InFlight
    storage = open_storage(location, max_concurrency=16)
    infos = [i for i in storage.list() if i.path != MANIFEST_NAME]
    most, digests = {}, {}
    for concurrency in (1, 16):
        state.update(most=0, first=True, gate=threading.Event() if concurrency > 1 else None)
        buffers = fetch(storage, infos, concurrency, part_size=256 << 10, progress=False)
        most[concurrency] = state["most"]
        digests[concurrency] = {p: hashlib.sha256(b.view).hexdigest() for p, b in buffers.items()}
        for buf in buffers.values():
            buf.close()
    parts = sum(-(-i.size // (256 << 10)) for i in infos)
    assert parts > 16  # enough requests to keep 16 in flight
    assert most[1] == 1, most  # one request at a time: every 256 KiB waits its 20 ms
    assert 2 <= most[16] <= 16, most  # many at once, never more than asked
    assert digests[16] == digests[1] and set(digests[1]) == {i.path for i in infos}


def s3_cli(*args, env):
    return run_cli(*args, env=env)


def test_missing_bucket_prefix_and_denied(s3_bucket, s3_env, seaweed, tmp_path):
    env = s3_env()
    out = ["--out", str(tmp_path / "o"), "--no-report", "--ceiling-gbps", "1", "--repeat", "1"]
    missing_bucket = s3_cli("synth", "restore", "s3://no-such-bucket-ckptprof/x", *out, env=env)
    assert_one_line_error(missing_bucket, "s3://no-such-bucket-ckptprof")
    missing_prefix = s3_cli(
        "synth", "restore", f"s3://{s3_bucket.name}/nothing-here", *out, env=env
    )
    assert_one_line_error(missing_prefix, f"s3://{s3_bucket.name}/nothing-here", "no such")
    location = s3_generate(s3_bucket.name, "torch", optimizer=False)
    denied_env = s3_env(credentials=seaweed.limited_credentials)
    denied_env["AWS_SESSION_TOKEN"] = "SESSIONTOKEN-never-shown"
    denied = s3_cli("synth", "restore", location, *out, env=denied_env)
    line = assert_one_line_error(denied, "access denied")
    for secret_text in (*seaweed.limited_credentials, "SESSIONTOKEN"):
        assert secret_text not in denied.stderr + denied.stdout
    assert line


def test_object_deleted_between_list_and_fetch(s3_bucket, s3_env):
    s3_env()
    location = s3_generate(s3_bucket.name, "torch", optimizer=False)
    storage = open_storage(location)
    infos = storage.list()
    victim = next(i for i in infos if i.path.endswith(".pt"))
    s3_bucket.client.delete_object(
        Bucket=s3_bucket.name, Key=location.split("/", 3)[3] + "/" + victim.path
    )
    with pytest.raises(FileNotFoundError, match=victim.path):
        fetch(storage, infos, 4, progress=False)


def test_truncated_object_names_it(s3_bucket, s3_env, tmp_path):
    env = s3_env()
    location = s3_generate(s3_bucket.name, "torch", optimizer=False)
    key = location.split("/", 3)[3] + "/checkpoint_rank0.pt"
    body = s3_bucket.client.get_object(Bucket=s3_bucket.name, Key=key)["Body"].read()
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=key, Body=body[: len(body) // 3])
    result = s3_cli(
        "synth",
        "restore",
        location,
        "--out",
        str(tmp_path / "o"),
        "--no-report",
        "--ceiling-gbps",
        "1",
        "--repeat",
        "1",
        env=env,
    )
    assert_one_line_error(result, "checkpoint_rank0.pt", "truncated")


def test_short_body_mid_transfer_names_the_object(s3_bucket, s3_env, fault_proxy):
    s3_env()
    location = s3_generate(s3_bucket.name, "torch", optimizer=False)
    s3_env(endpoint_url=fault_proxy.endpoint_url, max_attempts=1)
    storage = open_storage(location)
    infos = [i for i in storage.list() if i.path == "checkpoint_rank0.pt"]
    fault_proxy.truncate_next_get(100)
    with pytest.raises((EOFError, StorageError), match="checkpoint_rank0.pt"):
        fetch(storage, infos, 1, part_size=1 << 20, progress=False)
    assert fault_proxy.truncations == 1


def test_failed_runs_make_the_success_rate(s3_bucket, s3_env, fault_proxy, tmp_path, monkeypatch):
    """Errors that retries cannot absorb fail a run; the sweep goes on and reports: the
    success rate results.json (and the report read from it) gives is the share of the
    runs that succeeded, as their restore spans tell."""
    from ckptprof.report import aggregate, load, render_text
    from ckptprof.synth.runner import RestoreRunner

    run_once, started = RestoreRunner.run_once, []

    def second_run_fails(self, *args):  # the first run succeeds, then every 3rd request fails
        started.append(args)
        if len(started) == 2:
            fault_proxy.fail_every(3, status=500, code="InternalError")
        return run_once(self, *args)

    monkeypatch.setattr(RestoreRunner, "run_once", second_run_fails)
    s3_env()
    location = s3_generate(s3_bucket.name, "torch", optimizer=False)
    s3_env(endpoint_url=fault_proxy.endpoint_url, max_attempts=1)
    options = RestoreOptions(
        strategies=("staged",),  # whole objects: a few requests a run
        caches=("cold",),
        concurrency=(1,),
        repeat=2,
        ceiling_gbps=1.0,
        first_step=False,
        progress=False,
    )
    out = tmp_path / "out"
    with pytest.raises(StorageError, match="runs failed") as failed:
        run_restore(location, options, out, echo=lambda *_: None)
    doc = json.loads((out / "results.json").read_text())
    runs, failures = doc["runs"], doc["failures"]
    assert len(runs) == len(failures) == 1 and failures[0]["repeat"] == 1
    assert all("InternalError" in f["error"] and location in f["error"] for f in failures)
    roots = [s for s in read_spans(doc["trace_file"]) if s["name"] == "ckpt.restore"]
    failed_roots = [s for s in roots if s["status"]["status_code"] == "ERROR"]
    assert len(roots) == 2 and len(failed_roots) == len(failures)
    rate = (len(roots) - len(failed_roots)) / len(roots)  # the runs that succeeded
    assert doc["success_rate"] == rate == 0.5
    assert f"{len(failures)} of 2 runs failed (success rate {rate:.0%})" in str(failed.value)
    (results,) = load([out]).results
    assert results.reliability["success_rate"] == rate
    assert results.reliability["failures"] == failures
    text = render_text(aggregate(load([out])))
    assert f"success rate {rate:.0%} ({len(failures)} runs failed)" in text


def test_no_secrets_in_spans_results_or_logs(s3_bucket, s3_env, seaweed, tmp_path):
    env = s3_env()
    key, secret = seaweed.admin_credentials
    location = s3_generate(s3_bucket.name, "torch", optimizer=False)
    presigned = location + "?X-Amz-Signature=deadbeef&X-Amz-Credential=" + key
    result = s3_cli(
        "synth",
        "restore",
        presigned,
        "--out",
        str(tmp_path / "o"),
        "--repeat",
        "1",
        "--cache",
        "cold",
        "--concurrency",
        "2",
        env=env,
    )
    assert_one_line_error(result, f"{location}?…", "no query string")  # never another object
    clean = s3_cli("synth", "restore", location, "--out", str(tmp_path / "o"), "--repeat", "1",
                   "--cache", "cold", "--concurrency", "2", env=env)  # fmt: skip
    assert clean.returncode == 0, clean.stderr
    everything = result.stdout + result.stderr + clean.stdout + clean.stderr
    for path in (tmp_path / "o").rglob("*"):
        if path.is_file():
            everything += path.read_text(errors="replace")
    for secret_text in (key, secret, "X-Amz-Signature", "deadbeef"):
        assert secret_text not in everything, secret_text
    assert location in everything  # the clean URI is there


def test_safe_endpoint_strips_userinfo_and_query():
    from ckptprof.storage.s3 import split_s3_uri
    from ckptprof.storage.s3_client import safe_endpoint

    assert safe_endpoint("http://user:pw@127.0.0.1:9000/?token=x") == "http://127.0.0.1:9000"
    assert split_s3_uri("s3://b/a#b/c") == ("b", "a#b/c/")  # '#' is a key character
    with pytest.raises(Exception, match="no query string") as refused:
        split_s3_uri("s3://b/a/b?X-Amz-Signature=1")
    assert "Signature" not in str(refused.value)
    with pytest.raises(Exception, match="s3://bucket/prefix"):
        split_s3_uri("s3:/nobucket")


def test_metadata_addresses_are_never_called_unless_opted_in(monkeypatch, tmp_path):
    """The EC2/ECS credential providers are off by default; a stand-in server proves it."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from ckptprof.errors import CkptprofError

    hits: list[str] = []

    class StandIn(BaseHTTPRequestHandler):
        def _answer(self):
            hits.append(f"{self.command} {self.path}")
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_PUT = _answer  # noqa: N815 - http.server's naming

        def log_message(self, *args):
            pass

    from tests.test_export import refused_port

    server = HTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    refused = refused_port()
    closed_port = refused.__enter__()  # an endpoint that refuses, held for the test
    try:
        for name in [n for n in __import__("os").environ if n.startswith("AWS_")]:
            monkeypatch.delenv(name)
        base = f"http://127.0.0.1:{server.server_port}"
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", base)
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", base + "/ecs-creds")
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port}")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.delenv("CKPTPROF_S3_INSTANCE_CREDENTIALS", raising=False)
        with pytest.raises(CkptprofError, match="no AWS credentials.*CKPTPROF_S3_INSTANCE"):
            open_storage("s3://bucket/ckpt").list()
        assert hits == []
        monkeypatch.setenv("CKPTPROF_S3_INSTANCE_CREDENTIALS", "1")
        with pytest.raises(CkptprofError, match="s3://bucket/ckpt"):
            open_storage("s3://bucket/ckpt").list()
        assert hits  # opted in: the (stand-in) metadata service was asked
    finally:
        refused.__exit__(None, None, None)
        server.shutdown()


def test_generation_checks_local_staging_space_first(s3_bucket, s3_env):
    env = s3_env()
    location = f"s3://{s3_bucket.name}/huge"
    result = run_cli(
        "synth", "generate", location, "--model", "llama3-405b", "--layout", "dcp", env=env
    )
    assert_one_line_error(result, "staged here before upload", "TMPDIR")
    listing = s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name, Prefix="huge/")
    assert listing.get("KeyCount", 0) == 0


def test_retries_of_calls_that_finally_fail_are_counted(s3_bucket, s3_env, fault_proxy):
    """Once, only completed calls' RetryAttempts were counted ("0 retries, 21 failed
    attempts" while botocore did retry)."""
    s3_env()
    location = s3_generate(s3_bucket.name, "torch", optimizer=False)
    s3_env(endpoint_url=fault_proxy.endpoint_url, max_attempts=3)
    storage = open_storage(location)
    fault_proxy.fail_next(6, status=503, code="SlowDown")  # two calls, all attempts fail
    for _ in range(2):
        with pytest.raises(StorageError, match="503 .* after 3 attempts"):
            storage.stat("checkpoint_rank0.pt")
    assert fault_proxy.failures_injected == 6
    assert (storage.stats.requests, storage.stats.errors, storage.stats.retries) == (6, 6, 4)


def hung_proxy_env(s3_bucket, s3_env, fault_proxy, monkeypatch, read_timeout: str = "2"):
    s3_env()
    location = s3_generate(s3_bucket.name, "torch", optimizer=False)
    env = s3_env(endpoint_url=fault_proxy.endpoint_url, max_attempts=2)
    monkeypatch.setenv("CKPTPROF_S3_READ_TIMEOUT", read_timeout)
    env["CKPTPROF_S3_READ_TIMEOUT"] = read_timeout
    return location, env


def test_a_hung_endpoint_stops_the_sweep_within_seconds(
    s3_bucket, s3_env, fault_proxy, monkeypatch, tmp_path
):
    """Once, a server that keeps the connection open and never answers stalled each run
    for minutes, and the sweep went on to the next run."""
    import time

    from ckptprof.errors import UnreachableError
    from ckptprof.synth.runner import RestoreRunner
    from ckptprof.tracing import CheckpointTracer, setup_telemetry

    location, _ = hung_proxy_env(s3_bucket, s3_env, fault_proxy, monkeypatch)
    telemetry = setup_telemetry(tmp_path)
    options = RestoreOptions(
        caches=("cold",), concurrency=(2,), repeat=3, ceiling_gbps=1.0, first_step=False
    )
    options.progress = False
    runner = RestoreRunner(location, options, CheckpointTracer(telemetry.provider))
    fault_proxy.hang()
    started = time.monotonic()
    with pytest.raises(UnreachableError, match=f"{fault_proxy.endpoint_url}.*did not answer"):
        runner.sweep(echo=lambda *_: None)
    assert time.monotonic() - started < 30  # generous: 2 attempts x 2 s, not minutes
    assert runner.runs == [] and runner.failures == []  # stopped, not recorded and moved on
    telemetry.shutdown()


def test_a_hung_endpoint_is_named_by_the_cli(s3_bucket, s3_env, fault_proxy, monkeypatch, tmp_path):
    location, env = hung_proxy_env(s3_bucket, s3_env, fault_proxy, monkeypatch)
    fault_proxy.hang()
    result = run_cli(
        "synth",
        "restore",
        location,
        "--out",
        str(tmp_path / "o"),
        "--no-report",
        env=env,
        timeout=60,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert "is not answering" in lines[0] and fault_proxy.endpoint_url in lines[0]
    assert lines[-1].startswith("ckptprof: error:") and fault_proxy.endpoint_url in lines[-1]
    assert "CKPTPROF_S3_READ_TIMEOUT" in lines[-1]


def test_a_bad_timeout_setting_is_one_line(s3_bucket, s3_env, tmp_path):
    env = s3_env()
    env["CKPTPROF_S3_READ_TIMEOUT"] = "soon"
    result = s3_cli("synth", "restore", f"s3://{s3_bucket.name}/x", "--out", str(tmp_path), env=env)
    assert_one_line_error(result, "CKPTPROF_S3_READ_TIMEOUT='soon'", "seconds")


def test_a_key_with_a_hash_is_kept_whole_and_a_query_is_refused(s3_bucket, s3_env, tmp_path):
    """Once, `s3://b/hash#tag` was written to `s3://b/hash`, `s3://b/q?x=1` to
    `s3://b/q`: another object than the one named."""
    s3_env()
    location = f"s3://{s3_bucket.name}/hash#tag"
    generate(location, SynthSpec("llama2-7b", "torch", TINY_SCALE), progress=False)
    keys = [o["Key"] for o in s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name)["Contents"]]
    assert keys and all(k.startswith("hash#tag/") for k in keys)
    assert restore(location, tmp_path)["runs"]
    refused = run_cli("synth", "generate", f"s3://{s3_bucket.name}/q?X-Amz-Signature=secret",
                      "--scale", str(TINY_SCALE))  # fmt: skip
    line = assert_one_line_error(refused, f"s3://{s3_bucket.name}/q?…", "no query string")
    assert "secret" not in refused.stderr + refused.stdout and "X-Amz" not in line
    after = s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name)["Contents"]
    assert [o["Key"] for o in after] == keys  # nothing written to s3://bucket/q


def test_a_stall_below_the_read_timeout_is_named(s3_bucket, s3_env, fault_proxy, tmp_path):
    """Once, the server stops answering for a few seconds mid-fetch (under the
    read timeout, so nothing fails): the run line and the fetch span say so."""
    s3_env()
    location = s3_generate(s3_bucket.name, "safetensors")
    s3_env(endpoint_url=fault_proxy.endpoint_url)
    fault_proxy.stall_next_get(3.0, "model-00002-of-")  # a data file, once the fetch runs
    lines: list[str] = []
    options = RestoreOptions(caches=("cold",), concurrency=(2,), repeat=1, progress=False,
                             ceiling_gbps=1.0, first_step=False,
                             strategies=("staged",))  # fmt: skip
    payload = run_restore(location, options, tmp_path / "out", echo=lines.append)
    (run,) = payload["runs"]
    assert run["slowest_request_s"] >= 2.5, lines
    assert run["slowest_request"].startswith(f"{location}/model-00002-of-")
    assert any("STALL: one request took" in line for line in lines)
    _, phases = phase_spans(payload)
    assert phases[0]["ckpt.fetch"]["attributes"]["ckpt.fetch.slowest_request_s"] >= 2.5
    report = run_cli("report", str(tmp_path / "out"))
    assert report.returncode == 0 and "one fetch request waited" in report.stdout
