"""The test suite's faults inside the ranks of a real job, put there from outside the
product: a test launches ``ckptprof … --nproc-per-node N`` with this folder first on
``PYTHONPATH`` (``rank_hooks()`` in tests/test_distributed.py), so each rank's interpreter
loads this module at start-up and, in the rank named, wraps a step of the restore or save:

* ``CKPTPROF_TEST_SLOW_RANK=RANK:SECONDS``: that rank sleeps inside a ``fetch`` phase of
  each restore, right after its ``list`` (as slow storage would hold it);
* ``CKPTPROF_TEST_DIE_RANK=RANK``: that rank exits with code 70 there, saying nothing;
* ``CKPTPROF_TEST_SLOW_SAVE_START=RANK:SECONDS``: that rank builds its state for a save
  that much later than the others (it reaches the save's barrier last).

Processes that are not a launched rank (the command itself, the launcher) are left as
they are.
"""

from __future__ import annotations

import os


def _rank_and_seconds(name: str) -> tuple[int, float] | None:
    raw = os.environ.get(name)
    if not raw:
        return None
    rank, _, seconds = raw.partition(":")
    return int(rank), float(seconds or 0)


def _install(rank: int) -> None:
    import time

    slow = _rank_and_seconds("CKPTPROF_TEST_SLOW_RANK")
    die = _rank_and_seconds("CKPTPROF_TEST_DIE_RANK")
    if (slow and slow[0] == rank) or (die and die[0] == rank):
        from ckptprof.phases import Phase
        from ckptprof.synth import run

        list_phase = run.list_phase

        def held_after_list(subject, op):
            listed = list_phase(subject, op)
            if die and die[0] == rank:
                os._exit(70)
            with op.phase(Phase.FETCH):  # the sleep counts as the fetch, as slow storage's
                time.sleep(slow[1])
            return listed

        run.list_phase = held_after_list
    late = _rank_and_seconds("CKPTPROF_TEST_SLOW_SAVE_START")
    if late and late[0] == rank:
        from ckptprof.synth import save

        build_state = save.build_state

        def built_late(*args, **kwargs):
            time.sleep(late[1])
            return build_state(*args, **kwargs)

        save.build_state = built_late


if os.environ.get("TORCHELASTIC_RUN_ID") and "RANK" in os.environ:
    _install(int(os.environ["RANK"]))
