"""Where producers of checkpoint spans start: :class:`CheckpointTracer` makes the
save/restore operations (and the plain spans of the interruption story and the run) on a
tracer provider, each with the run's root attributes (framework, run id).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link

from ckptprof.phases import Attr
from ckptprof.redact import scrub
from ckptprof.tracing.recorder import Operation
from ckptprof.tracing.summary import AttrValue


class CheckpointTracer:
    """Creates save/restore operations on a tracer provider.

    Args:
        tracer_provider: where spans go; defaults to the global provider (which
            ckptprof never sets). Pass ``setup_telemetry().provider`` for the
            trace file + OTLP behaviour of the CLI.
        framework: value of ``ckpt.framework`` on every root span.
        run_id: value of ``ckpt.run_id``.
        per_file_spans: also emit one ``ckpt.file`` child span per file.
        stall_after_s: seconds without progress before an open operation is named as
            stalled (:mod:`ckptprof.tracing.watchdog`); by default
            ``$CKPTPROF_STALL_AFTER`` or 120 s; None turns it off.

    Example::

        tracer = CheckpointTracer(telemetry.provider, framework="lightning")
        with tracer.restore({Attr.FORMAT: "torch"}) as op:
            with op.phase(Phase.FETCH):
                ...
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        *,
        framework: str = "synthetic",
        run_id: str | None = None,
        per_file_spans: bool = False,
        stall_after_s: float | None | bool = True,
    ) -> None:
        from ckptprof._version import __version__
        from ckptprof.tracing.watchdog import stall_after_from_env

        provider = tracer_provider or trace.get_tracer_provider()
        self._tracer = provider.get_tracer("ckptprof", __version__)
        self.framework = framework
        self.run_id = run_id
        self.per_file_spans = per_file_spans
        #: seconds without progress before an operation is said to stall (True: from
        #: $CKPTPROF_STALL_AFTER or the default; None/False: not watched)
        if stall_after_s is True:
            stall_after_s = stall_after_from_env()
        self.stall_after_s = stall_after_s or None

    def _base(self, attributes: Mapping[str, Any] | None) -> dict[str, AttrValue]:
        base: dict[str, AttrValue] = {Attr.FRAMEWORK: self.framework}
        if self.run_id:
            base[Attr.RUN_ID] = self.run_id
        for key, value in (attributes or {}).items():
            if value is not None:
                base[key] = scrub(value)  # a presigned URL's secrets never reach a span
        return base

    def _operation(self, kind: str, attributes, links, parent) -> Operation:
        return Operation(
            self._tracer, kind, self._base(attributes), self.per_file_spans, links, parent,
            self.stall_after_s,
        )  # fmt: skip

    def restore(
        self,
        attributes: Mapping[str, Any] | None = None,
        links: list[Link] | None = None,
        parent: Context | None = None,
    ) -> Operation:
        return self._operation("restore", attributes, links, parent)

    def save(
        self,
        attributes: Mapping[str, Any] | None = None,
        links: list[Link] | None = None,
        parent: Context | None = None,
    ) -> Operation:
        return self._operation("save", attributes, links, parent)

    def start_span(
        self,
        name: str,
        attributes: Mapping[str, Any] | None = None,
        start_ns: int | None = None,
        parent: Context | None = None,
        links: list[Link] | None = None,
        trace_id: int | None = None,
    ) -> trace.Span:
        """A plain span with the root attributes (framework, run id): for the interruption
        story (``ckpt.interruption``, ``ckpt.notice``, ``ckpt.emergency_save``) and the
        process's ``ckpt.run`` (each of its snapshots in one ``trace_id``)."""
        ids = getattr(self._tracer, "id_generator", None)
        joined = ids.in_trace(trace_id) if trace_id and hasattr(ids, "in_trace") else None
        with joined or contextlib.nullcontext():
            return self._tracer.start_span(
                name,
                context=parent,
                attributes=self._base(attributes),
                start_time=start_ns,
                links=links or None,
            )
