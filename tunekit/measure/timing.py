"""The one timing helper: device-synchronized repeats, summarized by median/min/max.

Benchmarks, calibration, the Lab and the notebooks all time through `time_repeats`, so every
clock read in tunekit follows the same rule: synchronize the device, then read the clock.

    >>> tunekit.median_s(lambda: a @ b, repeats=5, warmup=1)     # seconds, median of 5
"""
from __future__ import annotations

import math
import statistics
import time

from ..core.validate import whole
from .device import synchronize

NaN = math.nan


def time_repeats(fn, device=None, warmup: int = 1, repeats: int = 5, after_each=None) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn()`` after ``warmup`` untimed calls.

    The device is synchronized before each clock read (``device=None``: CUDA if this process
    initialized it). ``after_each(i, seconds)`` runs after call i, outside its clock.
    """
    warmup, repeats = whole("warmup", warmup, 0), whole("repeats", repeats)
    for _ in range(warmup):
        fn()
    out = []
    for i in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        out.append(time.perf_counter() - t0)
        if after_each is not None:
            after_each(i, out[-1])
    return out


def median_s(fn, repeats: int = 5, warmup: int = 1, device=None) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` calls after ``warmup``.

    Example: ``tunekit.median_s(lambda: model(x).sum().backward(), repeats=5)``.
    """
    return statistics.median(time_repeats(fn, device, warmup, repeats))


def stats(times, prefix: str = "") -> dict:
    """median/min/max of a list of seconds (NaN when empty): keys ``{prefix}median_s`` etc."""
    if not times:
        return {f"{prefix}median_s": NaN, f"{prefix}min_s": NaN, f"{prefix}max_s": NaN,
                f"{prefix}repeats": 0}
    return {f"{prefix}median_s": statistics.median(times), f"{prefix}min_s": min(times),
            f"{prefix}max_s": max(times), f"{prefix}repeats": len(times)}
