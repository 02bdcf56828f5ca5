"""Restore strategies: how a checkpoint's bytes become the restored state.

One module per strategy (:mod:`.staged`, :mod:`.pipelined`, :mod:`.framework`,
:mod:`.runai`, :mod:`.s3torchconnector`), the shared contract and helpers in
:mod:`.base`, DCP's own loader paths in :mod:`.dcp`, and the names in :mod:`.registry`.
Each strategy says which layout formats it restores and with which function
(:meth:`~.base.Strategy.handlers`): that is the strategy × format table of
``docs/design.md`` §5. Every strategy fills the same
:class:`~ckptprof.synth.targets.TargetState`, so results compare byte for byte, and
reads through the one I/O core (:mod:`ckptprof.io`).
"""

from ckptprof.synth.strategies.registry import BUILTIN, DEFAULT, NAMES, OPTIONAL, get_strategy

__all__ = ["BUILTIN", "DEFAULT", "NAMES", "OPTIONAL", "get_strategy"]
