"""How one phase of a finished save or restore becomes spans: its span under the root
(from its first start to its last end, with its events), the busy pieces inside it and,
when asked, one span per file. Written once, when the operation finishes."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.context import Context

from ckptprof.phases import FILE_SPAN, Attr, span_name
from ckptprof.tracing.guest import guest
from ckptprof.tracing.pieces import emit_pieces
from ckptprof.tracing.summary import PhaseStats


def emit_phase_span(
    tracer: trace.Tracer, context: Context, stats: PhaseStats, per_file_spans: bool
) -> None:
    """The span of the phase ``stats``, a child of the root in ``context``."""
    span = tracer.start_span(
        span_name(stats.phase),
        context=context,
        start_time=stats.start_ns,
        attributes=stats.span_attributes(),
    )
    for name, at_ns, attributes in stats.events:
        span.add_event(name, attributes, timestamp=at_ns)
    _emit_pieces(tracer, span, stats)
    if per_file_spans:
        _emit_files(tracer, span, stats)
    span.end(end_time=stats.end_ns)


@guest
def _emit_pieces(tracer: trace.Tracer, parent, stats: PhaseStats) -> None:
    emit_pieces(tracer, parent, stats.phase, stats.intervals)


def _emit_files(tracer: trace.Tracer, parent, stats: PhaseStats) -> None:
    ctx = trace.set_span_in_context(parent)
    for rec in stats.files:
        start = rec.start_ns if rec.start_ns is not None else stats.start_ns
        child = tracer.start_span(
            FILE_SPAN,
            context=ctx,
            start_time=start,
            attributes={Attr.PATH: rec.path, Attr.BYTES: rec.nbytes},
        )
        child.end(end_time=start + int(rec.seconds * 1e9))
