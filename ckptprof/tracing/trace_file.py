"""The local trace file every run writes: one span per line (the SDK's own span JSON),
in ``--trace-dir``, ``$CKPTPROF_TRACE_DIR`` or ``./ckptprof-traces``. An unwritable (or
full) directory costs one warning, never the job.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("ckptprof")

TRACE_DIR_ENV = "CKPTPROF_TRACE_DIR"
DEFAULT_TRACE_DIR = "ckptprof-traces"


def span_to_json_line(span: ReadableSpan) -> str:
    """The SDK's own span JSON, folded onto one line."""
    return json.dumps(json.loads(span.to_json(indent=None)), separators=(",", ":"))


class JsonLinesSpanExporter(SpanExporter):
    """Appends one span per line to a file; disk trouble is a single warning, after
    which it writes nothing more (a full disk stays full)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file = None
        self._failed = False

    def _open(self):
        if self._file is None and not self._failed:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            except OSError as exc:
                self._fail(exc)
        return self._file

    @property
    def failed(self) -> bool:
        """Whether writing stopped after an error: the file is missing spans."""
        return self._failed

    def _fail(self, exc: OSError) -> None:
        self._failed = True
        self._close()
        log.warning(
            "ckptprof: cannot write the trace file %s (%s); spans are not saved locally. "
            "Set %s or --trace-dir to a writable directory.",
            self.path,
            exc.strerror or exc,
            TRACE_DIR_ENV,
        )

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            if self._failed:
                return SpanExportResult.FAILURE
            handle = self._open()
            if handle is None:
                return SpanExportResult.FAILURE
            try:
                handle.write("".join(span_to_json_line(s) + "\n" for s in spans))
                handle.flush()
            except OSError as exc:
                self._fail(exc)
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def _close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def shutdown(self) -> None:
        with self._lock:
            self._close()


def resolve_trace_dir(trace_dir: str | os.PathLike | None) -> Path:
    return Path(trace_dir or os.environ.get(TRACE_DIR_ENV) or DEFAULT_TRACE_DIR)
