"""Low-level readings: clocks, CPU memory, torch's CUDA allocator. Measurement layer.

Nothing here prints. torch is only touched when the user's process already imported it, and
CUDA only when it is already initialized: measuring must never create a CUDA context (that alone
costs hundreds of MiB outside the allocator).
"""
from __future__ import annotations

import math
import os
import resource
import sys
import time

NaN = math.nan
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_HAS_PROC = os.path.exists("/proc/self/statm")


# --- CPU memory --------------------------------------------------------------------------------


def cpu_rss_bytes() -> int:
    """Resident set size of this process (Linux: /proc/self/statm, else psutil)."""
    if _HAS_PROC:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    import psutil

    return psutil.Process().memory_info().rss


def _vm_hwm_bytes() -> int | None:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def _reset_hwm() -> bool:
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0): an exact,
    # cheap (~40 µs) per-block peak instead of a sampling thread.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _maxrss_bytes() -> int:
    # ru_maxrss is KiB on Linux, bytes on macOS
    v = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return v if sys.platform == "darwin" else v * 1024


class CpuPeak:
    """Peak RSS between `start()` and `stop()`.

    Exact on Linux via VmHWM reset. Elsewhere the process-lifetime ru_maxrss only tells the
    peak when it grew during the block; otherwise the peak is unknown (NaN), not guessed.
    Meters nest: before an inner meter resets VmHWM, the peak so far is handed to the outer ones.
    """

    def __init__(self):
        self.exact = _HAS_PROC
        self.note = None
        self.hwm_seen = 0

    def start(self) -> int:
        if self.exact:
            hwm = _vm_hwm_bytes() or 0
            for outer in _ACTIVE_CPU:
                outer.hwm_seen = max(outer.hwm_seen, hwm)
            self.exact = _reset_hwm()
        if not self.exact:
            self.note = "CPU peak is exact only where /proc/self/clear_refs works"
        self._maxrss0 = None if self.exact else _maxrss_bytes()
        self.rss0 = cpu_rss_bytes()
        _ACTIVE_CPU.append(self)
        return self.rss0

    def stop(self) -> tuple[int, float]:
        """(rss delta, peak above the start) in bytes."""
        if self in _ACTIVE_CPU:
            _ACTIVE_CPU.remove(self)
        rss1 = cpu_rss_bytes()
        if self.exact:
            hwm = _vm_hwm_bytes()
            peak = max(hwm, rss1, self.hwm_seen) - self.rss0 if hwm is not None else NaN
        else:
            m = _maxrss_bytes()
            peak = m - self.rss0 if m > self._maxrss0 else NaN
        return rss1 - self.rss0, peak


_ACTIVE_CPU: list[CpuPeak] = []


# --- torch / CUDA --------------------------------------------------------------------------------


def torch_if_loaded():
    """The torch module if the process imported it, else None (we never import it ourselves)."""
    return sys.modules.get("torch")


def cuda_device_index():
    """The current CUDA device index if CUDA is initialized in this process, else None."""
    torch = torch_if_loaded()
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_device()


def synchronize(device=None) -> None:
    """Wait for queued device work so that a clock read covers it (no-op on CPU)."""
    torch = torch_if_loaded()
    if torch is None:
        return
    if device is None:
        if cuda_device_index() is not None:
            torch.cuda.synchronize()
        return
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


def now_s(device=None) -> float:
    """perf_counter after synchronizing the device."""
    synchronize(device)
    return time.perf_counter()


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
        if self.index is not None:
            torch = torch_if_loaded()
            self.alloc0 = torch.cuda.memory_allocated(self.index)
            high = torch.cuda.max_memory_allocated(self.index)
            for outer in _ACTIVE_CUDA:
                if outer.index == self.index:
                    outer.max_seen = max(outer.max_seen, high)
            torch.cuda.reset_peak_memory_stats(self.index)
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
        }


_ACTIVE_CUDA: list[CudaMeter] = []


def device_label(cuda_index=None) -> str:
    """'cuda:0 (NVIDIA H100 80GB HBM3)' or 'cpu (N threads)'."""
    torch = torch_if_loaded()
    if cuda_index is not None and torch is not None:
        return f"cuda:{cuda_index} ({torch.cuda.get_device_name(cuda_index)})"
    threads = torch.get_num_threads() if torch is not None else os.cpu_count()
    return f"cpu ({threads} threads)"
