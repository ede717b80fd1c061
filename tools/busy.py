"""Keep N cores busy for a while: the load that tests and timings must hold up under.

    python tools/busy.py --cores 2 --seconds 600     # 2 spinning processes for 10 minutes
    python tools/busy.py --cores 2 -- pytest -q tests/measure/test_trace.py   # a command beside the load

    from busy import busy                             # tools/ on sys.path, or load the file
    with busy(cores=2, seconds=600):                  # stopped on leaving the block
        ...

Each spinner is a separate Python process doing integer arithmetic (no memory traffic, no I/O),
so it competes for CPU time only. Nothing outlives its owner: a spinner stops when its time is
up, when it is told to (SIGTERM, SIGINT), and when the process that started it dies, even by
SIGKILL (Linux's parent-death signal, and a check of the parent pid as a fallback). The command
line itself also stops when its parent dies (`make` killed mid-run). Ctrl-C stops everything
and exits without a traceback; with a command, Ctrl-C goes to the command (pytest still prints
its summary) and the load stops when the command has ended. The exit status is the command's.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import time

# One spinner: argv = seconds, the pid of its owner. Standalone code (python -c): nothing to
# import, so it starts in ~20 ms and never loads what the owner has loaded (torch).
SPIN = r"""
import os, signal, sys, time
seconds, owner = float(sys.argv[1]), int(sys.argv[2])
try:   # Linux: SIGTERM when the owner dies, even by SIGKILL (prctl PR_SET_PDEATHSIG = 1)
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
except Exception:
    pass
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the owner's to handle
deadline = time.monotonic() + seconds
while time.monotonic() < deadline and os.getppid() == owner:   # owner gone: re-parented
    x = 0
    for i in range(200_000):   # ~10 ms of pure CPU between checks
        x += i * i
"""


def _check(cores, seconds) -> tuple[int, float]:
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores must be a whole number >= 1, got {cores!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds <= 0:
        raise ValueError(f"seconds must be a finite number > 0, got {seconds!r}")
    return cores, float(seconds)


def _say(line: str) -> None:
    print(line, flush=True)


class Busy:
    """``cores`` spinning processes for ``seconds``; ``stop()`` ends them early.

    ``log``: a function taking one line, told what happens (stdout by default; ``None``: silent).
    Start it from the main thread: Linux's parent-death signal follows the thread that started
    a spinner, so a spinner started from a thread stops when that thread ends."""

    def __init__(self, cores: int = 2, seconds: float = 600.0, log=_say):
        self.cores, self.seconds = _check(cores, seconds)
        self.log = log or (lambda line: None)
        self.procs: list[subprocess.Popen] = []
        self.t0 = None

    def start(self) -> "Busy":
        self.t0 = time.monotonic()
        for _ in range(self.cores):
            # their own process group: a terminal's Ctrl-C reaches the owner, which stops them
            self.procs.append(subprocess.Popen([sys.executable, "-c", SPIN, repr(self.seconds), str(os.getpid())],
                                               stdin=subprocess.DEVNULL, process_group=0))
        self.log(f"busy: {self.cores} process{'es' if self.cores > 1 else ''} spinning for {self.seconds:g} s "
                 f"(pids {', '.join(str(p.pid) for p in self.procs)}) on a machine with {os.cpu_count()} CPUs")
        return self

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def running(self) -> int:
        """How many spinners are still running."""
        return sum(p.poll() is None for p in self.procs)

    def ended_early(self) -> list[str]:
        """The spinners that have ended, each as "pid N: exit code C" (a negative code: killed by
        signal -C), for the log when the load ended before its time."""
        return [f"pid {p.pid}: exit code {p.returncode}" for p in self.procs if p.poll() is not None]

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every spinner has stopped (its time up); False if ``timeout`` passed first."""
        end = None if timeout is None else time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(None if end is None else max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def stop(self, why: str = "stopped") -> None:
        """Stop every spinner (SIGTERM, then SIGKILL after 5 s) and reap it."""
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.t0 is not None:
            self.log(f"busy: {why} after {time.monotonic() - self.t0:.1f} s")
            self.t0 = None

    def __enter__(self) -> "Busy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def busy(cores: int = 2, seconds: float = 600.0, log=_say) -> Busy:
    """A context manager keeping ``cores`` cores busy for at most ``seconds`` (``with busy(2): ...``);
    or call ``.start()`` / ``.stop()`` yourself."""
    return Busy(cores, seconds, log)


def _die_with_parent() -> None:
    """Linux: SIGTERM when our parent dies (make killed mid-target), so our spinners stop too."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except Exception:
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=int, default=2, help="spinning processes (default 2)")
    ap.add_argument("--seconds", type=float, default=600.0, help="how long at most (default 600)")
    ap.add_argument("command", nargs=argparse.REMAINDER,
                    help="after --: a command to run beside the load; the load stops when it ends, "
                         "and its exit status is ours")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        _check(args.cores, args.seconds)
    except ValueError as e:
        ap.error(str(e))
    parent = os.getppid()
    _die_with_parent()
    stopped = {"why": None}

    def on_signal(signum, frame):
        stopped["why"] = f"stopped by {signal.Signals(signum).name}"
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    # with a command, Ctrl-C is the command's to handle (pytest prints its summary) and we stop
    # when it ends; a handler that does nothing, not SIG_IGN, which the command would inherit
    signal.signal(signal.SIGINT, (lambda *a: None) if command else on_signal)
    b = busy(args.cores, args.seconds)
    why, proc, rc = "time up", None, 0
    try:   # started inside: a Ctrl-C right after the pid line still stops the spinners cleanly
        b.start()
        if command:
            try:
                proc = subprocess.Popen(command)
            except OSError as e:
                b.log(f"busy: cannot run {command[0]!r}: {e}")
                why, rc = "the command did not start", 127
            else:
                rc = proc.wait()
                why = f"{' '.join(command)} exited with {rc}"
                rc = 128 - rc if rc < 0 else rc   # killed by signal N: exit 128 + N, as a shell does
            if b.running() < args.cores:
                b.log(f"busy: the load ended before the command did ({args.seconds:g} s; "
                      f"{'; '.join(b.ended_early())}): raise --seconds")
        else:
            told = False
            while not b.wait(timeout=1.0):
                if os.getppid() != parent:   # no parent-death signal here (not Linux): poll
                    why = "stopped: the parent process is gone"
                    break
                if not told and b.running() < args.cores:   # something else ended one: say what
                    told = True
                    b.log(f"busy: a spinner ended before its time ({'; '.join(b.ended_early())})")
    except KeyboardInterrupt:
        why = stopped["why"] or "stopped by SIGINT"
        rc = 130 if why.endswith("SIGINT") else 143
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl-C must not cut the clean-up short
        if proc is not None and proc.poll() is None:
            proc.terminate()
            rc = 128 - proc.wait()   # ended by our SIGTERM: 143
        b.stop(why)
    return rc


if __name__ == "__main__":
    sys.exit(main())
