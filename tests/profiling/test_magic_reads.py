"""What `%gpuprofile on` reads from the kernel per trivial cell: counted, not timed (issue 39).

Each figure a record carries comes from one read: /proc/self/status once at the start (VmHWM, to
know whether to reset it, and VmRSS) and once at the stop (both again), the CPU-wait counter
(PSI) at both ends, the machine's CPU counters (/proc/stat) at the start only (a short block
leaves them unread at the stop: its clock ticks could not tell), glibc's allocation totals at both
ends, and SIGINT's handler switched once in and once out for the whole cell.
"""
import collections
import os

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
    monkeypatch.setattr(meters._MALLINFO, "in_use", counted("mallinfo2", meters._MALLINFO.in_use))
    monkeypatch.setattr(mc._COUNTERS, "read", counted("counters", mc._COUNTERS.read))
    # a cell is short: the stop leaves /proc/stat unread (held so, whatever the machine's load)
    monkeypatch.setattr(mc, "resolved", lambda *a, **k: False)

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
    ip.run_cell("%gpuprofile on -q")
    try:
        ip.run_cell("warm = 1", store_history=True)  # files opened, caches filled
        reads.clear()
        ip.run_cell("x = 1", store_history=True)
        seen = dict(reads)
    finally:
        ip.run_cell("%gpuprofile off")
    seen.pop("clear_refs", None)  # written only when memory was freed since the last peak
    # status: start + stop = 2; psi: start + stop = 2; stat: start only = 1; mallinfo2: start + stop = 2;
    # SIGINT's handler: in at pre_run_cell, out at post_run_cell = 2
    assert seen == {"status": 2, "psi": 2, "stat": 1, "mallinfo2": 2, "sigint switches": 2}


def test_a_bare_cell_reads_nothing(ip, reads):
    ip.run_cell("y = 1", store_history=True)
    # the extension's hooks still run (a shield per cell: 2 switches), but nothing is measured
    assert dict(reads) == {"sigint switches": 2}
