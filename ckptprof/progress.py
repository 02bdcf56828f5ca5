"""Progress bars for long work, one look everywhere (tqdm).

``progress``: True shows the bar, False hides it, None lets tqdm decide (shown on a
terminal, hidden when output goes to a file or a pipe: CI logs stay clean).
"""

from __future__ import annotations

from tqdm import tqdm


def bar(total: int, desc: str, progress: bool | None, *, nbytes: bool = True, leave=False):
    """A bar over ``total`` bytes (or items with ``nbytes=False``)."""
    return tqdm(
        total=total,
        unit="B" if nbytes else "it",
        unit_scale=nbytes,
        desc=desc,
        disable=None if progress is None else not progress,
        leave=leave,
    )


__all__ = ["bar"]
