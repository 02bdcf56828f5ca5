"""What an hour of the job's instances costs: the rate interruption records and
``ckptprof compare`` price downtime and restores at."""

from __future__ import annotations

import os

COST_ENV = "CKPTPROF_COST_PER_HOUR"
#: on-demand $/hour of one 8×A100 instance (AWS p4d.24xlarge, us-east-1 list price);
#: set ``CKPTPROF_COST_PER_HOUR`` (or ``cost_per_hour=``) to yours
DEFAULT_COST_PER_HOUR = 32.77


def cost_per_hour(value: float | None = None) -> float:
    """``value`` if given, else ``$CKPTPROF_COST_PER_HOUR``, else :data:`DEFAULT_COST_PER_HOUR`."""
    if value is not None:
        return float(value)
    return float(os.environ.get(COST_ENV, DEFAULT_COST_PER_HOUR))
