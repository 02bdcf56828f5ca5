"""The synthetic restore as a distributed job: one process per rank, launched by PyTorch.

Shared storage behaves differently when many ranks read at once, so each rank of the
job is a process that restores what that rank of the target job holds, through the same
engine as a one-process restore. Launching, rendezvous and failure detection are
PyTorch's own (``torch.distributed.run``, the engine behind ``torchrun``):
``--nproc-per-node N`` starts it on this machine, and ``torchrun --nnodes … -m ckptprof
synth restore …`` runs it across nodes. The ranks start every run together (a barrier
after cache preparation, done once per node), share one trace id per run, and rank 0
gathers every rank's records; the job's RTO is its slowest rank's (the MLPerf rule).
"""

from __future__ import annotations

import faulthandler
import os
import secrets
import socket
from dataclasses import dataclass
from datetime import timedelta

from ckptprof.errors import CkptprofError
from ckptprof.phases import Attr

TIMEOUT_ENV = "CKPTPROF_DIST_TIMEOUT"  # seconds a collective may wait for the other ranks
DEFAULT_TIMEOUT_S = 600.0
QUOTED_ENV = "CKPTPROF_LAUNCHER_QUOTES_ERRORS"  # set by launch(): ranks leave the line to it


@dataclass
class Job:
    """This process's place in the job (from the launcher's environment)."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    node: int  # the launcher's group rank: one per node (agent)
    host: str
    backend: str = "gloo"

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def broadcast(self, value):
        """Rank 0's ``value`` on every rank."""
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value) -> list | None:
        """Every rank's ``value`` on rank 0 (in rank order); None elsewhere."""
        import torch.distributed as dist

        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(value, out, dst=0)
        return out

    def close(self, finished: bool) -> None:
        """Leave the job. A rank that ``finished`` waits at a last barrier first, so no
        rank tears down its connections while another is still inside a collective with
        it (gloo aborts the process that sees a peer vanish mid-collective); a failed
        rank leaves at once, and the launcher stops the others."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        try:
            if finished:
                dist.barrier()
        finally:
            dist.destroy_process_group()

    def attributes(self) -> dict:
        return {
            Attr.LOCAL_RANK: self.local_rank,
            Attr.NODE: self.node,
            Attr.HOST: self.host,
            Attr.DIST_BACKEND: self.backend,
        }


def launched() -> bool:
    """Started by torch.distributed.run (torchrun) as one rank of a job: its agent sets
    ``TORCHELASTIC_RUN_ID``. (``RANK``/``MASTER_ADDR`` alone, as a batch script may export
    for its own job, do not make ckptprof wait for a rendezvous.)"""
    return bool(os.environ.get("TORCHELASTIC_RUN_ID")) and "RANK" in os.environ


def join(device_type: str = "cpu") -> Job:
    """Join the job the launcher started (gloo on CPU, nccl when every rank has a GPU);
    every collective waits at most ``$CKPTPROF_DIST_TIMEOUT`` seconds."""
    import torch.distributed as dist

    env = os.environ
    try:
        timeout = float(env.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    except ValueError:
        raise CkptprofError(
            f"{TIMEOUT_ENV}={env[TIMEOUT_ENV]!r} is not a number of seconds."
        ) from None
    job = Job(
        rank=int(env["RANK"]),
        world=int(env["WORLD_SIZE"]),
        local_rank=int(env.get("LOCAL_RANK", 0)),
        local_world=int(env.get("LOCAL_WORLD_SIZE", 1)),
        node=int(env.get("GROUP_RANK", 0)),
        host=socket.gethostname(),
        backend="nccl" if device_type == "cuda" else "gloo",
    )
    # a rank that aborts in native code (gloo, c10d) prints the Python stack of each of
    # its threads first: otherwise its only trace is the C++ runtime's one line
    faulthandler.enable(all_threads=True)
    if job.backend == "nccl":
        import torch

        torch.cuda.set_device(rank_gpu(job.local_rank, torch.cuda.device_count()))
    dist.init_process_group(job.backend, timeout=timedelta(seconds=timeout))
    return job


def rank_gpu(local_rank: int, visible: int) -> int:
    """The GPU a rank restores onto: its local rank's, or the one it sees where the
    scheduler shows each rank a single GPU (CUDA_VISIBLE_DEVICES per rank)."""
    if visible == 1:
        return 0
    if local_rank < visible:
        return local_rank
    raise CkptprofError(
        f"local rank {local_rank} sees {visible} CUDA device(s): give each rank one GPU "
        "(--nproc-per-node at most the GPUs here), or --device cpu."
    )


def job_context(job: Job):
    """The parent every rank's span of one run hangs from: the same trace id and parent
    span id on every rank (rank 0 draws them), so a trace viewer shows the run as one
    trace with a span per rank."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    trace_id, span_id = job.broadcast((secrets.randbits(128) or 1, secrets.randbits(64) or 1))
    context = SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)
    )
    return trace.set_span_in_context(NonRecordingSpan(context))


def launch(nproc: int, argv: list[str], what: str = "restore") -> int:
    """Run ``ckptprof ARGV`` as ``nproc`` ranks on this machine through
    torch.distributed.run (a standalone rendezvous on 127.0.0.1); a failed rank is one
    line naming it and its exit code."""
    import tempfile

    # the launcher's own files (each rank's error file) in a folder removed after the run,
    # never a torchelastic_* folder left in the machine's temporary folder per launch
    with tempfile.TemporaryDirectory(prefix="ckptprof-launch-") as logs:
        return _launch(nproc, argv, what, logs)


def _launch(nproc: int, argv: list[str], what: str, logs: str) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(
        [
            "--standalone",
            "--log-dir",
            logs,
            "--nproc-per-node",
            str(nproc),
            "--max-restarts",
            "0",
            "--monitor-interval",
            "0.2",
            "-m",
            "ckptprof",
            *argv,
        ]
    )
    _quiet_launcher()
    # what the launcher would set for each rank anyway, minus its warning about it
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ[QUOTED_ENV] = "1"
    try:
        run(args)
    except ChildFailedError as exc:
        rank, failure = _root_cause(exc.failures)
        message = _failure_message(failure)
        how = (
            f"was killed by signal {-failure.exitcode}"
            if failure.exitcode < 0
            else f"exited with code {failure.exitcode}"
        )
        raise CkptprofError(
            f"rank {rank} of {nproc} {how} during the {what}"
            + (f": {message.rstrip('.')}" if message else " (its output is above)")
            + "; the other ranks were stopped."
        ) from None
    return 0


def _root_cause(failures: dict):
    """The rank that failed first on its own: not one the agent stopped (SIGTERM) after."""
    import signal

    stopped = (-signal.SIGTERM, 128 + signal.SIGTERM)  # killed, or exited on it cleanly

    def order(item):
        rank, failure = item
        return (failure.exitcode in stopped, failure.timestamp, rank)

    return min(failures.items(), key=order)


def _failure_message(failure) -> str:
    """The failed rank's own one-line error, where it wrote one."""
    message = getattr(failure, "message", "")
    if isinstance(message, dict):  # a traceback recorded by torchelastic's @record
        message = message.get("message", "")
    text = str(message or "").strip().splitlines()
    if not text or text[0].startswith(("To enable traceback", "Signal ")):
        return ""
    return text[0].removeprefix("CkptprofError: ")


def _quiet_launcher() -> None:
    """The launcher's log lines (rendezvous, worker groups, which worker it stopped) are
    noise in a report; a failure is the one line :func:`launch` raises."""
    import logging

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    logging.getLogger("torch.distributed.run").setLevel(logging.CRITICAL)


def record_error(message: str) -> bool:
    """Hand a rank's one-line error to the launcher (its error file): torchrun shows it
    in its failure summary, and ``--nproc-per-node``'s one line quotes it. True when the
    rank may stay silent (that one line will carry it)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return False
    import json
    import time

    from ckptprof.atomic import atomic_write

    try:
        atomic_write(path, json.dumps({"message": message, "timestamp": int(time.time())}))
    except OSError:
        return False
    return os.environ.get(QUOTED_ENV) == "1"


__all__ = ["Job", "job_context", "join", "launch", "launched", "record_error"]
