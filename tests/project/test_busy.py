"""tools/busy.py, the load `make test-under-load` runs the tests beside: it starts what it says,
and nothing outlives it (time up, stop(), Ctrl-C, its owner killed). Checked by counting and
naming processes, never by timing them."""
import importlib.util
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "busy.py"
_spec = importlib.util.spec_from_file_location("busy", TOOL)
busy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(busy)


def _running(pid) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE   # a zombie has ended (init reaps it later)
    except psutil.NoSuchProcess:
        return False


def _cmdline(p: psutil.Process, timeout=30.0) -> str:
    """``p``'s command line once its exec has set it: Popen returns when exec has begun, and until
    the new program's arguments are in place /proc shows none (seen on a loaded machine: an empty
    command line, the process in disk sleep loading python). A liveness bound, not a timing."""
    deadline = time.monotonic() + timeout
    while not (line := " ".join(p.cmdline())) and time.monotonic() < deadline:
        time.sleep(0.01)
    return line


def _gone(pids, timeout=30.0) -> list:
    """The pids still running after waiting up to ``timeout`` s for them to end (a liveness bound:
    they end within ~10 ms when they work)."""
    deadline = time.monotonic() + timeout
    while any(map(_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _running(p)]


@pytest.mark.parametrize("kw,words", [({"cores": 0}, "cores must be a whole number >= 1"),
                                      ({"cores": 1.5}, "cores"), ({"cores": True}, "cores"),
                                      ({"seconds": 0}, "seconds must be a finite number > 0"),
                                      ({"seconds": math.nan}, "seconds"), ({"seconds": math.inf}, "seconds"),
                                      ({"seconds": "60"}, "seconds")])
def test_bad_input_is_refused_before_any_process_starts(kw, words):
    before = psutil.Process().children()
    with pytest.raises(ValueError, match=words):
        busy.busy(**kw)
    assert psutil.Process().children() == before


def test_context_manager_runs_n_spinners_and_stops_them_on_exit():
    lines = []
    with busy.busy(cores=2, seconds=60, log=lines.append) as b:
        assert b.running() == 2
        for pid in b.pids:   # children of this process, running the spin loop
            p = psutil.Process(pid)
            assert p.ppid() == os.getpid() and "x += i * i" in _cmdline(p)
    assert b.running() == 0 and all(p.returncode is not None for p in b.procs)   # stopped and reaped
    assert lines[0].startswith("busy: 2 processes spinning for 60 s (pids ")
    assert lines[1].startswith("busy: stopped after ")


def test_spinners_stop_by_themselves_when_their_time_is_up():
    b = busy.busy(cores=1, seconds=0.2, log=None).start()
    assert b.wait(timeout=30)   # a liveness bound, not a timing: the spinner ended on its own
    assert [p.returncode for p in b.procs] == [0]
    b.stop()


def _cli(*args, **kw):
    return subprocess.Popen([sys.executable, str(TOOL), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def _state(pids) -> str:
    """What each process is doing, for a failure's message: status, scheduling policy, nice, CPU
    seconds, and this test process's own policy (a leaked real-time policy starves its children)."""
    out = [f"test process: policy {os.sched_getscheduler(0)}, nice {os.getpriority(os.PRIO_PROCESS, 0)}"]
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out.append(f"{pid}: {p.status()}, policy {os.sched_getscheduler(pid)}, nice {p.nice()}, "
                       f"cpu {sum(p.cpu_times()[:2]):.1f} s, {' '.join(p.cmdline())[:60]!r}")
        except (psutil.Error, OSError) as e:
            out.append(f"{pid}: {type(e).__name__}")
    return "; ".join(out)


def _finish(cli, timeout=300) -> tuple[str, str]:
    """``cli.communicate`` within a liveness bound; past it, says what every process was doing,
    then kills the command line (its spinners follow it) so no load outlives the test."""
    try:
        return cli.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        said = _state([cli.pid] + [c.pid for c in psutil.Process(cli.pid).children(recursive=True)])
        cli.kill()
        out, err = cli.communicate()
        pytest.fail(f"busy.py still running after {timeout} s: {said}; its output {out!r} {err!r}")


def _spinner_pids(line: str) -> list[int]:
    # "busy: 2 processes spinning for 60 s (pids 123, 124) on a machine with 2 CPUs"
    return [int(p) for p in line.split("(pids ")[1].split(")")[0].split(", ")]


def test_ctrl_c_stops_the_command_line_cleanly():
    # liveness bounds, not timings: the load runs 600 s, so only the Ctrl-C ends it within the
    # 300 s waited (60 s was too short once in CI, beside the unit tests and the notebooks)
    cli = _cli("--cores", "2", "--seconds", "600")
    pids = _spinner_pids(cli.stdout.readline())
    assert len(pids) == 2 and all(map(_running, pids)), _state([cli.pid, *pids])
    cli.send_signal(signal.SIGINT)
    out, err = _finish(cli)
    assert cli.returncode == 130 and err == "" and out.startswith("busy: stopped by SIGINT after ")
    assert _gone(pids) == []


def test_spinners_stop_when_the_command_line_is_killed():
    cli = _cli("--cores", "2", "--seconds", "60")
    pids = _spinner_pids(cli.stdout.readline())
    cli.kill()   # SIGKILL: no clean-up runs in it
    cli.wait()
    assert _gone(pids) == []


def test_a_command_runs_beside_the_load_and_its_exit_status_is_passed_on():
    # the command counts the spinners running beside it: its parent's other children
    code = ("import psutil, sys; me = psutil.Process(); "
            "print('beside', sum('x += i * i' in ' '.join(c.cmdline()) for c in me.parent().children() "
            "if c.pid != me.pid)); sys.exit(3)")
    cli = _cli("--cores", "2", "--seconds", "600", "--", sys.executable, "-c", code)   # bounds: as above
    out, err = _finish(cli)
    lines = out.splitlines()
    assert cli.returncode == 3 and err == ""
    assert lines[1] == "beside 2" and "exited with 3 after" in lines[2]
    assert _gone(_spinner_pids(lines[0])) == []
