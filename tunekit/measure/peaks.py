"""Peak TFLOPS for MFU: the spec sheet where the device is known, else a measured MAMF.

MAMF (maximum achievable matmul FLOPS) is the best TFLOPS a short sweep of large matmuls reaches
on this device and dtype. It is what "100%" can honestly mean on a CPU or an unlisted GPU.
Calibrations are cached as JSON (``$TUNEKIT_CACHE`` or ``~/.cache/tunekit``) per device, dtype,
torch version, thread count and, on a CPU, libgomp's wait policy (measure.conditions_gomp), so the
sweep runs once.

A calibration is never trusted when it was taken on a busy machine (the sweep runs inside a
`ConditionsMeter`): a process that finds one cached measures again, once, and the faster of the
two stays (a busy sweep never replaces a faster one). A figure above its peak means the
peak is too low: `rates` re-checks a calibrated peak once per process with one matmul at its best
shape, and a faster try replaces the cached peak (load only ever slows a try).
"""
from __future__ import annotations

import functools
import platform
import time
import warnings
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tunekit.core import bounds, formulas, paths, specs
from tunekit.core.registry import BF16, DTYPES, FP8, FP32, TF32
from tunekit.core.units import is_missing
from tunekit.core.validate import choice, flag, real, whole
from tunekit.measure import mamf_cache
from tunekit.measure.conditions import ConditionsMeter
from tunekit.measure.conditions_gomp import policy
from tunekit.measure.device import default_device, existing_device, torch_dtype
from tunekit.measure.mamf_cache import Calibration, distrust, stale
from tunekit.measure.priority import NORMAL, ahead, level
from tunekit.measure.timing import time_repeats
from tunekit.measure.trials import Trial, interleaved

_warned: set = set()


@dataclass(frozen=True)
class Peak:
    tflops: float | None
    source: str            # human-readable: which table row or which calibration
    kind: str | None       # "spec" | "calibrated" | "given" | None


def cache_dir() -> Path:
    return paths.cache_dir()


def device_name(device=None) -> str:
    """Marketing name of a torch device: 'NVIDIA H100 80GB HBM3' or the CPU model string."""
    import torch

    dev = _device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return _cpu_model() or platform.processor() or "cpu"


@functools.lru_cache(maxsize=1)
def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def peak_tflops(device=None, dtype: str = BF16) -> float | None:
    """Spec-sheet dense peak TFLOPS for a device (name, torch device or None = current).

    Unknown devices give None and one notice; `calibrate()` measures a usable peak instead.

    >>> peak_tflops("NVIDIA H100 80GB HBM3", "bf16")
    989.0
    """
    try:
        name = device if isinstance(device, str) and not _is_torch_device_str(device) else device_name(device)
    except ValueError as e:
        raise ValueError(f"{e}; to read a device's spec sheet from anywhere, give its name: "
                         "peak_tflops('NVIDIA H100 80GB HBM3')") from None
    value, why = specs.spec_peak(name, dtype)
    if value is None and (name, dtype) not in _warned:
        _warned.add((name, dtype))
        warnings.warn(f"tunekit: {why}; use tunekit.calibrate(dtype={dtype!r}) for a measured peak",
                      stacklevel=2)
    return value


def _is_torch_device_str(s: str) -> bool:
    head = s.split(":")[0]
    return head in ("cpu", "cuda", "mps", "xpu", "meta")


def _cache_key(name: str, dtype: str, cpu: bool = True) -> str:
    """The cache key of ``name``'s ``dtype`` calibration in this process: a CPU's (``cpu``) holds the
    wait policy its libgomp runs under, as the stream record's key does."""
    import torch

    return mamf_cache.entry_key(name, dtype, torch.__version__, torch.get_num_threads(), policy() if cpu else None)


def _key_of(device, dtype: str) -> str:
    """`_cache_key` of a torch device (None: the default one)."""
    dev = _device(device)
    return _cache_key(device_name(dev), dtype, dev.type == "cpu")


CALIBRATION_BUDGET_S = 4.0   # a sweep stops growing the matmul beyond this (slow dtypes on CPU), and its rounds
SWEEP_ROUNDS = 4   # a sweep's rounds at most, per least one (`calibrate`'s ``repeats``): while still faster


def default_sizes(device_type: str) -> list[int]:
    # Big enough to be compute-bound, small enough to finish in about a second each way.
    return [512, 1024, 1536, 2048] if device_type == "cpu" else [2048, 4096, 6144, 8192]


def calibrate(dtype: str = FP32, device=None, sizes=None, repeats: int = 3,
              force: bool = False) -> Calibration:
    """Measure the maximum achievable matmul TFLOPS (MAMF) on `device` for `dtype`.

    Square matmuls of each size are warmed up and timed once, then in rounds over the sizes (device
    synchronized around the clock): at least `repeats` rounds, more while a round still makes them 1%
    faster on average, at most ``SWEEP_ROUNDS * repeats``, none begun past ``CALIBRATION_BUDGET_S``
    (`measure.trials.interleaved`); each size's fastest try is its figure, the best TFLOPS wins. Noise
    only ever slows a try, so the best try is the estimate, and a slow spell slows one round of every
    size rather than every try of one. ``cal.conditions`` says what else used
    the machine meanwhile; a busy sweep is not trusted (the next process to use it measures
    again, once) and never replaces a faster cached one. Read from the cache unless `force`;
    written to it unless `sizes` are custom.

    >>> tunekit.calibrate("fp32").tflops   # e.g. 0.1-0.2 on 2 laptop cores
    """
    import torch

    choice("dtype", dtype, DTYPES)
    repeats = whole("repeats", repeats)
    flag("force", force)
    if sizes is not None:
        sizes = [whole(f"sizes[{i}]", n, 1, 65536) for i, n in enumerate(sizes)]
        if not sizes:
            raise ValueError("sizes must name at least one matrix size, got []")
    dev = _device(device)
    name = device_name(dev)
    key = _cache_key(name, dtype, dev.type == "cpu")
    cache = mamf_cache.load()
    if key in cache and not force and sizes is None:
        return mamf_cache.from_entry(cache[key])

    if dtype == FP8:
        raise ValueError("fp8 calibration needs torch._scaled_mm on a GPU that supports it; pass --peak instead")
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32 if dev.type == "cuda" else None
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = dtype == TF32
    meter = ConditionsMeter(dev.index if dev.type == "cuda" else None).start()
    t_start = time.perf_counter()
    try:
        layout, sweep = _sweep(dev, dtype, sizes, repeats, t_start)
    finally:
        if prev_tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    m, k, n, top = max(sweep, key=lambda r: r[3])
    seconds = time.perf_counter() - t_start
    cal = Calibration(device=name, dtype=dtype, tflops=top, best_shape=(m, k, n), sweep=sweep,
                      seconds=seconds, torch_version=torch.__version__, threads=torch.get_num_threads(),
                      taken_at=time.time(), layout=layout, conditions=meter.stop(seconds),
                      **_cpu_conditions(dev.type == "cpu"))
    if sizes is None:
        _store(key, cal)
        _remeasured.add(key)  # this process's one measurement: a busy one is not re-done at once
    return cal


def _sweep(dev, dtype: str, sizes, repeats: int, t_start: float) -> tuple:
    """(the faster layout, [(n, n, n, TFLOPS of n's fastest try), ...]): `calibrate`'s sweep of ``sizes``
    (None: `default_sizes`, grown while the budget allows) begun at ``t_start`` (``time.perf_counter``)."""
    cpu, keep = dev.type == "cpu", keeps_operands(dev)

    def made(n, layout):
        return _matmul(n, layout, dev, dtype, keep)

    every = sizes or default_sizes(dev.type)
    # Kernels differ by memory layout: bf16 on a CPU without AMX ran A @ B at 1.3 GFLOPS and
    # A @ B.T (nn.Linear's layout) at 17 here. The maximum achievable is the faster layout's.
    layout = min(("nn", "nt"), key=lambda lay: made(every[0], lay)[1])
    trials, first = {}, {}
    for n in every:
        if trials and sizes is None:
            # a slow dtype (bf16 on a CPU without AMX runs ~100x below fp32): stop growing the matmul
            # when the next size's least rounds, with those of the sizes before, would blow the budget
            rate = max(2 * m**3 / t for m, t in first.items())
            cost = repeats * sum(2 * m**3 / rate for m in [*first, n])
            if time.perf_counter() - t_start + cost > CALIBRATION_BUDGET_S:
                break
        trials[n], first[n] = made(n, layout)
    # rounds over the sizes, not each size's tries back to back: a slow spell slows a round, not a size
    best = interleaved(trials, least=repeats, most=SWEEP_ROUNDS * repeats, shielded=cpu,
                       until=t_start + CALIBRATION_BUDGET_S)
    sweep = [(n, n, n, 2 * n**3 / min(t, first[n]) / 1e12) for n, t in best.items()]
    return layout, sweep


def keeps_operands(dev) -> bool:
    """A sweep keeps each size's operands over its rounds on a CPU (made again, fresh pages fault
    in), not on a GPU (the default sizes' fp32 operands, all alive, are ~1 GB)."""
    return dev.type == "cpu"


def _matmul(n: int, layout: str, dev, dtype: str, keep: bool) -> tuple:
    """A timed n x n matmul (a `Trial`) and its first try's seconds; its operands made once (``keep``)
    or for each try, off the clock, and freed when the try returns."""
    import torch

    def operands():
        a, b = (torch.randn(n, n, device=dev).to(torch_dtype(dtype)) for _ in range(2))
        return a, b.t() if layout == "nt" else b
    kept = operands() if keep else None

    def once(warmup: int) -> float:
        a, b = kept or operands()
        return time_repeats(lambda: torch.mm(a, b), dev, warmup=warmup, repeats=1)[0]
    with ahead() if dev.type == "cpu" else nullcontext():   # on a CPU ahead of the machine's other work
        return Trial(lambda: once(0)), once(1)


def _cpu_conditions(cpu: bool) -> dict:
    """A calibration's fields only a CPU's has: the priority its trials ran at, libgomp's wait policy."""
    return dict(priority=level(), wait_policy=policy()) if cpu else dict(priority=NORMAL, wait_policy=None)


def _store(key: str, cal: Calibration) -> None:
    """Cache ``cal``, unless it was taken on a busy machine and the cache holds a faster, fresh
    peak: load only ever slows a sweep, so a busy one never replaces a faster one."""
    cache = mamf_cache.load()  # re-read: another process may have added entries meanwhile
    old = mamf_cache.from_entry(cache[key]) if key in cache else None
    if old is not None and cal.verdict == "busy" and old.tflops > cal.tflops and not stale(old):
        return
    cache[key] = asdict(cal)
    mamf_cache.save(cache)
    _stamp_memo.clear()


def cached_calibration(device=None, dtype: str = FP32) -> Calibration | None:
    """The cached MAMF for this device and dtype, or None (never measures)."""
    c = mamf_cache.load().get(_key_of(device, dtype))
    return None if c is None else mamf_cache.from_entry(c)


def resolve_peak(device=None, dtype: str = BF16, given: float | None = None,
                 allow_calibration: bool = True) -> Peak:
    """The peak MFU is measured against: given > spec sheet > calibrated MAMF > unknown.

    Example: ``tunekit.measure.resolve_peak("cuda", "bf16").tflops``."""
    flag("allow_calibration", allow_calibration)
    if given is not None:
        return Peak(real("given", given), f"given: {given} TFLOPS", "given")
    key = (str(device), dtype, _load_cache_stamp())
    if key in _resolved:  # a per-cell hot path: one lookup per device, dtype and cache state
        return _resolved[key]
    peak = _resolve(device, dtype, allow_calibration)
    if peak.tflops is not None:
        _resolved[key] = peak
    return peak


_resolved: dict = {}


def _load_cache_stamp():
    # stat() releases the GIL (see meters._Proc): look at the file at most once a second
    now, folder = time.monotonic(), cache_dir()
    if now - _stamp_memo.get("at", -2.0) > 1.0 or _stamp_memo.get("folder") != folder:
        try:
            _stamp_memo["stamp"] = (str(folder), (folder / "mamf.json").stat().st_mtime_ns)
        except OSError:
            _stamp_memo["stamp"] = (str(folder), None)
        _stamp_memo.update(at=now, folder=folder)
    return _stamp_memo["stamp"]


_stamp_memo: dict = {}


def _resolve(device, dtype, allow_calibration) -> Peak:
    name = device_name(device)
    value, why = specs.spec_peak(name, dtype)
    if value is not None:
        return Peak(value, why, "spec")
    cal, redone, key = cached_calibration(device, dtype), "", _key_of(device, dtype)
    if cal is not None and allow_calibration and key not in _remeasured:
        why_not = distrust(cal)
        if why_not:  # once per process: a machine that stays busy must not cost a sweep per cell
            _remeasured.add(key)
            fresh = calibrate(dtype, device, force=True)
            # the cache keeps the faster of two busy sweeps (see _store); unwritable, the fresh one
            cal, redone = cached_calibration(device, dtype) or fresh, f"; re-measured: {why_not}"
    if cal is None and allow_calibration:
        cal = calibrate(dtype, device)
    if cal is not None:
        return _calibrated_peak(cal, redone)
    return Peak(None, why, None)


def _calibrated_peak(cal: Calibration, redone: str = "") -> Peak:
    shape = "x".join(map(str, cal.best_shape))
    lay = ", B transposed as nn.Linear keeps it" if cal.layout == "nt" else ""
    busy = "; taken on a busy machine, so possibly too low" if cal.verdict == "busy" else ""
    raised = f"; {cal.raised}" if cal.raised else ""
    return Peak(cal.tflops, f"calibrated MAMF on {cal.device}, {cal.dtype}, best {shape} matmul "
                            f"({cal.threads} threads{lay}){redone}{raised}{busy}", "calibrated")


_remeasured: set = set()  # cache keys measured in this process (a busy one is re-measured once per process)


_rechecked: dict = {}  # cache key -> what this process's one re-check found


def recheck_peak(device=None, dtype: str = FP32) -> tuple[Peak | None, str]:
    """Re-check the cached calibration once per process per device and dtype: one timed matmul at
    its best shape. Load only slows a try, so a try faster than the cached peak proves the peak
    too low: it replaces the cached one. Returns (the calibrated peak now, what was found)."""
    import torch

    key, cal = _key_of(device, dtype), cached_calibration(device, dtype)
    if cal is None:
        return None, "no cached calibration to re-check"
    if key in _rechecked:
        return _calibrated_peak(cal), f"re-checked once in this process already ({_rechecked[key]})"
    dev = _device(device)
    m, k, n = cal.best_shape
    a = torch.randn(m, k, device=dev).to(torch_dtype(cal.dtype))
    b = torch.randn(k, n, device=dev).to(torch_dtype(cal.dtype))
    b = b.t().contiguous().t() if cal.layout == "nt" else b
    best = min(time_repeats(lambda: torch.mm(a, b), dev, warmup=1, repeats=2))
    now, shape = 2 * m * k * n / best / 1e12, f"{m}x{k}x{n}"
    if now > cal.tflops:
        found = f"a re-check at {shape} reached {now:.3g} TFLOPS, above the calibrated {cal.tflops:.3g}"
        cal = replace(cal, tflops=now, sweep=cal.sweep + [(m, k, n, now)],
                      raised=f"raised from {cal.tflops:.3g} by a re-check on {time.strftime('%Y-%m-%d %H:%M')}")
        _store(key, cal)
    else:
        found = f"a re-check at {shape} reached {now:.3g} TFLOPS, no faster than the calibration"
    _rechecked[key] = found
    return _calibrated_peak(cal), found


def _device(device):
    """``device`` if this machine has it (else a clear error, not torch's assertion); None: the
    default device, CUDA with its current index."""
    import torch

    if device is not None:
        return existing_device(device)
    dev = default_device()
    return torch.device("cuda", torch.cuda.current_device()) if dev.type == "cuda" else dev


@dataclass(frozen=True)
class Rates:
    """TFLOPS, MFU and HFU of one timed run, the peak they are measured against, and why they
    are past it (`core.bounds.above_peak`; None when they are not)."""

    tflops: float
    mfu: float
    hfu: float
    peak: Peak
    above_peak: str | None


def rates(executed, model, seconds, peak: Peak, device=None, dtype: str = FP32, devices: int = 1,
          recheck: bool = True) -> Rates:
    """TFLOPS, MFU and HFU of ``executed``/``model`` FLOPs in ``seconds`` on ``devices`` devices
    of ``peak`` TFLOPS each: the one place MFU/HFU are computed. Executed FLOPs above a calibrated
    peak re-check it (`recheck_peak`, once per process; ``recheck=False`` where a matmul must not
    run now) and are taken against the peak after that; what is still above is flagged."""
    def against(p):
        total = None if p is None or p.tflops is None else p.tflops * devices
        return formulas.utilization(model, seconds, total), formulas.utilization(executed, seconds, total)

    mfu, hfu = against(peak)
    found = None
    peak_too_low = bounds.over(hfu) or (is_missing(hfu) and bounds.over(mfu))
    if peak_too_low and peak.kind == "calibrated":
        if recheck:
            new, found = recheck_peak(device, dtype)
            if new is not None and new.tflops > peak.tflops:
                peak = new
                mfu, hfu = against(peak)
        else:
            found = "not re-checked here (a matmul now would allocate device memory mid-notebook)"
    return Rates(formulas.tflops(executed, seconds), mfu, hfu, peak,
                 bounds.above_peak(mfu, hfu, peak.tflops, peak.source, peak.kind, found))
