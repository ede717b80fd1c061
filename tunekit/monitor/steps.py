"""The steps of a monitored training loop (`tunekit.Monitor`): their columns and their summary.
Pure: rows are plain dicts of numbers, no torch, no pandas at import.

A step's speed comes from its ``wall_s``: the time from the previous step's end to its own end,
so waiting for the next batch (``wait_s``) and whatever the loop does between steps count, as
they do for the run. Steps that are warm-up, FLOP-counted (the counter slows them), traced
(the profiler slows them: ``Monitor(trace=N)``) or failed carry no speed and are left out of the summary.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from tunekit.core.fmt import fmt_ms, fmt_pct, fmt_rate, fmt_tflops
from tunekit.core.notes import Note
from tunekit.core.units import is_missing

NaN = math.nan

# every column of a row, in order; the user's scalars (loss, ...) follow
COLUMNS = ("step", "wall_s", "step_s", "wait_s", "monitor_s", "tokens", "samples", "tokens_per_s",
           "samples_per_s", "flops", "model_flops", "flops_source", "tflops", "mfu", "hfu",
           "cpu_rss_bytes", "cpu_peak_bytes", "gpu_alloc_bytes", "gpu_peak_bytes", "gpu_reserved_bytes",
           "warmup", "counted", "traced", "left", "machine", "error")
# what `mon.results()` shows by default (the speed column is tokens/s or samples/s)
CURATED = ("step", "wall_s", "wait_s", "tflops", "mfu", "cpu_peak_bytes", "gpu_peak_bytes",
           "machine", "warmup", "counted", "traced", "left", "error")


def speed_column(rows) -> str:
    """``tokens_per_s`` when the steps had tokens (a model with a sequence), else ``samples_per_s``."""
    return "tokens_per_s" if any(_ok(r.get("tokens")) and r["tokens"] > 0 for r in rows) else "samples_per_s"


def measured(row) -> bool:
    """A step whose time measures the loop: not warm-up, not slowed by the FLOP counter or the
    profiler, not left half-way (a break), no error."""
    return (not row["warmup"] and not row["counted"] and not row.get("traced") and not row.get("left")
            and row["error"] is None)


def quantile(values, q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation, NaN for no values.
    ``quantile([1, 2, 3, 4], 0.9)`` = 3.7: position 0.9 x 3 = 2.7, between 3 and 4."""
    v = sorted(values)
    if not v:
        return NaN
    pos = q * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


@dataclass
class StepSummary:
    """The measured steps of a monitored run (see `measured`) in a few figures."""

    steps: int                     # every step, warm-up and counted included
    measured: int                  # steps whose time counts
    median_step_s: float = NaN     # of wall_s
    p90_step_s: float = NaN
    per_s: float = NaN             # tokens (or samples) per second over the measured steps
    unit: str = "tokens/s"
    tflops: float = NaN            # executed FLOPs / time over the measured steps
    mfu: float = NaN
    hfu: float = NaN
    wait_share: float = NaN        # share of the measured time spent waiting for the next batch
    cpu_peak_bytes: float = NaN    # over every step
    gpu_peak_bytes: float = NaN
    warmup: int = 0
    counted: int = 0
    traced: int = 0
    left: int = 0
    failed: int = 0
    notes: list = field(default_factory=list)


def summarize(rows, peak_tflops: float | None = None, uncounted: str | None = None) -> StepSummary:
    """Median and p90 step time, throughput, TFLOPS, MFU/HFU (against ``peak_tflops``) and the
    share of time waiting for data, over the measured steps; memory peaks over all steps.
    ``uncounted``: why no step has a FLOP count, where the caller chose none (``"flops='never'"``).

    Two measured steps of 0.1 and 0.3 s, 1,000 tokens each: 2,000 tokens / 0.4 s = 5,000 tokens/s
    (a ratio of sums, not a mean of ratios, so a slow step weighs as long as it took)."""
    good = [r for r in rows if measured(r)]
    col = speed_column(rows)
    amount = "tokens" if col == "tokens_per_s" else "samples"
    s = StepSummary(steps=len(rows), measured=len(good), unit=amount + "/s",
                    warmup=sum(1 for r in rows if r["warmup"]),
                    counted=sum(1 for r in rows if r["counted"] and not r["warmup"]),
                    traced=sum(1 for r in rows if r.get("traced")),
                    left=sum(1 for r in rows if r.get("left")),
                    failed=sum(1 for r in rows if r["error"] is not None))
    s.cpu_peak_bytes = _max(r["cpu_peak_bytes"] for r in rows)
    s.gpu_peak_bytes = _max(r["gpu_peak_bytes"] for r in rows)
    if not good:
        s.notes.append("no step ran" if not rows else
                       "no measured step: every step was warm-up, FLOP-counted, traced, left or failed")
        return s
    walls = [r["wall_s"] for r in good]
    total = sum(walls)
    s.median_step_s, s.p90_step_s = quantile(walls, 0.5), quantile(walls, 0.9)
    done = [r[amount] for r in good if _ok(r[amount])]
    if len(done) == len(good):
        s.per_s = sum(done) / total
    s.wait_share = sum(r["wait_s"] for r in good if _ok(r["wait_s"])) / total
    executed, model = [r["flops"] for r in good], [r["model_flops"] for r in good]
    if all(_ok(f) for f in executed):
        s.tflops = sum(executed) / total / 1e12
        s.hfu = s.tflops / peak_tflops if peak_tflops else NaN
    else:
        missing = sum(1 for f in executed if not _ok(f))
        which = (f"{uncounted}: no step counted" if uncounted else "no measured step has an executed FLOP count"
                 ) if missing == len(good) else f"{missing} of {len(good)} measured steps have no executed FLOP count"
        s.notes.append(Note("rates.none", f"TFLOPS/HFU n/a: {which}"))
    if all(_ok(f) for f in model) and peak_tflops:
        s.mfu = sum(model) / total / 1e12 / peak_tflops
    return s


def summary_line(s: StepSummary) -> str:
    """One line: ``12 steps (2 warm-up, 1 counted): 31.6 ms/step median, p90 35.0 ms, 32,407 tokens/s, ...``."""
    extra = ", ".join(f"{n} {w}" for n, w in ((s.warmup, "warm-up"), (s.counted, "counted"),
                                              (s.traced, "traced"), (s.left, "left"), (s.failed, "failed")) if n)
    head = f"{s.steps} steps" + (f" ({extra})" if extra else "")
    if not s.measured:
        return head + ": no measured step"
    parts = [f"{fmt_ms(s.median_step_s)}/step median, p90 {fmt_ms(s.p90_step_s)}"]
    if _ok(s.per_s):
        parts.append(fmt_rate(s.per_s, s.unit))
    if _ok(s.tflops):
        parts.append(fmt_tflops(s.tflops))
    if _ok(s.mfu):
        parts.append(f"MFU {fmt_pct(s.mfu)}")
    if _ok(s.wait_share):
        parts.append(f"waiting for data {fmt_pct(s.wait_share, 0)}")
    return head + ": " + ", ".join(parts)


def _ok(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _max(values) -> float:
    v = [x for x in values if _ok(x)]
    return max(v) if v else NaN


def status(row) -> str:
    """A step's one word in a table: why it has no speed, or "ok"."""
    if not is_missing(row.get("error")):
        return f"error: {row['error']}"
    for flag, word in (("counted", "FLOP count"), ("warmup", "warm-up"), ("traced", "traced"), ("left", "left")):
        if row.get(flag) is True:
            return word
    return "ok"


def steps_view(df):
    """``mon.results()`` as a person reads it: the step's time and wait in ms, its speed (tokens/s
    or samples/s), TFLOPS, MFU, memory in MiB (GPU only where there is one), the machine, one
    status word, then the logged scalars; the frame behind keeps the raw numbers."""
    from tunekit.core.summary import machine_word

    rows = df.to_dict("records")
    col = "tokens_per_s" if "tokens_per_s" in df and ("tokens" not in df or df["tokens"].notna().any()) \
        else "samples_per_s"
    unit = col.replace("_per_s", "/s")
    out = {"step": df["step"], "step (ms)": df["wall_s"] * 1e3, "wait (ms)": df["wait_s"] * 1e3}
    if col in df:
        out[unit] = df[col]
    out.update({"TFLOPS": df["tflops"], "MFU": df["mfu"], "CPU peak RSS (MiB)": df["cpu_peak_bytes"] / 2**20})
    if df["gpu_peak_bytes"].notna().any():
        out["GPU peak (MiB)"] = df["gpu_peak_bytes"] / 2**20
    out["machine"] = df["machine"].map(machine_word)
    out["status"] = [status(r) for r in rows]
    for c in df.columns:
        if c not in COLUMNS:
            out[c] = df[c]
    import pandas as pd

    return pd.DataFrame(out)
