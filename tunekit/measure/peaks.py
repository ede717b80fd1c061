"""Peak TFLOPS for MFU: the spec sheet where the device is known, else a measured MAMF.

MAMF (maximum achievable matmul FLOPS) is the best TFLOPS a short sweep of large matmuls reaches
on this device and dtype. It is what "100%" can honestly mean on a CPU or an unlisted GPU.
Calibrations are cached as JSON (``$TUNEKIT_CACHE`` or ``~/.cache/tunekit``) per device, dtype,
torch version and thread count, so the sweep runs once.
"""
from __future__ import annotations

import functools
import json
import os
import platform
import stat
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core import paths, specs
from ..core.registry import DTYPES
from ..core.validate import choice, flag, real, whole
from .device import existing_device, torch_dtype
from .timing import time_repeats

_warned: set = set()


@dataclass(frozen=True)
class Peak:
    tflops: float | None
    source: str            # human-readable: which table row or which calibration
    kind: str | None       # "spec" | "calibrated" | "given" | None


@dataclass
class Calibration:
    device: str
    dtype: str
    tflops: float
    best_shape: tuple
    sweep: list            # [(m, k, n, tflops), ...]
    seconds: float
    torch_version: str
    threads: int
    busy: float            # other runnable tasks per CPU when it started (1-min load average)
    layout: str            # "nn" (A @ B) or "nt" (A @ B.T, how nn.Linear keeps its weight): the faster
    taken_at: float        # time.time(); entries written before these two fields are re-measured


def cache_dir() -> Path:
    return paths.cache_dir()


def device_name(device=None) -> str:
    """Marketing name of a torch device: 'NVIDIA H100 80GB HBM3' or the CPU model string."""
    import torch

    dev = existing_device(device) if device is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
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


def peak_tflops(device=None, dtype: str = "bf16") -> float | None:
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


def _cache_key(name: str, dtype: str) -> str:
    import torch

    return _key(name, dtype, torch.__version__, torch.get_num_threads())


def _key(name: str, dtype: str, torch_version: str, threads: int) -> str:
    return f"{name}|{dtype}|torch {torch_version}|{threads} threads"


_CAL_FIELDS = {f for f in Calibration.__dataclass_fields__}
_memo: dict = {}


def _load_cache() -> dict:
    """The calibration cache, re-read only when the file changed. A file that is not a JSON
    object (binary junk, a directory, a FIFO: never opened) or an entry that is not a calibration
    tunekit wrote is ignored, with one warning: it is re-measured, never used."""
    path = cache_dir() / "mamf.json"
    try:
        st = path.stat()
    except OSError:
        return {}
    stamp = (str(path), st.st_mtime_ns, st.st_size)
    if _memo.get("stamp") != stamp:
        data, why = {}, None
        if not stat.S_ISREG(st.st_mode):  # reading a FIFO would wait for a writer forever
            why = "it is not a regular file"
        else:
            try:
                data = json.loads(path.read_bytes())
            except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
                why = f"it cannot be read as JSON ({type(e).__name__})"
        if not isinstance(data, dict):
            data, why = {}, "it is not a JSON object"
        _memo["data"] = {k: v for k, v in data.items() if _is_calibration(k, v)}
        if why is None and len(_memo["data"]) < len(data):
            why = f"{len(data) - len(_memo['data'])} of its {len(data)} entries are not calibrations"
        if why:
            warnings.warn(f"tunekit: ignored the calibration cache {path} where {why}; those calibrations "
                          "are measured again", stacklevel=3)
        _memo["stamp"] = stamp
    return dict(_memo["data"])


def _is_calibration(key, v) -> bool:
    """An entry as calibrate() writes it: exactly Calibration's fields, each of its type and
    range, under the key of its own device, dtype, torch version and threads."""
    if not isinstance(v, dict) or set(v) != _CAL_FIELDS:
        return False

    def num(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < float("inf")

    def count(x):
        return isinstance(x, int) and not isinstance(x, bool) and x >= 1

    texts = all(isinstance(v[k], str) for k in ("device", "dtype", "torch_version", "layout"))
    return (texts and v["dtype"] in DTYPES and v["layout"] in ("nn", "nt") and count(v["threads"])
            and num(v["tflops"]) and v["tflops"] > 0 and num(v["seconds"]) and num(v["busy"])
            and num(v["taken_at"]) and isinstance(v["best_shape"], list) and len(v["best_shape"]) == 3
            and all(count(n) for n in v["best_shape"]) and isinstance(v["sweep"], list)
            and all(isinstance(r, list) and len(r) == 4 and all(num(x) for x in r) for r in v["sweep"])
            and key == _key(v["device"], v["dtype"], v["torch_version"], v["threads"]))


def _save_cache(data: dict) -> None:
    path = cache_dir() / "mamf.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a private temp file per writer, then an atomic rename: concurrent writers never
        # see half a file or each other's temp file
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".mamf-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1)
            os.replace(tmp, path)
        except OSError:
            os.unlink(tmp)  # e.g. mamf.json is a directory: leave no temp file behind
            raise
    except OSError as e:
        warnings.warn(f"tunekit: could not cache the calibration in {path.parent} ({e}); "
                      "set TUNEKIT_CACHE to a writable folder", stacklevel=3)


CALIBRATION_BUDGET_S = 4.0   # a sweep stops growing the matmul beyond this (slow dtypes on CPU)


def default_sizes(device_type: str) -> list[int]:
    # Big enough to be compute-bound, small enough to finish in about a second each way.
    return [512, 1024, 1536, 2048] if device_type == "cpu" else [2048, 4096, 6144, 8192]


def calibrate(dtype: str = "fp32", device=None, sizes=None, repeats: int = 3,
              force: bool = False) -> Calibration:
    """Measure the maximum achievable matmul TFLOPS (MAMF) on `device` for `dtype`.

    Square matmuls of each size are warmed up, then timed `repeats` times (device synchronized
    around the clock), and the best size `2 * repeats` times more; the best TFLOPS wins. Noise
    only ever slows a try, so the best try is the estimate. Cached unless `force`; recalibrate
    (`force=True`) if it ran while the machine was busy.

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
    dev = existing_device(device) if device is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
    name = device_name(dev)
    key = _cache_key(name, dtype)
    cache = _load_cache()
    if key in cache and not force and sizes is None:
        c = cache[key]
        return Calibration(**{**c, "best_shape": tuple(c["best_shape"])})

    if dtype == "fp8":
        raise ValueError("fp8 calibration needs torch._scaled_mm on a GPU that supports it; pass --peak instead")
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32 if dev.type == "cuda" else None
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    t_start, busy = time.perf_counter(), _busy()
    sweep = []

    def tries(n, warmup, repeats, layout):
        """(n, n, n, TFLOPS) of each timed n x n matmul; the operands live only in here."""
        a, b = (torch.randn(n, n, device=dev).to(torch_dtype(dtype)) for _ in range(2))
        b = b.t() if layout == "nt" else b
        times = time_repeats(lambda: torch.mm(a, b), dev, warmup=warmup, repeats=repeats)
        return [(n, n, n, 2 * n**3 / t / 1e12) for t in times]

    first = (sizes or default_sizes(dev.type))[0]
    # Kernels differ by memory layout: bf16 on a CPU without AMX ran A @ B at 1.3 GFLOPS and
    # A @ B.T (nn.Linear's layout) at 17 here. The maximum achievable is the faster layout's.
    layout = max(("nn", "nt"), key=lambda lay: max(r[3] for r in tries(first, 1, 1, lay)))
    try:
        for n in sizes or default_sizes(dev.type):
            if sweep and sizes is None:
                # a slow dtype (bf16 on a CPU without AMX runs ~100x below fp32): stop growing
                # the matmul when the next size would blow the time budget
                m, _, _, best = max(sweep, key=lambda r: r[3])
                cost = (repeats + 1) * 2 * n**3 / (best * 1e12)
                if time.perf_counter() - t_start + cost > CALIBRATION_BUDGET_S:
                    break
            # warm-up first (kernel selection, page faults, caches); the best try is the estimate
            sweep.append(max(tries(n, 1, repeats, layout), key=lambda r: r[3]))
        # Second look at the winner: a busy moment during the sweep can only make a size look
        # slower, so more tries of the best size lift the peak toward what the device can do.
        n, _, _, best = max(sweep, key=lambda r: r[3])
        left = CALIBRATION_BUDGET_S - (time.perf_counter() - t_start)
        sweep.extend(tries(n, 0, max(1, min(2 * repeats, int(left / (2 * n**3 / (best * 1e12))))), layout))
    finally:
        if prev_tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    m, k, n, top = max(sweep, key=lambda r: r[3])
    cal = Calibration(device=name, dtype=dtype, tflops=top, best_shape=(m, k, n), sweep=sweep,
                      seconds=time.perf_counter() - t_start, torch_version=torch.__version__,
                      threads=torch.get_num_threads(), busy=busy, taken_at=time.time(), layout=layout)
    if sizes is None:
        cache = _load_cache()  # re-read: another process may have added entries meanwhile
        cache[key] = asdict(cal)
        _save_cache(cache)
        _stamp_memo.clear()
    return cal


def cached_calibration(device=None, dtype: str = "fp32") -> Calibration | None:
    """The cached MAMF for this device and dtype, or None (never measures)."""
    c = _load_cache().get(_cache_key(device_name(device), dtype))
    return None if c is None else Calibration(**{**c, "best_shape": tuple(c["best_shape"])})


def resolve_peak(device=None, dtype: str = "bf16", given: float | None = None,
                 allow_calibration: bool = True) -> Peak:
    """The peak MFU is measured against: given > spec sheet > calibrated MAMF > unknown."""
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
    cal, redone = cached_calibration(device, dtype), ""
    if cal is not None and allow_calibration:
        distrust = _distrust(cal) or _recheck(cal, device)
        if distrust:
            cal, redone = calibrate(dtype, device, force=True), f"; re-measured: {distrust}"
    if cal is None and allow_calibration:
        cal = calibrate(dtype, device)
    if cal is not None:
        shape = "x".join(map(str, cal.best_shape))
        lay = ", B transposed as nn.Linear keeps it" if cal.layout == "nt" else ""
        return Peak(cal.tflops, f"calibrated MAMF on {cal.device}, {dtype}, best {shape} matmul "
                                f"({cal.threads} threads{lay}){redone}", "calibrated")
    return Peak(None, why, None)


STALE_DAYS = 30      # a calibration older than this is re-measured (drivers, BIOS, thermals change)
BUSY_LIMIT = 0.5     # other runnable tasks per CPU above which a calibration counts as taken under load


def _busy() -> float:
    """Runnable tasks per CPU besides this process, from the 1-minute load average (0 if unknown)."""
    try:
        return max(0.0, (os.getloadavg()[0] - 1) / (os.cpu_count() or 1))
    except (OSError, AttributeError):
        return 0.0


def _distrust(cal: Calibration) -> str | None:
    """Why a cached calibration should not be used as it is, or None."""
    if time.time() - cal.taken_at > STALE_DAYS * 86400:
        return f"older than {STALE_DAYS} days"
    if cal.busy > BUSY_LIMIT:
        return f"it was taken under load ({cal.busy:.1f} other tasks per CPU)"
    return None


_rechecked: dict = {}


def _recheck(cal: Calibration, device) -> str | None:
    """Once per process: one timed matmul at the calibrated best shape. Load only slows a try,
    so a try faster than the cached peak proves the peak too low (it was measured while busy)."""
    import torch

    key = (cal.device, cal.dtype)
    if key not in _rechecked:
        dev = torch.device(device) if device is not None else torch.device("cpu")
        m, k, n = cal.best_shape
        a = torch.randn(m, k, device=dev).to(torch_dtype(cal.dtype))
        b = torch.randn(k, n, device=dev).to(torch_dtype(cal.dtype))
        b = b.t().contiguous().t() if cal.layout == "nt" else b
        best = min(time_repeats(lambda: torch.mm(a, b), dev, warmup=1, repeats=2))
        now = 2 * m * k * n / best / 1e12
        _rechecked[key] = (f"a re-check reached {now:.3g} TFLOPS, above the cached {cal.tflops:.3g}"
                           if now > 1.05 * cal.tflops else None)
    return _rechecked[key]
