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

TERMS = ("fixed", "per byte", "per file")


@dataclass(frozen=True)
class Point:
    """One rank's measured seconds in one phase, at its bytes and its files."""

    bytes: int
    files: int
    seconds: float


def _solve(rows: list[tuple[float, ...]], values: list[float]) -> list[float]:
    """Least squares by the normal equations (at most three terms: no library needed)."""
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


def fit(points: list[Point], source: str) -> Cost:
    """The cost that ``points`` measured: per byte alone from one setting; from more,
    fixed plus per byte (where the bytes vary) plus per file (where the files vary), by
    least squares over each setting's median. A term that comes out negative is dropped
    (a cost is not negative; a negative part per byte drops the fixed part instead) and
    the rest fitted again."""
    settings: dict[tuple[int, int], list[float]] = defaultdict(list)
    for p in points:
        settings[(p.bytes, p.files)].append(p.seconds)
    keys = sorted(settings)
    values = [median(settings[k]) for k in keys]
    if len(keys) == 1:
        nbytes = keys[0][0]
        return Cost(Given(values[0] / nbytes if nbytes else 0.0, f"measured: {source}"))
    terms = ["fixed"]
    if len({b for b, _ in keys}) > 1:
        terms.append("per byte")
    if len({f for _, f in keys}) > 1 and len(keys) > len(terms):
        terms.append("per file")
    where = f"fitted: {len(keys)} settings, {sum(map(len, settings.values()))} runs of {source}"
    while True:
        rows = [tuple({"fixed": 1.0, "per byte": b, "per file": f}[t] for t in terms)
                for b, f in keys]  # fmt: skip
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
        per_file_s=given.get("per file"),
    )


def remainder(whole: Cost, parts: list[Cost]) -> Cost:
    """What ``whole`` (a rank's wall time, fitted) holds beyond ``parts`` (its phases,
    fitted), term by term: set-up and the gaps between phases, or, negative, the time the
    phases overlapped."""

    def left(term: str) -> Given | None:
        found = [getattr(c, term) for c in (whole, *parts) if getattr(c, term) is not None]
        if not found:
            return None
        value = (getattr(whole, term).value if getattr(whole, term) else 0.0) - sum(
            getattr(p, term).value for p in parts if getattr(p, term) is not None
        )
        return Given(value, f"{whole.source}: the wall time less its phases")

    return Cost(left("per_byte_s"), left("fixed_s"), left("per_file_s"))
