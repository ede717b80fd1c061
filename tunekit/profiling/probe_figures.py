"""What a `Probe` fills in after its clock and meters have stopped: the FLOPs (counted, reused or
0) and the rates (TFLOPS, MFU, HFU) with the notes that say why none. Each function takes the
probe and its record as `Probe._stop` hands them on; nothing here reads a clock or a meter.
"""
from __future__ import annotations

import importlib
import math
import sys

from tunekit.core import formulas
from tunekit.core.notes import Note
from tunekit.core.registry import BF16, FP32
from tunekit.core.units import is_missing
from tunekit.measure.device import torch_if_loaded
from tunekit.measure.history import FLOP_COUNTS, CachedCount, remember

NaN = math.nan

_TORCH_SIDE: dict = {}  # functions of modules that import torch, bound once torch is loaded


def _torch_side(module: str, name: str):  # (an import statement per call costs µs)
    return _TORCH_SIDE.get(name) or _TORCH_SIDE.setdefault(name, getattr(importlib.import_module(module), name))


def compiled_graphs():
    """Graphs Dynamo compiled so far in this process (None: torch not loaded, or Dynamo never used)."""
    if torch_if_loaded() is None:
        return None
    return _torch_side("tunekit.measure.torch_private", "compiled_graphs")()


def counting_active() -> bool:
    """A torch FLOP counter is on the dispatch stack (checked only once its module is loaded: torch is)."""
    return "torch.utils.flop_counter" in sys.modules and _torch_side("tunekit.measure.flops", "counting_active")()


def fill_flops(probe, rec, exc, tracer, counted, tap=None) -> None:
    """The record's FLOPs: counted in this run, 0 for an inert block, or a cached count reused."""
    if counted is not None:
        rec.flops_source, rec.mfu_convention = "counted", formulas.MFU_COUNTED
        rec.flops, rec.model_flops = _flops_of(counted)
        rec.recompute_flops = float(counted.recompute)
        rec.notes.extend(counted.notes)
        # a failed run's calls are partial: its model FLOPs stay the count's
        shaped = tap.result() if tap is not None and exc is None else (None, [])
        _use_shape(rec, shaped)
        if exc is None:  # an interrupted run's count is partial: never reuse it
            remember(FLOP_COUNTS, probe.key, CachedCount(probe.fp, counted, rec.name, shaped=shaped))
        else:
            rec.notes.append("the block failed: FLOPs counted up to the failure")
    elif probe.inert and probe.mode != "never" and torch_if_loaded() is not None:
        # what a counter reports for a block that runs no op (`_flops_of` of an empty count), known
        # without one: "inert", so nothing reads the record as timed under a counter (core.slowed)
        rec.flops_source, rec.mfu_convention = "inert", formulas.MFU_COUNTED
        rec.flops = rec.model_flops = rec.recompute_flops = 0.0
    elif probe.mode == "auto" and probe.key in FLOP_COUNTS and not probe.stale:
        c = FLOP_COUNTS[probe.key]
        FLOP_COUNTS.move_to_end(probe.key)
        rec.flops_source, rec.mfu_convention = "cached", formulas.MFU_COUNTED
        rec.flops, rec.model_flops = _flops_of(c.count)
        rec.recompute_flops = float(c.count.recompute)
        rec.notes.append(f"FLOPs reused from the counted run '{c.counted_in}' (same inputs)")
        _use_shape(rec, c.shaped)
        if c.count.uncounted_ops:
            rec.notes.append(Note("flops.uncounted", "the count misses ops without a FLOP formula: "
                                  + ", ".join(c.count.uncounted_ops)))
        # a safety net for inputs the fingerprint cannot see: the time moved a lot
        busy_now = rec.conditions is not None and rec.conditions.busy
        last, c.last_wall_s = c.last_wall_s, rec.wall_s
        busy_before, c.last_busy = c.last_busy, busy_now
        if last > 0 and not 0.5 < rec.wall_s / last < 2:
            ratio = rec.wall_s / last
            # "0.0x" would say nothing: a faster run says how many times faster
            moved = f"{ratio:.1f}x slower" if ratio > 1 else f"{1 / ratio:.1f}x faster"
            if busy_now or busy_before:  # the load, not the work, can explain it: no recount advice
                which = "this run" if busy_now else "the last run"
                rec.notes.append(f"time changed since the last run on this count ({moved}), and "
                                 f"{which} was taken on a busy machine: re-run when it is quiet")
            else:
                rec.notes.append(f"time changed since the last run on this count ({moved}): "
                                 "if the work changed, use --flops always")
    if probe.model_flops is not None:
        rec.model_flops, rec.mfu_convention = float(probe.model_flops), "given (--model-flops)"
        if rec.flops_source == "none":
            rec.flops, rec.flops_source = float(probe.model_flops), "given"
            rec.notes.append("no count: executed FLOPs taken as the given model FLOPs")

def fill_rates(probe, rec, exc, tracer, *_) -> None:
    """TFLOPS, MFU and HFU of the record, or a note (kind rates.none) why none."""
    if rec.flops_source == "none" or rec.error is not None or is_missing(rec.flops):
        return
    if tracer is not None:
        rec.notes.append(Note("rates.none",
                              "timed under torch.profiler, which slows it: no TFLOPS/MFU from this run"))
        return
    if probe.under_counter:
        rec.notes.append(Note("rates.none", "timed under an outer FLOP counter, which slows it: no TFLOPS/MFU"))
        return
    # None: Dynamo never used so far (the same as none compiled); it may be first imported by
    # the block without compiling anything, which is no compile
    compiled = 0 if probe.inert else (compiled_graphs() or 0) - (probe.graphs0 or 0)
    if compiled > 0:
        rec.notes.append(Note("rates.none", f"torch.compile compiled {compiled} graph(s) "
                              "during this run, so its time includes compiling: no TFLOPS/MFU; re-run"))
        return
    if rec.flops == 0:  # exact whatever the counter cost: nothing ran
        rec.tflops = 0.0
        return
    if rec.flops_source == "counted":
        rec.notes.append(Note("rates.none",
                              "FLOPs counted in this run, which the counter slows: re-run for TFLOPS/MFU"))
        return
    rec.tflops = formulas.tflops(rec.flops, rec.wall_s)
    from tunekit.measure.peaks import rates, resolve_peak

    torch = torch_if_loaded()
    device = torch.device("cuda", probe.index) if probe.index is not None else "cpu"
    rec.dtype = probe.dtype or (BF16 if probe.index is not None else FP32)
    # Measure a missing peak (or re-check one) only on CPU: on a GPU the matmuls would
    # allocate GiBs and leave them reserved, changing what the next cells see.
    peak = resolve_peak(device, rec.dtype, given=probe.peak, allow_calibration=probe.index is None)
    rec.peak_tflops_source = peak.source
    if peak.tflops is None:
        rec.notes.append(Note("rates.none",
                              f"no peak known ({peak.source}): pass --peak or run tunekit.calibrate()"))
        return
    r = rates(rec.flops, rec.model_flops, rec.wall_s, peak, device, rec.dtype, recheck=probe.index is None)
    rec.peak_tflops, rec.peak_tflops_source = r.peak.tflops, r.peak.source
    rec.hfu, rec.mfu, rec.above_peak = r.hfu, r.mfu, r.above_peak


def _use_shape(rec, shaped) -> None:
    """Model FLOPs from the model's shape (`ModelTap.result()`) when it gave them, else the count's."""
    flops, notes = shaped
    if flops is not None:
        rec.model_flops, rec.mfu_convention = float(flops), formulas.MFU_ANALYTIC
    rec.notes.extend(notes)


def _flops_of(count) -> tuple[float, float]:
    """(executed, model) FLOPs; unknown (NaN), not 0, when only ops without a formula ran."""
    if count.executed == 0 and count.uncounted_ops:
        return NaN, NaN
    return float(count.executed), float(count.model)
