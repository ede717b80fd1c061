"""Unit constants, and what counts as a missing figure. Pure: no torch, no IPython.

GiB/MiB are binary (2**30, 2**20); GB is decimal (1e9). Printed sizes always say which; the
formats themselves are in `core.fmt`.
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
