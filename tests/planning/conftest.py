"""Fixtures the plan's tests share: the Lab a plan is taken of, and a fixed CPU calibration."""
import pytest


@pytest.fixture
def lab(make_lab):
    """A fresh cpu-tiny Lab under its defaults (micro_batch 8, sdpa, adamw, fp32), its log in tmp_path."""
    return make_lab()


@pytest.fixture
def fixed_cpu(monkeypatch, tmp_path):
    """A calibration cache in tmp_path holding fixed CPU figures (the stream record and the fp32 and
    bf16 MAMF sweeps of this machine's key), so a CPU plan's expectation is exact and measures
    nothing: every sweep function raises. The figures are of the order a 2-core EPYC VM measured
    quiet (benchmarks/RESULTS.md, 2026-11-28: 50-75 GB/s in cache, 16-45 GB/s cold, 2.15 us per
    view, 0.76 us per module call, 76 us per checkpointed segment and 11 us per saved tensor).
    ``fixed_cpu(verdict, priority)`` rewrites the records as taken under that verdict, their trials at that
    priority (measure.priority); returns the cache folder."""
    import dataclasses
    import json
    import time

    import torch

    from tunekit.core.conditions import Conditions
    from tunekit.measure import peaks, rng, stream

    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    for memo in ("_resolved", "_rechecked"):
        monkeypatch.setattr(peaks, memo, {})
    monkeypatch.setattr(peaks, "_remeasured", set())

    def measured(*a, **k):
        raise AssertionError("a CPU figure was measured: the cached calibration should have been read")

    for fn in ("host_trials", "compute_trials"):
        monkeypatch.setattr(stream, fn, measured)
    monkeypatch.setattr(peaks, "time_repeats", measured)
    monkeypatch.setattr(rng, "bernoulli_rate", measured)
    name, version, threads = peaks.device_name("cpu"), torch.__version__, torch.get_num_threads()

    def write(verdict="quiet", priority="normal"):
        cond = Conditions(verdict, f"injected {verdict}")
        sizes = [3 * n for n in stream.SIZES]
        st = stream.Stream(
            device=name, sweep=list(zip(sizes, (0.045, 0.060, 0.065, 0.050, 0.030, 0.025))),
            cold=list(zip(sizes, (0.020, 0.030, 0.040, 0.035, 0.020, 0.016))), op_s=4e-6,
            matmuls={"fp32": [(64, 0.03), (128, 0.08), (256, 0.12), (512, 0.15), (1024, 0.17)],
                     "bf16": [(64, 0.02), (128, 0.05), (256, 0.09), (512, 0.12), (1024, 0.14)]},
            attention={"fp32": 0.02, "bf16": 0.015}, gelu={"fp32": 6e8, "bf16": 4e8}, view_s=2.15e-6,
            module_s=0.76e-6, checkpoint_s=(76e-6, 11e-6), torch_version=version, threads=threads,
            taken_at=time.time(), conditions=cond, priority=priority)
        (tmp_path / "stream.json").write_text(json.dumps(
            {stream._key(name): {**dataclasses.asdict(st), "conditions": cond.to_dict()}}))
        cals = {}
        for dtype, top in (("fp32", 0.2), ("bf16", 0.16)):
            sweep = [(n, n, n, top * f) for n, f in ((512, 0.8), (1024, 0.9), (1536, 1.0), (2048, 1.0))]
            cal = peaks.Calibration(name, dtype, top, (1536, 1536, 1536), sweep, 1.0, version, threads,
                                    layout="nt", taken_at=time.time(), conditions=cond, priority=priority)
            cals[peaks._cache_key(name, dtype)] = dataclasses.asdict(cal)
        (tmp_path / "mamf.json").write_text(json.dumps(cals))
        # dropout's random fill: 1.7e8 elements/s, a 2-core EPYC VM's bernoulli_ (5.8 ns an element)
        (tmp_path / "rng.json").write_text(json.dumps({rng._key(name): {
            "rates": {"fp32": 1.7e8, "bf16": 1.7e8}, "elements": rng.ELEMENTS, "taken_at": time.time(),
            "verdict": verdict}}))
        peaks._resolved.clear()
        return tmp_path

    write()
    return write
