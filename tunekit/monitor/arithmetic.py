"""The arithmetic of a monitored step, apart from its I/O (as Lightning's ``Throughput``): the
caller (`monitor.Monitor`) reads the clocks, the meters and the FLOP counter and passes the
numbers in; here they become a row, its rates and its window's figures. Pure: no torch, no clock,
no device (tests/monitor/test_monitor_arithmetic.py runs it on plain numbers).

    >>> row = step_row(0, None, wall_s=0.5, step_s=0.4, wait_s=0.1, tokens=2048.0, samples=None,
    ...                executed=6e12, model_flops=5e12, flops_source="cached", gpu={}, alloc0=math.nan,
    ...                warmup=False, counted=False, traced=False, left=False, error=None)
    >>> fill_rates(row, peak_tflops=100.0)     # True would mean above the peak
    False
    >>> row["tokens_per_s"], row["tflops"], row["mfu"], row["hfu"]
    (4096.0, 12.0, 0.1, 0.12)
"""
from __future__ import annotations

import math

from tunekit.core.formulas import MFU_ANALYTIC, MFU_COUNTED, tflops, utilization
from tunekit.core.units import is_missing

NaN = math.nan
JUDGE_EVERY_S = 0.2   # the machine is judged over windows of one step, or of steps this long together


def amounts(step_tokens, step_samples, tokens, samples, read_tokens, read_samples, unknown) -> tuple:
    """(tokens, samples, given) of one step: the step's own (``mon.step(tokens=)``), else the
    Monitor's (``Monitor(tokens=)``), else what the inputs said; none when the inputs could not
    all be read (``unknown``) and nothing was given: no guess. ``given``: whether any was given."""
    given = bool(step_tokens or step_samples or tokens or samples)
    t = step_tokens or tokens or (None if given else read_tokens)
    s = step_samples or samples or (None if given else read_samples)
    if unknown and not given:
        t = s = None
    return t, s, given


def model_flops_of(given, per_token, calls, executed, counted_model) -> tuple:
    """(model FLOPs of the step, their convention, whether the shape gave more than ran).

    ``given``: ``Monitor(model_flops=)`` (wins); ``per_token``: the shape's model FLOPs per token
    of each forward call (None: unknown), ``calls`` the tokens of each; ``executed``/``counted_model``:
    the FLOP count's executed and model FLOPs (None: not counted). The shape's figure, unless a
    count says fewer FLOPs ran (frozen weights get no weight gradients): then the count's."""
    if given is not None:
        return given, "given (model_flops=)", False
    shaped_more = False
    if calls and per_token and all(f is not None for f in per_token):
        shaped = float(sum(f * n for f, n in zip(per_token, calls)))
        if executed is None or shaped <= executed:
            return shaped, MFU_ANALYTIC, False
        shaped_more = True
    if counted_model is None:
        return NaN, None, shaped_more
    return float(counted_model), MFU_COUNTED, shaped_more


def error_text(error) -> str | None:
    """An exception as ``"Type: message"`` (a string as it is; None: no error)."""
    if error is None or isinstance(error, str):
        return error
    return type(error).__name__ + (f": {error}" if str(error) else "")


def step_row(n, step, wall_s, step_s, wait_s, tokens, samples, executed, model_flops, flops_source, gpu,
             alloc0, warmup, counted, traced, left, error) -> dict:
    """One step's row (`monitor.steps.COLUMNS`); its rates NaN until `fill_rates`, its CPU memory
    and machine until its window is judged (`window_figures`). ``gpu``: a CudaMeter's reading
    (empty off CUDA), above ``alloc0``, the bytes allocated as the step started."""
    return dict(step=n if step is None else step, wall_s=wall_s, step_s=step_s, wait_s=wait_s,
                monitor_s=NaN, tokens=float(tokens) if tokens else NaN,
                samples=float(samples) if samples else NaN, tokens_per_s=NaN, samples_per_s=NaN,
                flops=executed, model_flops=model_flops, flops_source=flops_source,
                tflops=NaN, mfu=NaN, hfu=NaN,
                cpu_rss_bytes=NaN, cpu_peak_bytes=NaN,   # the window's (see window_figures)
                gpu_alloc_bytes=alloc0 + gpu.get("gpu_alloc_delta_bytes", NaN),
                gpu_peak_bytes=alloc0 + gpu.get("gpu_peak_delta_bytes", NaN),
                gpu_reserved_bytes=float(gpu.get("gpu_reserved_bytes", NaN)),
                warmup=warmup, counted=counted, traced=traced, left=left, machine=None, error=error)


def speeds_measured(row) -> bool:
    """Whether a row carries speeds: not warm-up, not counted, not traced, no error, not left."""
    return not (row["warmup"] or row["counted"] or row["traced"] or row["left"] or row["error"] is not None)


def fill_rates(row, peak_tflops: float | None) -> bool:
    """tokens/s or samples/s, TFLOPS, MFU and HFU of a measured row, from its ``wall_s``, in place.
    Returns whether MFU or HFU came out above 1 (the peak is then in doubt: the caller re-checks
    it). ``peak_tflops`` None: TFLOPS only."""
    wall = row["wall_s"]
    for amount in ("tokens", "samples"):
        if not is_missing(row[amount]):
            row[amount + "_per_s"] = row[amount] / wall
    if is_missing(row["flops"]) and is_missing(row["model_flops"]):
        return False
    if peak_tflops is None:
        row["tflops"] = row["flops"] / wall / 1e12
        return False
    row["tflops"] = tflops(row["flops"], wall)
    row["mfu"] = utilization(row["model_flops"], wall, peak_tflops)
    row["hfu"] = utilization(row["flops"], wall, peak_tflops)
    return row["mfu"] > 1 or row["hfu"] > 1


def window_due(t0: float, t1: float, last: bool = False) -> bool:
    """Whether the machine's window begun at ``t0`` closes at ``t1``: ``JUDGE_EVERY_S`` long (a
    reading costs tens of microseconds: not one per millisecond-step), or the run's last."""
    return last or t1 - t0 >= JUDGE_EVERY_S


def window_figures(rows, verdict, cpu_peak_bytes, cpu_rss_bytes) -> None:
    """Each step of a window gets the window's figures: the machine's verdict, the CPU peak and RSS."""
    for r in rows:
        r["machine"] = verdict
        r["cpu_peak_bytes"], r["cpu_rss_bytes"] = cpu_peak_bytes, cpu_rss_bytes
