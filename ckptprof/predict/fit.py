"""A phase's cost as a fixed part plus a part per byte (plus one per file), fitted from
measured runs.

At the scales one node can afford to measure, much of an operation is fixed cost: a
process's set-up, each tensor's copy set-up, each file's create, fsync and open. A cost
per byte alone, taken from one small run, charges that fixed cost again for every byte
of a larger job. Two runs at different sizes separate the two parts; runs at different
file counts add a part per file. Each part keeps its source: measured (one run: per byte
alone, as before), or fitted (from which runs).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from statistics import median

from ckptprof.predict.model import Cost, Given


@dataclass(frozen=True)
class Point:
    """One rank's measured seconds in one phase, at its bytes and its files."""

    bytes: int
    files: int
    seconds: float


def _solve(rows: list[tuple[float, ...]], values: list[float]) -> list[float]:
    """Least squares by the normal equations (two terms at most: no library needed)."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    b = [sum(r[i] * v for r, v in zip(rows, values, strict=True)) for i in range(n)]
    for col in range(n):  # Gauss-Jordan with partial pivoting
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot], b[col], b[pivot] = a[pivot], a[col], b[pivot], b[col]
        if a[col][col] == 0:
            raise ZeroDivisionError("singular")
        for r in range(n):
            if r != col:
                k = a[r][col] / a[col][col]
                a[r] = [x - k * y for x, y in zip(a[r], a[col], strict=True)]
                b[r] -= k * b[col]
    return [b[i] / a[i][i] for i in range(n)]


def per_file_slope(settings: dict[tuple[int, int], list[float]]) -> tuple[float, int, int] | None:
    """The cost of one more file: the slope between the two largest file counts measured
    at about the same bytes (within a tenth: each file's own headers add bytes with the
    count, and belong to its cost), ``(seconds, fewer, more)``; None where no bytes were
    measured at two counts, or where more files took less time (a cost is not negative).

    Not a least-squares line through every count: a restore reads 8 files at a time and a
    save serializes while it writes, so below that concurrency an added file adds
    parallelism as well as work; and with the fixed part a line through every count could
    drop (a negative term), one file carried the whole fixed cost as its part per file.
    The largest counts are the nearest to the jobs a many-file prediction is for."""
    keys = sorted(settings, key=lambda key: (key[1], key[0]), reverse=True)
    for most in keys:  # the largest count with a smaller one at about its bytes
        near = [k for k in keys if k[1] < most[1] and abs(k[0] - most[0]) <= most[0] / 10]
        if near:
            fewer = near[0]  # the largest such count (the larger bytes on a tie)
            break
    else:
        return None
    slope = (median(settings[most]) - median(settings[fewer])) / (most[1] - fewer[1])
    return (slope, fewer[1], most[1]) if slope >= 0 else None


def fit(points: list[Point], source: str) -> Cost:
    """The cost that ``points`` measured: per byte alone from one setting; from more,
    fixed plus per byte (where the bytes vary) by least squares over each setting's
    median, after a part per file (where the files vary: :func:`per_file_slope`) is taken
    out of each. A term that comes out negative is dropped and the rest fitted again (a
    cost is not negative; a negative part per byte drops the fixed part instead)."""
    settings: dict[tuple[int, int], list[float]] = defaultdict(list)
    for p in points:
        settings[(p.bytes, p.files)].append(p.seconds)
    keys = sorted(settings)
    values = [median(settings[k]) for k in keys]
    if len(keys) == 1:
        nbytes = keys[0][0]
        return Cost(Given(values[0] / nbytes if nbytes else 0.0, f"measured: {source}"))
    where = f"fitted: {len(keys)} settings, {sum(map(len, settings.values()))} runs of {source}"
    per_file = per_file_slope(settings)
    if per_file is not None:
        values = [v - per_file[0] * f for v, (_, f) in zip(values, keys, strict=True)]
    terms = ["fixed"]
    if len({b for b, _ in keys}) > 1:
        terms.append("per byte")
    while True:
        rows = [tuple({"fixed": 1.0, "per byte": b}[t] for t in terms) for b, _ in keys]
        try:
            solved = dict(zip(terms, _solve(rows, values), strict=True))
        except ZeroDivisionError:
            solved = {t: 0.0 for t in terms}
        negative = [t for t in terms if solved[t] < 0]
        if not negative or len(terms) == 1:
            break
        # a negative cost per byte: the runs cannot tell it from a fixed cost; per byte
        # alone is the reading that does not make a larger job free
        drop = "fixed" if "per byte" in negative and "fixed" in terms else None
        terms.remove(drop or min(negative, key=solved.get))
    given = {t: Given(max(0.0, solved[t]), where) for t in terms}
    return Cost(
        per_byte_s=given.get("per byte", Given(0.0, where)),
        fixed_s=given.get("fixed"),
        per_file_s=Given(per_file[0], f"{where}; per file: {per_file[1]} → {per_file[2]} files")
        if per_file is not None
        else None,
    )


def remainder(whole: Cost, parts: list[Cost], what: str = "the wall time") -> Cost:
    """What ``whole`` (a rank's ``what``, fitted) holds beyond ``parts`` (its phases,
    fitted), term by term: set-up and the gaps between phases, or, negative, the time the
    phases overlapped."""

    def left(term: str) -> Given | None:
        found = [getattr(c, term) for c in (whole, *parts) if getattr(c, term) is not None]
        if not found:
            return None
        value = (getattr(whole, term).value if getattr(whole, term) else 0.0) - sum(
            getattr(p, term).value for p in parts if getattr(p, term) is not None
        )
        return Given(value, f"{whole.source}: {what} less its phases")

    return Cost(left("per_byte_s"), left("fixed_s"), left("per_file_s"))
