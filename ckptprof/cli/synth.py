"""``ckptprof synth``: the standalone synthetic mode, one module per subcommand
(:mod:`~ckptprof.cli.synth_generate`, :mod:`~ckptprof.cli.synth_save`,
:mod:`~ckptprof.cli.synth_restore`); the options they share are declared once in
:mod:`~ckptprof.cli.synth_options`."""

from __future__ import annotations

from ckptprof.cli import synth_generate, synth_restore, synth_save


def add_parser(commands) -> None:
    synth = commands.add_parser(
        "synth",
        help="generate synthetic checkpoints, time their save and restore",
        description="Synthetic mode: realistic checkpoints (real tensor names, shapes and file "
        "layouts) on a target storage, restored phase by phase.",
    )
    sub = synth.add_subparsers(dest="synth_command", metavar="SUBCOMMAND")
    sub.required = True
    synth_generate.add_parser(sub)
    synth_save.add_parser(sub)
    synth_restore.add_parser(sub)
