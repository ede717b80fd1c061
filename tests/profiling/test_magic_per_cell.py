"""`%gpuprofile on`'s work per cell does not grow with the history: counted, not timed.

A trivial cell is profiled after 10 profiled cells and again after 1,000 (each a new source, so
each one FLOP-counted and its count cached: the caches are full and evicting by then). Both
times we count what tunekit does for the cell: the calls of every Python function of tunekit
(a per-record helper called in a loop would multiply them), and every element of the history's
list and of the count caches that is read (a loop over them without calls). Equal counts at 10
and at 1,000 rows mean the work is O(1) in the history's length. The machine's counters are held
still, so that the load cannot change the verdict's wording (and its calls) between the two, and
so is the process's memory (a cell that freed memory takes the CPU peak's reset path).
"""
import os
import sys
from collections import Counter, OrderedDict

import pytest

import tunekit
from tunekit.core.slowed import slowed_by
from tunekit.measure import conditions as mc
from tunekit.measure import history, meters
from tunekit.profiling import probe, probe_figures

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


def _steady_counters(with_sched, with_stat=True, with_wait=True):
    """The machine's counters, never moving: a quiet verdict for every cell (a busy one words
    its reason with a few more calls, which is the load's doing, not the history's)."""
    s = {"own_cpu_s": 0.0, **({"wait_s": 0.0, "wait_source": "psi"} if with_wait else {})}
    return {**s, "busy_s": 0.0, "steal_s": 0.0} if with_stat else s


@pytest.fixture
def watched(monkeypatch):
    monkeypatch.setattr(mc._COUNTERS, "sample", _steady_counters)
    # every lean block short (under 2 ms its stop reads no load average): a trivial cell preempted
    # past 2 ms by a busy machine would read it, which is the load's doing, not the history's
    monkeypatch.setattr(mc, "CPU_WAIT_MIN_S", float("inf"))
    # the process's memory held still too: a cell during which Python or glibc happened to give
    # memory back (a garbage collection) takes the CPU peak's reset path, one status read and a
    # clear_refs write more; that is the allocator's doing, not the history's (CI saw all five
    # early cells take it once). A high-water mark never above RSS keeps every cell on the lean path.
    monkeypatch.setattr(meters, "_mark_bound", lambda: 0)
    monkeypatch.setattr(history.HISTORY, "_records", _WatchedList())
    for name in ("FLOP_COUNTS", "LAST_WALLS"):  # where they are kept, and where the probe reads them
        cache = _WatchedCache()
        for where in (history, probe, probe_figures):
            if hasattr(where, name):
                monkeypatch.setattr(where, name, cache)


def test_a_profiled_cells_work_is_the_same_after_10_and_after_1000_history_rows(ip, watched):
    ip.run_cell("%gpuprofile on -q")
    try:
        def fill_to(rows):
            i = len(history.HISTORY)
            while len(history.HISTORY) < rows:
                ip.run_cell(f"fill_{i} = {i} + 0", store_history=True)  # an operator: counted
                i += 1

        def work(tag, code):
            # the cell with the least work of five: a cell now and then resets the CPU peak
            # (memory was freed since the last one), the same few calls at any history length
            cells = [_cell_work(ip, f"probe_{tag}_{k} = {k}{code}") for k in range(5)]
            return min(cells, key=lambda c: (sum(c[0].values()), c[1]))

        fill_to(10)
        # a cell counted (an operator), and one that binds a name only (0 FLOPs without a counter)
        early = work("early", " + 0"), work("early_inert", "")
        assert len(history.HISTORY) == 20 and sum(early[0][0].values()) > 0  # the cells were profiled
        fill_to(1000)
        late = work("late", " + 0"), work("late_inert", "")
        assert len(history.HISTORY) == 1010
        assert len(history.FLOP_COUNTS) == history.FLOP_CACHE_SIZE  # full: each new count evicts one
    finally:
        ip.run_cell("%gpuprofile off")
    for (calls0, reads0), (calls1, reads1) in zip(early, late):
        assert calls1 == calls0, {k: (calls0[k], calls1[k]) for k in calls0 | calls1 if calls0[k] != calls1[k]}
        assert reads0 == reads1 == 0  # no record and no cached count is read for a new cell


@pytest.fixture
def counters_made(monkeypatch):
    """How many FLOP counters were built so far (a list: one entry per counter)."""
    from tunekit.measure import flops

    made, real = [], flops.TunekitFlopCounter

    class Counted(real):
        def __init__(self):
            made.append(1)
            super().__init__()

    monkeypatch.setattr(flops, "TunekitFlopCounter", Counted)
    return made


def test_a_block_that_runs_nothing_gets_the_counters_zero_without_a_counter(counters_made):
    keys = ("flops", "flops_source", "model_flops", "recompute_flops", "mfu_convention", "tflops", "mfu",
            "hfu", "notes")
    counted = probe.Probe("counted", key="k-counted").start().stop()   # a counter ran; nothing ran under it
    assert counters_made == [1]
    inert = probe.Probe("inert", key="k-inert", inert=True).start().stop()
    assert counters_made == [1]  # none built for it
    same = [k for k in keys if k != "flops_source"]
    assert {k: getattr(inert, k) for k in same} == {k: getattr(counted, k) for k in same}
    assert (inert.flops, inert.flops_source, inert.tflops) == (0.0, "inert", 0.0)  # 0 FLOPs in any time
    # no counter ran, so nothing says its clock was slowed by one (a counted run's was)
    assert (slowed_by(inert), slowed_by(counted)) == (None, "FLOP counting")


def test_on_counts_a_cell_unless_its_code_can_run_nothing(ip, counters_made):
    ip.run_cell("%gpuprofile on -q")
    try:
        described = []
        ip.user_ns["watched"] = type("Watched", (), {"__getattribute__": lambda o, k: described.append(k)})()
        ip.run_cell("lr = 3e-4\nsizes = (batch_size, 128)\nw = watched", store_history=True)  # binds names only
        assert counters_made == [] and tunekit.last().flops_source == "inert" and tunekit.last().flops == 0
        assert described == []  # its inputs decide nothing: not fingerprinted
        ip.run_cell("y = lr * 2", store_history=True)  # an operator: may run anything, so counted
        assert counters_made == [1]
        ip.run_cell("out = model(torch.ones(2, 128))", store_history=True)
        assert counters_made == [1, 1] and tunekit.last().flops == 2 * 2 * 128 * 128  # 2 rows x 2 FLOPs per weight
    finally:
        ip.run_cell("%gpuprofile off")


def _tracked_from(obj) -> dict:
    """id -> object of everything the garbage collector tracks that ``obj`` reaches (types excluded)."""
    import gc

    seen, todo = {}, [obj]
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, type):
            continue
        if gc.is_tracked(o):
            seen[id(o)] = o
        todo.extend(gc.get_referents(o))
    return seen


def test_a_trivial_cells_record_keeps_three_objects_for_the_garbage_collector(ip):
    # one record is kept per profiled cell for the whole session: what it holds is what a long
    # notebook's full garbage collections walk, and what makes them come (net new objects)
    ip.run_cell("%gpuprofile on -q")
    try:
        ip.run_cell("kept_a = 1", store_history=True)
        a = tunekit.last()
        ip.run_cell("kept_b = 2", store_history=True)
        b = tunekit.last()
    finally:
        ip.run_cell("%gpuprofile off")
    assert a is not b and probe._TRIVIAL in a.notes and probe._TRIVIAL in b.notes
    mine, theirs = _tracked_from(a), _tracked_from(b)
    own = [o for k, o in mine.items() if k not in theirs]  # not shared with the next record (the note, ...)
    # the record (slots: no dict of its own), its notes list, its verdict to be judged (its
    # readings inline, in a dict of numbers and strings the collector does not track): 3
    assert sorted(type(o).__name__ for o in own) == ["Deferred", "ProfileRecord", "list"]
