"""Calibration trials run ahead of the machine's other work where the user may ask for it
(tunekit.measure.priority), and every thread's scheduling is put back afterwards."""
import os
import subprocess
import sys
import threading

import pytest

from tunekit.core.conditions import Conditions
from tunekit.measure import peaks, priority
from tunekit.measure.priority import NICE, NORMAL, REALTIME, ahead, shielded_verdict


def _policies():
    out = {}
    for t in (int(t) for t in os.listdir("/proc/self/task")):
        try:
            out[t] = (os.sched_getscheduler(t), os.getpriority(os.PRIO_PROCESS, t))
        except (ProcessLookupError, OSError):    # the thread ended meanwhile
            pass
    return out


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(priority, "_denied", set())


def test_every_thread_is_put_back_as_it_was(fresh):
    before = _policies()
    started = threading.Event()
    with ahead() as got:
        # a thread started inside the block inherits the block's nice value (under real time it
        # starts at normal priority: SCHED_RESET_ON_FORK); it is put back as well
        t = threading.Thread(target=started.wait)
        t.start()
        inside = _policies()
    after = _policies()
    started.set()
    t.join()
    assert got in (REALTIME, NICE, NORMAL)
    if got == REALTIME:
        raised = {p for tid, (p, _) in inside.items() if tid in before}
        assert raised == {os.SCHED_FIFO | os.SCHED_RESET_ON_FORK} and inside[t.native_id][0] == os.SCHED_OTHER
    if got == NICE:
        assert {n for _, n in inside.values()} == {-20}
    both = before.keys() & after.keys()    # a thread of the test run may end meanwhile
    assert {t: after[t] for t in both} == {t: before[t] for t in both}
    assert set(after.values()) <= set(before.values())   # the new thread too: the caller's policy and nice


def test_an_exception_inside_still_puts_everything_back(fresh):
    before = _policies()
    with pytest.raises(KeyError), ahead():
        raise KeyError("trial failed")
    after = _policies()
    both = before.keys() & after.keys()    # a thread of the test run may end meanwhile
    assert {t: after[t] for t in both} == {t: before[t] for t in both}
    assert set(after.values()) <= set(before.values())


def test_a_ctrl_c_while_priorities_are_raised_still_puts_everything_back(monkeypatch, fresh):
    # the second thread's sched_setscheduler is interrupted: the first thread, raised already, goes back
    before, real, calls = _policies(), os.sched_setscheduler, []

    def interrupted(tid, policy, param):
        calls.append(tid)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(tid, policy, param)

    threading.Thread(target=lambda: None).start()   # whatever runs, make sure a second thread can exist
    gate = threading.Event()
    t = threading.Thread(target=gate.wait)
    t.start()
    monkeypatch.setattr(os, "sched_setscheduler", interrupted)
    with pytest.raises(KeyboardInterrupt), ahead():
        pass
    monkeypatch.setattr(os, "sched_setscheduler", real)
    after = _policies()
    gate.set()
    t.join()
    both = before.keys() & after.keys()
    assert len(calls) >= 2 and {t: after[t] for t in both} == {t: before[t] for t in both}


def test_a_process_started_at_real_time_priority_starts_at_normal_priority(fresh):
    code = "import os; print(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))"
    with ahead() as got:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    if got != REALTIME:
        pytest.skip(f"real-time priority not permitted here ({got})")
    assert out.split() == [str(os.SCHED_OTHER), "0"]   # SCHED_RESET_ON_FORK: not inherited


def test_a_calibration_on_a_thread_of_its_own_leaves_the_main_thread_alone(fresh):
    main = threading.main_thread().native_id
    before, seen = _policies()[main], {}

    def calibrate():   # as the dashboard's expectation line does
        with ahead() as got:
            seen.update(got=got, main=_policies()[main], me=_policies()[threading.get_native_id()])

    t = threading.Thread(target=calibrate)
    t.start()
    t.join()
    assert seen["main"] == before == _policies()[main]
    if seen["got"] == REALTIME:
        assert seen["me"][0] == os.SCHED_FIFO | os.SCHED_RESET_ON_FORK


def test_blocks_in_two_threads_take_turns_and_put_everything_back(fresh):
    before, inside, both_in = _policies(), [], threading.Barrier(2, timeout=60)

    def trial():
        both_in.wait()   # both threads ask at once
        with ahead():
            inside.append(threading.get_native_id())
            with ahead():   # nested in the same thread: runs as it is
                pass

    threads = [threading.Thread(target=trial) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = _policies()
    common = before.keys() & after.keys()
    assert len(inside) == 2 and {t: after[t] for t in common} == {t: before[t] for t in common}


def test_a_refusal_is_not_asked_again(monkeypatch, fresh):
    calls = []

    def refuse(*args):
        calls.append(args)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    monkeypatch.setattr(os, "setpriority", refuse)
    with ahead() as got:
        pass
    # one refused real-time call, then one refused nice call: the same for every later trial
    assert (got, len(calls), priority.level()) == (NORMAL, 2, NORMAL)
    with ahead() as again:
        pass
    assert (again, len(calls)) == (NORMAL, 2)


def test_nice_when_real_time_is_refused(monkeypatch, fresh):
    seen = {}

    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    monkeypatch.setattr(os, "getpriority", lambda which, tid: 0)
    monkeypatch.setattr(os, "setpriority", lambda which, tid, v: seen.__setitem__(tid, v))
    with ahead() as got:
        during = dict(seen)
    assert got == NICE == priority.level() and set(during.values()) == {-20} and set(seen.values()) == {0}


@pytest.mark.parametrize("verdict,prio,said", [
    ("busy", REALTIME, "busy, measured ahead of it"),   # ran before the load: trusted
    ("busy", NICE, "busy"),                              # ~87x the share, still not load-proof
    ("busy", NORMAL, "busy"),
    ("quiet", REALTIME, "quiet"),
])
def test_verdict(verdict, prio, said):
    assert shielded_verdict(Conditions(verdict, "injected"), prio) == said
    assert shielded_verdict(None, prio) == "unknown"


def test_a_busy_calibration_taken_ahead_of_the_load_is_trusted(calibrations):
    calibrations.cache(conditions={"verdict": "busy", "reason": "tasks waited for a CPU 97% of the time"},
                       priority=REALTIME)
    peak = peaks.resolve_peak("cpu", "fp32")
    assert "re-measured" not in peak.source and "busy" not in peak.source and calibrations.sweeps == 0
