"""What `%gpuprofile on` reads from the kernel per trivial cell: counted, not timed (issue 39).

Each figure a record carries comes from one read: RSS from /proc/self/statm and a bound of its
high-water mark from getrusage (~1 us) at the start and at the stop (/proc/self/status, ~25 us,
only when the bound does not settle the peak: memory freed since the last peak, a temporary in
the block), the CPU-wait counter (PSI) at both ends, the machine's CPU counters (/proc/stat) at
the start only (a short block leaves them unread at the stop: its clock ticks could not tell;
a cell whose code can run nothing, `x = 1`, not at all: only preemption makes it long, and PSI
tells that), glibc's allocation totals at both ends, and SIGINT's handler switched once in and
once out for the whole cell. A trivial cell, a one-line binding that makes nothing and releases
nothing large (`fingerprint.cell_inputs`: `x = 1`), reads no memory at all (its record says
so, note kind ``readings.trivial``) and is not parsed either.
"""
import builtins
import collections
import os
import resource

import pytest

from tunekit.measure import conditions as mc
from tunekit.measure import interrupts, meters

pytestmark = pytest.mark.skipif(
    meters._PROC is None or meters._PROC.libc is None or not os.path.exists("/proc/pressure/cpu"),
    reason="Linux /proc with PSI and glibc")


@pytest.fixture
def reads(monkeypatch):
    """Counter of the reads made so far, by file ("status", "psi", ...) and kind."""
    seen = collections.Counter()

    def counted(kind, fn):
        def call(*a):
            seen[a[0] if a and isinstance(a[0], str) else kind] += 1
            return fn(*a)
        return call

    monkeypatch.setattr(meters._PROC, "read", counted("proc", meters._PROC.read))
    monkeypatch.setattr(meters._PROC, "reset_hwm", counted("clear_refs", meters._PROC.reset_hwm))
    # getrusage's bound of the high-water mark, as it reads when no memory was freed since the last
    # peak and no parent's peak sits above (the usual case; whether it is, the load and the process
    # that started this one decide): the mark's value, which is RSS then
    monkeypatch.setattr(meters, "_mark_bound", counted("getrusage", _rss))
    monkeypatch.setattr(meters._MALLINFO, "in_use", counted("mallinfo2", meters._MALLINFO.in_use))
    monkeypatch.setattr(mc._COUNTERS, "read", counted("counters", mc._COUNTERS.read))
    # a cell is short: the stop leaves /proc/stat unread, and PSI too (under 2 ms no wait makes it
    # busy); held so, whatever the machine's load
    monkeypatch.setattr(mc, "resolved", lambda *a, **k: False)
    monkeypatch.setattr(mc, "CPU_WAIT_MIN_S", float("inf"))

    class Signal:  # interrupts' `_signal`, counting the SIGINT handler switches
        def __getattr__(self, name):
            return getattr(interrupts.__dict__["_real_signal"], name)

        def signal(self, *a):
            seen["sigint switches"] += 1
            return interrupts.__dict__["_real_signal"].signal(*a)

    monkeypatch.setitem(interrupts.__dict__, "_real_signal", interrupts._signal)
    monkeypatch.setattr(interrupts, "_signal", Signal())
    return seen


def test_a_trivial_profiled_cell_reads_each_figure_once(ip, reads):
    ip.user_ns.pop("x", None)   # the shell is shared: x = 1 below binds a name that held nothing
    ip.run_cell("%gpuprofile on -q")
    try:
        ip.run_cell("warm = 1", store_history=True)  # files opened, caches filled
        reads.clear()
        ip.run_cell("x = 1", store_history=True)
        seen = dict(reads)
    finally:
        ip.run_cell("%gpuprofile off")
    # psi: start only = 1 (a short cell leaves it unread at the stop); no stat (x = 1 can run
    # nothing); no memory read at all, getrusage, statm, status or mallinfo2 (x = 1 makes and
    # releases nothing large); SIGINT's handler: in at pre_run_cell, out at post_run_cell = 2
    assert seen == {"psi": 1, "sigint switches": 2}


def test_a_trivial_cells_record_says_what_it_skipped(ip):
    import math

    import tunekit

    ip.user_ns.pop("x", None)
    ip.run_cell("%gpuprofile on -q")
    try:
        ip.run_cell("x = 1", store_history=True)
        trivial = tunekit.last()
        ip.run_cell("x = (1, 2)", store_history=True)  # a tuple: not a one-line binding of a number or name
        other = tunekit.last()
    finally:
        ip.run_cell("%gpuprofile off")
    kinds = [getattr(n, "kind", None) for n in trivial.notes]
    assert kinds.count("readings.trivial") == 1
    assert math.isnan(trivial.cpu_rss_delta_bytes) and math.isnan(trivial.cpu_peak_delta_bytes)
    assert trivial.flops == 0 and trivial.flops_source == "inert" and trivial.wall_s > 0
    assert "readings.trivial" not in [getattr(n, "kind", None) for n in other.notes]
    assert other.cpu_peak_delta_bytes >= 0  # read: a number, not NaN


def test_a_cell_that_may_run_something_reads_the_machines_counters_at_its_start(ip, reads):
    ip.run_cell("y = 2")
    ip.run_cell("%gpuprofile on -q")
    try:
        ip.run_cell("warm = y + 0", store_history=True)
        reads.clear()
        ip.run_cell("x = y + 0", store_history=True)  # an operator: may run anything
        seen = dict(reads)
    finally:
        ip.run_cell("%gpuprofile off")
    # as x = 1, and /proc/stat once at the start (a short block leaves it unread at the stop);
    # glibc's totals at both ends (not a one-line binding of a number or a name) = 2
    assert seen == {"getrusage": 2, "statm": 2, "psi": 1, "stat": 1, "mallinfo2": 2, "sigint switches": 2}


def test_a_trivial_cell_opens_no_file(ip, reads, monkeypatch):
    opened = []
    for where, name in ((os, "open"), (builtins, "open")):  # descriptors and file objects
        real = getattr(where, name)
        monkeypatch.setattr(where, name, lambda *a, real=real, **k: opened.append(a[0]) or real(*a, **k))
    ip.run_cell("%gpuprofile on -q")
    try:
        ip.run_cell("warm = 1", store_history=True)  # files opened once per process, before
        opened.clear()
        ip.run_cell("x = 1", store_history=True)
        ip.run_cell("x = y + 0", store_history=True)
    finally:
        ip.run_cell("%gpuprofile off")
    assert opened == []  # every /proc file is read through a descriptor kept open


@pytest.mark.parametrize("held, cell, totals", [
    ("[0] * 10", "x = 1", 2),      # x held a list: its release may be large
    ("1", "x = 1; y = 2", 2),      # two statements: not a one-line binding
    ("1", "x = y", 0),             # y's object is shared, x's 1 released: nothing large (no memory read)
])
def test_glibc_totals_are_read_unless_the_cell_allocates_little(ip, reads, held, cell, totals):
    ip.run_cell(f"x = {held}\ny = 3")
    ip.run_cell("%gpuprofile on -q")
    try:
        ip.run_cell("warm = 1", store_history=True)
        reads.clear()
        ip.run_cell(cell, store_history=True)
        seen = dict(reads)
    finally:
        ip.run_cell("%gpuprofile off")
    # mallinfo2 at the start and at the stop = 2, or not at all
    assert seen.get("mallinfo2", 0) == totals


def _rss():
    """RSS in bytes, read past the counter."""
    return int(type(meters._PROC).read(meters._PROC, "statm").split()[1]) * meters._PAGE


def test_a_bound_above_rss_reads_status_at_both_ends(ip, reads, monkeypatch):
    # memory freed since the last peak (or a parent's peak inherited through exec): the bound
    # settles nothing, so status is read at each end, as before the bound (1 MiB above RSS)
    monkeypatch.setattr(meters, "_mark_bound", lambda: _rss() + 2**20)
    ip.run_cell("%gpuprofile on -q")
    try:
        ip.run_cell("warm = (1, 2)", store_history=True)
        reads.clear()
        ip.run_cell("x = (1, 2)", store_history=True)  # runs nothing, but not trivial: memory read
        seen = dict(reads)
    finally:
        ip.run_cell("%gpuprofile off")
    seen.pop("clear_refs", None)  # written only when the mark is above RSS
    # statm then status at each end: 2 + 2; glibc's totals at each end: 2; psi at the start: 1; no
    # stat (a tuple of constants runs nothing); SIGINT's handler in and out: 2
    assert seen == {"statm": 2, "status": 2, "mallinfo2": 2, "psi": 1, "sigint switches": 2}


def test_the_bound_is_the_mark_or_above():
    # ru_maxrss (KiB) is computed as VmHWM is, or is the parent's peak when that is larger; read
    # after status, it may lag the kernel's batched page counters (a few hundred KiB, 4 MiB allowed)
    hwm, _ = meters._hwm_rss_bytes()
    for who in (resource.RUSAGE_SELF, meters._RUSAGE):
        assert resource.getrusage(who).ru_maxrss * 1024 >= hwm - 4 * 2**20


def test_a_bare_cell_reads_nothing(ip, reads):
    ip.run_cell("y = 1", store_history=True)
    # the extension's hooks still run (a shield per cell: 2 switches), but nothing is measured
    assert dict(reads) == {"sigint switches": 2}
