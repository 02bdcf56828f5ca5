"""The recorder is a guest in the training job: an internal error of its own is logged
once per function and swallowed, so profiling never breaks the job it profiles."""

from __future__ import annotations

import functools
import logging

log = logging.getLogger("ckptprof")
# Functions that already logged an internal error: one warning per process, not per call.
_warned: set[str] = set()


def guest(fn):
    """Log an internal failure once per function and carry on."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - profiling must never break the job
            if fn.__qualname__ not in _warned:
                _warned.add(fn.__qualname__)
                log.warning("ckptprof: internal error in %s ignored: %r", fn.__qualname__, exc)
            return None

    return wrapper
