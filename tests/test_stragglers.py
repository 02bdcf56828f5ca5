"""The straggler rule on hand-made boards: each case is what the ranks of a job would
publish (the run's trace id, whether an operation is open, its open phases), and the
answer is worked out by hand from the rule: a rank is named when it is inside a phase
that every other rank of the same run has left."""

from __future__ import annotations

import pytest

from ckptprof.synth.stragglers import stragglers

RUN = "a" * 32
OTHER_RUN = "b" * 32


def entry(phases: list[str], trace: str = RUN, open_: bool = True) -> dict:
    return {"trace": trace, "phases": phases, "open": open_, "host": "node-0"}


@pytest.mark.parametrize(
    "board, named",
    [
        # the other rank finished the run: rank 1, still fetching, is the one waited on
        ({0: entry([], open_=False), 1: entry(["fetch"])}, [(1, "fetch", RUN)]),
        # the other rank is in a later phase of the same run
        ({0: entry(["deserialize"]), 1: entry(["fetch"])}, [(1, "fetch", RUN)]),
        # a save: the other rank has moved on to its commit
        ({0: entry(["write"]), 1: entry(["commit"]), 2: entry([], open_=False)},
         [(0, "write", RUN)]),
        # the same phase: nobody is ahead, nobody is named
        ({0: entry(["fetch"]), 1: entry(["fetch"])}, []),
        # one rank is ahead, the other is still in that phase with the straggler
        ({0: entry(["fetch"]), 1: entry(["fetch"]), 2: entry(["verify"])}, []),
        # the other rank is in another run (not there yet, or past it): not comparable
        ({0: entry([], trace=OTHER_RUN, open_=False), 1: entry(["fetch"])}, []),
        # open between phases: ahead of nothing, so not past the fetch
        ({0: entry([]), 1: entry(["fetch"])}, []),
        # a rank that has not opened an operation is nobody's straggler
        ({0: entry([], open_=False), 1: entry(["fetch"], open_=False)}, []),
        # alone in the job: no one waits on it
        ({0: entry(["fetch"])}, []),
    ],
)  # fmt: skip
def test_the_straggler_rule_on_hand_made_boards(board, named):
    assert stragglers(board) == named
