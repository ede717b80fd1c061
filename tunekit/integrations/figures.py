"""What a trainer's own log gets from tunekit: the ``tunekit/...`` figures of the steps since its
previous log; and at the end of training the run's summary (`finish`). Shared by the callbacks."""
from __future__ import annotations

import math

from tunekit.core.summary import Summary
from tunekit.monitor.steps import StepSummary, measured, speed_column
from tunekit.view.frontend import show


def figures(s: StepSummary, rows) -> dict:
    """The ``tunekit/...`` entries of a log over ``rows`` (the steps since the previous log), one
    statistic each: the rates and times are over the window's measured steps taken together
    (a ratio of sums: tokens/s = their tokens / their time; ``wall_s`` = their time / their number,
    the mean step; TFLOPS, MFU, HFU and ``wait_share`` likewise), the memory figures the peak
    over every step of the window. What could not be measured is left out, never logged as 0."""
    col = speed_column(rows)
    walls = [r["wall_s"] for r in rows if measured(r)]
    mean = sum(walls) / len(walls) if walls else math.nan
    out = {f"tunekit/{col}": s.per_s, "tunekit/wall_s": mean, "tunekit/tflops": s.tflops,
           "tunekit/mfu": s.mfu, "tunekit/hfu": s.hfu, "tunekit/wait_share": s.wait_share,
           "tunekit/cpu_peak_bytes": s.cpu_peak_bytes, "tunekit/gpu_peak_bytes": s.gpu_peak_bytes}
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def finish(callback) -> None:
    """At the end of training: the callback's Monitor closed, then its summary (`show_summary`). With
    the summary shown, the live view ends on the last step's line (`MonitorView.summary_follows`):
    the summary holds the summary line, which the view's last line would repeat."""
    mon = callback.monitor
    if callback.summary and mon.view is not None:
        mon.view.summary_follows = True
    mon.close()
    show_summary(callback)


def show_summary(callback) -> None:
    """At the end of training, where ``callback.summary`` asks for it: the run's record summarized as
    tunekit summarizes every record (core.summary.Summary: the steps, the median step time, tokens/s,
    TFLOPS and MFU against the peak it names, the peak memory, the machine's conditions while it ran),
    displayed in a notebook, printed elsewhere (view.frontend.show)."""
    mon = callback.monitor
    if callback.summary and mon is not None and mon.record is not None:
        show(Summary(mon.record))
