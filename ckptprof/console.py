"""Output that never crashes on the terminal's encoding.

ckptprof's text uses a few typographic characters (…, —, ×, ≈, ±, →). Where a stream
cannot encode them (``LC_ALL=C``, a pipe to an ASCII-only logger), each degrades to its
ASCII spelling instead of raising ``UnicodeEncodeError`` half-way through a report; and
where the reader of standard output has gone, the rest is discarded, not an error.
"""

from __future__ import annotations

import codecs
import os
import sys

ERROR_HANDLER = "ckptprof-ascii"
ASCII_SPELLINGS = {
    "…": "...",
    "—": "-",
    "–": "-",
    "×": "x",
    "≈": "~",
    "±": "+/-",
    "→": "->",
    "←": "<-",
    "≥": ">=",
    "≤": "<=",
    "µ": "u",
    "·": ".",
    "‘": "'",
    "’": "'",
    "“": '"',
    "”": '"',
}


def _ascii_spelling(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    text = exc.object[exc.start : exc.end]
    return "".join(ASCII_SPELLINGS.get(ch, "?") for ch in text), exc.end


codecs.register_error(ERROR_HANDLER, _ascii_spelling)


def degrade_unencodable(*streams) -> None:
    """Make each text stream (stdout and stderr by default) write what its encoding
    cannot hold in ASCII rather than fail; streams that can encode it are untouched."""
    for stream in streams or (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        encoding = getattr(stream, "encoding", None) or "ascii"
        try:
            "".join(ASCII_SPELLINGS).encode(encoding)
            continue  # it encodes ckptprof's characters: nothing to do
        except (UnicodeEncodeError, LookupError):
            pass
        if reconfigure is not None:
            reconfigure(errors=ERROR_HANDLER)


class ClosedPipeSafe:
    """A text stream that outlives its reader: once the reader has gone (``| head -1``),
    what follows goes to ``/dev/null`` and the command carries on to its end, its
    results written, instead of failing on ``EPIPE`` half-way through a measurement."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._discard()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._discard()

    def _discard(self) -> None:
        self.reader_gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())  # the pending bytes go there too
        finally:
            os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
