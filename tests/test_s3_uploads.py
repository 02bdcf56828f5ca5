"""S3 multipart uploads on the real SeaweedFS: a part size S3 would refuse is refused before
any byte moves, at every place an upload starts; every failed upload is aborted, whatever
ends it (the server's error, Ctrl-C, a local error while serializing); and ``--force``
aborts the uploads a killed save left open under its prefix, and only there."""

from __future__ import annotations

import ast
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

import ckptprof
from ckptprof.errors import CkptprofError, StorageError
from ckptprof.storage import multipart, open_storage
from ckptprof.synth.ceiling import WRITE_PROBE_NAME, probe_write
from ckptprof.synth.generate import generate
from ckptprof.synth.layouts import get_layout
from ckptprof.synth.options import SaveOptions
from ckptprof.synth.plan import SynthSpec
from ckptprof.synth.save import build_state, run_save
from ckptprof.synth.savers import SaveContext, save
from ckptprof.tracing import CheckpointTracer, setup_telemetry
from tests.conftest import TINY_SCALE
from tests.s3infra import _Fault, _ProxyHandler

MiB = 1 << 20


def open_uploads(bucket) -> list[str]:
    """The keys of the multipart uploads still open in the bucket."""
    listed = bucket.client.list_multipart_uploads(Bucket=bucket.name)
    return sorted(u["Key"] for u in listed.get("Uploads", []))


def fresh_location(bucket, name: str = "ckpt") -> str:
    return f"s3://{bucket.name}/{uuid.uuid4().hex[:8]}/{name}"


# ------------------------------------------------------------------ the rule


@pytest.mark.parametrize(
    "size, part_size, refused",
    [
        (20 * MiB, 5 * MiB, None),
        (20 * MiB, 5 * MiB - 1, "at least 5 MiB"),
        (20 * MiB, 4096, "at least 5 MiB"),
        (4096, 4096, None),  # one PUT: any part size that holds it
        (5 * MiB, 4 * MiB, "at least 5 MiB"),  # the last part may be small, not the first
        (6 << 30, 8 << 30, "5 GiB one PUT"),
        (20 << 30, 6 << 30, "at most 5 GiB"),
        (10_000 * 8 * MiB, 8 * MiB, None),  # exactly 10,000 parts
        (10_000 * 8 * MiB + 1, 8 * MiB, "10,001 parts"),
    ],
)
def test_s3s_part_rules(size, part_size, refused):
    found = multipart.problem(size, part_size)
    assert found is None if refused is None else refused in found
    smallest = multipart.smallest_part_size(size)
    assert multipart.problem(size, smallest) is None  # the fix the refusal gives works
    if size > smallest - MiB:  # and a MiB less does not (where it is still a multipart)
        assert multipart.problem(size, smallest - MiB) is not None


def test_a_refusal_names_the_option_and_the_smallest_part_size_that_works():
    with pytest.raises(CkptprofError) as refused:
        multipart.check_part_size(1 << 30, 4 << 20, "s3://b/ckpt/model.pt")
    assert str(refused.value) == (
        "--part-size 4M: s3://b/ckpt/model.pt (1.07 GB) needs parts of at least 5 MiB (every "
        "part but the last) on S3; use --part-size 5M or more."
    )
    with pytest.raises(CkptprofError, match=r"10,240 parts.*use --part-size 11M or more"):
        multipart.check_part_size(100 << 30, 10 << 20, "s3://b/ckpt/model.pt")


# ------------------------------------------------------------------ every place an upload starts

#: the calls that start a multipart upload (boto3's own, and the storage's part writer)
UPLOAD_STARTS = {"create_multipart_upload", "upload_file", "upload_fileobj", "open_writer"}


def upload_sites() -> set[str]:
    """Every function (``module.Class.function``) of ckptprof's own code that starts a
    multipart upload."""
    root = Path(ckptprof.__file__).parent
    sites = set()
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            scopes = node.body if isinstance(node, ast.ClassDef) else [node]
            owner = f"{node.name}." if isinstance(node, ast.ClassDef) else ""
            for scope in scopes:
                if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                calls = [n.func for n in ast.walk(scope) if isinstance(n, ast.Call)]
                if any(isinstance(f, ast.Attribute) and f.attr in UPLOAD_STARTS for f in calls):
                    sites.add(f"{module}.{owner}{scope.name}")
    return sites


def tracer_for(tmp_path) -> tuple:
    telemetry = setup_telemetry(tmp_path / "traces")
    return telemetry, CheckpointTracer(telemetry.provider, framework="synthetic",
                                       stall_after_s=None)  # fmt: skip


def parallel_save(location: str, tmp_path, part_size: int, *, files=None, drop=None, conc=2):
    """One ``parallel`` save of a tiny torch checkpoint through the savers, in this process
    (``drop``: a tensor left out of the state, so serializing its file fails)."""
    spec = SynthSpec("llama2-7b", "torch", TINY_SCALE, files=files)
    plan = get_layout("torch").plan(spec)
    tensors = build_state(plan)
    if drop is not None:
        del tensors[plan.data_files[drop].pieces[0]]
    telemetry, tracer = tracer_for(tmp_path)
    try:
        with tracer.save({}) as op:
            save("parallel", SaveContext(
                storage=open_storage(location), plan=plan, tensors=tensors, op=op, fsync=False,
                concurrency=conc, part_size=part_size, tracer=tracer,
            ))  # fmt: skip
    finally:
        telemetry.shutdown()


def start_with_small_parts(site: str, location: str, tmp_path) -> None:
    """Start ``site``'s upload with 1 MiB parts (S3 refuses them only at the completion)."""
    if site == "ckptprof.storage.s3_writer.S3FileWriter.__init__":  # reached through open_writer
        open_storage(location).open_writer("model.pt", 8 * MiB, MiB)
    elif site == "ckptprof.synth.ceiling.probe_write":
        probe_write(open_storage(location), 64 * MiB, MiB, concurrency=2, fsync=False)
    elif site == "ckptprof.synth.savers.parallel.Parallel.save":
        parallel_save(location, tmp_path, MiB)
    elif site == "ckptprof.synth.save.run_save":  # before the state is built or DEST claimed
        options = SaveOptions(repeat=1, strategy="parallel", part_size=MiB)
        spec = SynthSpec("llama2-7b", "torch", TINY_SCALE)
        run_save(location, spec, options, tracer=None, echo=print)
    else:
        raise AssertionError(site)


#: each place an upload starts: True where it is given a part size, False where it picks
#: its own (generate's upload_file: the rule's part size, checked below)
SITES = {
    "ckptprof.storage.s3_writer.S3FileWriter.__init__": True,
    "ckptprof.synth.ceiling.probe_write": True,
    "ckptprof.synth.savers.parallel.Parallel.save": True,
    "ckptprof.storage.s3.S3Storage.staging_file": False,
}


def test_every_place_an_upload_starts_is_known():
    assert upload_sites() == set(SITES)


@pytest.mark.parametrize(
    "site", [s for s, given in SITES.items() if given] + ["ckptprof.synth.save.run_save"]
)
def test_a_part_size_s3_refuses_is_refused_before_any_byte_moves(site, s3_bucket, s3_env,
                                                                 tmp_path):  # fmt: skip
    s3_env()
    location = fresh_location(s3_bucket)
    with pytest.raises(CkptprofError, match=r"^--part-size 1M: .* use --part-size 5M or more"):
        start_with_small_parts(site, location, tmp_path)
    prefix = location.split("/", 3)[3]
    listed = s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name, Prefix=prefix)
    assert not listed.get("Contents")  # nothing claimed, probed or uploaded
    assert not open_uploads(s3_bucket)


@pytest.mark.parametrize("size", [1, 16 * MiB + 1, 5 << 30, 160 << 30, 1 << 40, 40 << 40])
def test_generations_uploads_pick_a_part_size_s3_takes(size):
    """``staging_file`` (boto3's upload_file) picks its own parts: the default, or the
    smallest the rule allows for the file."""
    from ckptprof.storage.base import DEFAULT_PART_SIZE

    assert multipart.problem(size, multipart.part_size_for(size, DEFAULT_PART_SIZE)) is None


def test_the_cli_refuses_in_one_line_and_posix_keeps_small_parts(s3_bucket, s3_env, tmp_path,
                                                                 capsys):  # fmt: skip
    from ckptprof.cli import main
    from ckptprof.synth.save import check

    s3_env()
    location = fresh_location(s3_bucket)
    argv = ["synth", "save", location, "--scale", str(TINY_SCALE), "--strategy", "parallel",
            "--part-size", "4M", "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"ckptprof: error: --part-size 4M: {location}/checkpoint_rank0.pt (21.78 MB) needs "
        "parts of at least 5 MiB (every part but the last) on S3; use --part-size 5M or more."
    ]
    assert not open_uploads(s3_bucket)
    spec = SynthSpec("llama2-7b", "torch", TINY_SCALE)  # a file system takes 4K writes
    check(str(tmp_path / "local"), spec, SaveOptions(strategy="parallel", part_size=4096))


# ------------------------------------------------------------------ every failed upload aborted


class Faults(_ProxyHandler):
    """Answers the requests ``fail`` picks with an S3 error; calls ``on_part`` as each
    UploadPart arrives."""

    fail = staticmethod(lambda command, path: None)
    on_part = staticmethod(lambda: None)

    def _handle(self):
        if self.command == "PUT" and "partNumber=" in self.path:
            type(self).on_part()
        fault = type(self).fail(self.command, self.path)
        if fault is None:
            return super()._handle()
        for _ in self._iter_body():
            pass
        self._send_fault(fault)


def through_faults(fault_proxy, s3_env, **handlers) -> None:
    s3_env(endpoint_url=fault_proxy.endpoint_url, max_attempts=1)
    fault_proxy._server.RequestHandlerClass = type("Injected", (Faults,), {
        name: staticmethod(handler) for name, handler in handlers.items()})  # fmt: skip


def test_an_upload_the_server_fails_is_aborted(s3_bucket, s3_env, fault_proxy, tmp_path):
    parts = iter(range(1, 100))

    def second_part(command, path):
        second = command == "PUT" and "partNumber=" in path and next(parts) == 2
        return _Fault(500, "InternalError") if second else None

    through_faults(fault_proxy, s3_env, fail=second_part)
    with pytest.raises(StorageError, match="InternalError"):
        parallel_save(fresh_location(s3_bucket), tmp_path, 5 * MiB)
    assert not open_uploads(s3_bucket)


def test_an_abort_the_server_refuses_is_said_and_the_saves_own_error_raised(
    s3_bucket, s3_env, fault_proxy, tmp_path, caplog
):
    """The server fails a part, then the abort too (it went down): the part's error is the
    one raised, and one warning names the upload left open and what aborts it later."""

    def part_and_abort(command, path):
        failing = "partNumber=" in path or (command == "DELETE" and "uploadId=" in path)
        return _Fault(500, "InternalError") if failing else None

    through_faults(fault_proxy, s3_env, fail=part_and_abort)
    location = fresh_location(s3_bucket)
    with pytest.raises(StorageError, match="InternalError"):
        parallel_save(location, tmp_path, 5 * MiB, conc=1)
    [warning] = [r.getMessage() for r in caplog.records if "could not abort" in r.getMessage()]
    assert warning.startswith(
        f"ckptprof: warning: could not abort an unfinished upload ({location}/checkpoint_rank0"
        ".pt: InternalError "
    )
    assert warning.endswith("); a --force save or generate there aborts it.")
    assert open_uploads(s3_bucket) == [f"{location.split('/', 3)[3]}/checkpoint_rank0.pt"]


def test_an_upload_refused_at_its_completion_is_aborted(s3_bucket, s3_env, fault_proxy,
                                                        tmp_path):  # fmt: skip
    """S3's answer to a part size it refuses: every part accepted, the completion not."""

    def completion(command, path):
        done = command == "POST" and "uploadId=" in path
        return _Fault(400, "EntityTooSmall") if done else None

    through_faults(fault_proxy, s3_env, fail=completion)
    with pytest.raises(StorageError, match="EntityTooSmall"):
        parallel_save(fresh_location(s3_bucket), tmp_path, 5 * MiB, files=2)
    assert not open_uploads(s3_bucket)


def test_ctrl_c_mid_upload_stops_the_parts_and_aborts(s3_bucket, s3_env, fault_proxy, tmp_path):
    """SIGINT to the main thread as the first part reaches the server: the parts not
    started are never sent (the file has five), and the upload is aborted."""
    main, sent = threading.main_thread().ident, []

    def interrupt():
        sent.append(1)
        if len(sent) == 1:
            signal.pthread_kill(main, signal.SIGINT)
        time.sleep(1.0)  # each part ends well after the interrupt has been seen

    through_faults(fault_proxy, s3_env, on_part=interrupt)
    with pytest.raises(KeyboardInterrupt):
        parallel_save(fresh_location(s3_bucket), tmp_path, 5 * MiB, conc=2)
    assert len(sent) <= 2  # the two in flight; the other three cancelled
    assert not open_uploads(s3_bucket)


def test_a_local_error_while_serializing_aborts_the_uploads_before_it(s3_bucket, s3_env,
                                                                      tmp_path):  # fmt: skip
    s3_env()
    with pytest.raises(KeyError):  # the second file's tensor is missing
        parallel_save(fresh_location(s3_bucket), tmp_path, 5 * MiB, files=2, drop=1)
    assert not open_uploads(s3_bucket)


def test_a_generations_upload_cut_by_ctrl_c_is_aborted(s3_bucket, s3_env, fault_proxy):
    """``generate`` uploads through boto3's ``upload_file`` (16 MiB parts: the 22 MB file is
    two): SIGINT as its second part arrives."""
    main, parts = threading.main_thread().ident, []

    def on_part():
        parts.append(1)
        if len(parts) == 2:
            signal.pthread_kill(main, signal.SIGINT)

    through_faults(fault_proxy, s3_env, on_part=on_part)
    with pytest.raises(KeyboardInterrupt):
        generate(fresh_location(s3_bucket), SynthSpec("llama2-7b", "torch", TINY_SCALE),
                 progress=False)  # fmt: skip
    assert len(parts) >= 2
    assert not open_uploads(s3_bucket)


# ------------------------------------------------------------------ --force aborts stale uploads


def leave_open(bucket, key: str) -> None:
    """What a save killed mid-upload (or a server that crashed) leaves: an upload with a
    part, never completed nor aborted."""
    upload = bucket.client.create_multipart_upload(Bucket=bucket.name, Key=key)["UploadId"]
    bucket.client.upload_part(Bucket=bucket.name, Key=key, UploadId=upload, PartNumber=1,
                              Body=b"x" * 1024)  # fmt: skip


def test_force_aborts_the_uploads_left_open_under_its_prefix_only(s3_bucket, s3_env, tmp_path):
    s3_env()
    location = fresh_location(s3_bucket)
    prefix = location.split("/", 3)[3]
    spec = SynthSpec("llama2-7b", "torch", 0.0001)  # 4 MB: the open uploads are the point
    generate(location, spec, progress=False, echo=print)
    others = [f"{prefix}2/checkpoint_rank0.pt", f"{prefix.rsplit('/', 1)[0]}/other/x.pt"]
    for key in others:  # a neighbour's, whose key starts with the same letters, and a sibling's
        leave_open(s3_bucket, key)
    leave_open(s3_bucket, f"{prefix}/checkpoint_rank0.pt")
    leave_open(s3_bucket, f"{prefix}/{WRITE_PROBE_NAME}")
    said: list[str] = []
    options = SaveOptions(repeat=1, strategy="parallel", force=True, ceiling_gbps=1.0)
    telemetry, tracer = tracer_for(tmp_path)
    try:
        run_save(location, spec, options, tracer, echo=said.append)
    finally:
        telemetry.shutdown()
    assert said[0] == (
        f"{location}: aborted 2 unfinished multipart uploads left there by a save or "
        "generation that did not finish."
    )
    assert open_uploads(s3_bucket) == sorted(others)
    leave_open(s3_bucket, f"{prefix}/checkpoint_rank0.pt")
    said.clear()
    generate(location, spec, force=True, progress=False, echo=said.append)
    assert said == [
        f"{location}: aborted 1 unfinished multipart upload left there by a save or "
        "generation that did not finish."
    ]
    assert open_uploads(s3_bucket) == sorted(others)
