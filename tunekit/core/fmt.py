"""Numbers as tunekit prints them: the one home of every number format. Pure: no torch.

Bytes (binary units), seconds, FLOPs, TFLOPS, percentages, parameter counts, rates (tokens/s),
a table's columns (`FORMATS`) and an axis's ticks. A figure this machine could not measure (None
or NaN) reads 'n/a'. Its own module, apart from the unit constants of `core.units`: formatting is
presentation, and moves with it.

    >>> fmt_bytes(3 * 2**20), fmt_seconds(0.0123), fmt_pct(0.404), fmt_rate(12345.6)
    ('3.0 MiB', '12.3 ms', '40.4%', '12,346 tokens/s')
"""
from __future__ import annotations

import math
from typing import Callable

from tunekit.core.units import GiB, KiB, MiB, is_missing

NA = "n/a"


def fmt_bytes(n, signed: bool = False) -> str:
    """Bytes in the largest binary unit that keeps a whole part: ``3 * 2**20`` -> '3.0 MiB',
    1023 -> '1023 B'; ``signed`` puts '+' before a positive delta."""
    if is_missing(n):
        return NA
    sign = ("+" if n > 0 else "-" if n < 0 else "") if signed else ("-" if n < 0 else "")
    v = abs(float(n))
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if v >= size:
            return f"{sign}{v / size:.1f} {unit}"
    return f"{sign}{int(v)} B"


def fmt_gib(n, digits: int = 2) -> str:
    """Bytes always in GiB, thousands separated: a plan's memory, ``3 * 2**30`` -> '3.00 GiB'."""
    return NA if is_missing(n) else f"{n / GiB:,.{digits}f} GiB"


def fmt_mib(n, digits: int = 1) -> str:
    """Bytes always in MiB, thousands separated: ``3 * 2**20`` -> '3.0 MiB'."""
    return NA if is_missing(n) else f"{n / MiB:,.{digits}f} MiB"


def fmt_seconds(s) -> str:
    """Seconds with a unit that keeps 3 significant digits: 0.0123 -> '12.3 ms'; 0.99995 -> '1 s'."""
    if is_missing(s):
        return NA
    if s >= 60:
        return f"{int(s // 60)} min {s % 60:.1f} s"
    r = float(f"{s:.3g}")  # the unit of the rounded figure: 999.95 ms is '1 s', not '1e+03 ms'
    if r >= 1:
        return f"{s:.3g} s"
    if r >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"


def fmt_ms(s, us_below_ms: bool = False) -> str:
    """A step's time in milliseconds, one decimal: 0.5375 -> '537.5 ms'. ``us_below_ms``: a time
    under a millisecond in microseconds instead (42e-6 -> '42.0 µs', never '0.0 ms'; 0 stays ms),
    spelled as `fmt_seconds` spells them."""
    if is_missing(s):
        return NA
    if us_below_ms and 0 < abs(s) < 1e-3:
        return f"{s * 1e6:,.1f} µs"
    return f"{s * 1e3:,.1f} ms"


def fmt_elapsed(s) -> str:
    """Wall-clock seconds gone, one decimal, in progress lines: 12.34 -> '12.3 s'."""
    return NA if is_missing(s) else f"{s:.1f} s"


def fmt_flops(n) -> str:
    """FLOP counts with SI prefixes (decimal): 3.3e10 -> '33.0 GFLOP'."""
    if is_missing(n):
        return NA
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} FLOP"


def fmt_tflops(x, digits: int = 3) -> str:
    """A rate in TFLOPS to ``digits`` significant digits: 41.234 -> '41.2 TFLOPS'."""
    return NA if is_missing(x) else f"{x:.{digits}g} TFLOPS"


def fmt_ratio(x) -> str:
    """How many times, three significant digits and no exponent (at least the whole part):
    1.6 -> '1.60x', 80.49 -> '80.5x', 804.92 -> '805x', 12345.6 -> '12346x'."""
    if is_missing(x):
        return NA
    places = max(0, 2 - math.floor(math.log10(abs(x)))) if x else 2
    return f"{x:.{places}f}x"


def fmt_pct(x, digits: int = 1, signed: bool = False) -> str:
    """A fraction as a percentage: 0.404 -> '40.4%' (``digits=0``: '40%'); ``signed``: a change,
    '+40%' / '-5%'. A figure that rounds to zero has no minus: -0.001 -> '0%', not '-0%'. A level
    (unsigned, above zero) under 1% keeps two significant digits: 0.0003 -> '0.030%' (an MFU of
    0.030% is not 0%), 0.00055 -> '0.055%' (not '0.1%': in a column beside 0.047% it read as twice
    that); a change that small still reads 0 (it is too small to matter)."""
    if is_missing(x):
        return NA
    v = round(100 * x, digits) + 0.0   # -0.0 + 0.0 is 0.0: the sign of a rounded-away figure dropped
    if 0 < 100 * x < 1 and not signed:
        places = max(digits, 1 - math.floor(math.log10(100 * x)))   # two significant digits, never an exponent
        return f"{100 * x:.{places}f}%"
    return f"{v:{'+' if signed else ''}.{digits}f}%"


def fmt_count(n) -> str:
    """A count of parameters (or tokens) in k/M/B, 4 significant digits: 426624 -> '426.6k',
    1.24e8 -> '124M', 999 -> '999', 999999 -> '1M'."""
    if is_missing(n):
        return NA
    r = abs(float(f"{n:.4g}"))  # the unit of the rounded figure: 999,999 is '1M', not '1000k'
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if r >= size:
            return f"{n / size:.4g}{unit}"
    return f"{n:g}"


def fmt_rate(x, unit: str = "tokens/s") -> str:
    """A throughput, whole and thousands separated: 12345.6 -> '12,346 tokens/s'; missing: 'n/a tokens/s'."""
    return f"{formatted(x, '{:,.0f}')} {unit}"


# a table's number format by column header (`formatted`; the HTML tables of core.summary)
FORMATS = {"tokens/s": "{:,.0f}", "samples/s": "{:,.0f}", "tokens or samples/s": "{:,.0f}",
           "step (ms)": "{:,.1f}", "time (s)": "{:.3g}", "TFLOPS": "{:.3g}",
           "MFU": fmt_pct, "HFU": fmt_pct, "peak (MiB)": "{:,.1f}", "saved (MiB)": "{:,.2f}",
           "GPU peak (MiB)": "{:,.1f}", "CPU peak RSS (MiB)": "{:,.1f}",
           "CPU peak above start (MiB)": "{:,.1f}", "GPU peak above start (MiB)": "{:,.1f}", "GFLOP": "{:,.2f}",
           "loss": "{:.3f}", "comm/step (MiB)": "{:,.2f}", "wait (ms)": "{:,.2f}",
           "expected (ms)": "{:,.1f}", "expected vs median step": "{:+.1%}"}


def formatted(value, fmt: str | Callable[[float], str]) -> str:
    """``fmt.format(value)`` (or ``fmt(value)``: a formatter of this module), or 'n/a' for a missing
    figure (None or NaN); text (a figure `core.summary.mark_rates` flagged) as it is."""
    if isinstance(value, str):
        return value
    if is_missing(value):
        return NA
    return fmt(value) if callable(fmt) else fmt.format(value)


def tick_label(v: float) -> str:
    """A tick's text: whole numbers as integers with thousands separators, others with at most
    three significant digits, never an exponent between 0.001 and a million."""
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6 or a < 1e-3:
        return f"{v:.2g}"
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:.3g}" if a < 1000 else f"{v:,.0f}"
