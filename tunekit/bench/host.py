"""Host-side microbenchmarks: DataLoader workers, pinned memory x non_blocking, Python's gc in
a training loop, and the NUMA affinity helper."""
from __future__ import annotations

import gc
import glob
import os
import time
import warnings

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from tunekit.bench.frame import frame
from tunekit.measure.device import default_device, synchronize
from tunekit.measure.timing import stats, time_repeats


class SlowDataset(Dataset):
    """Items that take `transform_s` each to "transform" (a sleep: I/O-like, so workers overlap
    even on few cores). Module-level so DataLoader workers can pickle it."""

    def __init__(self, n_items: int = 32, transform_s: float = 0.005, item_shape=(64,)):
        self.n_items, self.transform_s, self.item_shape = n_items, transform_s, tuple(item_shape)

    def __len__(self):
        return self.n_items

    def __getitem__(self, i):
        time.sleep(self.transform_s)
        return torch.full(self.item_shape, float(i))


def _epoch_s(loader) -> float:
    t0 = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - t0


def _stop_workers(loader) -> None:
    """Shut persistent workers down now, also after an error (whose traceback would otherwise
    keep the loader, and its worker processes, alive)."""
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    loader._iterator = None


def dataloader_workers(num_workers=(0, 1, 2, 3, 4), n_items: int = 32, batch_size: int = 4,
                       transform_s: float = 0.01, warmup: int = 1, repeats: int = 3):
    """Seconds per pass over a loader with a slow transform, for each `num_workers` (median, min,
    max, and ``times``: every timed pass, what `tunekit.verdict` compares).

    Workers persist across passes and the warm-up pass starts them, so the timed passes show
    the steady state of a long training run. The run of stas00/ml-engineering training/performance/README.md
    (DataLoader: 5.39, 3.90, 1.33, 0.84, 0.88 s
    for 0..4 workers) shows the gain flattening once the workers outpace the consumer; a
    sleep-like transform overlaps even on few cores.

    Example: ``bench.dataloader_workers(num_workers=(0, 2, 4))``.
    """
    ds = SlowDataset(n_items, transform_s)
    rows, notes = [], [f"{n_items} items x {transform_s * 1e3:g} ms transform, batch {batch_size}"]
    for w in num_workers:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = DataLoader(ds, batch_size=batch_size, num_workers=w, persistent_workers=w > 0)
            try:
                times = [_epoch_s(loader) for _ in range(warmup + repeats)][warmup:]
            finally:
                _stop_workers(loader)
        if any("worker" in str(c.message) for c in caught) and w > (os.cpu_count() or 1):
            notes.append(f"num_workers={w} exceeds the {os.cpu_count()} CPUs (torch warned)")
        rows.append({"num_workers": w, **stats(times), "times": times})  # every pass: for tunekit.verdict
    base = rows[0]["median_s"]
    for r in rows:
        r["speedup_vs_first"] = base / r["median_s"]
    return frame(rows, "dataloader_workers", "cpu", notes)


def pin_memory_non_blocking(device=None, n_batches: int = 16, batch_shape=(64, 1024),
                            warmup: int = 1, repeats: int = 3):
    """Seconds to feed `n_batches` host batches to the GPU, for pin_memory x non_blocking, with
    a small matmul per batch that a non-blocking copy can overlap. Needs CUDA: elsewhere the
    four rows are NaN and a note says why (pinned memory is a CUDA host allocation).

    Example: ``bench.pin_memory_non_blocking(n_batches=32)``."""
    dev = default_device(device)
    combos = [(p, nb) for p in (True, False) for nb in (True, False)]
    if dev.type != "cuda":
        rows = [{"pin_memory": p, "non_blocking": nb, **stats([])} for p, nb in combos]
        return frame(rows, "pin_memory", dev,
                     ["needs a CUDA device: pinned host memory and async copies are CUDA features"])
    data = TensorDataset(torch.randn(n_batches, *batch_shape))
    w = torch.randn(batch_shape[-1], batch_shape[-1], device=dev)
    rows = []
    for pin, nb in combos:
        loader = DataLoader(data, batch_size=None, pin_memory=pin, num_workers=0)

        def epoch():
            for (x,) in loader:
                y = x.to(dev, non_blocking=nb) @ w
            synchronize(dev)
            return y

        times = time_repeats(epoch, dev, warmup, repeats)
        rows.append({"pin_memory": pin, "non_blocking": nb, **stats(times)})
    return frame(rows, "pin_memory", dev)


def _make_garbage(n: int):
    # reference cycles: only the cyclic collector can free them, so they drive gc generations
    for _ in range(n):
        a, b = {}, {}
        a["b"], b["a"] = b, a


def gc_in_training_loop(steps: int = 30, garbage_per_step: int = 2000, width: int = 128,
                        collect_every: int = 10, device=None, warmup: int = 3):
    """Per-step time of a tiny training loop that also makes cyclic garbage, with Python's gc
    automatic vs disabled (plus a manual gc.collect() every `collect_every` steps).

    Automatic collections land on arbitrary steps: across ranks that makes stragglers, seen as
    a higher max than median. The gc state is restored afterwards.

    Example: ``bench.gc_in_training_loop(steps=50)``.
    """
    dev = default_device(device)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),
                                torch.nn.Linear(width, width)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, width, device=dev)
    was_enabled = gc.isenabled()
    rows = []
    try:
        for variant in ("gc automatic", f"gc disabled, collect every {collect_every}"):
            auto = variant == "gc automatic"
            gc.enable() if auto else gc.disable()
            gc.collect()
            times = []
            for i in range(warmup + steps):
                synchronize(dev)
                t0 = time.perf_counter()
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                _make_garbage(garbage_per_step)
                if not auto and (i + 1) % collect_every == 0:
                    gc.collect()
                synchronize(dev)
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
            st = stats(times)
            rows.append({"variant": variant, **st, "total_s": sum(times),
                         "max_over_median": st["max_s"] / st["median_s"]})
    finally:
        gc.enable() if was_enabled else gc.disable()
    return frame(rows, "gc", dev, [f"{garbage_per_step} reference cycles per step"])


# --- NUMA affinity ------------------------------------------------------------------------------

_numa_notices: set = set()


NUMA_NOTE = {"last": None}  # why the last set_numa_affinity() bound nothing (a neutral note)


def _expected(msg: str) -> None:
    """A machine without the hardware (no GPU, no NVML, one NUMA node): a note, not a warning."""
    NUMA_NOTE["last"] = msg


def _notice(msg: str) -> None:
    if msg not in _numa_notices:   # one notice per distinct reason, not one per call
        _numa_notices.add(msg)
        warnings.warn(msg, stacklevel=3)


def numa_node_count() -> int:
    """NUMA nodes the kernel reports (Linux sysfs); 0 when unknown."""
    return len(glob.glob("/sys/devices/system/node/node[0-9]*"))


def cpus_from_mask(words) -> list[int]:
    """CPU ids from NVML's affinity bitmask (a list of 64-bit words, word 0 = CPUs 0..63)."""
    return [64 * i + bit for i, w in enumerate(words) for bit in range(64) if (int(w) >> bit) & 1]


def set_numa_affinity(gpu_index: int = 0, verbose: bool = False) -> list[int] | None:
    """Bind this process to the CPU cores NVML says are local to torch's cuda:`gpu_index`
    (mapped through CUDA_VISIBLE_DEVICES). Call it before building DataLoaders so the workers
    inherit the binding. Without NVML, a GPU, or more than one NUMA node it does nothing but
    give one notice, and returns None; otherwise the list of CPUs now allowed.

    Example: ``bench.set_numa_affinity(0)`` before building DataLoaders."""
    from tunekit.measure import nvml

    if not hasattr(os, "sched_setaffinity"):
        _expected("set_numa_affinity: this OS has no sched_setaffinity; nothing was changed")
        return None
    try:
        handle = nvml.handle(gpu_index)
    except Exception as e:   # no such GPU, NVML error
        handle, why = None, f"NVML lookup failed ({type(e).__name__}: {e})"
    else:
        why = nvml.unavailable_reason()
    if handle is None:
        _expected(f"set_numa_affinity: no NVML GPU ({why or 'no device'}); nothing was changed")
        return None
    if numa_node_count() <= 1:
        _expected("set_numa_affinity: one NUMA node (or none reported): nothing to bind")
        return None
    import pynvml

    n_words = -(-(os.cpu_count() or 1) // 64)
    local = cpus_from_mask(pynvml.nvmlDeviceGetCpuAffinity(handle, n_words))
    # keep within what this process may use (cgroups, cpusets, an earlier binding)
    cpus = sorted(set(local) & os.sched_getaffinity(0))
    if not cpus:
        _notice(f"set_numa_affinity: none of the {len(local)} CPUs NVML lists for cuda:{gpu_index} "
                "is allowed to this process; nothing was changed")
        return None
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as e:
        _notice(f"set_numa_affinity: sched_setaffinity failed ({e}); nothing was changed")
        return None
    if verbose:
        print(f"cuda:{gpu_index} bound to {len(cpus)} CPUs: {cpus[:4]}...{cpus[-1]}")
    return cpus
