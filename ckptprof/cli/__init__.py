"""The ``ckptprof`` command: a thin entry that wires one module per command.

User mistakes (:class:`~ckptprof.errors.CkptprofError`, bad options, and the builtin
errors listed in ``_BY_ERRNO`` and ``_ONE_LINE``) print one line and exit non-zero;
anything else is one line too, with the hint to set ``CKPTPROF_DEBUG=1`` for the
full traceback.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import threading

from ckptprof.cli.options import Parser
from ckptprof.console import ClosedPipeSafe, degrade_unencodable
from ckptprof.errors import CkptprofError, Terminated

DEBUG_ENV = "CKPTPROF_DEBUG"
DEBUG_HINT = f"re-run with {DEBUG_ENV}=1 for the traceback"
UNEXPECTED_EXIT = 1

# OSErrors whose errno says what to do, whatever their type
_BY_ERRNO: dict[int, tuple[str, int]] = {
    errno.ENOSPC: ("no space left on device: {e}. Free space there or choose another place.", 4),
    errno.EDQUOT: ("disk quota exceeded: {e}. Free space there or choose another place.", 4),
    errno.EROFS: ("read-only filesystem: {e}. Choose a writable place.", 4),
    errno.EMFILE: ("too many open files: {e}. Raise `ulimit -n` or lower --concurrency.", 4),
}
_ONE_LINE: tuple[tuple[type[BaseException], str, int], ...] = (
    (FileNotFoundError, "not found: {e}. Check the path (or bucket/prefix).", 2),
    (NotADirectoryError, "not a directory: {e}. Point at the checkpoint's folder.", 2),
    (PermissionError, "permission denied: {e}. Check file permissions or credentials.", 2),
    (IsADirectoryError, "is a directory: {e}. Point at a file.", 2),
    (MemoryError, "out of memory: {e}. Use a smaller --scale.", 5),
    (OSError, "I/O error: {e}", 4),
)


def build_parser() -> Parser:
    from ckptprof import __version__
    from ckptprof.cli import compare, demo, export, predict, report, synth

    parser = Parser(
        prog="ckptprof",
        description=(
            "Where checkpoint restore time goes, and why. Generates realistic checkpoints, "
            "restores them phase by phase (list, fetch, verify, deserialize, reshard, "
            "first_step) as OpenTelemetry spans, and reports the breakdown."
        ),
        epilog=f"Set {DEBUG_ENV}=1 to see tracebacks. Docs: README.md and docs/index.md",
    )
    parser.add_argument("--version", action="version", version=f"ckptprof {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    synth.add_parser(commands)
    report.add_parser(commands)
    compare.add_parser(commands)
    export.add_parser(commands)
    demo.add_parser(commands)
    predict.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    degrade_unencodable()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    stdout = sys.stdout
    sys.stdout = ClosedPipeSafe(stdout)  # `| head -1` ends the reading, not the run
    previous = _raise_on_signals()
    try:
        return _run(argv)
    except (KeyboardInterrupt, Terminated):  # stopped while a failure was being said
        return _interrupted_exit(_stopped_by[0] if _stopped_by else signal.SIGINT)
    finally:
        sys.stdout = stdout
        for signum, handler in previous.items():
            signal.signal(signum, handler)


#: the signal that stopped the command, if one did (an exception a library made of it,
#: such as torch.save's RuntimeError around a KeyboardInterrupt, still reads as it)
_stopped_by: list[int] = []
_STOP_SIGNALS = {signal.SIGINT: (KeyboardInterrupt, 130), signal.SIGTERM: (Terminated, 143)}


def _raise_stop(signum, frame) -> None:
    _stopped_by.append(signum)
    kind, _ = _STOP_SIGNALS[signum]
    raise kind(signum)


def _raise_on_signals() -> dict:
    """SIGINT and SIGTERM raise in the main thread, so that every ``finally`` cleans up
    (the previous handlers are returned, to be put back); elsewhere nothing changes."""
    _stopped_by.clear()
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, _raise_stop) for signum in _STOP_SIGNALS}


def _interrupted_exit(signum: int) -> int:
    from ckptprof.synth.distributed import launched

    if not launched():  # a rank the launcher stopped: the launcher's line says why
        print(f"ckptprof: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
    return _STOP_SIGNALS[signum][1]


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or its one-line refusal: already said
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.func(args) or 0)
    except (KeyboardInterrupt, Terminated):
        return _interrupted_exit(_stopped_by[0] if _stopped_by else signal.SIGINT)
    except Exception as exc:  # noqa: BLE001 - every failure is one line (traceback on request)
        if _stopped_by:  # a library turned the interruption into its own error
            return _interrupted_exit(_stopped_by[0])
        if os.environ.get(DEBUG_ENV):
            raise
        message, code = one_line(exc)
        from ckptprof.synth.distributed import launched, record_error

        if not (launched() and record_error(message)):  # else the launcher's line has it
            print(f"ckptprof: error: {message}", file=sys.stderr)
        return code


def one_line(exc: Exception) -> tuple[str, int]:
    """The message and exit status for ``exc``: what went wrong and what to do."""
    if isinstance(exc, CkptprofError):
        return str(exc), exc.exit_code
    if isinstance(exc, OSError) and exc.errno in _BY_ERRNO:
        template, code = _BY_ERRNO[exc.errno]
        return template.format(e=exc), code
    for kind, template, code in _ONE_LINE:
        if isinstance(exc, kind):
            return template.format(e=exc), code
    if type(exc).__name__ == "OutOfMemoryError":  # torch's, on a device: no import needed
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        return (
            f"out of device memory: {first}. Use a smaller --scale, restore one rank "
            "(--world-size N --rank R), or --device cpu.",
            5,
        )
    if isinstance(exc, EOFError):
        return f"truncated data: {exc}", 3
    first = str(exc).splitlines()[0][:300] if str(exc) else ""
    detail = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return f"unexpected {detail}; {DEBUG_HINT}.", UNEXPECTED_EXIT
