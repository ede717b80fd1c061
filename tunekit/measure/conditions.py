"""Read what else used the machine while a block ran. Measurement layer; the verdict is
`core.conditions.judge`.

    m = ConditionsMeter().start(); ...; cond = m.stop(wall_s)   # -> core.conditions.Conditions

Start and stop read a handful of kernel counters (PSI ``/proc/pressure/cpu``, the first line of
``/proc/stat``, this thread's ``schedstat`` where PSI is missing, the process's CPU clock) with
libc's pread on files kept open, *without releasing the GIL* (like `meters._Proc`): ~20 µs a
block on the 2-core CI machine (benchmarks/bench_conditions.py). On a GPU, `stop()` also asks
NVML for other processes on the device and for clock slowdowns. Nothing here prints or raises:
an unreadable counter is simply absent from the verdict.
"""
from __future__ import annotations

import os
import sys
import time

from tunekit.core.conditions import CPU_WAIT_MIN_S, Conditions, judge, resolved
from tunekit.core.units import is_missing
from tunekit.core.validate import flag, whole
from tunekit.measure.device import existing_device, torch_if_loaded
from tunekit.measure.meters import after_fork, libc

_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
_CPUS = os.cpu_count()  # once: os.cpu_count() costs ~10 µs a call here, a fifth of the budget
_PATHS = {"psi": "/proc/pressure/cpu", "stat": "/proc/stat", "sched": "/proc/thread-self/schedstat"}


class _Counters:
    """The kernel files, opened once per process, read by pread with the GIL held (opened again
    in a forked child, and where a kept descriptor was closed under us: `_reread`).

    A sample keeps each file's bytes as read and parses them only when a window's `delta` uses
    both ends (`_cooked`): a lean meter's short block reads /proc/stat and PSI at its start and
    leaves them unread at its stop, so their numbers are never needed."""

    def __init__(self):
        self.pid, self.fds, self.args, self.ids, self.libc = None, {}, {}, {}, libc()
        if self.libc is not None:
            import ctypes

            self.buf = ctypes.create_string_buffer(512)
            # a function object of its own (the shared one has argtypes): called with arguments
            # built once per file, ctypes converts none of them per call (~1 us a read less)
            self.pread = self.libc["pread"]
            self.pread.restype = ctypes.c_ssize_t
        after_fork(self)

    def _open(self):
        if self.pid is None:  # first read in this process (a forked child must not read its parent's)
            self.fds, self.args, self.ids = {}, {}, {}
            for name in _PATHS:
                self._open_one(name)
            self.pid = os.getpid()
        return self.fds

    def _open_one(self, name: str) -> int | None:
        try:
            fd = os.open(_PATHS[name], os.O_RDONLY)
            st = os.fstat(fd)
        except OSError:
            return None
        self.fds[name], self.ids[name] = fd, (st.st_dev, st.st_ino)
        if self.libc is not None:
            import ctypes

            self.args[name] = (ctypes.c_int(fd), self.buf, ctypes.c_size_t(512), ctypes.c_long(0))
        return fd

    def read(self, name: str) -> bytes | None:
        if self.pid is None:
            self._open()
        args = self.args.get(name)
        if args is not None:  # (libc's pread, its arguments built once)
            n = self.pread(*args)  # /proc/stat's first line is within 512 bytes
            return self.buf[:n] if n > 0 else self._reread(name)
        fd = self.fds.get(name)
        if fd is None:
            return None
        try:
            return os.pread(fd, 512, 0)
        except OSError:
            return self._reread(name)

    def _reread(self, name: str) -> bytes | None:
        """A kept file's read failed. If its descriptor no longer is the file opened (closed under
        us, by code that closes every descriptor, say), the file is opened again and read; the old
        number is forgotten, not closed (it may be someone else's file now). If it still is, the
        file itself refused (nothing to reopen): None, as for any unreadable counter."""
        fd = self.fds.get(name)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == self.ids.get(name):
                return None
        except (OSError, TypeError):
            pass
        self.fds.pop(name, None), self.args.pop(name, None), self.ids.pop(name, None)
        fd = self._open_one(name)
        if fd is None:
            return None
        try:
            return os.pread(fd, 512, 0) or None
        except OSError:
            return None

    def sample(self, with_sched: bool, with_stat: bool = True, with_wait: bool = True) -> dict:
        """The counters now: CPU wait (s; not read without ``with_wait``), machine busy and steal
        time (s; not read without ``with_stat``), own CPU time (s). PSI's and /proc/stat's figures
        are kept as read (``_psi``, ``_stat``) until `_cooked` parses them."""
        out = {"own_cpu_s": time.process_time()}
        psi = self.read("psi") if with_wait else None
        if psi:  # "some avg10=0.00 avg60=0.00 avg300=0.00 total=123456" (µs)
            out["_psi"], out["wait_source"] = psi, "psi"
        elif with_sched and with_wait:
            sched = self.read("sched")  # "run_ns wait_ns slices" of this thread
            if sched:
                out["wait_s"], out["wait_source"] = int(sched.split()[1]) / 1e9, "schedstat"
        stat = self.read("stat") if with_stat else None
        if stat and stat.startswith(b"cpu "):
            out["_stat"] = stat
        return out


def _cooked(s: dict) -> dict:
    """``s`` with its kept bytes parsed into numbers (``wait_s``; ``busy_s``, ``steal_s``), in place."""
    psi = s.pop("_psi", None)
    if psi is not None:
        s["wait_s"] = int(psi[psi.index(b"total=") + 6:psi.index(b"\n")]) / 1e6
    stat = s.pop("_stat", None)
    if stat is not None:
        v = [int(x) for x in stat[4:stat.index(b"\n")].split()]
        # user nice system idle iowait irq softirq steal ...: busy = all but idle, iowait, steal
        s["busy_s"] = (v[0] + v[1] + v[2] + v[5] + v[6]) * _TICK_S
        s["steal_s"] = v[7] * _TICK_S if len(v) > 7 else None
    return s


_COUNTERS = _Counters()


def threads_in_use() -> int:
    """The threads the measured work can use: torch's intra-op pool, else 1."""
    torch = torch_if_loaded()
    return torch.get_num_threads() if torch is not None else 1


def delta(s0: dict, s1: dict) -> dict:
    """Raw readings over a window (what `judge` takes, less wall/cpus/threads); ranks send these."""
    out = {"own_cpu_s": s1["own_cpu_s"] - s0["own_cpu_s"]}
    if ("_psi" in s1 or "wait_s" in s1) or ("_stat" in s1 or "busy_s" in s1):  # both ends read: parse
        s0, s1 = _cooked(s0), _cooked(s1)
    if "wait_s" in s0 and "wait_s" in s1:
        out["cpu_wait_s"], out["wait_source"] = s1["wait_s"] - s0["wait_s"], s1["wait_source"]
    elif "wait_s" in s0 or "_psi" in s0:  # a counter there, left unread at the stop (a lean meter's short block)
        out["wait_source"] = s0["wait_source"]
    if "busy_s" in s0 and "busy_s" in s1:
        out["busy_cpu_s"] = s1["busy_s"] - s0["busy_s"]
        if s0.get("steal_s") is not None and s1.get("steal_s") is not None:
            out["steal_s"] = s1["steal_s"] - s0["steal_s"]
    return out


class ConditionsMeter:
    """Readings at `start()` and `stop()`; `stop()` returns the `Conditions` of the window.

    ``cuda_index``: the torch CUDA device in use (NVML is asked about it at stop), or None.
    ``lean``: `stop()` leaves /proc/stat unread when the block was too short for its clock ticks
    (`core.conditions.resolved`: the verdict leaves other processes and steal out there, and the
    record has them as NaN): the kernel renders the whole file, every CPU's and interrupt's
    line, for each read, which is most of what a meter costs a trivial cell. It leaves the
    CPU-wait counter unread too when the block was shorter than ``CPU_WAIT_MIN_S`` (2 ms), where
    no wait can make it busy (`judge` says "not read", the record has ``cpu_wait`` NaN), and the
    load average (which never decides: NaN). A lean meter's windows do not `follow()` one another.
    ``judged=False``: `stop()` takes every reading, and the verdict and its words are worked out
    from them when the record is first read (`Deferred`), not in the measured path.
    """

    def __init__(self, cuda_index: int | None = None, children: bool = False, lean: bool = False,
                 judged: bool = True):
        self.cuda_index, self.children, self.lean, self.judged = cuda_index, children, lean, judged
        self.s0 = self.raw = None

    def _sample(self, with_stat: bool = True, with_wait: bool = True) -> dict:
        s = _COUNTERS.sample(True, with_stat, with_wait)
        if self.children:  # the CPU time of child processes that ended and were waited for
            import resource

            ru = resource.getrusage(resource.RUSAGE_CHILDREN)
            s["own_cpu_s"] += ru.ru_utime + ru.ru_stime
        return s

    def start(self, machine: bool = True) -> "ConditionsMeter":
        """``machine=False``: /proc/stat is not read (nor at the stop): for a block whose code can
        run nothing (`fingerprint.runs_nothing`), which only preemption can make last past the
        file's resolution; its other processes and steal are then NaN, as a short block's."""
        self.s0 = self._sample(with_stat=machine)
        self.t0 = time.perf_counter()
        return self

    def follow(self) -> "ConditionsMeter":
        """A meter whose window starts where this one stopped (back-to-back windows, one reading
        per boundary: a monitored loop's steps). Call after `stop()`."""
        if self.lean:
            raise ValueError("a lean ConditionsMeter's stop may leave /proc/stat unread: it cannot be followed")
        nxt = ConditionsMeter(self.cuda_index, self.children, judged=self.judged)
        nxt.s0, nxt.t0 = self.s1, self.t1
        return nxt

    def stop(self, wall_s: float | None = None, threads: int | None = None) -> Conditions | None:
        """The window's conditions (``wall_s``: the measured block's time, else start..stop)."""
        s0 = self.s0
        if s0 is None:
            return None
        t1 = time.perf_counter()
        if is_missing(wall_s):
            wall_s = t1 - self.t0
        full = not self.lean or wall_s >= CPU_WAIT_MIN_S  # a lean meter's block under 2 ms: the least
        stat = ("_stat" in s0 or "busy_s" in s0) and (not self.lean or resolved(wall_s, _CPUS, _TICK_S))
        s1 = self._sample(with_stat=stat, with_wait=full)
        self.s1, self.t1 = s1, t1
        if full or stat:
            raw = delta(s0, s1)
        else:  # a lean meter's short block: its own CPU time, and where its wait would have come from
            raw = {"own_cpu_s": s1["own_cpu_s"] - s0["own_cpu_s"]}
            if "wait_source" in s0:
                raw["wait_source"] = s0["wait_source"]
        self.raw = raw
        if not threads:  # (threads_in_use(), without the call)
            torch = sys.modules.get("torch")
            threads = torch.get_num_threads() if torch is not None else 1
        kw = dict(wall_s=wall_s, cpus=_CPUS, threads=threads, tick_s=_TICK_S,
                  load_avg=_load1() if full else None, **raw)
        if self.cuda_index is not None:
            kw.update(gpu_readings(self.cuda_index))
        return judge(**kw) if self.judged else Deferred(kw)


class Deferred(Conditions):
    """A `Conditions` whose readings were all taken, judged (`core.conditions.judge`) when one
    of its fields is first read; from then on it is a plain `Conditions`. A profiled cell's
    record carries one: its verdict in words costs nothing until someone looks."""

    def __init__(self, kw: dict):  # judge's arguments, not the dataclass's fields
        # (set as an attribute, not through __dict__: the instance keeps it inline, with no dict
        # object of its own until it is judged; one is kept per profiled cell)
        object.__setattr__(self, "_judge", kw)

    def judged(self) -> Conditions:
        kw = self.__dict__.pop("_judge", None)
        if kw is not None:
            self.__dict__.update(judge(**kw).__dict__)
            object.__setattr__(self, "__class__", Conditions)
        return self

    def __getattr__(self, name):  # only what is not there yet: the fields before the verdict
        if name.startswith("__") or "_judge" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.judged(), name)

    def __eq__(self, other):
        return self.judged() == other

    def __hash__(self):
        return hash(self.judged())


class watch:
    """The conditions over a ``with`` block, for scripts and benchmarks:

    >>> with tunekit.measure.watch_conditions() as w:
    ...     run_my_benchmark()
    >>> print(w.conditions)        # e.g. "quiet: tasks waited for a CPU 0% of the time; ..."

    The block's own child processes (a kernel, ranks) count as its own work, not as other
    processes, once they have ended and been waited for.
    """

    def __init__(self, cuda_index: int | None = None, children: bool = True):
        if cuda_index is not None:  # a GPU this machine lacks: a clear error now, not a silent gap later
            existing_device(whole("cuda_index", cuda_index, 0), "cuda_index")
        self.meter, self.conditions = ConditionsMeter(cuda_index, flag("children", children)), None

    def __enter__(self) -> "watch":
        self.meter.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.conditions = self.meter.stop()
        return False


def judge_rank(reading: dict, group_cpu_s: float) -> Conditions:
    """A rank's `Conditions` from its `rank_reading`, where ``group_cpu_s`` is the CPU time of
    all the run's ranks on its machine: the ranks of one run are not 'other processes' to each
    other."""
    return judge(reading["wall_s"], reading["cpus"], reading["threads"], tick_s=_TICK_S,
                 load_avg=reading["load_avg"], group_cpu_s=group_cpu_s, **reading["raw"], **reading["gpu"])


def rank_reading(meter: "ConditionsMeter", wall_s: float, exclude_pids=()) -> dict:
    """What a rank sends rank 0 (plain data, picklable): its raw readings over the timed steps."""
    import socket

    meter.stop(wall_s)
    return {"wall_s": wall_s, "raw": meter.raw, "host": socket.gethostname(), "cpus": _CPUS,
            "threads": threads_in_use(), "load_avg": _load1(),
            "gpu": gpu_readings(meter.cuda_index, exclude_pids)}


def _load1() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


# NVML clocks-event reason bits (nvml.h: nvmlClocksEventReason*), in words
_REASONS = {0x1: "idle", 0x2: "application clocks", 0x4: "sw power cap", 0x8: "hw slowdown",
            0x20: "sw thermal", 0x40: "hw thermal", 0x80: "power brake", 0x100: "display clocks"}


def throttle_words(mask: int) -> tuple:
    """NVML's clocks-event bitmask in words: ``throttle_words(0x48) == ('hw slowdown', 'hw thermal')``.
    'sw thermal' is reported as 'thermal'."""
    out = []
    for bit, word in _REASONS.items():
        if mask & bit:
            out.append("thermal" if word == "sw thermal" else word)
    return tuple(out)


def gpu_readings(cuda_index: int | None, exclude_pids=()) -> dict:
    """Other processes on the GPU (not this one, nor ``exclude_pids``: a run's own ranks) and its
    clock slowdowns, from NVML (empty where unreadable)."""
    if cuda_index is None:
        return {}
    from tunekit.measure import nvml

    try:
        h = nvml.handle(cuda_index)
        nv = nvml.library()
        if h is None or nv is None:
            return {}
        me = {os.getpid(), *exclude_pids}
        procs = set()
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                procs |= {p.pid for p in getattr(nv, getter)(h)}
            except Exception:
                pass
        getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return {"gpu_other_processes": len(procs - me), "gpu_throttle": throttle_words(int(getter(h)))}
    except Exception:  # NVML present but a query failed: judge the CPU side alone
        return {}


__all__ = ["ConditionsMeter", "Conditions", "Deferred", "watch", "delta", "judge_rank", "rank_reading", "gpu_readings",
           "throttle_words", "threads_in_use"]
