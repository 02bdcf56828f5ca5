"""``--strategy s3torchconnector``: AWS's real client (its CRT core) against the loopback
SeaweedFS server, through its custom-endpoint support."""

from __future__ import annotations

import json

import pytest

from ckptprof.manifest import MANIFEST_NAME
from ckptprof.storage import open_storage
from ckptprof.synth.options import RestoreOptions
from tests.conftest import children, read_spans, run_cli
from tests.test_bad_input import assert_one_line_error
from tests.test_s3 import s3_generate


def restored(location: str, strategy: str, tmp_path, **kw):
    """One restore with ``strategy``: the state's digest and the run's spans."""
    from ckptprof.synth.runner import RestoreRunner
    from ckptprof.tracing import CheckpointTracer, setup_telemetry

    options = RestoreOptions(
        strategies=(strategy,), caches=("hot",), concurrency=(2,), repeat=1, verify="full",
        ceiling_gbps=1.0, first_step=False, progress=False, **kw,
    )  # fmt: skip
    telemetry = setup_telemetry(tmp_path / f"traces-{strategy}")
    try:
        runner = RestoreRunner(location, options, CheckpointTracer(telemetry.provider))
        runner.run_once(strategy, "hot", 2, 0)
    finally:
        telemetry.shutdown()
    spans = read_spans(telemetry.trace_file)
    (root,) = [s for s in spans if s["name"] == "ckpt.restore"]
    return runner.state.digest(), root, children(spans, root), spans


@pytest.mark.parametrize(("layout", "ranks", "world"), [("torch", 1, None), ("dcp", 2, 1)])
def test_the_same_state_as_ckptprofs_own_fetch(layout, ranks, world, s3_bucket, s3_env, tmp_path):
    s3_env()
    location = s3_generate(s3_bucket.name, layout, ranks, optimizer=False)
    digest, root, phases, spans = restored(location, "s3torchconnector", tmp_path, world_size=world)
    expected, *_ = restored(location, "pipelined", tmp_path, world_size=world)
    assert digest == expected
    assert root["attributes"]["ckpt.strategy"] == "s3torchconnector"
    assert root["attributes"]["ckpt.loader"] == "s3torchconnector"
    assert {"ckpt.list", "ckpt.fetch", "ckpt.verify", "ckpt.deserialize"} <= set(phases)
    fetch = phases["ckpt.fetch"]["attributes"]
    assert fetch["ckpt.loader"] == "s3torchconnector" and fetch["ckpt.bytes"] > 0
    manifest = json.loads(open_storage(location).read_bytes(MANIFEST_NAME))
    assert fetch["ckpt.bytes"] == sum(f["size"] for f in manifest["files"].values())
    if layout == "dcp":  # its S3StorageReader under dcp.load: one interval, said so
        assert "S3StorageReader" in phases["ckpt.deserialize"]["attributes"]["ckpt.fused"]
    else:
        assert phases["ckpt.reshard"]["attributes"]["ckpt.bytes"] > 0


def test_a_local_path_or_no_credentials_is_one_clear_line(checkpoints, s3_bucket, s3_env):
    local = run_cli("synth", "restore", str(checkpoints("torch")), "--strategy",
                    "s3torchconnector", "--cache", "hot", "--repeat", "1")  # fmt: skip
    assert_one_line_error(local, "--strategy s3torchconnector reads s3://", "pipelined")
    env = s3_env()
    location = s3_generate(s3_bucket.name, "torch", optimizer=False)
    env.update(AWS_ACCESS_KEY_ID="", AWS_SECRET_ACCESS_KEY="")  # no AWS_PROFILE either
    bare = run_cli("synth", "restore", location, "--strategy", "s3torchconnector",
                   "--cache", "hot", "--repeat", "1", env=env)  # fmt: skip
    assert_one_line_error(bare, "AWS_ACCESS_KEY_ID", "CKPTPROF_S3_INSTANCE_CREDENTIALS=1")
