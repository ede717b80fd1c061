"""The one batch-size search: the largest whole number that fits, by doubling then bisection.
Pure core: the search knows nothing of what "fits" means (a real step, a fake one, a line of
bytes); its callers (lab.maxbatch, the plan's search, lab.fit's Line) say it.

    >>> found = largest_fitting(lambda b: b <= 37, limit=1024)
    >>> found.best, found.too_big, found.stopped, found.tried
    (37, 38, 'converged', [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37])
"""
from __future__ import annotations

from dataclasses import dataclass, field

STOPS = ("converged", "search limit", "stopped")


@dataclass
class Found:
    best: int | None          # the largest size that fit (None: none did)
    too_big: int | None       # the smallest size that did not (None: none failed)
    stopped: str              # one of STOPS
    tried: list = field(default_factory=list)   # the sizes asked, in order


def largest_fitting(fits, start: int = 1, limit: int = 1024) -> Found:
    """The largest ``b`` in ``[1, limit]`` with ``fits(b)`` (``fits`` monotone: true up to some
    size, false above): from ``start`` (a predicted first guess, or 1) double, capped at
    ``limit``, until a size does not fit, then bisect between the last fit and the first miss
    (below ``start`` when even it does not fit). Stops with ``"converged"`` (``best`` fits and
    ``best + 1`` does not), ``"search limit"`` (``limit`` fits: the true maximum may be higher) or
    ``"stopped"``, when ``fits(b)`` returns None: the caller cannot pay for a try at ``b`` (a time
    budget); ``best`` and ``too_big`` then bracket the answer. An exception ``fits`` raises
    ends the search and passes through."""
    if not (isinstance(start, int) and isinstance(limit, int)) or not 1 <= start <= limit:
        raise ValueError(f"need whole numbers 1 <= start <= limit, got start={start!r}, limit={limit!r}")
    found = Found(None, None, "converged")

    def ask(b: int):
        found.tried.append(b)
        return fits(b)

    good, b = 0, start
    while True:   # doubling
        ok = ask(b)
        if ok is None:
            found.stopped = "stopped"
            break
        if not ok:
            found.too_big = b
            break
        good = b
        if b >= limit:
            found.stopped = "search limit"
            break
        b = min(2 * b, limit)
    while found.stopped == "converged" and found.too_big - good > 1:   # bisection
        mid = (good + found.too_big) // 2
        ok = ask(mid)
        if ok is None:
            found.stopped = "stopped"
        elif ok:
            good = mid
        else:
            found.too_big = mid
    found.best = good or None
    return found
