"""A straggler named while it straggles: the rank still inside a phase every other rank
of the job has left.

Each rank publishes what its open save or restore is doing (the run's trace id, its open
phases) in the job's own c10d store, on change, at most once a second; rank 0 reads every
rank's entry as often and, when one rank has stayed inside a phase for ``stall_after``
seconds after every other rank of the same run left it (finished the run, or moved past
that phase), warns once, then at doubling intervals, naming the rank, its host and the
phase. A rank that is itself stalled says what it waits on (its own watchdog); this says
who the job waits on. Nothing here ever stops the job; a store that cannot be reached
turns it off, said once in the log.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from ckptprof.phases import RESTORE_PHASES, SAVE_PHASES, STRAGGLER_EVENT, Attr
from ckptprof.synth.distributed import Job
from ckptprof.tracing.watchdog import watchdog

log = logging.getLogger("ckptprof")

KEY = "ckptprof/phases/{rank}"
ORDER = [p.value for p in (*RESTORE_PHASES, *SAVE_PHASES)]


class PhaseBoard:
    """One rank's side of the board (rank 0 also reads it); see the module docstring."""

    def __init__(self, job: Job, stall_after_s: float | None) -> None:
        self.job, self.stall_after_s = job, stall_after_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._published = None
        self._since: dict[tuple, float] = {}  # (rank, trace, phase) -> when it straggled
        self._next: dict[tuple, float] = {}

    def start(self) -> PhaseBoard:
        if not self.stall_after_s:
            return self
        try:
            import torch.distributed as dist

            self.store = dist.distributed_c10d._get_default_store()
        except Exception as exc:  # noqa: BLE001 - a guest: no store, no board
            log.warning("ckptprof: warning: no straggler warnings (no c10d store: %s)", exc)
            return self
        self._thread = threading.Thread(target=self._run, name="ckptprof-stragglers", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self._publish()
                if self.job.rank == 0:
                    self._read()
            except Exception as exc:  # noqa: BLE001 - never breaks the job
                log.debug("ckptprof: straggler board: %s", exc)

    def _mine(self) -> dict:
        dog = watchdog()
        ops = dog.watched()
        phases = [phase for op in ops for phase in op.open_phases()]
        return {
            "trace": dog.latest_trace, "phases": phases, "open": bool(ops), "host": self.job.host,
        }  # fmt: skip

    def _publish(self) -> None:
        mine = self._mine()
        if mine != self._published:
            self.store.set(KEY.format(rank=self.job.rank), json.dumps(mine))
            self._published = mine

    def _read(self) -> None:
        keys = [KEY.format(rank=r) for r in range(self.job.world)]
        if not all(self.store.check([k]) for k in keys):
            return  # a rank that has not started yet is not a straggler
        board = {r: json.loads(self.store.get(k)) for r, k in enumerate(keys)}
        now = time.monotonic()
        found = stragglers(board)
        for rank, phase, trace in found:
            key = (rank, trace, phase)
            since = self._since.setdefault(key, now)
            due = self._next.setdefault(key, self.stall_after_s)
            if now - since >= due:
                self._next[key] = due * 2
                host = board[rank].get("host") or ""
                log.warning(
                    "ckptprof: warning: rank %d%s is still in %s %.1f s after every other rank "
                    "of the job left it: the job waits on it (a straggler; next warning after "
                    "%.0f s)", rank, f" on {host}" if host else "", phase, now - since, due * 2,
                )  # fmt: skip
                self._record(rank, phase, now - since)
        for key in [
            k for k in self._since if k not in {(r, t, p) for r, p, t in stragglers(board)}
        ]:
            self._since.pop(key, None)
            self._next.pop(key, None)

    def _record(self, rank: int, phase: str, seconds: float) -> None:
        """The warning as an event on rank 0's open operation, if any (else the log only)."""
        for op in watchdog().watched():
            op.add_stall_event(
                STRAGGLER_EVENT,
                {Attr.STRAGGLER_RANK: rank, Attr.STRAGGLER_PHASE: phase,
                 Attr.STALL_IDLE_S: round(seconds, 3)},
            )  # fmt: skip


def stragglers(board: dict[int, dict]) -> list[tuple[int, str, str]]:
    """``(rank, phase, trace)`` for each rank inside a phase that every other rank of
    the same run has left: finished the run, or inside only later phases."""
    out = []
    for rank, entry in board.items():
        trace = entry.get("trace")
        if not trace or not entry.get("open"):
            continue
        others = [e for r, e in board.items() if r != rank]
        if not others or any(e.get("trace") != trace for e in others):
            continue  # another rank has not reached this run yet (or is past it)
        for phase in entry.get("phases", []):
            if all(_left(e, phase) for e in others):
                out.append((rank, phase, trace))
    return out


def _left(entry: dict, phase: str) -> bool:
    if not entry.get("open"):
        return True  # done with the run
    later = ORDER.index(phase) if phase in ORDER else len(ORDER)
    return bool(entry["phases"]) and all(
        p != phase and (ORDER.index(p) if p in ORDER else -1) > later for p in entry["phases"]
    )


__all__ = ["PhaseBoard", "stragglers"]
