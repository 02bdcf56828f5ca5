"""Phase model recording and OpenTelemetry export (docs/design.md §2).

The recorder needs only the OpenTelemetry API; the SDK (export) is imported on first
use of :func:`setup_telemetry`, so ``import ckptprof`` stays light.
"""

from ckptprof.tracing.recorder import Operation
from ckptprof.tracing.summary import OperationSummary, PhaseStats
from ckptprof.tracing.tracer import CheckpointTracer

__all__ = [
    "CheckpointTracer",
    "Operation",
    "OperationSummary",
    "PhaseStats",
    "Telemetry",
    "setup_telemetry",
]


def __getattr__(name: str):
    if name in ("Telemetry", "setup_telemetry"):
        from ckptprof.tracing import export

        return getattr(export, name)
    raise AttributeError(name)
