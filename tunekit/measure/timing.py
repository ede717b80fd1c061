"""The one timing helper: device-synchronized repeats, summarized by median/min/max.

Benchmarks, calibration, the Lab and the notebooks all time through `time_repeats`, so every
clock read in tunekit follows the same rule: synchronize the device, then read the clock.

    >>> tunekit.median_s(lambda: a @ b, repeats=5, warmup=1)     # seconds, median of 5
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

from ..core.validate import real, whole
from .device import existing_device, synchronize

NaN = math.nan


def time_repeats(fn, device=None, warmup: int = 1, repeats: int = 5, after_each=None) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn()`` after ``warmup`` untimed calls.

    The device is synchronized before each clock read (``device=None``: CUDA if this process
    initialized it). ``after_each(i, seconds)`` runs after call i, outside its clock.
    """
    warmup, repeats = whole("warmup", warmup, 0), whole("repeats", repeats)
    if device is not None:
        device = existing_device(device)  # a device this machine lacks: a clear error, not torch's assertion
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


@dataclass(frozen=True)
class Verdict:
    """Whether a change helped, hurt, or stayed within the noise of the measurements."""

    speedup: float   # best old time / best new time (> 1: the change is faster)
    band: float      # relative noise band the speed-up had to clear
    word: str        # "helped" | "hurt" | "within noise"

    def __str__(self) -> str:
        return f"{self.word} ({self.speedup:.2f}x, noise band ±{self.band:.0%})"


def verdict(before, after, floor: float = 0.05) -> Verdict:
    """Compare repeated timings of two settings (seconds, or seconds per token; >= 2 each).

    Contention only ever adds time, so each setting is represented by its best repeat and its
    noise by the gap between its two best repeats; the band is the larger gap, at least ``floor``.
    The change helped if it is faster by more than the band, hurt if slower by more.

    >>> tunekit.verdict([1.00, 1.02, 1.30], [0.50, 0.51])   # helped (2.00x, noise band ±5%)
    """
    floor = real("floor", floor, low_open=False)
    a, b = sorted(_times("before", before)), sorted(_times("after", after))
    band = max(floor, a[1] / a[0] - 1, b[1] / b[0] - 1)
    speedup = a[0] / b[0]
    word = "helped" if speedup > 1 + band else "hurt" if speedup < 1 / (1 + band) else "within noise"
    return Verdict(speedup, band, word)


def _times(name: str, values) -> list[float]:
    try:
        values = [float(v) for v in values]
    except (TypeError, ValueError):
        values = values if isinstance(values, (list, tuple)) else [values]   # said below
    if len(values) < 2 or not all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"{name} must hold at least 2 positive finite times (got {values!r}): "
                         "the noise band comes from the gap between the two best repeats.")
    return values
