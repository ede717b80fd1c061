"""Ahead of the machine's other work: a calibration trial asks the scheduler to run this process's
threads before anything else, where the user may ask (root, or CAP_SYS_NICE). Measurement layer.

A CPU figure is the fastest of repeated trials (measure.stream.fastest), but on two cores beside two
busy processes no trial longer than a scheduler slice runs uninterrupted, so the fastest trial was
still 2-7x the quiet one (benchmarks/RESULTS.md, issue 39). Linux runs a ``SCHED_FIFO`` thread
before every ordinary one (sched(7)), so a trial taken at that priority is the machine's own speed
whatever else runs; failing that, ``nice -20`` gives the threads ~87x an ordinary task's share
(CFS weights 88761 vs 1024, kernel/sched/core.c's sched_prio_to_weight). Each is asked per trial,
for every thread of the process (torch's intra-op pool included), and put back after it; under
real-time priority the trial is followed by a pause a quarter of its length, so the rest of the
machine keeps a fifth of the CPU while a calibration runs (and the kernel's real-time throttling,
sched_rt_runtime_us, keeps 5% more).

    >>> with ahead() as got:      # "realtime", "nice -20" or "normal" (neither permitted)
    ...     t = trial()
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tunekit.core.conditions import Conditions

REALTIME, NICE, NORMAL = "realtime", "nice -20", "normal"
PAUSE = 0.25      # under real-time priority, a pause of this share of each trial follows it

_denied: set = set()   # what this process was refused once (not asked again)
_RESET_ON_FORK = getattr(os, "SCHED_RESET_ON_FORK", 0)   # Linux: children do not inherit real time


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:        # not Linux: the calling thread only
        return [0]


_one_at_a_time = threading.RLock()   # see "one block at a time" in ahead's docstring
_inside = threading.local()


@contextmanager
def ahead():
    """Run the block with this process's threads ahead of the machine's other work, as far as the
    user may; yields which priority it got (``REALTIME``, ``NICE`` or ``NORMAL``). Every thread's
    own policy and nice value are put back on exit, also on an exception or a Ctrl-C that lands
    while they are being raised (each is saved before it is changed, inside the ``try``).

    The real-time policy carries ``SCHED_RESET_ON_FORK``: a process started while it holds (a
    subprocess another thread launches) starts at normal priority. Without it such a child kept
    SCHED_FIFO for good, and a child that spins (a load generator) then starved its own parent and
    everything of normal priority on the machine until it ended.

    The main thread is raised only when it is the caller: a calibration on a thread of its own (the
    dashboard's expectation line) leaves the user's main thread, busy with the user's own work, at
    the priority the user gave it.

    One block at a time: two threads' trials at once would each time the other's work too, and the
    second to start would save the first's raised policy as the one to put back, leaving every
    thread at real time for good. A block waits for another thread's to end; a block nested in one
    of the same thread runs as it is, and the outer one puts everything back."""
    with _one_at_a_time:
        if getattr(_inside, "got", None) is not None:   # nested: already ahead (or as far as it got)
            yield _inside.got
            return
        with _raised() as got:
            _inside.got = got
            try:
                yield got
            finally:
                _inside.got = None


@contextmanager
def _raised():
    """``ahead``'s body: raise the threads, yield the priority got, put them back."""
    got, saved, nices = NORMAL, {}, {}
    me, main = threading.get_native_id(), threading.main_thread().native_id
    tids = [t for t in _threads() if t == me or t != main]   # see "the main thread" in the docstring
    start = time.perf_counter()
    try:
        if REALTIME not in _denied and hasattr(os, "sched_setscheduler"):
            try:
                for tid in tids:
                    try:
                        saved[tid] = (os.sched_getscheduler(tid), os.sched_getparam(tid))
                        try:
                            os.sched_setscheduler(tid, os.SCHED_FIFO | _RESET_ON_FORK, os.sched_param(1))
                        except OSError:          # refused or gone: nothing changed to put back
                            del saved[tid]
                            raise
                    except ProcessLookupError:   # the thread ended meanwhile
                        pass
                got = REALTIME
            except OSError:    # not permitted (EPERM), or no real-time class here
                _restore_policy(saved, saved.get(me))
                saved = {}
                _denied.add(REALTIME)
        if got == NORMAL and NICE not in _denied and hasattr(os, "setpriority"):
            try:
                for tid in tids:
                    try:
                        nices[tid] = os.getpriority(os.PRIO_PROCESS, tid)
                        try:
                            os.setpriority(os.PRIO_PROCESS, tid, -20)
                        except OSError:
                            del nices[tid]
                            raise
                    except ProcessLookupError:
                        pass
                got = NICE
            except OSError:
                _restore_nice(nices, nices.get(me, 0))
                nices = {}
                _denied.add(NICE)
        start = time.perf_counter()
        yield got
    finally:
        took = time.perf_counter() - start
        if saved:
            # threads started inside the block (a first parallel region) inherited the policy
            _restore_policy({**{t: None for t in _threads() if t != main or t == me}, **saved}, saved.get(me))
            if got == REALTIME:
                time.sleep(PAUSE * took)
        if nices:
            _restore_nice({**{t: None for t in _threads() if t != main or t == me}, **nices}, nices.get(me, 0))


def level() -> str:
    """The priority `ahead` gets in this process (what it was refused is not asked again)."""
    return NORMAL if NICE in _denied else NICE if REALTIME in _denied else REALTIME


def _restore_policy(saved: dict, default) -> None:
    """Each thread's (policy, param) back; a thread started meanwhile (None) gets the caller's."""
    default = default or (os.SCHED_OTHER, os.sched_param(0))
    for tid, was in saved.items():
        policy, param = was if was is not None else default
        try:
            os.sched_setscheduler(tid, policy, param)
        except OSError:    # the thread has ended
            pass


def _restore_nice(nices: dict, default: int) -> None:
    for tid, value in nices.items():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, default if value is None else value)
        except OSError:
            pass


def shielded_verdict(conditions: Conditions | None, priority: str) -> str:
    """A calibration's verdict: its conditions', except that trials run at real-time priority on a
    busy machine ran ahead of the load (``"busy, measured ahead of it"``, not ``"busy"``)."""
    if conditions is None:
        return "unknown"
    if conditions.verdict == "busy" and priority == REALTIME:
        return "busy, measured ahead of it"
    return conditions.verdict
