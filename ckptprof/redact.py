"""URLs without their secrets, wherever ckptprof writes one (span attributes, span
errors, log lines): a presigned URL's query (``X-Amz-Signature=…``) and a URL's user
info (``user:token@``) grant access to whoever reads the trace or the log, so neither
leaves the process. Local paths are left as they are (a ``?`` in a file name is no
query string)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

_URL = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)"
    r"(?P<userinfo>[^/\s'\"<>]*@)?"  # a password with an unescaped ? or #: all of it
    r"(?P<rest>[^\s?'\"<>]*)"  # a '#' stays: a key character in object stores (s3)
    r"(?P<query>\?[^\s'\"<>]*)?"
)


def strip_url_secrets(text: str) -> str:
    """``text`` with every URL in it cut to scheme, host and path: no user info, no query
    string."""
    if "://" not in text:
        return text
    return _URL.sub(lambda m: m["scheme"] + m["rest"], text)


def scrub(value: Any) -> Any:
    """A span attribute's value with :func:`strip_url_secrets` applied to its text (a
    string, or the strings of a sequence); any other value as it is."""
    if isinstance(value, str):
        return strip_url_secrets(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, str) for v in value):
        return type(value)(strip_url_secrets(v) if isinstance(v, str) else v for v in value)
    return value


def scrub_read(doc: Any, line: str) -> Any:
    """``doc``, decoded from ``line`` of a file written elsewhere, without its URLs'
    secrets (walked only where the line names a URL at all)."""
    return doc if "://" not in line else scrub_tree(doc)


def scrub_tree(value: Any) -> Any:
    """A JSON document (a span read back, an OTLP request) with every string in it passed
    through :func:`strip_url_secrets`."""
    if isinstance(value, str):
        return strip_url_secrets(value)
    if isinstance(value, dict):
        return {key: scrub_tree(item) for key, item in value.items()}
    if isinstance(value, list):
        return [scrub_tree(item) for item in value]
    return value


def scrub_attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """``attributes`` with every value passed through :func:`scrub`."""
    return {key: scrub(value) for key, value in (attributes or {}).items()}


class _LogFilter(logging.Filter):
    """ckptprof's log lines (a failure naming the URL it read) without URL secrets."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
            stripped = strip_url_secrets(message)  # as it is where it names no URL
            if stripped is not message:
                record.msg, record.args = stripped, None
        except Exception:  # noqa: BLE001, S110 - a log line is never worth an error
            pass
        return True


def protect_log(name: str = "ckptprof") -> None:
    """Install the filter on the ``name`` logger (every ckptprof module logs there); once."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, _LogFilter) for f in logger.filters):
        logger.addFilter(_LogFilter())


__all__ = ["protect_log", "scrub", "scrub_attributes", "strip_url_secrets"]
