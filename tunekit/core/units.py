"""Unit constants and human formatting. Pure: no torch, no IPython.

GiB/MiB are binary (2**30, 2**20); GB is decimal (1e9). Printed sizes always say which.
"""
from __future__ import annotations

import math

KiB = 2**10
MiB = 2**20
GiB = 2**30
GB = 10**9


def is_missing(x) -> bool:
    """True for None and NaN: a figure this machine could not measure."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt_bytes(n, signed: bool = False) -> str:
    """Bytes in binary units: ``fmt_bytes(3 * 2**20) == '3.0 MiB'``; missing -> 'n/a'."""
    if is_missing(n):
        return "n/a"
    sign = ("+" if n > 0 else "-" if n < 0 else "") if signed else ("-" if n < 0 else "")
    v = abs(float(n))
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if v >= size:
            return f"{sign}{v / size:.1f} {unit}"
    return f"{sign}{int(v)} B"


def fmt_seconds(s) -> str:
    """Seconds with a unit that keeps 3 significant digits: 0.0123 -> '12.3 ms'."""
    if is_missing(s):
        return "n/a"
    if s >= 60:
        return f"{int(s // 60)} min {s % 60:.1f} s"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"


def fmt_flops(n) -> str:
    """FLOP counts with SI prefixes (decimal): 3.3e10 -> '33.0 GFLOP'."""
    if is_missing(n):
        return "n/a"
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} FLOP"


def fmt_pct(x) -> str:
    """A fraction as a percentage: 0.404 -> '40.4%'."""
    return "n/a" if is_missing(x) else f"{100 * x:.1f}%"
