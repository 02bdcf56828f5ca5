"""Phase model recording and OpenTelemetry export (DESIGN.md §2)."""

from ckptprof.tracing.export import Telemetry, setup_telemetry
from ckptprof.tracing.recorder import CheckpointTracer, Operation, OperationSummary, PhaseStats

__all__ = [
    "CheckpointTracer",
    "Operation",
    "OperationSummary",
    "PhaseStats",
    "Telemetry",
    "setup_telemetry",
]
