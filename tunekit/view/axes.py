"""Axes, colours and marks that cannot mislead: pure helpers behind tunekit's charts.
no plotting library, no measuring, so every rule here is testable with exact numbers.

    >>> value_range([0.006])               # one point: from zero, not plotly's [-1, 1]
    [0.0, 0.0066]
    >>> log_ticks([1, 2, 4, 8, 16])        # every measured k labelled, no minor 2..9
    ([1, 2, 4, 8, 16], ['1', '2', '4', '8', '16'])
    >>> slowed_by({"flops_source": "counted"})
    'FLOP counting'
"""
from __future__ import annotations

import math

from tunekit.core.fmt import tick_label
from tunekit.core.slowed import slowed_by

__all__ = ["BASE_COLOR", "COMPONENTS", "CPU_COLOR", "ERROR_COLOR", "GPU_COLOR", "RUN_COLOR", "SLOWED_COLOR",
           "SLOWED_PATTERN", "log_ticks", "nice_ticks", "slowed_by", "tick_label", "value_range"]

# one meaning, one colour, in every panel of every tunekit chart
BASE_COLOR = "#d62728"      # the baseline run every other run is compared with
RUN_COLOR = "#1f77b4"       # a measured run or cell
SLOWED_COLOR = "#c7c7c7"    # timed while FLOP counting or tracing slowed it: not comparable
ERROR_COLOR = "#7f0000"     # a cell that raised
CPU_COLOR, GPU_COLOR = "#ff7f0e", "#2ca02c"   # process RSS, device allocator
# what a toggle changes: the measured components of a run's memory, stacked in this order
COMPONENTS = (("params_bytes", "parameters", "#636efa"), ("grads_bytes", "gradients", "#EF553B"),
              ("optimizer_bytes", "optimizer state", "#00cc96"),
              ("saved_bytes", "saved activations (one micro-batch)", "#ab63fa"))
SLOWED_PATTERN = {"shape": "/", "fgcolor": "#7f7f7f", "solidity": 0.3}


def _finite(values) -> list[float]:
    out = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out.append(f)
    return out


def value_range(values, pad: float = 0.1) -> list[float]:
    """The y range of a bar or point chart: from zero (a ratio is read against zero) to ``pad``
    above the largest value, below zero only for negative values. One point, a flat series or no
    finite value still gets a range that shows it above zero: [0, 1] when there is nothing else."""
    vals = _finite(values)
    lo, hi = min(vals + [0.0]), max(vals + [0.0])
    if lo == hi == 0.0:
        return [0.0, 1.0]
    span = hi - lo
    return [_round(lo - pad * span if lo < 0 else 0.0), _round(hi + pad * span if hi > 0 else 0.0)]


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def log_ticks(values) -> tuple[list, list[str]]:
    """(tickvals, ticktext) for a log axis: the values themselves when there are at most 8
    distinct ones (a sweep over k = 1, 2, 4, 8, 16 is labelled at each k), else 1-2-5 steps of
    every decade they span. Never the minor labels 2..9 plotly draws on short log ranges."""
    vals = sorted({v for v in _finite(values) if v > 0})
    if not vals:
        return [], []
    if len(vals) <= 8:
        ticks = [int(v) if v.is_integer() else v for v in vals]
    else:
        lo, hi = math.floor(math.log10(vals[0])), math.ceil(math.log10(vals[-1]))
        mults = (1,) if hi - lo > 3 else (1, 2, 5)
        ticks = [m * 10 ** e for e in range(lo, hi + 1) for m in mults if vals[0] <= m * 10 ** e <= vals[-1]]
        ticks = [int(t) if float(t).is_integer() else t for t in ticks]
    return ticks, [tick_label(t) for t in ticks]


def nice_ticks(lo: float, hi: float, most: int = 6) -> list[float]:
    """Ticks on 1, 2 or 5 times a power of ten inside [lo, hi], at most ``most`` of them: a
    secondary axis gets 80, 100, 120, not 89, 110.7."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    step = 10 ** math.floor(math.log10((hi - lo) / most))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= most:
            step *= m
            break
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    return [_round(k * step) for k in range(first, last + 1)]
