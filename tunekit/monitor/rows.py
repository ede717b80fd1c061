"""What a monitored run leaves: its summary record, and the values a row takes from the user
(logged scalars, a batch's size)."""
from __future__ import annotations

import math
import numbers
import sys
import time
import weakref

import torch

from tunekit.core.records import ProfileRecord
from tunekit.core.units import is_missing
from tunekit.measure.device import device_label
from tunekit.measure.meters import rss_blind_note
from tunekit.monitor.steps import COLUMNS, CURATED, speed_column, steps_view, summary_line

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
    kept = [i for i, r in enumerate(rows)
            if not r["warmup"] and not r["counted"] and not r.get("traced") and r["error"] is None]
    good = [rows[i] for i in kept]
    if good and all(not is_missing(r["flops"]) for r in good):
        rec.flops = sum(r["flops"] for r in good)
        rec.flops_source = "cached"
    rec.model_flops = sum(r["model_flops"] for r in good) if good else NaN
    used = sorted({c for i in kept if (c := mon.flop_rates.conventions.get(i)) is not None})
    rec.mfu_convention = "; ".join(used) or None   # several: the steps' model FLOPs mix them
    rec.peak_tflops = mon.peak_tflops or NaN
    rec.peak_tflops_source = mon.flop_rates.peak_source
    rec.dtype = mon.dtype or mon.tap.dtype
    if rows:   # above the run's start (the first step's, read before it): a peak never below it
        rec.cpu_rss_delta_bytes = rows[-1]["cpu_rss_bytes"] - mon.rss0
        rec.cpu_peak_delta_bytes = peak_above(s.cpu_peak_bytes, mon.rss0)
        heap = None if mon.heap is None or mon.heap0 is None else mon.heap - mon.heap0
        unseen = rss_blind_note(rec.cpu_rss_delta_bytes, heap)
        if not is_missing(s.gpu_peak_bytes):  # a CUDA model: its allocator's figures
            rec.gpu_alloc_delta_bytes = rows[-1]["gpu_alloc_bytes"] - mon.alloc0
            rec.gpu_peak_delta_bytes = peak_above(s.gpu_peak_bytes, mon.alloc0)
            rec.gpu_reserved_bytes = rows[-1]["gpu_reserved_bytes"]
    failed = [r["error"] for r in rows if r["error"] is not None]
    rec.error = failed[-1] if failed else mon.loader_error
    rec.notes = [summary_line(s), "figures over the measured steps (not warm-up, not counted, not traced, "
                 "no error); TFLOPS/MFU from their time, data waits included"] + s.notes + mon.notes
    if rows and unseen is not None:
        rec.notes.append(unseen)
    return rec


def sink_metrics(row) -> dict:
    """What a row sends to the sinks: its figures, what was logged, and whether it was a warm-up,
    FLOP-counted or traced step (1/0: such a step's time is not a speed)."""
    metrics = {k: row[k] for k in ("wall_s", "wait_s", "tokens_per_s", "samples_per_s", "tflops", "mfu",
                                    "hfu", "cpu_peak_bytes", "gpu_peak_bytes")}
    metrics.update(warmup=float(row["warmup"]), counted=float(row["counted"]), traced=float(row["traced"]))
    metrics.update({k: v for k, v in row.items() if k not in COLUMNS})
    return metrics


def results_frame(rows, all: bool = False):
    """``Monitor.results``: a DataFrame of the rows, shown formatted (`steps.steps_view`), or every
    column plain (``all=True``). Example: ``results_frame(mon.rows).tail()``."""
    import pandas as pd

    from tunekit.core.summary import readable

    df = pd.DataFrame(rows, columns=None if rows else list(COLUMNS))
    if all or not rows:
        return df
    keep = list(CURATED[:3]) + [speed_column(rows)] + list(CURATED[3:])
    keep += [c for c in df.columns if c not in COLUMNS]
    return readable(df[keep], steps_view, "mon.results(all=True)")


def peak_above(peak: float, start: float) -> float:
    """A peak over a run above the run's start, NaN where either was not read. The start is a
    point of the run, so the peak is never below it (a lagging RSS counter can read a few KiB
    under it: 0, never negative)."""
    if is_missing(peak) or is_missing(start):
        return NaN
    return max(peak, start) - start


def number(v) -> float:
    """A logged scalar as a float: a one-element tensor read with ``.item()``, else NaN."""
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            return NaN
        v = v.detach().item()
    return float(v)


def check_scalar(name: str, v) -> None:
    """A value ``mon.log`` takes: a real number (numpy's too) or a one-element tensor; never a
    bool (True is not a measurement) nor a tensor of several values."""
    if isinstance(v, torch.Tensor):
        if v.numel() != 1 or v.dtype == torch.bool:
            raise ValueError(f"{name} must be one number: got a {v.dtype} tensor of shape {tuple(v.shape)}")
        return
    if isinstance(v, (bool, np_bool())) or not isinstance(v, numbers.Real):
        raise ValueError(f"{name} must be a number or a one-element tensor, got {type(v).__name__} {v!r}"[:160])


def np_bool():
    numpy = sys.modules.get("numpy")
    return bool if numpy is None else numpy.bool_


_MONITORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # model -> its open Monitor


def replace_monitor_of(model, mon) -> None:
    """One open Monitor per model: a new one (a notebook cell run again) closes the one before,
    which removes its hooks and records what it saw."""
    old = _MONITORS.get(model)
    if old is not None and not old.closed:
        old.notes.append("closed by a new Monitor on the same model")
        old.close()
    _MONITORS[model] = mon
