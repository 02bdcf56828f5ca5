"""The interruption story every adapter shares: notice → emergency save → record, and on
the next run: record → linked restore → downtime, steps lost, cost.

Adapters supply three things: where records live (the checkpoint folder or ``s3://``
prefix), a traced ``save()`` of the current state, and calls at step boundaries. The
guard does the rest:

* interrupted process: a notice (see :mod:`ckptprof.interrupt.notice`) opens a
  ``ckpt.interruption`` trace with a ``ckpt.notice`` span and writes a *pending* record
  at once (from a helper thread: a signal handler only sets a flag). At the next step
  boundary the adapter's save runs under ``ckpt.emergency_save`` (its ``ckpt.save`` is a
  child), the record gets the outcome (``saved``, ``missed_deadline``, ``failed``) and
  the margin to the deadline, spans are flushed (to the collector too, within a share of
  the grace left), and the signal is handed on to the handler ckptprof replaced (for the
  default action: the process ends as it would have).
* resumed process: the restore reads the record, links to the notice span, and at the
  first step records ``ckpt.interruption.notice_to_start_s`` (notice → this process
  started: the wind-down and the downtime, which the report tells apart),
  ``…startup_s`` (this process started → its restore began), ``…recovery_s`` (notice →
  first step: the two and the RTO), ``…steps_lost`` and the cost at
  ``$CKPTPROF_COST_PER_HOUR`` (default :data:`ckptprof.cost.DEFAULT_COST_PER_HOUR`).

What those spans and the record say is worked out in :mod:`ckptprof.interrupt.story`.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ckptprof.cost import cost_per_hour
from ckptprof.interrupt.notice import Notice, NoticeWatcher
from ckptprof.interrupt.record import (
    NOT_SAVED,
    InterruptionRecord,
    as_attributes,
    consume_record,
    read_record,
    write_record,
)
from ckptprof.interrupt.story import (
    interrupted_by,
    notice_attributes,
    pending_record,
    record_outcome,
    recovery_attributes,
)
from ckptprof.phases import INTERRUPTION_SPAN, Attr, Phase
from ckptprof.units import fmt_margin

log = logging.getLogger("ckptprof")

#: the shortest wait of a noted signal for a step boundary before it is handed on
MIN_HANDOFF_S = 3.0
#: the source of a notice another rank saw (agreed at a step boundary)
PEER_SOURCE = "peer"
#: what a rank brings to the agreement (the largest wins): nothing, a notice, given up
_NOTHING, _NOTICE, _GAVE_UP = 0, 1, 2
NOTICE_SPAN, EMERGENCY_SAVE_SPAN = Phase.NOTICE.span_name, Phase.EMERGENCY_SAVE.span_name


class GuardHost(Protocol):
    """What the guard needs from its adapter (the adapters' ``TracingSession`` has it)."""

    framework: str
    tracer: Any  # a CheckpointTracer once started
    telemetry: Any  # a Telemetry (or None: nothing to flush)
    save_parent: Any  # the guard sets an OpenTelemetry context here around the save
    interruptions: Any
    rank: int  # only rank 0 writes and retires the record

    def start(self) -> None: ...

    def warn_once(self, where: str, exc: BaseException) -> None: ...


def process_start_ns() -> int:
    """When the OS started this process (the end of a downtime, the start of its life in
    the goodput report): its start in clock ticks since boot (``/proc/self/stat``) against
    the boot-time clock now, so no rounding of the boot time (psutil's whole seconds) gets
    in; the one definition every view uses."""
    try:
        with open("/proc/self/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        since_boot_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot_s
        return time.time_ns() - int(age_s * 1e9)
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import psutil

        return int(psutil.Process().create_time() * 1e9)
    except Exception:  # noqa: BLE001 - no process table: the adapter's own start
        return time.time_ns()


class InterruptionGuard:
    """Notice handling for one adapter (see the module docstring).

    Args:
        inst: the adapter's host object (:class:`GuardHost`).
        location: a callable returning where records live (evaluated when needed).
        save: saves the current state through the adapter (traced); returns the path.
        stop: asks the framework to stop after the emergency save when no signal will end
            the process (metadata notices); optional.
        sources, metadata_url, signal_grace_s: see :class:`NoticeWatcher`.
        cost_per_hour_usd: price of the instance for the cost estimate.
        agree_across_ranks: in a multi-process job, agree at each step boundary whether
            any rank saw a notice (one all-reduce of one flag), so all save at one step.
    """

    def __init__(
        self,
        inst: GuardHost,
        location: Callable[[], str | None],
        save: Callable[[], str | None],
        stop: Callable[[], None] | None = None,
        *,
        sources: list[str] | str | None = None,
        metadata_url: str | None = None,
        signal_grace_s: float | None = None,
        cost_per_hour_usd: float | None = None,
        agree_across_ranks: bool = True,
    ) -> None:
        self.inst = inst
        self.agree_across_ranks = agree_across_ranks
        self.location = location
        self.save = save
        self.stop_training = stop
        self.cost_per_hour = cost_per_hour(cost_per_hour_usd)
        self.watcher = NoticeWatcher(sources, None, metadata_url, signal_grace_s)
        self.record: InterruptionRecord | None = None
        self.resumed_from: InterruptionRecord | None = None
        self._restart_ns: int | None = None
        self.last_step = 0
        self.last_step_ns: int | None = None
        self._lock = threading.Lock()
        self._root = None
        self._handled = False
        self._gave_up = False  # handled without a save (no step boundary came in time)
        #: the ranks agreed on a notice: no more agreements (every rank stops at once)
        self._agreed = False
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._step_times: collections.deque[int] = collections.deque(maxlen=16)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> InterruptionGuard:
        self.watcher.start()
        if self._thread is None:
            self._stopped.clear()
            self._thread = threading.Thread(
                target=self._watch, name="ckptprof-interruption", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop watching and put the signal handlers back. A notice that came but was
        never saved for (training ended first) is recorded as such and its trace ended,
        so the story is not lost; a signal it noted waits for :meth:`release_signal`."""
        self._stopped.set()
        self.watcher.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self._thread = None
        self._give_up("training ended before a step boundary")

    def release_signal(self) -> None:
        """After :meth:`close` (and after the adapter flushed its spans): a signal noted
        but never handed on reaches the handler ckptprof replaced. For the default
        action the process ends here, as it would have when the signal came."""
        self.watcher.resend_pending()

    def _claim(self) -> bool:
        """Take the notice for handling (an emergency save, or giving up on one): once."""
        with self._lock:
            if self.watcher.notice is None or self._handled:
                return False
            self._handled = True
            return True

    def _give_up(self, reason: str) -> bool:
        """Record a notice that gets no emergency save; False when it was handled already."""
        if not self._claim():
            return False
        self._gave_up = True
        if self._root is None or self.record is None:
            return True
        try:
            self.record.outcome = NOT_SAVED
            self.record.error = reason
            self._write()
            self._root.set_attributes(as_attributes(self.record))
            self._root.end()
            self._flush(ending=self.watcher.signum is not None)
        except Exception as exc:  # noqa: BLE001
            self.inst.warn_once("interruption", exc)
        return True

    def _flush(self, ending: bool) -> None:
        """The story's spans out; when the process ends next (``ending``), to the collector
        too, within a share of the notice's remaining grace."""
        telemetry = self.inst.telemetry
        if telemetry is None:
            return
        if not ending:
            telemetry.flush()
            return
        from ckptprof.tracing.export import exit_flush_budget_s

        notice = self.watcher.notice
        telemetry.flush_before_exit(exit_flush_budget_s(notice and notice.seconds_left))

    @property
    def notice(self) -> Notice | None:
        return self.watcher.notice

    def _watch(self) -> None:
        """Open the story when a notice comes; hand a signal on when no step boundary
        comes in time for the emergency save (a job whose loop ended or hangs)."""
        while not self._stopped.wait(0.1):
            if self.watcher.notice is None:
                continue
            self._open()
            if self._handled:
                return
            waited = (time.time_ns() - self.watcher.notice.received_ns) / 1e9
            if self.watcher.signum is None or waited <= self.handoff_after_s():
                continue
            if self._give_up(f"no step boundary within {waited:.1f} s of the signal"):
                log.warning(
                    "ckptprof: no training step ended within %.1f s of the %s; handing the "
                    "signal on without an emergency save",
                    waited,
                    self.watcher.notice.source,
                )
                self.watcher.handoff()
            return

    def handoff_after_s(self) -> float:
        """How long a noted signal waits for a step boundary: three recent steps' time
        (at least :data:`MIN_HANDOFF_S`), never past the deadline."""
        times = list(self._step_times)
        intervals = sorted(b - a for a, b in zip(times, times[1:], strict=False))
        typical = intervals[len(intervals) // 2] / 1e9 if intervals else 0.0
        wait = max(MIN_HANDOFF_S, 3 * typical)
        notice = self.watcher.notice
        if notice is not None and notice.deadline_ns is not None:
            wait = min(
                wait, max(MIN_HANDOFF_S, (notice.deadline_ns - notice.received_ns) / 1e9 - 1)
            )
        return wait

    # ------------------------------------------------------------------ interrupted run
    def _open(self) -> None:
        """The notice span and the pending record, once (any thread)."""
        with self._lock:
            if self._root is not None:
                return
            notice = self.watcher.notice
            try:
                self.inst.start()
                tracer = self.inst.tracer
                attrs = notice_attributes(notice, self.last_step)
                attrs[Attr.RANK] = getattr(self.inst, "rank", 0)
                self._root = tracer.start_span(INTERRUPTION_SPAN, attrs, notice.received_ns)
                from opentelemetry import trace

                ctx = trace.set_span_in_context(self._root)
                span = tracer.start_span(NOTICE_SPAN, attrs, notice.received_ns, ctx)
                span.end(end_time=notice.received_ns)
                self.record = pending_record(
                    self._root,
                    notice,
                    tracer.run_id,
                    self.last_step,
                    self.last_step_ns,
                    self.inst.framework,
                )
                self._write()
                log.warning(
                    "ckptprof: %s notice; %s left; emergency save at the next step boundary",
                    notice.source,
                    "unknown time"
                    if notice.deadline_ns is None
                    else f"{max(0.0, notice.seconds_left):.3f} s",
                )
            except Exception as exc:  # noqa: BLE001
                self.inst.warn_once("interruption", exc)

    def _write(self) -> None:
        """The record, by rank 0 only (every rank sees the notice; one record per job)."""
        location = self.location()
        if location and self.record is not None and getattr(self.inst, "rank", 0) == 0:
            try:
                write_record(location, self.record)
            except Exception as exc:  # noqa: BLE001
                self.inst.warn_once("write_record", exc)

    def step_end(self, step: int) -> None:
        """Call at every step boundary; runs the emergency save when a notice is pending.
        In a multi-process job the ranks first agree whether any of them saw one, so every
        rank saves at the same step (a save needs all of them)."""
        self.last_step, self.last_step_ns = step, time.time_ns()
        self._step_times.append(self.last_step_ns)
        if not self._agreed:  # on every rank at the same steps, whatever this one handled
            self._agree_across_ranks()
        if self._handled and self.watcher.signum is not None:
            self.watcher.chain()  # a signal after the notice was already saved for
            return
        if self.watcher.notice is None:
            return
        self._open()
        if self._claim():
            self.emergency_save(step)

    def _agree_across_ranks(self) -> None:
        """One all-reduce of one flag per step until the ranks agree on a notice (every
        rank calls step_end at the same steps, and all stop agreeing at the same one): a
        notice seen by any rank is taken by all, as a notice from a peer rank; a rank that
        gave up on it (no step boundary came in time) makes every rank give up, so that no
        rank starts a save the others will not join. Nothing in a one-process job or when
        turned off."""
        group = _job_group() if self.agree_across_ranks else None
        if group is None:
            return
        import torch
        import torch.distributed as dist

        seen = self.watcher.notice is not None
        state = _GAVE_UP if self._gave_up else _NOTICE if seen else _NOTHING
        try:
            device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
            flag = torch.tensor([state], dtype=torch.int32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        except Exception as exc:  # noqa: BLE001 - the job's own collectives will tell
            self.agree_across_ranks = False  # never again: a half-done agreement must not hang
            self.inst.warn_once("interruption agreement", exc)
            return
        agreed = int(flag.item())
        if agreed == _NOTHING:
            return
        self._agreed = True
        if not seen:
            now = time.time_ns()
            grace = int(self.watcher.signal_grace_s * 1e9)
            self.watcher.inject(Notice(PEER_SOURCE, now, now + grace, True, "another rank's"))
        if agreed == _GAVE_UP and not self._handled:
            self._open()
            self._give_up("another rank gave up on the emergency save")

    def emergency_save(self, step: int) -> None:
        """Save now under ``ckpt.emergency_save``, record the outcome, hand the signal on."""
        from opentelemetry import trace

        record, root, notice = self.record, self._root, self.watcher.notice
        span = None
        if root is not None and record is not None:
            record.step = record.last_step = step
            record.last_step_ns = self.last_step_ns
            record.save_start_ns = time.time_ns()
            self._write()
            ctx = trace.set_span_in_context(root)
            span = self.inst.tracer.start_span(EMERGENCY_SAVE_SPAN, {}, record.save_start_ns, ctx)
            self.inst.save_parent = trace.set_span_in_context(span)
        error: BaseException | None = None
        path = None
        try:
            path = self.save()
        except Exception as exc:  # noqa: BLE001 - record it; the job decides what happens next
            error = exc
            log.warning("ckptprof: emergency save failed: %r", exc)
        finally:
            self.inst.save_parent = None
        if record is not None and root is not None:
            try:
                record_outcome(record, path, step, error)
                self._write()
                attrs = as_attributes(record)
                span.set_attributes(attrs)
                span.end(end_time=record.save_end_ns)
                root.set_attributes(attrs)
                root.end()
                ending = self.watcher.signum is not None or (
                    notice is not None and notice.deadline_ns is not None and self.stop_training
                )
                self._flush(ending=bool(ending))
                margin = record.margin_s
                log.warning(
                    "ckptprof: emergency save %s at step %d%s",
                    record.outcome,
                    step,
                    "" if margin is None else f", {fmt_margin(margin)}",
                )
            except Exception as exc:  # noqa: BLE001
                self.inst.warn_once("emergency_save", exc)
        if self.watcher.signum is not None:
            self.watcher.chain()  # the default action ends the process here
        elif notice is not None and notice.deadline_ns is not None and self.stop_training:
            self.stop_training()  # (a rebalance recommendation has no deadline: go on)

    # ------------------------------------------------------------------ resumed run
    def resume_links(
        self, run_id: str | None = None, restart_ns: int | None = None
    ) -> tuple[list, dict[str, Any]]:
        """Links and attributes for a restore that follows an interruption (or nothing).

        ``restart_ns`` ends the wait: this process's start by default (the simulated
        interruption of the synthetic mode passes the restore's start).
        """
        location = self.location()
        if not location:
            return [], {}
        record = read_record(location, run_id)
        if record is None:
            return [], {}
        self.resumed_from = record
        started = self._restart_ns = restart_ns or process_start_ns()
        return interrupted_by(record, started)

    def resumed(self, op, restored_step: int) -> None:
        """At the first step after a linked restore: recovery time, steps lost, cost."""
        record, self.resumed_from = self.resumed_from, None
        if record is None or op is None:
            return
        try:
            now = time.time_ns()
            started = self._restart_ns or process_start_ns()
            rate = self.cost_per_hour
            op.set_attributes(recovery_attributes(record, op, now, started, restored_step, rate))
            location = self.location()
            if location and getattr(self.inst, "rank", 0) == 0:
                consume_record(location)
        except Exception as exc:  # noqa: BLE001
            self.inst.warn_once("resumed", exc)


def _job_group():
    """The default process group of a multi-process job (None: one process)."""
    import sys

    if "torch.distributed" not in sys.modules:  # a job that never imported it has none
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return dist.group.WORLD
