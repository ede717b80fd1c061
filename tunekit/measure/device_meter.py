"""The peak memory of a block on one torch device, as one absolute figure: the meter a run's timed
steps, a fit trial and every rank take (measure.meters has the readers it wraps). Measurement
layer; nothing here prints, nothing initializes CUDA.
"""
from __future__ import annotations

from tunekit.core.units import is_missing
from tunekit.measure.meters import CpuPeak, CudaMeter, cpu_rss_bytes, malloc_trim


def settled_rss_bytes() -> int:
    """This process's RSS once glibc has handed its heaps' freed pages back (``malloc_trim``, ~10 ms):
    what a settled `DeviceMeter` reads at its start, were a block to start now."""
    malloc_trim()
    return cpu_rss_bytes()


CPU_SOURCE = ("CPU process RSS peak (VmHWM), from a start with freed heap pages handed back (malloc_trim): "
              "includes Python and torch themselves")


class DeviceMeter:
    """The peak memory of a block on one torch device, as one absolute figure.

    CPU: the process RSS peak (VmHWM), its start settled first: glibc hands the freed pages of its
    heaps back (``malloc_trim(0)``, ~10 ms). Without that, RSS at the start holds whatever earlier
    blocks freed into glibc's heaps (tens of MiB after a few training runs, more after a larger
    one), the block reuses those pages unseen, and the same block measured twice reads different
    peaks (issue 42: 377 -> 471 MiB for one setting over a session). Settled, the peak is the
    process's floor plus what the block itself touched. ``start_bytes``: RSS at the start.
    CUDA: torch's allocated peak (tensors only, no context); ``start_bytes``: allocated at the
    start. Other devices: not measured (None). Nests like the meters it wraps, so an enclosing
    ``%%gpuprofile`` keeps its own peak (its per-cell meter is a bare CpuPeak: no trim there).
    ``stop()`` returns the peak in bytes, or None; ``notes`` then says what makes it less sure.
    """

    def __init__(self, device, cuda_index: int | None = None, settle: bool = True):
        kind = getattr(device, "type", str(device).split(":")[0])
        self.meter = CpuPeak() if kind == "cpu" else CudaMeter(cuda_index) if kind == "cuda" else None
        self.settle = settle and kind == "cpu"
        self.source = {"cpu": CPU_SOURCE if self.settle else
                       "CPU process RSS peak (VmHWM): includes Python and torch themselves",
                       "cuda": "torch.cuda.max_memory_allocated (tensors only; no CUDA context)"
                       }.get(kind, f"not measured on {kind}")
        self.last = None  # CUDA: what the meter read at stop (allocator retries, OOMs, ...)
        self.start_bytes = None
        self.notes: list = []

    def start(self) -> "DeviceMeter":
        self.notes = []
        if self.settle and malloc_trim() is None:
            from tunekit.core.notes import Note

            self.notes.append(Note("memory.untrimmed", "no glibc malloc_trim here: the CPU peak's start keeps "
                                   "what earlier blocks freed, so the same block may read another peak"))
        if self.meter is not None:
            self.meter.start()
            self.start_bytes = self.meter.rss0 if isinstance(self.meter, CpuPeak) else self.meter.alloc0
        return self

    def stop(self) -> float | None:
        if isinstance(self.meter, CpuPeak):
            _, above = self.meter.stop()
            if self.meter.unseen is not None:
                self.notes.append(self.meter.unseen)
            return None if is_missing(above) else self.meter.rss0 + above
        if self.meter is not None:
            g = self.last = self.meter.stop()
            return g["gpu_peak_delta_bytes"] + self.meter.alloc0 if g else None
        return None
