"""Measurement: devices and clocks, memory meters, NVML, FLOP counting, peaks, timing, OOM
handling, input fingerprints and the Probe that puts them together. Returns records; never prints.
"""
