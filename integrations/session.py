"""The tracing side every adapter shares: telemetry, and the lifecycle of its restore and
save operations (begin, end, first step, background saves).

A session is a guest in the training job: its own bookkeeping errors are logged once
and swallowed, the framework's exceptions are recorded and passed on unchanged, and
:meth:`TracingSession.close` stops every thread and closes every file it opened.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from ckptprof import activity
from ckptprof.integrations.first_step import first_step_parts, wait_for_device
from ckptprof.integrations.health import BEFORE_SAVE, AfterResume, StepClock
from ckptprof.integrations.lifetime import GoodputSoFar, Lifetime, job_identity
from ckptprof.memory import MemoryWatch
from ckptprof.phases import AFTER_RESUME_SPAN, Attr, Phase
from ckptprof.tracing.export import Telemetry, setup_telemetry
from ckptprof.tracing.recorder import Operation, phase_or_nothing
from ckptprof.tracing.summary import OperationSummary
from ckptprof.tracing.tracer import CheckpointTracer

log = logging.getLogger("ckptprof")
GUEST_SAMPLE_S = 0.01  # the memory sampler's period inside a training job
MetricsSink = Callable[[dict[str, float], int], None]


def show_info_lines() -> None:
    """Let the one-line summaries (INFO) reach the console, as Lightning does for its own
    logger: only when nothing is configured (no handler on ``ckptprof`` or the root), with
    a handler on ``ckptprof``'s logger alone; a job that configures logging decides."""
    if log.handlers or logging.getLogger().hasHandlers():
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    log.propagate = False


def shared_run_id() -> str | None:
    """One run id for every rank of a distributed job, so the report can group ranks.

    ``CKPTPROF_RUN_ID`` wins; else torchrun's ``TORCHELASTIC_RUN_ID``; else, when
    ``WORLD_SIZE`` > 1, the rendezvous address and port every rank shares, with the date.
    """
    if os.environ.get("CKPTPROF_RUN_ID"):
        return os.environ["CKPTPROF_RUN_ID"]
    if os.environ.get("TORCHELASTIC_RUN_ID") not in (None, "", "none"):
        return os.environ["TORCHELASTIC_RUN_ID"]
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("MASTER_PORT"):
        day = time.strftime("%Y%m%d")
        return f"{day}-{os.environ.get('MASTER_ADDR', 'localhost')}-{os.environ['MASTER_PORT']}"
    return None


class TracingSession:
    """Telemetry and the open operations of one adapter.

    Args:
        framework: value of ``ckpt.framework``.
        trace_dir: trace-file directory (default ``$CKPTPROF_TRACE_DIR`` or ``./ckptprof-traces``).
        tracer_provider: record into this provider instead of ckptprof's own (no trace file).
        rank: ``ckpt.rank`` of this process (default from ``RANK``).
    """

    def __init__(
        self,
        framework: str,
        *,
        trace_dir: str | os.PathLike | None = None,
        tracer_provider=None,
        rank: int | None = None,
    ) -> None:
        self.framework = framework
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        self._trace_dir = trace_dir
        self._provider = tracer_provider
        self.telemetry: Telemetry | None = None
        self.tracer: CheckpointTracer | None = None
        self.restore_op: Operation | None = None
        self.restore_memory: MemoryWatch | None = None
        #: the open saves, innermost last (a save inside a save: a hook or a signal
        #: handler calling the framework's save while it saves), each with its file or
        #: folder named as growing while the framework writes it
        self._saves: list[tuple[Operation, contextlib.ExitStack]] = []
        self.last_restore: OperationSummary | None = None
        self.last_save: OperationSummary | None = None
        self._warned: set[str] = set()
        self.save_parent = None  # an OpenTelemetry context: saves nest under it (emergency)
        self.interruptions = None  # the InterruptionGuard while one watches for notices
        #: where finished restores and saves go as scalars (the framework's own loggers)
        self.metrics_sink: MetricsSink | None = None
        self.steps = StepClock()  # step times: before a save, and after a resume
        self.after_resume: AfterResume | None = None
        self.lifetime = Lifetime()  # this process's steps and life, for goodput
        #: the job's checkpoint folder, as the adapter knows it (its identity for goodput)
        self.checkpoint_dir: Callable[[], str | None] = lambda: None
        self._job: str | None = None
        self._goodput: GoodputSoFar | None = None  # computed after a resume, then logged

    # ------------------------------------------------------------------ lifecycle
    @property
    def started(self) -> bool:
        return self.tracer is not None

    def start(self) -> None:
        """Create the tracer (lazily, in the process that trains); idempotent."""
        if self.tracer is not None:
            return
        show_info_lines()
        provider = self._provider
        run_id = shared_run_id()
        if provider is None:
            self.telemetry = setup_telemetry(self._trace_dir, run_id=run_id)
            provider = self.telemetry.provider
            run_id = self.telemetry.run_id
        self.tracer = CheckpointTracer(provider, framework=self.framework, run_id=run_id)

    def job(self) -> str | None:
        """This job's identity across its restarts (:func:`job_identity`); the checkpoint
        folder is kept once known (the adapter may have let go of the trainer at close)."""
        if self._job is None:
            try:
                folder = self.checkpoint_dir()
            except Exception as exc:  # noqa: BLE001 - a guest: no identity, not a failure
                self.warn_once("job", exc)
                folder = None
            self._job = job_identity(folder) if folder else None
        return self._job or job_identity(None)

    def close(self) -> None:
        """End open operations, flush and stop exporting; a later :meth:`start` begins anew."""
        self._report_after_resume()  # the job ended before all the steps were timed
        self._stop_memory_watch()
        while self._saves:  # saves never ended (innermost first): finished, unwatched
            op, growing = self._saves.pop()
            growing.close()
            if not op.finished:
                with contextlib.suppress(Exception):
                    op.finish()
        op, self.restore_op = self.restore_op, None
        if op is not None and not op.finished:
            with contextlib.suppress(Exception):
                op.finish()
        if self._goodput is not None:
            self._send_goodput(self.lifetime.last_step, wait_s=2.0)
            self._goodput.join()
            self._goodput = None
        if self.tracer is not None:
            try:
                self.lifetime.emit(self.tracer, self.rank, job=self.job())
            except Exception as exc:  # noqa: BLE001
                self.warn_once("lifetime", exc)
        self.lifetime = Lifetime()
        telemetry, self.telemetry, self.tracer = self.telemetry, None, None
        if telemetry is not None:
            try:
                telemetry.shutdown()
            except Exception as exc:  # noqa: BLE001
                self.warn_once("close", exc)

    def flush(self, wait: bool = True) -> None:
        if self.telemetry is not None:
            self.telemetry.flush(wait=wait)

    def warn_once(self, where: str, exc: BaseException) -> None:
        """One warning per kind of failure: a user's fixable mistake (an unwritable state
        folder) says what to do; anything else is ckptprof's own bug, and is ignored."""
        from ckptprof.errors import CkptprofError

        if isinstance(exc, CkptprofError):
            key = str(exc)
            if key not in self._warned:
                self._warned.add(key)
                log.warning("ckptprof: %s", exc)
        elif where not in self._warned:
            self._warned.add(where)
            log.warning("ckptprof: internal error in %s ignored: %r", where, exc)

    # ------------------------------------------------------------------ restore
    def begin_restore(self, attributes: dict[str, Any]) -> Operation | None:
        """Start a ``ckpt.restore``; linked to the interrupted run when a record says so."""
        try:
            self.start()
            self.job()  # the adapter knows its checkpoint folder now: kept for the close
            if self.restore_op is not None and not self.restore_op.finished:
                self.restore_op.finish()
            links, extra = [], {}
            if self.interruptions is not None:
                links, extra = self.interruptions.resume_links()
            self.restore_op = self.tracer.restore(self._attrs({**attributes, **extra}), links)
            self._watch_memory()
            return self.restore_op
        except Exception as exc:  # noqa: BLE001
            self.warn_once("begin_restore", exc)
            return None

    def end_restore(self, error: BaseException | None = None) -> OperationSummary | None:
        op, self.restore_op = self.restore_op, None
        if op is None:
            return None
        try:
            step = op.attributes.get(Attr.RESTORED_STEP)  # the checkpoint's own step
            if self.interruptions is not None and error is None and step is not None:
                self.interruptions.resumed(op, int(step))
            watch = self._stop_memory_watch()
            if watch is not None:
                watch.record(op)
            summary = op.finish(error)
            self.lifetime.blocked(op.start_ns, op.start_ns + int(summary.wall_s * 1e9))
            self.last_restore = summary
            # off the training loop's critical path, unless the restore failed
            self.flush(wait=error is not None)
            return summary
        except Exception as exc:  # noqa: BLE001
            self.warn_once("end_restore", exc)
            return None

    def discard_restore(self) -> None:
        """The restore begun found nothing to load (a first launch): no operation at all,
        so that no report or goodput counts a restore that never happened."""
        op, self.restore_op = self.restore_op, None
        self._stop_memory_watch()
        if op is not None:
            op.discard()

    def _watch_memory(self) -> None:
        """Sample memory for the restore (the job's own peak counters are never reset)."""
        self._stop_memory_watch()
        try:
            self.restore_memory = MemoryWatch(interval_s=GUEST_SAMPLE_S).start()
        except Exception as exc:  # noqa: BLE001 - no /proc: the restore goes on without
            self.warn_once("memory", exc)

    def _stop_memory_watch(self) -> MemoryWatch | None:
        watch, self.restore_memory = self.restore_memory, None
        if watch is not None:
            watch.stop()
        return watch

    def first_step_done(
        self,
        step: int,
        since_ns: int | None = None,
        announce: bool = True,
        batch: tuple[int, int] | None = None,
        skipped_batches: int | None = None,
        **attributes: Any,
    ) -> OperationSummary | None:
        """End the restore at the end of the first training step after it: ``first_step``
        from ``since_ns`` (default: the end of the last restore phase), the step reached,
        and the one-line summary logged where ``announce`` (rank zero).

        ``batch`` (start, end ns) is when the first batch was fetched, where the adapter
        saw it: ``first_step`` is then split into ``setup_s`` (before the fetch),
        ``batch_s`` (the fetch, with the data fast-forward of ``skipped_batches`` inside)
        and ``compute_s`` (the step itself), as ``ckpt.first_step.*`` attributes."""
        op = self.restore_op
        if op is None:
            return None
        try:
            wait_for_device()
            end = time.time_ns()
            if batch is None:
                start = since_ns or op.latest_end_ns
                op.add_interval(Phase.FIRST_STEP, start, end)
            else:  # from the last load before the first batch: the fetch is the step's
                start = since_ns or op.latest_end_before(batch[0])
                op.add_interval_around(Phase.FIRST_STEP, start, end)
                parts = first_step_parts(start, batch, end, op.phase_busy_s(Phase.FIRST_STEP))
                op.set_phase_attributes(Phase.FIRST_STEP, **parts)
            if skipped_batches is not None:
                op.set_phase_attributes(
                    Phase.FIRST_STEP, **{Attr.FIRST_STEP_SKIPPED_BATCHES: skipped_batches}
                )
            op.set_attributes({Attr.STEP: step, **attributes})
        except Exception as exc:  # noqa: BLE001
            self.warn_once("first_step", exc)
        context, before = op.span_context, op.attributes.get(BEFORE_SAVE)
        summary = self.end_restore()
        if summary is not None:
            if announce:
                log.info("%s", summary.one_line())
            self._send_metrics(summary, step)
            self.steps.restart()
            self.after_resume = AfterResume(context, before)
        return summary

    def step_ended(self, step: int) -> None:
        """A training step ended (every step): time it; after a resume, once enough steps
        are timed, say how they compare with the steps before the save."""
        try:
            self.lifetime.step_ended(step)
            if self._goodput is not None and not self._goodput.sent:
                self._send_goodput(step)
            seconds = self.steps.tick()
            watch = self.after_resume
            if watch is not None and seconds is not None and watch.add(seconds):
                self._report_after_resume()
        except Exception as exc:  # noqa: BLE001
            self.warn_once("step_ended", exc)

    def _report_after_resume(self) -> None:
        """``ckpt.after_resume``: a span linked to the restore, from its first step's end
        over the steps timed since (at least 3 of them)."""
        watch, self.after_resume = self.after_resume, None
        if watch is None or len(watch.times) < 3 or self.tracer is None:
            return
        try:
            from opentelemetry.trace import Link

            links = [Link(watch.restore_context)] if watch.restore_context else None
            span = self.tracer.start_span(
                AFTER_RESUME_SPAN,
                {Attr.RANK: self.rank, **watch.attributes()},
                start_ns=watch.start_ns,
                links=links,
            )
            span.end()
            if self.rank == 0:
                watch.warn_if_slower()
        except Exception as exc:  # noqa: BLE001
            self.warn_once("after_resume", exc)

    def _send_metrics(self, summary: OperationSummary, step: int | None) -> None:
        """The RTO and phase seconds into the framework's loggers (``log_metrics=True``)."""
        if self.metrics_sink is None or step is None:
            return
        try:
            self.metrics_sink(summary.metrics(), int(step))
        except Exception as exc:  # noqa: BLE001 - a logger's trouble is never the job's
            self.warn_once("log_metrics", exc)
        if summary.kind == "restore" and self._goodput is None:
            restored = summary.attributes.get(Attr.RESTORED_STEP)
            self._goodput = GoodputSoFar(self, restored, summary.attributes).start()

    def training_ended(self, step: int | None) -> None:
        """Training is over but the loggers are still open: what is still to be logged
        goes now (the goodput so far, if it was not ready at a step's end)."""
        self._send_goodput(step, wait_s=2.0)

    def _send_goodput(self, step: int | None, wait_s: float = 0.0) -> None:
        """The goodput so far, to the loggers once it is computed (at a step's end, off
        the resume's critical path; at the close, waiting ``wait_s`` at most)."""
        job = self._goodput
        if job is None or job.sent or self.metrics_sink is None or step is None:
            return
        metrics = job.result(wait_s)
        if metrics is None:
            return
        job.sent = True
        if metrics:
            try:
                self.metrics_sink(metrics, int(step))
            except Exception as exc:  # noqa: BLE001
                self.warn_once("log_metrics", exc)

    # ------------------------------------------------------------------ save
    @property
    def save_op(self) -> Operation | None:
        """The innermost open save (the one the framework is writing now), or None."""
        return self._saves[-1][0] if self._saves else None

    def begin_save(self, attributes: dict[str, Any]) -> Operation | None:
        """Start a ``ckpt.save``; one begun while another is open is its own operation,
        and the outer one goes on (it is :attr:`save_op` again once the inner ends)."""
        try:
            self.start()
            self.job()
            self.steps.saving()
            recent = self.steps.median()
            if recent is not None:  # the pace the resume will be compared with
                attributes = {**attributes, Attr.SAVE_STEP_MEDIAN_S: round(recent, 6)}
            op = self.tracer.save(self._attrs(attributes), parent=self.save_parent)
            growing = contextlib.ExitStack()
            self._saves.append((op, growing))
            if attributes.get(Attr.PATH):  # the framework's bytes reaching it are progress
                growing.enter_context(activity.growing(str(attributes[Attr.PATH])))
            return op
        except Exception as exc:  # noqa: BLE001
            self.warn_once("begin_save", exc)
            return None

    def end_save(
        self, error: BaseException | None = None, op: Operation | None = None
    ) -> OperationSummary | None:
        """End ``op`` (default: the innermost open save); other open saves stay open."""
        found = [i for i, (open_op, _) in enumerate(self._saves) if op is None or open_op is op]
        if not found:
            return None
        op, growing = self._saves.pop(found[-1])
        growing.close()
        try:
            self.last_save = op.finish(error)
            self.lifetime.blocked(op.start_ns, op.start_ns + int(self.last_save.wall_s * 1e9))
            if self.tracer is not None:  # the life so far: a process killed later keeps it
                self.lifetime.emit(self.tracer, self.rank, final=False, job=self.job())
            if error is None:
                self._send_metrics(self.last_save, op.attributes.get(Attr.STEP))
            return self.last_save
        except Exception as exc:  # noqa: BLE001
            self.warn_once("end_save", exc)
            return None

    @contextlib.contextmanager
    def saving(self, attributes: dict[str, Any]) -> Iterator[Operation | None]:
        """A ``ckpt.save`` around the block; the framework's exception ends it and passes."""
        op = self.begin_save(attributes)
        try:
            yield op
        except BaseException as exc:
            if op is not None:  # this block's save only, never one around it
                self.end_save(exc, op)
            raise
        if op is not None:
            self.end_save(op=op)

    def begin_background_save(self, attributes: dict[str, Any], queued_by) -> Operation | None:
        """The background half of an asynchronous save (a writer thread or process): its own
        ``ckpt.save`` marked ``ckpt.save.background``, linked to the save that queued it
        (``queued_by``: that save's span context)."""
        try:
            from opentelemetry.trace import Link

            if self.tracer is None:
                return None
            links = [Link(queued_by)] if queued_by is not None else None
            attrs = self._attrs({**attributes, Attr.SAVE_BACKGROUND: True})
            op = self.tracer.save(attrs, links=links)
            self.lifetime.background(op)
            return op
        except Exception as exc:  # noqa: BLE001
            self.warn_once("background_save", exc)
            return None

    def _attrs(self, attributes: dict[str, Any]) -> dict[str, Any]:
        return {Attr.RANK: self.rank, **attributes}


def timed(op: Operation | None, phase: Phase | str, fn, *args, **kwargs):
    """Run the framework's ``fn`` inside ``phase`` (or plainly without an operation)."""
    if op is None:
        return fn(*args, **kwargs)
    with op.phase(phase):
        return fn(*args, **kwargs)


__all__ = ["TracingSession", "phase_or_nothing", "shared_run_id", "timed"]
