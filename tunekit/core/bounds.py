"""No figure past its physical bound unflagged. Pure: no torch.

MFU and HFU divide by a peak, and no work runs faster than the device can: a figure above 100%
(TFLOPS above the peak) means the peak is wrong, or the FLOPs are. `above_peak` says which, in
words; every place that computes MFU/HFU keeps its answer in the record (``above_peak``) and
every view marks the figures it concerns with `FLAG`.

    >>> above_peak(1.5, 1.51, 0.085, "calibrated MAMF on this CPU", "calibrated")
    'MFU 150% / HFU 151% of 0.085 TFLOPS: the calibrated peak is too low (calibrated MAMF on this CPU);
    recalibrate on a quiet machine: tunekit.calibrate(force=True)'
"""
from __future__ import annotations

from tunekit.core.fmt import fmt_pct
from tunekit.core.units import is_missing

FLAG = "⚠"                  # marks a figure past its bound in every view
WORDS = "⚠ above the peak"  # the same, where there is room for words


def over(x) -> bool:
    """A utilization above 100% (NaN and None are not)."""
    return not is_missing(x) and x > 1.0


def above_peak(mfu, hfu, peak_tflops, peak_source: str | None = None, peak_kind: str | None = None,
               recheck: str | None = None) -> str | None:
    """Why ``mfu``/``hfu`` (fractions of ``peak_tflops``) are past their bound, or None when
    neither is above 100%. ``peak_kind``: "calibrated" | "spec" | "given" | None (unknown);
    ``recheck``: what a re-check of a calibrated peak found, in words."""
    if not (over(mfu) or over(hfu)):
        return None
    figures = " / ".join(f"{name} {fmt_pct(x, 0)}" for name, x in (("MFU", mfu), ("HFU", hfu)) if not is_missing(x))
    head = f"{figures} of {peak_tflops:.3g} TFLOPS"
    if not over(hfu) and not is_missing(hfu):
        # the FLOPs that ran fit under the peak: the model FLOPs, not the peak, are too high
        return (f"{head}: MFU is above 100% while HFU is not, so the model FLOPs exceed the FLOPs "
                "that ran (a --model-flops or formula that does not match the work)")
    where = f" ({peak_source})" if peak_source else ""
    if peak_kind == "calibrated":
        why = f"the calibrated peak is too low{where}"
        why += f"; {recheck}" if recheck else ""
        return (f"{head}: {why}; recalibrate on a quiet machine: tunekit.calibrate(force=True)")
    if peak_kind == "spec":
        return (f"{head}: above the spec-sheet peak{where}; the dtype whose peak was used does not "
                "match what ran (--dtype), or the FLOPs are over-counted")
    if peak_kind == "given":
        return f"{head}: above the given peak{where}, which is too low"
    return f"{head}: above the peak{where}; the peak is too low or the FLOPs too high"


def mark(text: str, value, flagged) -> str:
    """``text`` with `FLAG` appended when the record is ``flagged`` and ``value`` is past 100%."""
    return f"{text} {FLAG}" if flagged and over(value) else text
