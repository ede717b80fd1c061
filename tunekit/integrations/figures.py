"""What a trainer's own log gets from tunekit: the ``tunekit/...`` figures of the steps since its
previous log. Shared by the callbacks."""
from __future__ import annotations

import math

from tunekit.monitor.steps import StepSummary, speed_column


def figures(s: StepSummary, rows) -> dict:
    """The ``tunekit/...`` entries of a log over ``rows`` (the steps since the previous log);
    what could not be measured is left out, never logged as 0."""
    col = speed_column(rows)
    out = {f"tunekit/{col}": s.per_s, "tunekit/wall_s": s.median_step_s, "tunekit/tflops": s.tflops,
           "tunekit/mfu": s.mfu, "tunekit/hfu": s.hfu, "tunekit/wait_share": s.wait_share,
           "tunekit/cpu_peak_bytes": s.cpu_peak_bytes, "tunekit/gpu_peak_bytes": s.gpu_peak_bytes}
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and math.isfinite(v)}
