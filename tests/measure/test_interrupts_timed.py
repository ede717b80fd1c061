"""Real Ctrl-Cs at swept delays in a profiled cell leave nothing behind (issue 30, item 5).

tests/measure/test_interrupts.py delivers SIGINT at line events of tunekit's own frames. A real signal
lands anywhere: between two bytecodes of torch's code that the FLOP counter runs inside the
user's forward, in C calls, while a first KeyboardInterrupt unwinds. Here the kernel delivers it:
a POSIX timer sends SIGINT to the main thread at a delay after the cell starts (two timers for a
double Ctrl-C). Where it lands depends on the machine's load, so each delivery asserts only what
must hold wherever it landed: nothing of tunekit left installed, the cell recorded once when its
code ran (with the KeyboardInterrupt when that code was stopped), and the KeyboardInterrupt shown.
"""

import ctypes
import ctypes.util
import gc
import signal
import sys
import threading
import time

import pytest
import torch
from torch.nn.modules import module as M
from torch.utils._python_dispatch import _pop_mode

import tunekit
from tunekit.measure import history, meters
from tunekit.measure.torch_private import dispatch_mode_stack

GLOBAL_HOOKS = [n for n in dir(M) if n.startswith("_global_") and n.endswith("hooks")]
# the user's code: touch() when it starts and ends; many small ops, each dispatched to the counter
CELL = "touch()\ny = x\nfor _ in range(60):\n    y = (y * 1.001 + 0.5).relu()\nmodel(y).sum().backward()\ntouch()"


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _Sigevent(ctypes.Structure):  # Linux: sigval, signo, notify, then a 48-byte union whose first int is the tid
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("tid", ctypes.c_int), ("pad", ctypes.c_int * 11)]


class Timer:
    """A POSIX timer that sends SIGINT to this (the main) thread once, ``arm(ns)`` from now."""

    SIGEV_THREAD_ID = 4

    def __init__(self):
        self.libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        ev = _Sigevent(signo=signal.SIGINT, notify=self.SIGEV_THREAD_ID, tid=threading.get_native_id())
        self.id = ctypes.c_void_p()
        if self.libc.timer_create(time.CLOCK_MONOTONIC, ctypes.byref(ev), ctypes.byref(self.id)) != 0:
            raise OSError(ctypes.get_errno(), "timer_create")

    def arm(self, ns) -> None:
        spec = _Itimerspec()
        spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(max(int(ns), 1), 10**9)
        self.libc.timer_settime(self.id, 0, ctypes.byref(spec), None)

    def disarm(self) -> bool:
        """Stop it; True if it had fired."""
        old = _Itimerspec()
        self.libc.timer_settime(self.id, 0, ctypes.byref(_Itimerspec()), ctypes.byref(old))
        return not (old.it_value.tv_sec or old.it_value.tv_nsec)

    def close(self) -> None:
        self.libc.timer_delete(self.id)


@pytest.fixture
def timers():
    if not sys.platform.startswith("linux"):
        pytest.skip("POSIX timers aimed at a thread are Linux's")
    made = [Timer(), Timer()]
    yield made
    for t in made:
        t.disarm()
        t.close()


def _settle():
    """A Python call: a signal the C handler took but Python has not run yet is run here."""
    return None


def _disarm(timers) -> list:
    """Stop the timers after a Ctrl-C escaped the cell: the other timer firing meanwhile is the
    double Ctrl-C reaching the prompt, as it would a user's, so it is taken here, not raised (seen in
    CI: the second SIGINT landed in the first one's timer_settime). Which timers fired."""
    fired = [False] * len(timers)
    for i, t in enumerate(timers):
        while True:
            try:
                fired[i] = t.disarm() or fired[i]
                break
            except KeyboardInterrupt:
                fired[i] = True
    while True:
        try:
            _settle()
            return fired
        except KeyboardInterrupt:
            continue


def state(ip):
    magics = tunekit.profiling.magics._STATE["magics"]
    return {
        "dispatch modes": [type(m).__name__ for m in dispatch_mode_stack()],
        "global module hooks": {n: len(getattr(M, n)) for n in GLOBAL_HOOKS},
        "module hooks": sum(len(h) for m in ip.user_ns["model"].modules()
                            for h in (m._forward_hooks, m._forward_pre_hooks)),
        "meters": (len(meters._ACTIVE_CPU), len(meters._ACTIVE_CUDA)),
        "SIGINT handler": signal.getsignal(signal.SIGINT),
        "cell in flight": (magics._shield, magics._probe),
    }


class Cell:
    """Runs ``src`` in ``ip`` with SIGINT at given delays and says what went wrong."""

    def __init__(self, ip, src, timers, monkeypatch, after_escape):
        self.ip, self.src, self.timers, self.after_escape = ip, src, timers, after_escape
        self.touched, self.shown, self.swallowed = [], [], []
        ip.user_ns.update(touch=lambda: self.touched.append(1), x=torch.randn(8, 128))
        # a KeyboardInterrupt IPython caught in a callback (pre/post_run_cell) is shown to the user
        monkeypatch.setattr(ip, "showtraceback", lambda *a, **k: self.shown.append(sys.exc_info()[0]))
        monkeypatch.setattr(ip.events, "print_on_error", False)
        # one that lands in a finalizer or weakref callback (torch's) Python itself drops, as unraisable
        monkeypatch.setattr(sys, "unraisablehook", lambda u: self.swallowed.append(u.exc_type))
        for _ in range(3):  # compiled, counted once: later runs take the same path
            assert ip.run_cell(src).error_in_exec is None
        self.before = state(ip)
        walls = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            ip.run_cell(src)
            walls.append(time.perf_counter_ns() - t0)
        self.wall = sorted(walls)[2]

    def deliver(self, *delays) -> list:
        history.clear_history()
        for seen in (self.touched, self.shown, self.swallowed):
            seen.clear()
        gc.collect()  # what the last run left to collect is freed now, not while this one runs
        result = escaped = None
        try:
            for t, d in zip(self.timers, delays):
                t.arm(d)
            result = self.ip.run_cell(self.src)
            fired = [t.disarm() for t in self.timers[:len(delays)]]
            _settle()
        except KeyboardInterrupt as e:  # landed in IPython's own lines around the cell
            escaped, fired = e, None
            while fired is None:   # the other timer's Ctrl-C can land as _disarm is entered (3.11 checks
                try:               # signals at a function's start): taken here, as _disarm takes it inside
                    fired = _disarm(self.timers[:len(delays)])
                except KeyboardInterrupt:
                    continue
        if escaped is not None:  # post_run_cell may not have come: the next cell closes what it left
            self.ip.run_cell(self.after_escape)
        return self._problems(result, escaped, any(fired))

    def _problems(self, result, escaped, fired) -> list:
        after = state(self.ip)
        problems = [f"{k}: {self.before[k]} -> {after[k]}" for k in self.before if after[k] != self.before[k]]
        # IPython runs a cell statement by statement: one stopped between two is an error "before exec"
        error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        reached = isinstance(error, KeyboardInterrupt) or escaped is not None
        records = history.HISTORY.records()
        if len(records) > 1 or (self.touched and not records):
            problems.append(f"{len(records)} records")
        if len(self.touched) == 1:  # the cell's code was stopped: the user sees it, the record says it
            if not reached:
                problems.append(f"the cell's code stopped, but its error is {error!r}")
            if records and records[0].error != "KeyboardInterrupt" and escaped is None:
                problems.append(f"recorded {records[0].error!r}")
        seen = reached or KeyboardInterrupt in self.shown + self.swallowed
        if fired and not seen:
            problems.append("the Ctrl-C was lost")
        return problems


def _sweep(cell, delays) -> list:
    failed = []
    gc.freeze()  # each run collects what the last one left: keep that cheap, the heap as it is
    try:
        for d in delays:
            problems = cell.deliver(*d)
            if problems:
                failed.append(f"SIGINT at {[round(x / 1e3, 1) for x in d]} us: {problems}")
                _repair(cell)  # so that one failure does not spoil the runs after it
    finally:
        gc.unfreeze()
    return failed


def _repair(cell) -> None:
    cell.ip.run_cell(cell.after_escape)
    while len(dispatch_mode_stack()) > len(cell.before["dispatch modes"]):
        _pop_mode()
    for name in GLOBAL_HOOKS:
        hooks = getattr(M, name)
        for key in list(hooks)[cell.before["global module hooks"][name]:]:
            del hooks[key]
    del meters._ACTIVE_CPU[cell.before["meters"][0]:]


def _geometric(lo, hi, n):
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


KINDS = {"cell magic": ("%%gpuprofile -q -n cell --flops always\n", "pass"),
         "on": ("", "%gpuprofile on -q --flops always")}


def _cell(ip, timers, monkeypatch, kind):
    prefix, after_escape = KINDS[kind]
    if kind == "on":
        ip.run_cell(after_escape)
    return Cell(ip, prefix + CELL, timers, monkeypatch, after_escape)


def depth(n, dense):
    return pytest.mark.parametrize("n", [n, pytest.param(dense, marks=pytest.mark.slow)], ids=["spread", "dense"])


@pytest.mark.parametrize("kind", KINDS)
@depth(60, 260)
def test_one_ctrl_c_at_any_delay_into_a_profiled_cell(ip, timers, monkeypatch, kind, n):
    cell = _cell(ip, timers, monkeypatch, kind)
    # from 2 us (tunekit's set-up) to past the end of the cell
    failed = _sweep(cell, [(d,) for d in _geometric(2e3, 1.3 * cell.wall, n)])
    assert not failed, f"{len(failed)} of {n} deliveries (cell {cell.wall / 1e6:.1f} ms):\n" + "\n".join(failed[:10])


@pytest.mark.parametrize("kind", KINDS)
@depth(60, 260)
def test_two_ctrl_cs_5_to_50_us_apart_while_the_cell_stops(ip, timers, monkeypatch, kind, n):
    # the first lands in the cell's code (mostly: it takes most of the cell's time), the second
    # while its KeyboardInterrupt unwinds through the counter and into tunekit's clean-up
    cell = _cell(ip, timers, monkeypatch, kind)
    firsts = [cell.wall * (0.1 + 0.8 * i / n) for i in range(n)]
    gaps = _geometric(5e3, 50e3, n)
    failed = _sweep(cell, [(d, d + gaps[(7 * i) % n]) for i, d in enumerate(firsts)])
    assert not failed, f"{len(failed)} of {n} deliveries (cell {cell.wall / 1e6:.1f} ms):\n" + "\n".join(failed[:10])
