"""Unit constants, and what counts as a missing figure. Pure: no torch, no IPython.

GiB/MiB are binary (2**30, 2**20); GB is decimal (1e9). Printed sizes always say which; the
formats themselves are in `core.fmt`.
"""
from __future__ import annotations

import math
import numbers

KiB = 2**10
MiB = 2**20
GiB = 2**30
GB = 10**9


def is_missing(x) -> bool:
    """True for None and NaN (a float, a numpy float): a figure this machine could not measure.
    The one test for a missing number in tunekit (``tests/project/test_code_shape.py`` forbids ``x != x``,
    ``math.isnan`` and private twins elsewhere).

    >>> is_missing(None), is_missing(float("nan")), is_missing(0.0), is_missing("n/a")
    (True, True, False, False)
    """
    return x is None or (isinstance(x, (float, numbers.Real)) and math.isnan(x))  # float first: the common case
