"""`%gpuprofile on`'s work per cell does not grow with the history: counted, not timed.

A trivial cell is profiled after 10 profiled cells and again after 1,000 (each a new source, so
each one FLOP-counted and its count cached: the caches are full and evicting by then). Both
times we count what tunekit does for the cell: the calls of every Python function of tunekit
(a per-record helper called in a loop would multiply them), and every element of the history's
list and of the count caches that is read (a loop over them without calls). Equal counts at 10
and at 1,000 rows mean the work is O(1) in the history's length. The machine's counters are held
still, so that the load cannot change the verdict's wording (and its calls) between the two.
"""
import os
import sys
from collections import Counter, OrderedDict

import pytest

import tunekit
from tunekit.measure import conditions as mc
from tunekit.measure import history
from tunekit.profiling import probe

TUNEKIT = os.path.dirname(tunekit.__file__) + os.sep


class _Reads:
    n = 0  # elements of the watched containers read so far


class _WatchedList(list):
    """The history's records: every element read is counted (iteration, indexing, search)."""

    def __iter__(self):
        _Reads.n += len(self)
        return super().__iter__()

    def __reversed__(self):
        _Reads.n += len(self)
        return super().__reversed__()

    def __getitem__(self, i):
        _Reads.n += len(range(*i.indices(len(self)))) if isinstance(i, slice) else 1
        return super().__getitem__(i)

    def __contains__(self, x):
        _Reads.n += len(self)
        return super().__contains__(x)

    def index(self, *a):
        _Reads.n += len(self)
        return super().index(*a)

    def count(self, x):
        _Reads.n += len(self)
        return super().count(x)

    def copy(self):
        _Reads.n += len(self)
        return super().copy()


class _WatchedCache(OrderedDict):
    """A count cache: iterating it (keys, values, items) counts each entry."""

    def __iter__(self):
        _Reads.n += len(self)
        return super().__iter__()

    def keys(self):
        _Reads.n += len(self)
        return super().keys()

    def values(self):
        _Reads.n += len(self)
        return super().values()

    def items(self):
        _Reads.n += len(self)
        return super().items()


def _cell_work(ip, src):
    """(calls of each tunekit function, elements of history and caches read) while ``src`` runs."""
    calls = Counter()

    def prof(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(TUNEKIT):
            calls[(frame.f_code.co_filename[len(TUNEKIT):], frame.f_code.co_name)] += 1

    reads0 = _Reads.n
    sys.setprofile(prof)
    try:
        ip.run_cell(src, store_history=True)
    finally:
        sys.setprofile(None)
    return calls, _Reads.n - reads0


def _steady_counters(with_sched, with_stat=True):
    """The machine's counters, never moving: a quiet verdict for every cell (a busy one words
    its reason with a few more calls, which is the load's doing, not the history's)."""
    s = {"own_cpu_s": 0.0, "wait_s": 0.0, "wait_source": "psi"}
    return {**s, "busy_s": 0.0, "steal_s": 0.0} if with_stat else s


@pytest.fixture
def watched(monkeypatch):
    monkeypatch.setattr(mc._COUNTERS, "sample", _steady_counters)
    monkeypatch.setattr(history.HISTORY, "_records", _WatchedList())
    for name in ("FLOP_COUNTS", "LAST_WALLS"):  # where they are kept, and where the probe reads them
        cache = _WatchedCache()
        monkeypatch.setattr(history, name, cache)
        monkeypatch.setattr(probe, name, cache)


def test_a_profiled_cells_work_is_the_same_after_10_and_after_1000_history_rows(ip, watched):
    ip.run_cell("%gpuprofile on -q")
    try:
        def fill_to(rows):
            i = len(history.HISTORY)
            while len(history.HISTORY) < rows:
                ip.run_cell(f"fill_{i} = {i}", store_history=True)
                i += 1

        def work(tag):
            # the cell with the least work of five: a cell now and then resets the CPU peak
            # (memory was freed since the last one), the same few calls at any history length
            cells = [_cell_work(ip, f"probe_{tag}_{k} = {k}") for k in range(5)]
            return min(cells, key=lambda c: (sum(c[0].values()), c[1]))

        fill_to(10)
        early = work("early")
        assert len(history.HISTORY) == 15 and sum(early[0].values()) > 0  # the cells were profiled
        fill_to(1000)
        late = work("late")
        assert len(history.HISTORY) == 1005
        assert len(history.FLOP_COUNTS) == history.FLOP_CACHE_SIZE  # full: each new count evicts one
    finally:
        ip.run_cell("%gpuprofile off")
    assert late[0] == early[0], {k: (early[0][k], late[0][k]) for k in early[0] | late[0]
                                 if early[0][k] != late[0][k]}
    assert early[1] == late[1] == 0  # no record and no cached count is read for a new cell
