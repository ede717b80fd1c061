"""What measuring keeps across runs: every record (`HISTORY`, `history()`), and per block (a
cell's source, or a `profile` block's place) its FLOP count and the wall time of its last clean
run. Measurement layer.

    >>> tunekit.history()          # every profiled cell or block, oldest first
    >>> tunekit.clear_history()    # and forget the counts
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from tunekit.core.records import History, ProfileRecord

HISTORY = History()
FLOP_CACHE_SIZE = 256   # blocks remembered; the least recently used are dropped past it


@dataclass
class CachedCount:
    """A block's FLOP count, reused while its inputs keep their fingerprint."""

    fingerprint: tuple  # the inputs as they were when the count was taken
    count: object       # flops.FlopCount
    counted_in: str     # name of the record whose run was counted
    last_wall_s: float = math.nan
    last_busy: bool = False  # the last run on this count was taken on a busy machine
    shaped: tuple = (None, [])  # (model FLOPs from the model's shape or None, notes): ModelTap


# block key -> CachedCount
FLOP_COUNTS: OrderedDict = OrderedDict()
# block key -> the wall time of its last clean run (untraced, uncounted, no error): the
# profiler's overhead is a traced run's time against it
LAST_WALLS: OrderedDict = OrderedDict()


def remember(cache: OrderedDict, key: str, value) -> None:
    """``cache[key] = value`` as the most recently used entry, dropping the least recently used
    past FLOP_CACHE_SIZE."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > FLOP_CACHE_SIZE:
        cache.popitem(last=False)


def source_key(source: str, name: str = "") -> tuple:
    """The key of a block: its name and source, as they are (a dict hashes a string once and
    compares the text itself on a match: no digest per cell, and no two sources share a key).
    A profiled cell's source is the string IPython keeps in its own history: nothing copied."""
    return (name, source)


def history(all: bool = False):
    """pandas.DataFrame of every profiled cell or block, oldest first: what ran, its time, FLOPs,
    TFLOPS, MFU, memory, the machine and the error (``core.summary.HISTORY_COLUMNS``), shown
    formatted; ``all=True``: every column (``core.records.COLUMNS``), a plain DataFrame. The
    values are the raw numbers either way.

    Example: ``tunekit.history().tail()``: the latest profiled cells."""
    from tunekit.core.summary import HISTORY_COLUMNS, history_view, readable

    df = HISTORY.to_frame()
    return df if all else readable(df[list(HISTORY_COLUMNS)], history_view, "tunekit.history(all=True)")


def last() -> ProfileRecord | None:
    """The latest record (a dataclass), or None.

    Example: ``tunekit.last().wall_s``: seconds of the latest profiled cell."""
    return HISTORY.last()


def clear_history() -> None:
    """Forget every record and every cached FLOP count.

    Example: ``tunekit.clear_history()`` before a new series of measurements."""
    HISTORY.clear()
    FLOP_COUNTS.clear()
    LAST_WALLS.clear()
