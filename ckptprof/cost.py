"""What an hour of the job's instances costs: the rate interruption records and
``ckptprof compare`` price downtime and restores at."""

from __future__ import annotations

import logging
import os

COST_ENV = "CKPTPROF_COST_PER_HOUR"
#: on-demand $/hour of one 8×A100 instance (AWS p4d.24xlarge, us-east-1 list price);
#: set ``CKPTPROF_COST_PER_HOUR`` (or ``cost_per_hour=``) to yours
DEFAULT_COST_PER_HOUR = 32.77
#: no instance-hour costs more (the largest GPU instances list below $100/hour): a price
#: above it is a typo, and would print costs hundreds of digits long
MAX_PRICE_PER_HOUR = 100_000.0


def cost_per_hour(value: float | None = None) -> float:
    """``value`` if given, else ``$CKPTPROF_COST_PER_HOUR``, else :data:`DEFAULT_COST_PER_HOUR`.

    A variable that is no price in range is the default, said once in the log."""
    if value is not None:
        return float(value)
    raw = os.environ.get(COST_ENV, "").strip()
    if not raw:
        return DEFAULT_COST_PER_HOUR
    try:
        price = float(raw)
    except ValueError:
        price = -1.0
    if not 0 <= price <= MAX_PRICE_PER_HOUR:
        _warn_once(
            f"ckptprof: warning: {COST_ENV}={raw!r} is not a price per hour from 0 to "
            f"{MAX_PRICE_PER_HOUR:g}; using {DEFAULT_COST_PER_HOUR}."
        )
        return DEFAULT_COST_PER_HOUR
    return price


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logging.getLogger("ckptprof").warning(message)
