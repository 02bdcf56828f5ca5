"""Short names for where results came from, so every view labels a source the same way."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def source_labels(paths: Sequence[str]) -> list[str]:
    """Each path's folder (a results.json's or save.json's own folder), with as many parent
    folders as it takes to tell the paths apart: ``local/restore``, ``s3/restore``."""
    parts = [(Path(p).parent if Path(p).suffix == ".json" else Path(p)).parts for p in paths]
    deepest = max((len(x) for x in parts), default=1)
    for depth in range(1, deepest + 1):
        labels = ["/".join(x[-depth:]) or str(p) for x, p in zip(parts, paths, strict=True)]
        if len(set(labels)) == len(labels):
            return labels
    return [str(p) for p in paths]


__all__ = ["source_labels"]
