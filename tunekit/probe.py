"""Measure a block: time, CPU/GPU memory, FLOPs, TFLOPS, MFU/HFU. Measurement layer.

`Probe` is the one place that measures; the magic, `profile()` and the lab call it. It never
prints. FLOPs follow the `flops` mode:
- ``auto``: count the first run of a block, and again whenever what it reads (shapes, dtypes,
  scalar values, module settings: its *fingerprint*) changed between the end of its previous run
  and the start of this one, i.e. was changed from outside (another cell); reuse the count
  otherwise. Changes the block makes itself (a step counter, lazily set attributes) are not new
  inputs: the fingerprint is retaken after every run. A counted run is
  slowed by the counter, so it reports no TFLOPS; the re-runs do, from an uncounted clock.
- ``always``: count every run (no TFLOPS then). ``never``: no counting.
"""
from __future__ import annotations

import ast
import functools
import gc
import hashlib
import linecache
import math
import sys
import time
import types
from dataclasses import dataclass

from . import formulas, nvml
from .meters import CpuPeak, CudaMeter, cuda_device_index, device_label, synchronize, torch_if_loaded
from .records import History, ProfileRecord

NaN = math.nan
FLOPS_MODES = ("auto", "always", "never")
HISTORY = History()


@dataclass
class _CachedCount:
    fingerprint: tuple
    count: object      # flops.FlopCount
    counted_in: str    # name of the record whose run was counted


_FLOP_CACHE: dict = {}


# --- fingerprints: has what the block reads changed since its FLOPs were counted? -------------


def describe(value, depth: int = 0):
    """A cheap, hashable summary of a value: shapes for tensors, values for scalars."""
    torch = torch_if_loaded()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if torch is not None:
        if isinstance(value, torch.Tensor):
            return ("T", tuple(value.shape), str(value.dtype), str(value.device), value.requires_grad)
        if isinstance(value, torch.nn.Module):
            return ("M", type(value).__name__, _module_state(value))
    if depth >= 2:
        return type(value).__name__
    # Containers that grow as a side effect (a losses list, optimizer state) must not look like
    # new inputs: tuples are described item by item, lists by their tensors only, dicts not at all.
    if isinstance(value, tuple):
        return ("tuple", len(value)) if len(value) > 16 else tuple(describe(v, depth + 1) for v in value)
    if isinstance(value, list):
        return ("list",) + tuple(describe(v, depth + 1) for v in value[:16] if _is_tensor(v))
    if isinstance(value, dict):
        return "dict"
    if isinstance(value, types.FunctionType):
        return ("F", id(value.__code__), _function_globals(value, depth))
    if isinstance(value, (types.ModuleType, type)):
        return type(value).__name__
    d = getattr(value, "__dict__", None)
    if isinstance(d, dict):
        return (type(value).__name__,) + tuple(
            (k, describe(v, depth + 1)) for k, v in sorted(d.items()) if not k.startswith("__"))[:32]
    return type(value).__name__


def _is_tensor(v) -> bool:
    torch = torch_if_loaded()
    return torch is not None and isinstance(v, torch.Tensor)


def _module_state(module) -> tuple:
    # Parameter count plus every submodule's scalar settings (training flag, checkpointing or
    # attention switches...): flipping one of them can change the FLOPs that run.
    torch = torch_if_loaded()
    state = [sum(p.numel() for p in module.parameters())]
    for name, sub in module.named_modules():
        scalars = tuple((k, v) for k, v in sub.__dict__.items()
                        if isinstance(v, (bool, int, float, str)) and not k.startswith("_"))
        state.append((name, sub.training, scalars))
    if torch is not None and any(True for _ in module.parameters()):
        p = next(module.parameters())
        state.append((str(p.dtype), str(p.device)))
    return tuple(state)


def _function_globals(fn, depth: int) -> tuple:
    g = fn.__globals__
    names = [n for n in fn.__code__.co_names if n in g]
    cells = tuple(describe(c.cell_contents, depth + 1) for c in (fn.__closure__ or ()) if _cell_ok(c))
    return tuple((n, describe(g[n], depth + 1)) for n in names) + cells


def _cell_ok(cell) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:  # empty cell
        return False


def fingerprint(namespace: dict, names) -> tuple:
    """Summaries of `names` looked up in `namespace` (missing names are skipped)."""
    return tuple((n, describe(namespace[n])) for n in sorted(set(names))
                 if n in namespace and not isinstance(namespace[n], ProfileRecord))


def names_read(source: str) -> set:
    """Names a block reads but never assigns: its inputs.

    Names it assigns (a loop counter, `step += 1`, its own outputs) are state the block changes
    itself; they must not make every run look like new inputs.

    >>> sorted(names_read("for i in range(n): y = f(x, i)"))
    ['f', 'n', 'range', 'x']
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    loaded, stored = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (stored if isinstance(node.ctx, (ast.Store, ast.Del)) else loaded).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stored.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            stored.update((a.asname or a.name).split(".")[0] for a in node.names)
    return loaded - stored


@functools.lru_cache(maxsize=256)
def _with_body_names(filename: str, lineno: int) -> frozenset | None:
    # The source of the `with tunekit.profile(...)` block that starts at `lineno`.
    lines = linecache.getlines(filename)
    if not lines:
        return None
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)) and node.lineno <= lineno <= node.body[0].lineno:
            body = "\n".join(ast.unparse(n) for n in node.body)
            return frozenset(names_read(body))
    return None


def source_key(source: str, name: str = "") -> str:
    return hashlib.sha1(f"{name}\0{source}".encode()).hexdigest()


# --- the probe ----------------------------------------------------------------------------


class Probe:
    """Measure one block. ``p.start(); ...; rec = p.stop(exc)``; see `profile()` for the context manager."""

    def __init__(self, name: str, key: str | None = None, fingerprint=(), flops: str = "auto",
                 model_flops: float | None = None, peak: float | None = None, dtype: str | None = None,
                 history: History | None = HISTORY):
        if flops not in FLOPS_MODES:
            raise ValueError(f"flops must be one of {FLOPS_MODES}, got {flops!r}")
        if model_flops is not None and not model_flops >= 0:
            raise ValueError(f"model_flops must be a non-negative number, got {model_flops!r}")
        if peak is not None and not peak > 0:
            raise ValueError(f"peak must be a positive TFLOPS figure, got {peak!r}")
        # `fingerprint`: a tuple, or a zero-arg callable so that it can be retaken after the run
        self.name, self.key = name, key or name
        self._fp_fn = fingerprint if callable(fingerprint) else (lambda: fingerprint)
        self.mode, self.model_flops, self.peak, self.dtype = flops, model_flops, peak, dtype
        self.history = history
        self.counter = None
        self.record = ProfileRecord(name=name)

    # the clock covers exactly start() .. stop(): readings before and after are outside it
    def start(self) -> "Probe":
        rec = self.record
        rec.started_at = time.time()
        torch = torch_if_loaded()
        cached = _FLOP_CACHE.get(self.key)
        self.fp = self._fp_fn() if self.mode == "auto" else ()
        self.count_now = torch is not None and (
            self.mode == "always" or (self.mode == "auto" and (cached is None or cached.fingerprint != self.fp)))
        if self.mode != "never" and torch is None:
            rec.notes.append("torch is not imported: no FLOPs to count")
        if self.mode == "auto" and cached is not None and cached.fingerprint != self.fp:
            rec.notes.append("inputs changed since the last count: recounted")
        self.cpu = CpuPeak()
        self.cuda = CudaMeter()
        self.cpu.start()
        self.cuda.start()
        if self.count_now:
            from .flops import TunekitFlopCounter  # imports torch, which is loaded already

            self.counter = TunekitFlopCounter()
            self.counter.__enter__()
        synchronize()
        self.t0 = time.perf_counter()
        return self

    def stop(self, exc: BaseException | None = None) -> ProfileRecord:
        synchronize()
        wall = time.perf_counter() - self.t0
        counted = None
        if self.counter is not None:
            self.counter.__exit__(None, None, None)
            counted = self.counter.result()
            self.counter = None
        rec = self.record
        rec.wall_s = wall
        rss_delta, peak_delta = self.cpu.stop()
        rec.cpu_rss_delta_bytes, rec.cpu_peak_delta_bytes = float(rss_delta), float(peak_delta)
        if self.cpu.note:
            rec.notes.append(self.cpu.note)
        gpu = self.cuda.stop()
        index = gpu.pop("index", None)
        for k, v in gpu.items():
            setattr(rec, k, float(v))
        used, why = nvml.used_bytes(index)
        rec.nvml_used_bytes = NaN if used is None else used
        if index is None:
            rec.notes.append("GPU figures n/a: no CUDA device in use")
        elif why:
            rec.notes.append(why)
        rec.device = device_label(index)
        if exc is not None:
            rec.error = f"{type(exc).__name__}: {exc}"
            if _is_oom(exc):
                rec.notes.append(_explain_oom(exc, rec))
        self._fill_flops(rec, counted, exc)
        self._fill_rates(rec, index)
        if self.history is not None:
            self.history.append(rec)
        return rec

    def _fill_flops(self, rec, counted, exc) -> None:
        if counted is not None:
            rec.flops, rec.flops_source = float(counted.executed), "counted"
            rec.recompute_flops = float(counted.recompute)
            rec.model_flops = float(counted.model)
            rec.notes.extend(counted.notes)
            if exc is None:  # an interrupted run's count is partial: never reuse it
                _FLOP_CACHE[self.key] = _CachedCount(self._fp_fn(), counted, rec.name)
            else:
                rec.notes.append("the block failed: FLOPs counted up to the failure")
        elif self.mode == "auto" and self.key in _FLOP_CACHE:
            c = _FLOP_CACHE[self.key]
            rec.flops, rec.flops_source = float(c.count.executed), "cached"
            rec.recompute_flops, rec.model_flops = float(c.count.recompute), float(c.count.model)
            rec.notes.append(f"FLOPs reused from the counted run '{c.counted_in}' (same inputs)")
            if exc is None:
                c.fingerprint = self._fp_fn()  # what the next run must find unchanged
        if self.model_flops is not None:
            rec.model_flops = float(self.model_flops)
            if rec.flops_source == "none":
                rec.flops, rec.flops_source = float(self.model_flops), "given"
                rec.notes.append("no count: executed FLOPs taken as the given model FLOPs")

    def _fill_rates(self, rec, index) -> None:
        if rec.flops_source == "none" or rec.error is not None:
            return
        if rec.flops == 0:  # exact whatever the counter cost: nothing ran
            rec.tflops = 0.0
            return
        if rec.flops_source == "counted":
            rec.notes.append("FLOPs counted in this run, which the counter slows: re-run for TFLOPS/MFU")
            return
        rec.tflops = formulas.tflops(rec.flops, rec.wall_s)
        from .peaks import resolve_peak

        torch = torch_if_loaded()
        device = torch.device("cuda", index) if index is not None else "cpu"
        rec.dtype = self.dtype or ("bf16" if index is not None else "fp32")
        peak = resolve_peak(device, rec.dtype, given=self.peak)
        rec.peak_source = peak.source
        if peak.tflops is None:
            rec.notes.append(f"no peak known ({peak.source}): pass --peak or run tunekit.calibrate()")
            return
        rec.peak_tflops = peak.tflops
        rec.hfu = formulas.utilization(rec.flops, rec.wall_s, peak.tflops)
        rec.mfu = formulas.utilization(rec.model_flops, rec.wall_s, peak.tflops)


def _is_oom(exc) -> bool:
    torch = torch_if_loaded()
    if isinstance(exc, MemoryError):
        return True
    if torch is not None and isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def _explain_oom(exc, rec) -> str:
    # Free what the failed block left behind, so the next cell starts from the baseline.
    gc.collect()
    torch = torch_if_loaded()
    if torch is not None and cuda_device_index() is not None:
        torch.cuda.empty_cache()
    return ("out of memory: memory was freed (gc + empty_cache). Try a smaller micro batch with "
            "gradient accumulation, bf16, activation checkpointing or a lighter optimizer")


class profile:
    """Measure a block outside IPython; the record is filled on exit and added to `history()`.

    >>> with tunekit.profile(name="step") as rec:
    ...     loss = model(x, y)[1]; loss.backward()
    >>> rec.wall_s, rec.tflops

    The FLOP count is reused while the caller's variables keep their shapes and values; pass
    `inputs=(...)` to say explicitly what the block depends on.
    """

    def __init__(self, name: str | None = None, flops: str = "auto", model_flops: float | None = None,
                 peak: float | None = None, dtype: str | None = None, inputs=None):
        frame = sys._getframe(1)
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        if inputs is not None:
            fp = (describe(inputs),)
        else:
            names = _with_body_names(frame.f_code.co_filename, frame.f_lineno)
            if names is None:  # no source (exec'd code): all the frame's names
                names = frame.f_code.co_names + frame.f_code.co_varnames
            fp = lambda: fingerprint({**frame.f_globals, **frame.f_locals}, names)  # noqa: E731
        self.probe = Probe(name or where, key=f"profile:{name or where}", fingerprint=fp, flops=flops,
                           model_flops=model_flops, peak=peak, dtype=dtype)

    def __enter__(self) -> ProfileRecord:
        self.probe.start()
        return self.probe.record

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.probe.stop(exc)
        return False  # the exception, if any, reaches the caller unchanged


def history():
    """pandas.DataFrame of every profiled cell or block, oldest first."""
    return HISTORY.to_frame()


def last() -> ProfileRecord | None:
    """The latest record (a dataclass), or None."""
    return HISTORY.last()


def clear_history() -> None:
    HISTORY.clear()
    _FLOP_CACHE.clear()
