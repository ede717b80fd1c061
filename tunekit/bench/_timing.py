"""Timing and result plumbing shared by the microbenchmarks.

Every benchmark warms up before timing, synchronizes the device before each clock read, and
reports the median of its repeats with the min and max.
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from tunekit.meters import synchronize

NaN = math.nan


def default_device(device=None) -> torch.device:
    """The given device, else cuda when available, else cpu."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def time_repeats(fn, device=None, warmup: int = 1, repeats: int = 5) -> list[float]:
    """Seconds of each of `repeats` calls of fn after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        out.append(time.perf_counter() - t0)
    return out


def stats(times, prefix: str = "") -> dict:
    """median/min/max of a list of seconds (NaN when empty): keys `{prefix}median_s` etc."""
    if not times:
        return {f"{prefix}median_s": NaN, f"{prefix}min_s": NaN, f"{prefix}max_s": NaN,
                f"{prefix}repeats": 0}
    return {f"{prefix}median_s": statistics.median(times), f"{prefix}min_s": min(times),
            f"{prefix}max_s": max(times), f"{prefix}repeats": len(times)}


def frame(rows, bench: str, device=None, notes=None):
    """A DataFrame with what plotting and reporting need in `.attrs`."""
    import pandas as pd

    df = pd.DataFrame(rows)
    df.attrs.update(bench=bench, device=str(device) if device is not None else None,
                    notes=list(notes or []))
    return df


def dtype_of(name) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    return {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
            "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}[name]
