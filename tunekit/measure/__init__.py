"""Measurement: devices and clocks, memory meters, NVML, FLOP counting, peaks, timing, OOM
handling, input fingerprints and the Probe that puts them together. Returns records; never prints.
"""
from tunekit.core.conditions import Conditions, conclude
from tunekit.measure.conditions import watch as watch_conditions
from tunekit.measure.peaks import resolve_peak
from tunekit.measure.timing import Verdict, median_s, time_records, time_repeats

__all__ = ["median_s", "time_repeats", "time_records", "Verdict", "conclude", "Conditions",
           "watch_conditions", "resolve_peak"]
