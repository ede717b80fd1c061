"""Whether two timings differ beyond noise: the one judgement behind ``tunekit.verdict``,
``tunekit.lab.repeat_agreement`` and the autotune search. Pure.

Contention on a shared machine only ever adds time, so a setting is represented by its fastest
repeat, and its noise by how far its repeats disagree (slowest over fastest, of its fastest few).
Two settings differ only when their best times are further apart than the noise band.

    >>> band([[1.00, 1.02, 1.30], [0.50, 0.51]], floor=0.05)   # 0.05: both gaps are 2%
    >>> word(1.00 / 0.50, 0.05)                                  # 'helped'
"""
from __future__ import annotations


def disagreement(groups, fastest: int | None = None) -> float:
    """How far repeated timings of one setting disagree, for the worst of ``groups`` (each a list
    of one setting's times): its slowest over its fastest time, 1.0 when they agree. ``fastest``:
    only each setting's that many fastest repeats count. A setting with one time, or none, agrees."""
    worst = 1.0
    for times in groups:
        best = sorted(times)[:fastest]
        if best:
            worst = max(worst, best[-1] / best[0])
    return worst


def band(groups, floor: float = 0.0) -> float:
    """The relative difference two timings must exceed to count: how far the two fastest repeats
    of any setting in ``groups`` disagree, at least ``floor``."""
    return max(floor, disagreement(groups, fastest=2) - 1)


def word(speedup: float, band: float) -> str:
    """``speedup`` (old best time / new best time) judged against ``band``: "helped" (faster
    beyond the band), "hurt" (slower beyond it) or "within noise"."""
    if speedup > 1 + band:
        return "helped"
    return "hurt" if speedup < 1 / (1 + band) else "within noise"
