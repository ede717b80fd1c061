"""Calibrated peaks on CPU, and the GPU code paths: mocked here, real under the `gpu` marker."""
import math
import types

import pytest
import torch

import tunekit
from tunekit.measure import nvml, peaks


def test_calibrate_cpu_measures_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    cal = peaks.calibrate("fp32", "cpu", sizes=[128, 256], repeats=2)
    assert cal.tflops > 0 and len(cal.sweep) == 2 + 4  # two sizes, then 2*repeats more of the best
    assert cal.best_shape in [(128, 128, 128), (256, 256, 256)]
    assert not (tmp_path / "mamf.json").exists()  # custom sweeps are not cached
    monkeypatch.setattr(peaks, "default_sizes", lambda kind: [128, 192])
    cal = peaks.calibrate("fp32", "cpu", repeats=2)
    assert (tmp_path / "mamf.json").exists()
    assert peaks.cached_calibration("cpu", "fp32").tflops == cal.tflops
    peak = peaks.resolve_peak("cpu", "fp32")
    assert (peak.kind, peak.tflops) == ("calibrated", cal.tflops)


def test_peak_precedence_given_then_spec(monkeypatch):
    assert peaks.resolve_peak("cpu", "bf16", given=12.5) == peaks.Peak(12.5, "given: 12.5 TFLOPS", "given")
    monkeypatch.setattr(peaks, "device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    peak = peaks.resolve_peak("cuda:0", "bf16")
    assert (peak.kind, peak.tflops) == ("spec", 989.0)


def test_nvml_index_follows_cuda_visible_devices():
    assert nvml.visible_to_nvml(1, "2,3") == 3
    assert nvml.visible_to_nvml(0, "") == 0
    assert nvml.visible_to_nvml(0, "GPU-8a1b,GPU-77") == "GPU-8a1b"
    with pytest.raises(IndexError):
        nvml.visible_to_nvml(2, "0,1")


def test_gpu_memory_path_with_a_mocked_cuda(monkeypatch):
    """The CUDA branch of the probe, driven by a fake allocator (no GPU on CI)."""
    state = {"alloc": 1000, "max": 1000, "reserved": 4096}
    fake = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True, current_device=lambda: 0,
        memory_allocated=lambda i: state["alloc"], max_memory_allocated=lambda i: state["max"],
        memory_reserved=lambda i: state["reserved"],
        memory_stats=lambda i: {"num_alloc_retries": 0, "num_ooms": 0},
        reset_peak_memory_stats=lambda i: state.update(max=state["alloc"]),
        synchronize=lambda *a: state.setdefault("syncs", []).append(a),
        get_device_name=lambda i: "NVIDIA H100 80GB HBM3",
        OutOfMemoryError=torch.cuda.OutOfMemoryError)
    monkeypatch.setattr(torch, "cuda", fake)
    monkeypatch.setattr(nvml, "used_bytes", lambda index: (7.0e9, None))
    with tunekit.profile(name="gpu", flops="never") as rec:
        state.update(alloc=3000, max=9000, reserved=16384)  # the block allocates and frees
    assert rec.gpu_alloc_delta_bytes == 2000     # 3000 - 1000
    assert rec.gpu_peak_delta_bytes == 8000      # 9000 - 1000: peak above the start
    assert rec.gpu_reserved_bytes == 16384 and rec.nvml_used_bytes == 7.0e9
    assert rec.device == "cuda:0 (NVIDIA H100 80GB HBM3)"
    assert len(state["syncs"]) >= 2              # synchronized before both clock reads


@pytest.mark.gpu
def test_real_gpu_profile_matmul():
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        with tunekit.profile(name="mm", dtype="bf16") as rec:
            c = a @ a
    assert rec.flops == 2 * 4096**3 and rec.flops_source == "cached"
    assert rec.gpu_alloc_delta_bytes == 4096 * 4096 * 2   # c stays alive
    assert rec.nvml_used_bytes > rec.gpu_reserved_bytes  # the CUDA context is outside the allocator
    assert rec.peak_tflops > 0 and 0 < rec.hfu < 1
    del c


@pytest.mark.gpu
def test_real_gpu_calibration_is_close_to_spec():
    cal = peaks.calibrate("bf16", "cuda", force=True)
    spec = tunekit.peak_tflops(None, "bf16")
    if spec is not None:
        assert 0.3 * spec < cal.tflops <= spec * 1.05
    assert not math.isnan(cal.tflops)


def _cached(monkeypatch, tmp_path, **changes):
    """A cache holding one calibration of this CPU at 32x32x32, changed by `changes`."""
    import json
    import time as _time

    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(peaks, "default_sizes", lambda kind: [32])
    peaks._resolved.clear()
    peaks._rechecked.clear()
    cal = peaks.calibrate("fp32", sizes=[32])
    entry = {**cal.__dict__, "busy": 0.0, "taken_at": _time.time(), **changes}
    (tmp_path / "mamf.json").write_text(json.dumps({peaks._cache_key(cal.device, "fp32"): entry}))
    return entry


@pytest.mark.parametrize("changes,why", [({"taken_at": 0.0}, "older than 30 days"),
                                          ({"busy": 1.5}, "it was taken under load (1.5 other tasks per CPU)"),
                                          ({"tflops": 1e-9}, "a re-check reached")])
def test_an_untrustworthy_calibration_is_measured_again(monkeypatch, tmp_path, changes, why):
    _cached(monkeypatch, tmp_path, **changes)
    peak = peaks.resolve_peak("cpu", "fp32")
    assert f"re-measured: {why}" in peak.source
    fresh = peaks.cached_calibration("cpu", "fp32")     # the cache now holds the new measurement
    assert fresh.taken_at > 1e9 and fresh.tflops > 1e-6


def test_a_trustworthy_calibration_is_used_as_it_is(monkeypatch, tmp_path):
    entry = _cached(monkeypatch, tmp_path, tflops=1e9)     # no re-check can beat 1e9 TFLOPS
    peak = peaks.resolve_peak("cpu", "fp32")
    assert peak.tflops == entry["tflops"] and "re-measured" not in peak.source
