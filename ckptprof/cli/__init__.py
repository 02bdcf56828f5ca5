"""The ``ckptprof`` command: a thin entry that wires one module per command.

User mistakes (:class:`~ckptprof.errors.CkptprofError` and the builtin errors
listed in ``_ONE_LINE``) print one line and exit non-zero; set
``CKPTPROF_DEBUG=1`` for the full traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ckptprof.errors import CkptprofError

_ONE_LINE: tuple[tuple[type[BaseException], str, int], ...] = (
    (FileNotFoundError, "not found: {e}. Check the path (or bucket/prefix).", 2),
    (NotADirectoryError, "not a directory: {e}. Point at the checkpoint's folder.", 2),
    (PermissionError, "permission denied: {e}. Check file permissions or credentials.", 2),
    (IsADirectoryError, "is a directory: {e}. Point at a file.", 2),
    (MemoryError, "out of memory: {e}. Use a smaller --scale.", 5),
    (OSError, "I/O error: {e}", 4),
)


def build_parser() -> argparse.ArgumentParser:
    from ckptprof import __version__
    from ckptprof.cli import demo, report, synth

    parser = argparse.ArgumentParser(
        prog="ckptprof",
        description=(
            "Where checkpoint restore time goes, and why. Generates realistic checkpoints, "
            "restores them phase by phase (list, fetch, verify, deserialize, reshard, "
            "first_step) as OpenTelemetry spans, and reports the breakdown."
        ),
        epilog="Set CKPTPROF_DEBUG=1 to see tracebacks. Docs: README.md",
    )
    parser.add_argument("--version", action="version", version=f"ckptprof {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    synth.add_parser(commands)
    report.add_parser(commands)
    demo.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("ckptprof: interrupted", file=sys.stderr)
        return 130
    except CkptprofError as exc:
        if os.environ.get("CKPTPROF_DEBUG"):
            raise
        print(f"ckptprof: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (EOFError, OSError, MemoryError) as exc:
        if os.environ.get("CKPTPROF_DEBUG"):
            raise
        for kind, template, code in _ONE_LINE:
            if isinstance(exc, kind):
                print(f"ckptprof: error: {template.format(e=exc)}", file=sys.stderr)
                return code
        print(f"ckptprof: error: truncated data: {exc}", file=sys.stderr)
        return 3
