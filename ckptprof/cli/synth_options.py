"""The options ``synth generate``, ``synth save``, ``synth restore`` and the demo share,
declared once, and how the commands read them."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from ckptprof.cli.options import Moot, choice_list, int_list, real, seconds_or_off, size, whole
from ckptprof.synth import ranges
from ckptprof.synth.layouts import LAYOUT_NAMES
from ckptprof.synth.options import RestoreOptions
from ckptprof.synth.presets import PRESETS
from ckptprof.synth.strategies import registry as strategy_registry

#: what a restore does when not told: the options' own defaults
RESTORE_DEFAULTS = RestoreOptions()


def add_spec_arguments(parser, scale: float = 1.0) -> None:
    """What the checkpoint is: model, layout, ranks, scale, optimizer, files, step, seed
    (``synth generate``, ``synth save`` and the demo: one declaration of each)."""
    parser.add_argument(
        "--model",
        default="llama2-7b",
        choices=tuple(PRESETS),
        metavar="NAME",
        help="preset: %(choices)s",
    )
    parser.add_argument(
        "--layout", default="torch", choices=LAYOUT_NAMES, help="file layout: %(choices)s"
    )
    parser.add_argument(
        "--ranks", type=whole(ranges.RANKS), default=1, help="ranks that saved it (sharding)"
    )
    parser.add_argument(
        "--scale",
        type=real(ranges.SCALE),
        default=scale,
        help=f"0 < S <= 1: fraction of full-size bytes; names and layout unchanged "
        f"(default {scale:g})",
    )
    parser.add_argument(
        "--optimizer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="include Adam moments (fp32)",
    )
    parser.add_argument("--master-weights", action="store_true", help="include fp32 master weights")
    parser.add_argument(
        "--files",
        type=whole(ranges.FILES),
        default=None,
        help="split the tensor data into N files (many small vs few packed)",
    )
    parser.add_argument(
        "--step", type=whole(ranges.STEP), default=1000, help="training step the checkpoint is at"
    )
    parser.add_argument(
        "--seed", type=whole(ranges.SEED), default=0, help="seed of the random bytes"
    )


# The restore options ``synth restore`` and the demo share (with ``--device``, from
# :func:`ckptprof.cli.options.add_device_option`): one declaration each. Their help says
# what they are; the help formatter adds each command's own default, so a command that
# restores differently by default (the demo) says so with ``set_defaults``.


def add_strategy_option(parser) -> None:
    parser.add_argument(
        "--strategy",
        type=choice_list(strategy_registry.NAMES),
        default=RESTORE_DEFAULTS.strategies,
        help="how bytes become state, comma-separated to compare side by side: staged "
        "(everything into memory, then load), pipelined (only what the rank needs, loaded "
        "as it lands, inside --memory-budget), framework (the layout's own loader on the "
        "path), runai (the Run:ai Model Streamer on safetensors; pip install "
        "runai-model-streamer) or s3torchconnector (AWS's S3 client for PyTorch, s3:// "
        "only; pip install s3torchconnector)",
    )


def add_concurrency_option(parser) -> None:
    parser.add_argument(
        "--concurrency",
        type=int_list(ranges.CONCURRENCY),
        default=RESTORE_DEFAULTS.concurrency,
        help="requests in flight, comma-separated",
    )


def add_repeat_option(parser) -> None:
    parser.add_argument(
        "--repeat",
        type=whole(ranges.REPEAT),
        default=RESTORE_DEFAULTS.repeat,
        help="repeats per setting; medians are reported",
    )


def add_world_size_option(parser) -> None:
    parser.add_argument(
        "--world-size",
        type=whole(ranges.RANKS),
        default=RESTORE_DEFAULTS.world_size,
        help="target ranks to reshard into (default: the saved ranks)",
    )


def add_rank_option(parser) -> None:
    parser.add_argument(
        "--rank",
        type=whole(ranges.RANK),
        default=RESTORE_DEFAULTS.rank,
        help="restore only this rank of --world-size (what one process of the job holds and "
        "reads); default: every rank, in this one process",
    )


def add_memory_budget_option(parser) -> None:
    parser.add_argument(
        "--memory-budget",
        type=size(ranges.MEMORY_BUDGET),
        default=RESTORE_DEFAULTS.memory_budget,
        metavar="SIZE",
        help="bytes the pipelined strategy may hold in flight, e.g. 1G (default: a quarter "
        "of free memory, at most 2G)",
    )


def memory_budget_moot(chosen: Callable[[argparse.Namespace], Sequence[str]]) -> Moot:
    """--memory-budget bounds only a strategy that holds a window of reads (its
    ``bounded_by_budget``): with none of them among the ``chosen`` strategies of the parsed
    arguments, it does nothing."""

    def windowed() -> list[str]:
        get = strategy_registry.get_strategy
        return [n for n in strategy_registry.NAMES if get(n).bounded_by_budget]

    return Moot(
        ("memory_budget",),
        lambda args: not set(chosen(args)) & set(windowed()),
        lambda args: (
            f"it bounds the reads {' and '.join(windowed())} holds, and --strategy "
            f"is {','.join(chosen(args))}"
        ),
        "add pipelined to --strategy, or drop --memory-budget",
    )


def add_force_option(parser) -> None:
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace the ckptprof checkpoint in DEST (only the files ckptprof wrote there)",
    )


def add_stall_option(parser) -> None:
    parser.add_argument(
        "--stall-after", type=seconds_or_off(ranges.SECONDS), default=None, metavar="SECONDS",
        help="warn (with every thread's stack, also in the trace) when a phase makes no "
        "progress for this long; the run goes on; 0 or off: never (default: "
        "$CKPTPROF_STALL_AFTER or 120)",
    )  # fmt: skip


def stall_option(given: float | None) -> float | bool:
    """``--stall-after`` as the options take it: True (not given: the environment's or the
    default), 0.0 (off) or the seconds."""
    return True if given is None else given


def stall_after_s(option: float | bool | None) -> float | None:
    """The seconds an option gives (True: the environment's, or the default)."""
    from ckptprof.tracing.watchdog import stall_after_from_env

    return stall_after_from_env() if option is True else (option or None)


def without_nproc(argv: list[str]) -> list[str]:
    """The command line, less ``--nproc-per-node N``: what each rank runs."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc-per-node":
            skip = True
        elif not arg.startswith("--nproc-per-node="):
            out.append(arg)
    return out
