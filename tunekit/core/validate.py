"""Checks for values that cross a public boundary, before any work starts. Pure.

Each returns the value in its plain Python type (a numpy or torch integer scalar becomes an
``int``) or raises ``ValueError`` naming the argument, the value and what is allowed.

    >>> whole("micro_batch", numpy.int64(4))
    4
    >>> flag("compile", "yes")          # ValueError: compile must be True or False, got 'yes'
"""
from __future__ import annotations

import math
import numbers


def is_whole(v) -> bool:
    """An integer, numpy/torch integer scalars included; never a bool."""
    if isinstance(v, bool) or getattr(v, "dtype", None) is not None and "bool" in str(v.dtype):
        return False
    if isinstance(v, numbers.Integral):
        return True
    # a 0-d torch integer tensor: has __index__ but is no numbers.Integral
    return hasattr(v, "__index__") and getattr(v, "ndim", 1) == 0


def whole(name: str, v, minimum: int = 1, maximum: int | None = None):
    """An integer in [minimum, maximum]."""
    if not is_whole(v) or not minimum <= int(v) <= (maximum if maximum is not None else int(v)):
        span = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be a whole number {span}, got {v!r}")
    return int(v)


def flag(name: str, v) -> bool:
    """True or False (numpy's bool_ too); "yes", 1 or None are refused."""
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return bool(v)
    raise ValueError(f"{name} must be True or False, got {v!r}")


def real(name: str, v, low: float = 0.0, high: float = math.inf, low_open: bool = True,
         high_open: bool = False) -> float:
    """A finite number in the given interval (open at ``low`` by default)."""
    ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
    if ok:
        ok = (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    if not ok:
        lo = f"{'>' if low_open else '>='} {low:g}"
        hi = "" if high == math.inf else f" and {'<' if high_open else '<='} {high:g}"
        raise ValueError(f"{name} must be a finite number {lo}{hi}, got {v!r}")
    return float(v)


def choice(name: str, v, allowed) -> str:
    if v not in tuple(allowed):
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {v!r}")
    return v
