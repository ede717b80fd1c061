"""Memory meters: CPU RSS and its exact peak, glibc's allocator totals, torch's CUDA allocator
(measure.device_meter wraps them in one meter per torch device for the engine). Measurement
layer; nothing here prints, nothing initializes CUDA.
"""
from __future__ import annotations

import math
import os
import resource
import sys

from tunekit.core.units import is_missing
from tunekit.measure.device import cuda_device_index, torch_if_loaded

NaN = math.nan
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_HAS_PROC = os.path.exists("/proc/self/statm")


_LIBC: list = []


def after_fork(files) -> None:
    """Forget ``files.pid`` in a child forked from this process, so that ``files`` opens the
    child's own /proc files on its next read (kept open otherwise: one check, no system call)."""
    def forget():
        files.pid = None

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=forget)


def libc():
    """This process's C library (``ctypes.PyDLL``: its calls keep the GIL), pread and write typed;
    None where it cannot be opened. One handle for every caller in tunekit."""
    if not _LIBC:
        try:
            import ctypes

            lib = ctypes.PyDLL(None)
            lib.pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
            lib.pread.restype = ctypes.c_ssize_t
            lib.write.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
            lib.write.restype = ctypes.c_ssize_t
            _LIBC.append(lib)
        except (OSError, AttributeError):
            _LIBC.append(None)
    return _LIBC[0]


# --- CPU memory --------------------------------------------------------------------------------


class _Proc:
    """/proc/self reads and the clear_refs write, done *without releasing the GIL*.

    A plain file read releases the GIL, and in IPython that lets the history thread run its
    sqlite write in the middle of the cell (~0.5 ms per cell measured with `%gpuprofile on`),
    work it otherwise does while the kernel waits for input. libc's pread/write called through
    ctypes.PyDLL keep the GIL (these calls take microseconds). The files stay open per process:
    a forked child opens its own (`after_fork`), without a getpid() system call per read.
    """

    def __init__(self):
        self.pid, self.libc, self.args = None, libc(), {}
        if self.libc is not None:
            import ctypes

            self.buf = ctypes.create_string_buffer(8192)
            # a function object of its own (the shared one has argtypes): called with arguments
            # built once per file, ctypes converts none of them per call (as conditions._Counters)
            self.pread = self.libc["pread"]
            self.pread.restype = ctypes.c_ssize_t
        after_fork(self)

    def _fds(self):
        if self.pid is None:  # first read in this process (the parent's files are not a child's)
            self.fd = {n: os.open(f"/proc/self/{n}", os.O_RDONLY) for n in ("statm", "status")}
            try:
                self.fd["clear_refs"] = os.open("/proc/self/clear_refs", os.O_WRONLY)
            except OSError:
                self.fd["clear_refs"] = None
            if self.libc is not None:
                import ctypes

                size = ctypes.c_size_t(len(self.buf))
                self.args = {n: (ctypes.c_int(self.fd[n]), self.buf, size, ctypes.c_long(0))
                             for n in ("statm", "status")}
            self.pid = os.getpid()
        return self.fd

    def read(self, name: str) -> bytes:
        if self.libc is None:
            with open(f"/proc/self/{name}", "rb") as f:
                return f.read()
        if self.pid is None:
            self._fds()
        n = self.pread(*self.args[name])
        if n < 0:
            raise OSError(f"cannot read /proc/self/{name}")
        return self.buf[:n]  # (the bytes read alone: `.raw` would copy the whole buffer first)

    def reset_hwm(self) -> bool:
        if self.libc is None:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        fd = self._fds()["clear_refs"]
        return fd is not None and self.libc.write(fd, b"5", 1) == 1


_PROC = _Proc() if _HAS_PROC else None


def cpu_rss_bytes() -> int:
    """Resident set size of this process (Linux: /proc/self/statm, else psutil)."""
    if _PROC is not None:
        return int(_PROC.read("statm").split()[1]) * _PAGE
    import psutil

    return psutil.Process().memory_info().rss


class _MallInfo2:
    """glibc's allocator totals (``mallinfo2``, glibc >= 2.33): bytes handed out and not taken
    back, wherever they sit. RSS counts pages, so it stays put when a block's allocation reuses
    freed memory the process still holds (a hole in the heap) or when a freed chunk stays in it;
    these totals move either way. The call walks glibc's free lists: ~10 us in a fresh process,
    ~0.3 ms in a fragmented one, holding the GIL as the /proc reads do."""

    def __init__(self):
        self.call = None
        if _PROC is None or _PROC.libc is None or not hasattr(_PROC.libc, "mallinfo2"):
            return
        import ctypes

        class Info(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                       "fsmblks", "uordblks", "fordblks", "keepcost")]

        self.call = _PROC.libc.mallinfo2
        self.call.argtypes, self.call.restype = [], Info

    def in_use(self) -> int | None:
        if self.call is None:
            return None
        info = self.call()
        return info.uordblks + info.hblkhd  # in use in the heaps (all arenas) + mmapped chunks


_MALLINFO = _MallInfo2()


def malloc_trim() -> bool | None:
    """Ask glibc to hand the freed pages of every heap (each thread's arena) back to the OS
    (``malloc_trim(0)``: the top of each heap and, since glibc 2.8, whole free pages inside it);
    True when some were, False when none were, None without glibc's malloc_trim."""
    lib = libc()
    if lib is None or not hasattr(lib, "malloc_trim"):
        return None
    return bool(lib.malloc_trim(0))


def minor_faults() -> int:
    """The process's minor page faults so far (all threads; ``ru_minflt``, ~1 us): pages the kernel
    handed it, zeroed, on first touch (a heap glibc trimmed, grown again)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def malloc_in_use_bytes() -> int | None:
    """Bytes glibc's malloc has handed out and not taken back (None without glibc's mallinfo2)."""
    return _MALLINFO.in_use()


_RSS_BLIND = 16 * 2**20  # what RSS may miss before a record says so


def rss_blind_note(rss_delta: float, alloc_delta: float | None):
    """A note (kind ``memory.rss_unseen``) when the block's allocations moved by more than 16 MiB
    that its RSS delta does not show; None when RSS tells the story. RSS may rise without
    allocations (Python's own arenas, libraries, stacks): only what it missed is said."""
    if alloc_delta is None or is_missing(rss_delta):
        return None
    grew = alloc_delta - max(rss_delta, 0) > _RSS_BLIND
    if not grew and -alloc_delta - max(-rss_delta, 0) <= _RSS_BLIND:  # (no import statement run)
        return None
    from tunekit.core.fmt import fmt_bytes
    from tunekit.core.notes import Note

    if grew:
        return Note("memory.rss_unseen",
                    f"RSS {fmt_bytes(rss_delta, True)}, but the block's allocations grew by "
                    f"{fmt_bytes(alloc_delta)}: the allocator reused memory this process already held, which "
                    "RSS does not count again (the CPU peak under-reads the same way)")
    return Note("memory.rss_unseen",
                f"RSS {fmt_bytes(rss_delta, True)}, but the block freed {fmt_bytes(-alloc_delta)} of "
                "allocations: glibc keeps freed heap memory for reuse, so RSS did not fall")


def _vm_hwm_bytes() -> int | None:
    return _hwm_rss_bytes()[0]


def _hwm_rss_bytes() -> tuple[int | None, int | None]:
    """(VmHWM, VmRSS) in bytes from one read of /proc/self/status (None where a line is missing).
    VmRSS there is statm's resident pages in kB: the same counters, so one read serves both."""
    text = _PROC.read("status")
    i = text.find(b"VmHWM:")
    if i < 0:
        return None, None
    j = text.index(b"kB", i)
    k = text.find(b"VmRSS:", j)
    rss = int(text[k + 6:text.index(b"kB", k)]) * 1024 if k >= 0 else None
    return int(text[i + 6:j]) * 1024, rss


_BOUND = {"parent": 0}  # getrusage's ru_maxrss inherited through exec (the parent's peak), once seen
# this thread's usage: the same memory figure, without summing the CPU times of every thread
_RUSAGE = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF) if sys.platform == "linux" else None


def _mark_bound() -> int | None:
    """VmHWM as getrusage gives it, in bytes (~1 us; status: ~25 us): ru_maxrss is computed as
    VmHWM is (the larger of the stored mark and RSS now), or is the peak of what the process
    replaced at exec (its parent's) when larger: then, once seen above this RSS, None (as off
    Linux). Read before RSS: the stored mark only grows (tunekit alone resets it), so a bound at
    most the RSS read after it says the mark is at RSS (to the counters' batching, as status)."""
    bound = None if _RUSAGE is None else resource.getrusage(_RUSAGE).ru_maxrss * 1024
    return None if bound is None or bound <= _BOUND["parent"] else bound


def _reset_hwm() -> bool:
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0): an exact,
    # cheap per-block peak instead of a sampling thread.
    try:
        return _PROC.reset_hwm()
    except OSError:
        return False


def _maxrss_bytes() -> int:
    # ru_maxrss is KiB on Linux, bytes on macOS
    v = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return v if sys.platform == "darwin" else v * 1024


class CpuPeak:
    """Peak RSS between `start()` and `stop()`.

    Exact on Linux via VmHWM (reset through /proc/self/clear_refs when it is above RSS).
    Elsewhere the process-lifetime ru_maxrss only tells the
    peak when it grew during the block; otherwise the peak is unknown (NaN), not guessed.
    Meters nest: before an inner meter resets VmHWM, the peak so far is handed to the outer ones.
    """

    def __init__(self, allocations: bool = True):
        self.exact = _HAS_PROC
        self.note = self.unseen = None  # unseen: what RSS missed (rss_blind_note)
        self.alloc0 = None
        self.hwm_seen = 0
        self.allocations = allocations  # False: no mallinfo2 (2-40 us), no rss_unseen note

    def start(self) -> int:
        rss = None
        if self.exact:
            # Reset only when the high-water mark sits above the current RSS (memory was freed
            # since the last peak). When they are equal, any growth in the block raises it anyway,
            # and skipping the write matters: it can cost IPython ~0.5 ms a cell in its history
            # thread, which is most of `%gpuprofile on`'s budget. Equal when getrusage's bound is
            # at most statm's RSS (hwm <= bound <= rss <= hwm), else one status read gives both
            # figures (resetting the mark leaves RSS as it is).
            bound = _mark_bound()
            rss = None if bound is None else cpu_rss_bytes()  # after the bound: see _mark_bound
            if rss is None or bound > rss:
                hwm, rss = _hwm_rss_bytes()
                if bound is not None and hwm is not None and bound > hwm + 2**20:  # (beyond the batching)
                    _BOUND["parent"] = bound  # ru_maxrss = max(parent's, hwm) > hwm: the parent's
                rss = cpu_rss_bytes() if rss is None else rss
                if hwm is None or hwm > rss:
                    for outer in _ACTIVE_CPU:  # hand the peak so far to the enclosing meters
                        outer.hwm_seen = max(outer.hwm_seen, hwm or 0)
                    self.exact = _reset_hwm()
        if not self.exact:
            self.note = "CPU peak is exact only where /proc/self/clear_refs works"
        self._maxrss0 = None if self.exact else _maxrss_bytes()
        self.alloc0 = malloc_in_use_bytes() if self.allocations else None
        self.rss0 = cpu_rss_bytes() if rss is None else rss
        _ACTIVE_CPU.append(self)
        return self.rss0

    def stop(self) -> tuple[int, float]:
        """(rss delta, peak above the start) in bytes."""
        if self in _ACTIVE_CPU:
            _ACTIVE_CPU.remove(self)
        hwm = rss1 = None
        if self.exact:
            # bound first, RSS after: a bound at most what the block is known to have reached
            # (RSS now or at the start, a nested meter's peak) is the peak; else read status
            bound = _mark_bound()
            rss1 = None if bound is None else cpu_rss_bytes()
            hwm = bound if rss1 is not None and bound <= max(rss1, self.hwm_seen, self.rss0) else None
            if hwm is None:
                hwm, rss1 = _hwm_rss_bytes()
        if rss1 is None:
            rss1 = cpu_rss_bytes()
        alloc1 = malloc_in_use_bytes() if self.alloc0 is not None else None
        self.unseen = rss_blind_note(rss1 - self.rss0, None if alloc1 is None else alloc1 - self.alloc0)
        if self.exact:
            # the start itself is a point of the block: the peak above it is never negative (the
            # kernel batches RSS counter updates per thread, so reads can lag by a few hundred KiB)
            peak = max(hwm, rss1, self.hwm_seen, self.rss0) - self.rss0 if hwm is not None else NaN
        else:
            m = _maxrss_bytes()
            peak = m - self.rss0 if m > self._maxrss0 else NaN
        return rss1 - self.rss0, peak


_ACTIVE_CPU: list[CpuPeak] = []


class PeakWindows:
    """Back-to-back CPU peak windows (a monitored loop's steps, or several short ones together).
    ``w.peak()`` closes a window: the highest RSS since the previous call (exact with VmHWM on
    Linux, which is then reset if memory was freed since that peak; the peak so far is handed to
    enclosing `CpuPeak` meters first), NaN where it cannot be known. The reset walks the
    process's page tables (~0.1 ms for a 500 MB process): callers close windows sparingly."""

    def __init__(self):
        self.exact = _HAS_PROC and _vm_hwm_bytes() is not None
        self.peak()

    def peak(self) -> float:
        rss = cpu_rss_bytes()
        if not self.exact:
            return NaN
        hwm = _vm_hwm_bytes() or 0
        if hwm > rss:
            for outer in _ACTIVE_CPU:
                outer.hwm_seen = max(outer.hwm_seen, hwm)
            self.exact = _reset_hwm()
        return float(max(hwm, rss))


# --- torch / CUDA --------------------------------------------------------------------------------


class CudaMeter:
    """torch allocator figures for the current device over a block.

    If CUDA is first initialized inside the block, the start is 0 allocated bytes, which is exact:
    torch had allocated nothing before it existed. Meters nest like CpuPeak: the peak so far is
    handed to the outer meters before an inner one resets torch's peak counter.
    """

    def __init__(self, index: int | None = None):
        self.wanted = index  # a fixed CUDA index (a Lab on cuda:1), else the current device

    def start(self) -> None:
        current = cuda_device_index()
        self.index = self.wanted if self.wanted is not None and current is not None else current
        self.alloc0 = 0
        self.max_seen = 0
        self.stats0 = {"gpu_alloc_retries": 0, "gpu_ooms": 0}  # CUDA first used in the block: 0 is exact
        if self.index is not None:
            torch = torch_if_loaded()
            self.alloc0 = torch.cuda.memory_allocated(self.index)
            high = torch.cuda.max_memory_allocated(self.index)
            for outer in _ACTIVE_CUDA:
                if outer.index == self.index:
                    outer.max_seen = max(outer.max_seen, high)
            torch.cuda.reset_peak_memory_stats(self.index)
            self.stats0 = _retries_ooms(torch, self.index)
        _ACTIVE_CUDA.append(self)

    def stop(self) -> dict:
        if self in _ACTIVE_CUDA:
            _ACTIVE_CUDA.remove(self)
        index = self.index if self.index is not None else cuda_device_index()
        if index is None:
            return {}
        torch = torch_if_loaded()
        high = max(torch.cuda.max_memory_allocated(index), self.max_seen)
        return {
            "index": index,
            "gpu_alloc_delta_bytes": torch.cuda.memory_allocated(index) - self.alloc0,
            "gpu_peak_delta_bytes": high - self.alloc0,
            "gpu_reserved_bytes": torch.cuda.memory_reserved(index),
            # the allocator's cudaMalloc retries (it freed its cache to fit) and OOMs in the block
            **{k: v - self.stats0[k] for k, v in _retries_ooms(torch, index).items()},
        }


def _retries_ooms(torch, index) -> dict:
    s = torch.cuda.memory_stats(index)
    return {"gpu_alloc_retries": s.get("num_alloc_retries", 0), "gpu_ooms": s.get("num_ooms", 0)}


_ACTIVE_CUDA: list[CudaMeter] = []
