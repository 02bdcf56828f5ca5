"""Shared fixtures: small real checkpoints and fresh telemetry per test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckptprof.synth.generate import generate
from ckptprof.synth.plan import SynthSpec

# A real S3 server (SeaweedFS) on 127.0.0.1 and a fault-injecting proxy: tests/s3infra.py
pytest_plugins = ["tests.s3infra"]

# Text is wrapped to the terminal: one width for every test, whatever runs them (a tty,
# CI's pipe, an xdist worker), so a report's lines are the same everywhere.
os.environ["COLUMNS"] = "100"

# One compute thread per process: the suite runs one process per core (xdist), where a
# second OpenMP thread only spins against the other worker's (the restore matrix took 13%
# less CPU). Subprocesses inherit it; a test that needs it unset passes None to run_cli.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# real tensor names and counts of llama2-7b, widths shrunk: ~140 MB with Adam state
SMALL_SCALE = 0.002
TINY_SCALE = 0.0005


def file_record(path: Path) -> dict | None:
    """ckptprof's record of a saved checkpoint file, from the test's state location."""
    from ckptprof.integrations.save_records import FILE_RECORD_SUFFIX
    from ckptprof.state import StateStore

    raw = StateStore().read(str(path.parent), path.name + FILE_RECORD_SUFFIX)
    return json.loads(raw) if raw else None


def folder_record_path(folder: Path, rank: int = 0) -> Path:
    """Where one rank's record of the files it saved into ``folder`` lives."""
    from ckptprof.integrations.save_records import FOLDER_RECORD
    from ckptprof.state import StateStore

    location = Path(StateStore().location(str(folder.parent)))
    return location / folder.name / FOLDER_RECORD.format(rank=rank)


def folder_record(folder: Path, rank: int = 0) -> dict | None:
    """One rank's record of the files it saved into a checkpoint folder."""
    path = folder_record_path(folder, rank)
    return json.loads(path.read_text()) if path.exists() else None


def interruption_record_path(checkpoint_dir: Path) -> Path:
    """Where the interruption record about ``checkpoint_dir`` lives (the state location)."""
    from ckptprof.interrupt.record import RECORD_NAME
    from ckptprof.state import StateStore

    return Path(StateStore().location(str(checkpoint_dir))) / RECORD_NAME


def ours_in(directory: Path) -> list[str]:
    """Files of ckptprof's anywhere under ``directory`` (a user's checkpoint folder)."""
    return sorted(str(p) for p in Path(directory).rglob("*ckptprof*"))


def assert_memory_recorded(restore: dict) -> None:
    """A restore span carries the process's memory: sampled while it ran, never below
    where it started (a job's own peak counters are never reset for it)."""
    attrs = restore["attributes"]
    assert attrs["ckpt.memory.peak_rss_bytes"] >= attrs["ckpt.memory.start_rss_bytes"] > 0


def read_spans(trace_file: Path) -> list[dict]:
    return [json.loads(line) for line in Path(trace_file).read_text().splitlines() if line]


RESTORE_PHASES = {
    "ckpt.list",
    "ckpt.fetch",
    "ckpt.verify",
    "ckpt.deserialize",
    "ckpt.reshard",
    "ckpt.first_step",
}


def spans_in(directory: Path) -> list[dict]:
    """Every span of every trace file in ``directory``."""
    return [s for f in sorted(directory.glob("*.jsonl")) for s in read_spans(f)]


def children(spans: list[dict], root: dict) -> dict[str, dict]:
    """The phase spans of ``root``, by name (its in-progress records are no phase)."""
    return {
        s["name"]: s
        for s in spans
        if s["parent_id"] == root["context"]["span_id"] and s["name"] != "ckpt.progress"
    }


def sigterm_when(command: list[str], ready: Path, **popen) -> tuple[int, str]:
    """Run ``command``; once ``ready`` exists (a checkpoint it saved), send it a real
    SIGTERM mid-training. Returns its exit status and stderr."""
    import signal
    import time

    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    )
    deadline = time.monotonic() + 120
    while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    return proc.returncode, stderr


def saved_by(restore: dict) -> list[str]:
    """The span ids of the saves a restore links back to (``ckpt.link=saved_by``)."""
    return [
        link["context"]["span_id"]
        for link in restore.get("links") or []
        if (link.get("attributes") or {}).get("ckpt.link") == "saved_by"
    ]


def linked_story(spans: list[dict]) -> tuple[dict, dict]:
    """The one ``ckpt.interruption`` root and the one restore, which links back to it."""
    (story,) = [s for s in spans if s["name"] == "ckpt.interruption"]
    (restore,) = [s for s in spans if s["name"] == "ckpt.restore"]
    to_story = [link for link in restore["links"] if link["context"]["trace_id"]
                == story["context"]["trace_id"] and not saved_by({"links": [link]})]  # fmt: skip
    assert [link["context"]["span_id"] for link in to_story] == [story["context"]["span_id"]]
    # and to the save that wrote what it read: the newest save of those files, which is
    # the emergency save or a regular one that followed it; a process killed right after
    # that later save may lose its span, so a link is checked where its span was written
    paths = (restore["attributes"]["ckpt.path"], restore["attributes"]["ckpt.path"] + ".partial")
    saves = {s["context"]["span_id"]: s for s in spans if s["name"] == "ckpt.save"}
    (save_id,) = saved_by(restore)
    (emergency,) = [s for s in spans if s["name"] == "ckpt.emergency_save"]
    assert emergency["parent_id"] == story["context"]["span_id"]
    under_emergency = [
        s for s in saves.values() if s["parent_id"] == emergency["context"]["span_id"]
    ]
    assert under_emergency, "the emergency save's own ckpt.save span is not in the trace"
    if save_id in saves:
        assert saves[save_id]["attributes"]["ckpt.path"] in paths
        assert saves[save_id]["start_time"] < restore["start_time"]
        assert saves[save_id]["start_time"] >= under_emergency[0]["start_time"]  # the newest
    return story, restore


#: fixtures whose users share one resource and so run on one xdist worker: one SeaweedFS
#: server for every S3 test, one apt-installed Chromium for the HTML tests
SHARED_GROUPS = {"seaweed": "s3", "s3_bucket": "s3", "s3_env": "s3", "fault_proxy": "s3",
                 "browser": "browser"}  # fmt: skip


def _made_once(item) -> set[str]:
    """The test module's own fixtures, wider than a test, that ``item`` uses (real jobs made
    once for the module's tests): a worker that runs none of those tests never makes them."""
    found = set()
    for name in item.fixturenames:
        for fixturedef in item._fixtureinfo.name2fixturedefs.get(name, ()):
            module = getattr(fixturedef.func, "__module__", "")
            if fixturedef.scope != "function" and module.rpartition(".")[2].startswith("test_"):
                found.add(f"{module.rpartition('.')[2]}.{name}")
    return found


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """One xdist group per set of tests joined by what they share (a server, a browser, or
    a module's fixture made once), so each is started or made on one worker only."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    keys_of = {}
    for item in items:
        servers = {SHARED_GROUPS[f] for f in item.fixturenames if f in SHARED_GROUPS}
        assert len(servers) <= 1, f"{item.nodeid} needs two shared servers"  # one at most
        keys_of[item] = sorted(servers) + sorted(_made_once(item))
        if servers:  # it needs a server or a browser started: not for the quick tier
            item.add_marker(pytest.mark.slow)
        for key in keys_of[item]:
            parent[root(key)] = root(keys_of[item][0])
    for item, keys in keys_of.items():
        if keys and item.get_closest_marker("xdist_group") is None:
            group = root(keys[0])
            server = next(
                (k for k in parent if root(k) == group and k in SHARED_GROUPS.values()), None
            )
            item.add_marker(pytest.mark.xdist_group(server or group))


def pytest_xdist_auto_num_workers(config) -> int:
    """A worker per core and one more: the suite's jobs wait a part of their time (sleeps
    held on purpose, launchers, servers starting; 1.63 of 2 cores were busy with one per
    core), and each test process has one compute thread (above)."""
    return (os.cpu_count() or 1) + 1


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch) -> Path:
    """ckptprof's records (manifests, interruption records) for this test only, never in
    the machine's own state location; subprocesses inherit it."""
    location = tmp_path / "ckptprof-state"
    monkeypatch.setenv("CKPTPROF_STATE_DIR", str(location))
    return location


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """Generate each layout once per session; tests must not modify these."""
    cache: dict[tuple, Path] = {}

    def get(layout: str, ranks: int = 1, scale: float = TINY_SCALE, **kw) -> Path:
        key = (layout, ranks, scale, tuple(sorted(kw.items())))
        if key not in cache:
            dest = tmp_path_factory.mktemp(f"ckpt-{layout}-{ranks}")
            generate(
                str(dest),
                SynthSpec(model="llama2-7b", layout=layout, scale=scale, ranks=ranks, **kw),
                force=True,
                progress=False,
            )
            cache[key] = dest
        return cache[key]

    return get


def interrupted_generation(dest: Path, after_files: int, monkeypatch) -> None:
    """A real generation that dies after ``after_files`` files (as a full disk or a kill
    mid-write would leave it): the generation record is there, no manifest."""
    from ckptprof.synth import generate as gen
    from ckptprof.synth.plan import SynthSpec

    write_one, written = gen._write_one, []

    def dying(*args):
        if len(written) == after_files:
            raise OSError(28, "No space left on device")
        written.append(args[3].path)
        return write_one(*args)

    with monkeypatch.context() as patch:
        patch.setattr(gen, "_write_one", dying)
        with pytest.raises(OSError):
            gen.generate(str(dest), SynthSpec("llama2-7b", "torch", TINY_SCALE, files=4),
                         progress=False)  # fmt: skip


CHROMIUM = "/usr/bin/chromium"
#: how Chromium starts on a closed network, as root, with nothing of the user's profile
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def browser():
    """A real headless Chromium (Debian's package, installed here when missing) driven by
    Playwright; the HTML report is checked the way a person opens it."""
    if not os.path.exists(CHROMIUM) and os.geteuid() == 0 and shutil.which("apt-get"):
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "timeout": 900}
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, **quiet)
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"]
        done = subprocess.run(install, env=env, check=False, **quiet)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (as root) for the HTML tests")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


#: gloo's sockets on the loopback interface only (tests contact nothing but 127.0.0.1)
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def run_cli(
    *args: str, env: dict | None = None, timeout: float = 600, **popen
) -> subprocess.CompletedProcess:
    """Run the real ``ckptprof`` command in a subprocess (``popen``: e.g. ``preexec_fn``;
    ``env``: variables to set, or to unset where None)."""
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    full_env.pop("CKPTPROF_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "ckptprof", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        **popen,
    )


@pytest.fixture
def s3_env(monkeypatch, seaweed, tmp_path):
    """Point boto3 (through the standard variables only) at the loopback server."""

    def configure(endpoint_url: str | None = None, credentials=None, max_attempts: int = 3):
        key, secret = credentials or seaweed.admin_credentials
        for name in list(os.environ):
            if name.startswith("AWS_"):
                monkeypatch.delenv(name)
        config = tmp_path / "aws-config"
        config.write_text("[default]\ns3 =\n    addressing_style = path\n")
        monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint_url or seaweed.endpoint_url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("AWS_RETRY_MODE", "standard")
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", str(max_attempts))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        return dict(os.environ)

    return configure


def traced_job(
    traces: Path, checkpoint_dir: Path, processes: int = 2, steps: int = 6, notice: bool = False
) -> None:
    """A job restarted ``processes - 1`` times, in this process: each life is a real
    TracingSession (the lifetime, save and restore code every adapter runs) that trains
    ``steps`` steps, saves once halfway (a real file into ``checkpoint_dir``) and closes;
    each after the first resumes from the last save. With ``notice``, the first life gets
    a Spot notice before its last step: a real InterruptionGuard saves at that step
    boundary, and the next life's restore tells the story (its start is the restart).
    Its ``ckpt.run`` spans are what ``report --goodput`` reads."""
    import time
    from unittest import mock

    from ckptprof.integrations.session import TracingSession
    from ckptprof.interrupt import guard as guards
    from ckptprof.interrupt.notice import Notice
    from ckptprof.phases import Attr

    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    records = checkpoint_dir.parent / f"{checkpoint_dir.name}-records"
    saved, resumed = None, 0
    for life in range(processes):
        session = TracingSession("test", trace_dir=traces, rank=0)
        session.checkpoint_dir = lambda: str(checkpoint_dir)
        session.start()

        def save(session=session, step_of=lambda: session.lifetime.last_step):
            nonlocal saved, resumed
            saved, resumed = checkpoint_dir / f"step-{step_of()}.pt", step_of()
            with session.saving({Attr.PATH: str(saved), Attr.STEP: resumed}):
                saved.write_bytes(b"\0" * 4096)
            return str(saved)

        guard = None
        if notice:
            guard = guards.InterruptionGuard(session, lambda: str(records), save, sources=[])
            session.interruptions = guard.start()
        first = resumed
        if saved is not None:
            with mock.patch.object(guards, "process_start_ns", time.time_ns):  # a new process
                session.begin_restore({Attr.PATH: str(saved), Attr.RESTORED_STEP: resumed})
            saved.read_bytes()
            session.first_step_done(first + 1, announce=False)
        for step in range(first + 1, first + steps + 1):
            time.sleep(0.01)
            session.step_ended(step)
            if step == first + steps // 2:
                save()
            if guard is not None and life == 0 and step == first + steps - 1:
                now = time.time_ns()
                guard.watcher.inject(Notice("simulated", now, now + 30 * 10**9, True))
            if guard is not None:
                guard.step_end(step)
        if guard is not None:
            guard.close()
            session.interruptions = None
        session.close()
