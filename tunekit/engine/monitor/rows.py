"""What a monitored run leaves: its summary record, and the values a row takes from the user
(logged scalars, a batch's size). Engine layer."""
from __future__ import annotations

import math
import time

import torch

from ...core.records import ProfileRecord
from ...core.steps import summary_line
from ...measure.device import device_label

NaN = math.nan


def summary_record(mon) -> ProfileRecord:
    """The run as one record for ``tunekit.history()``: its time, FLOPs, rates and memory over
    the measured steps, the machine over the whole run, the summary line first in its notes."""
    s, rows = mon.summary, mon.rows
    rec = ProfileRecord(name=mon.name, device=device_label(mon.cuda_index))
    if rows:
        rec.started_at = time.time() - sum(r["wall_s"] for r in rows)
        rec.wall_s = sum(r["wall_s"] for r in rows)
        rec.conditions = mon._whole.stop(rec.wall_s) if mon._t_end is not None else None
    rec.tflops, rec.mfu, rec.hfu = s.tflops, s.mfu, s.hfu
    good = [r for r in rows if not r["warmup"] and not r["counted"] and r["error"] is None]
    if good and all(r["flops"] == r["flops"] for r in good):
        rec.flops = sum(r["flops"] for r in good)
        rec.flops_source = "cached"
    rec.model_flops = sum(r["model_flops"] for r in good) if good else NaN
    rec.peak_tflops = getattr(mon, "peak_tflops", None) or NaN
    rec.peak_tflops_source = getattr(mon, "peak_source", None)
    rec.dtype = mon.dtype or mon.tap.dtype
    if rows:
        rec.cpu_rss_delta_bytes = rows[-1]["cpu_rss_bytes"] - rows[0]["cpu_rss_bytes"]
        rec.cpu_peak_delta_bytes = s.cpu_peak_bytes - rows[0]["cpu_rss_bytes"]
        if s.gpu_peak_bytes == s.gpu_peak_bytes:  # a CUDA model: its allocator's figures
            rec.gpu_alloc_delta_bytes = rows[-1]["gpu_alloc_bytes"] - rows[0]["gpu_alloc_bytes"]
            rec.gpu_peak_delta_bytes = s.gpu_peak_bytes - rows[0]["gpu_alloc_bytes"]
            rec.gpu_reserved_bytes = rows[-1]["gpu_reserved_bytes"]
    failed = [r["error"] for r in rows if r["error"] is not None]
    rec.error = failed[-1] if failed else None
    rec.notes = [summary_line(s), "figures over the measured steps (not warm-up, not counted, "
                 "no error); TFLOPS/MFU from their time, data waits included"] + s.notes + mon.notes
    return rec


def number(v) -> float:
    """A logged scalar as a float: a one-element tensor read with ``.item()``, else NaN."""
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            return NaN
        v = v.detach().item()
    return float(v)


def batch_len(batch):
    """Samples of a batch given to the step: the first tensor's first dimension."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else None
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for v in values:
        if isinstance(v, torch.Tensor) and v.dim():
            return v.shape[0]
    return None
