"""Calibrated peaks on CPU, and the GPU code paths: mocked here, real under the `gpu` marker."""
import json
import math
import threading
import types

import pytest
import torch

import tunekit
from tunekit.measure import mamf_cache, nvml, peaks


def _frozen_clock(monkeypatch):
    """The sweep's clock stopped at 0 s (its budget never reached but as its arithmetic says)."""
    from tunekit.measure import trials

    clock = types.SimpleNamespace(perf_counter=lambda: 0.0, time=lambda: 1.0)
    monkeypatch.setattr(peaks, "time", clock)
    monkeypatch.setattr(trials, "time", clock)


def test_a_sweep_takes_rounds_over_the_sizes_and_each_size_keeps_its_fastest(monkeypatch, calibrations):
    # a fake clock: each timed matmul takes the next scripted seconds, in the order the sweep asks
    _frozen_clock(monkeypatch)
    seconds = iter([0.004, 0.002,            # the layout: A @ B 4 ms, A @ B.T 2 ms -> "nt"
                    0.002, 0.010,            # each size's first try: 64, 128
                    0.003, 0.008,            # round 1
                    0.001, 0.004,            # round 2: (3-1)/3 and (8-4)/8 faster, mean 58% >= 1%: on
                    0.001, 0.005])           # round 3: none faster (0%), 2 rounds done: stop
    monkeypatch.setattr(peaks, "time_repeats", lambda fn, dev, warmup, repeats: [next(seconds)])
    cal = peaks.calibrate("fp32", "cpu", sizes=[64, 128], repeats=2)
    assert next(seconds, None) is None and cal.layout == "nt"
    # 64: min(0.002, 0.003, 0.001, 0.001) = 1 ms, 2 x 64^3 / 1e-3 / 1e12 = 5.24288e-4 TFLOPS;
    # 128: min(0.010, 0.008, 0.004, 0.005) = 4 ms, 2 x 128^3 / 4e-3 / 1e12 = 1.048576e-3
    assert cal.sweep == [(64, 64, 64, pytest.approx(5.24288e-4)), (128, 128, 128, pytest.approx(1.048576e-3))]
    assert (cal.best_shape, cal.tflops) == ((128, 128, 128), pytest.approx(1.048576e-3))


def test_a_sweep_stops_growing_the_matmul_when_its_rounds_would_blow_the_budget(monkeypatch, calibrations):
    # 64's first try 1 ms: 2 x 64^3 / 1e-3 = 5.24e8 FLOP/s. With 128 the least rounds would cost
    # repeats x (64's 1 ms + 128's 8 ms) = 3 x 9 ms = 27 ms (plus the 0 s the sweep took) > a 20 ms budget:
    # 128 is never made, 64 alone is swept (3 rounds, none faster after the first: stop at least)
    _frozen_clock(monkeypatch)
    monkeypatch.setattr(peaks, "CALIBRATION_BUDGET_S", 0.02)
    monkeypatch.setattr(peaks, "default_sizes", lambda kind: [64, 128])
    seconds = iter([0.001] * 6)   # 2 layouts, 64's first try, 3 rounds
    monkeypatch.setattr(peaks, "time_repeats", lambda fn, dev, warmup, repeats: [next(seconds)])
    cal = peaks.calibrate("fp32", "cpu", repeats=3)
    assert next(seconds, None) is None and [row[0] for row in cal.sweep] == [64]


def test_calibrate_cpu_measures_and_caches(monkeypatch, tmp_path, calibrations):
    # the sweeps' conditions are injected (quiet): on a loaded machine a real meter calls them busy
    # and the next use measures again (test_a_busy_calibration_is_measured_again_once_per_process)
    cal = peaks.calibrate("fp32", "cpu", sizes=[128, 256], repeats=2)
    assert cal.tflops > 0 and len(cal.sweep) == 2  # one row per size: its fastest try
    assert cal.best_shape in [(128, 128, 128), (256, 256, 256)]
    assert not (tmp_path / "mamf.json").exists()  # custom sweeps are not cached
    monkeypatch.setattr(peaks, "default_sizes", lambda kind: [128, 192])
    cal = peaks.calibrate("fp32", "cpu", repeats=2)
    assert cal.conditions.verdict == "quiet" and calibrations.sweeps == 2
    assert (tmp_path / "mamf.json").exists()
    back = peaks.cached_calibration("cpu", "fp32")
    assert (back.tflops, back.best_shape, back.conditions.reason) == (cal.tflops, cal.best_shape, "injected quiet")
    peak = peaks.resolve_peak("cpu", "fp32")
    assert (peak.kind, peak.tflops) == ("calibrated", cal.tflops) and calibrations.sweeps == 2


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


@pytest.mark.parametrize("changes,why", [
    ({"taken_at": 0.0}, "older than 30 days"),
    ({"conditions": {"verdict": "busy", "reason": "tasks waited for a CPU 97% of the time"}},
     "it was taken on a busy machine (tasks waited for a CPU 97% of the time)"),
    # a cache written before conditions were measured: its load-average reading decides
    ({"conditions": None, "busy": 1.5}, "it was taken under load (1.5 other tasks per CPU)")])
def test_an_untrustworthy_calibration_is_measured_again(calibrations, changes, why):
    calibrations.cache(**changes)
    peak = peaks.resolve_peak("cpu", "fp32")
    assert f"re-measured: {why}" in peak.source and calibrations.sweeps == 1
    fresh = peaks.cached_calibration("cpu", "fp32")     # the cache now holds the new measurement
    assert fresh.taken_at > 1e9 and fresh.tflops != 0.5 and fresh.conditions.verdict == "quiet"


def test_a_trustworthy_calibration_is_used_as_it_is(calibrations):
    calibrations.cache(tflops=1e9)
    peak = peaks.resolve_peak("cpu", "fp32")
    assert peak.tflops == 1e9 and "re-measured" not in peak.source and calibrations.sweeps == 0


def test_an_older_cache_file_without_conditions_still_loads(calibrations):
    calibrations.cache(busy=0.2, conditions=..., raised=...)  # ...: the field is left out of the entry
    cal = peaks.cached_calibration("cpu", "fp32")
    assert (cal.tflops, cal.busy, cal.conditions, cal.verdict) == (0.5, 0.2, None, "unknown")
    assert peaks.resolve_peak("cpu", "fp32").tflops == 0.5 and calibrations.sweeps == 0  # 0.2 < BUSY_LIMIT


def test_a_busy_calibration_is_measured_again_once_per_process(calibrations):
    calibrations.verdicts += ["busy", "busy"]  # the first sweep and the re-measure: the machine stays busy
    assert peaks.calibrate("fp32", "cpu").conditions.busy
    assert peaks.resolve_peak("cpu", "fp32").source.endswith("so possibly too low") and calibrations.sweeps == 1
    peaks._remeasured.clear()   # a later process finds the busy calibration in the cache
    peaks._resolved.clear()
    peak = peaks.resolve_peak("cpu", "fp32")
    assert "re-measured: it was taken on a busy machine (injected busy)" in peak.source
    assert peak.source.endswith("taken on a busy machine, so possibly too low") and calibrations.sweeps == 2
    peaks._resolved.clear()
    assert peaks.resolve_peak("cpu", "fp32").tflops == peak.tflops and calibrations.sweeps == 2  # no third


def test_a_busy_sweep_never_replaces_a_faster_calibration(calibrations):
    calibrations.cache(tflops=1e9)
    calibrations.verdicts.append("busy")
    cal = peaks.calibrate("fp32", "cpu", force=True)
    assert cal.conditions.busy and cal.tflops < 1e9      # measured and returned ...
    assert peaks.cached_calibration("cpu", "fp32").tflops == 1e9  # ... but the cache keeps the faster one


def test_of_two_busy_sweeps_the_faster_is_the_peak(calibrations):
    # load only ever slows a sweep: re-measured on a machine still busy, the faster one stays
    calibrations.cache(tflops=1e9, conditions={"verdict": "busy", "reason": "injected busy"})
    calibrations.verdicts.append("busy")
    peak = peaks.resolve_peak("cpu", "fp32")
    assert calibrations.sweeps == 1 and peak.tflops == 1e9
    assert "re-measured: it was taken on a busy machine (injected busy)" in peak.source


# --- the calibration cache never fails a measurement (review regressions) -----------------------


def test_unwritable_calibration_cache_does_not_fail_the_block(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TUNEKIT_CACHE", str(blocker / "sub"))   # mkdir under a file: NotADirectoryError
    monkeypatch.setattr(peaks, "default_sizes", lambda kind: [32])
    model, x = torch.nn.Linear(128, 128, bias=False), torch.randn(8, 128)
    with pytest.warns(UserWarning, match="could not cache the calibration .* set TUNEKIT_CACHE"):
        for _ in range(2):  # the second (cached) run resolves the peak
            with tunekit.profile(name="peak", inputs=(x,)) as rec:
                model(x)
    assert tunekit.last() is rec and rec.flops_source == "cached"


@pytest.mark.parametrize("content", ["null", "[]", "bad-entry"])
def test_corrupt_calibration_cache_is_ignored(monkeypatch, tmp_path, content):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    if content == "bad-entry":
        content = json.dumps({peaks._cache_key(peaks.device_name("cpu"), "fp32"): {"tflops": 1.0}})
    (tmp_path / "mamf.json").write_text(content)
    with pytest.warns(UserWarning, match="ignored the calibration cache .* measured again"):
        assert peaks.cached_calibration("cpu", "fp32") is None


def test_concurrent_cache_writers_do_not_fail(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    errors = []

    def writer(i):
        for k in range(300):
            try:
                mamf_cache.save({f"{i}-{k}": {"pad": "x" * 20000}})
            except OSError as e:
                errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_gpu_sweeps_operands_live_for_one_try_a_cpus_for_the_whole_sweep(monkeypatch):
    import weakref

    seen = []   # a weak reference to each matmul's first operand, as torch.mm is called
    mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: (seen.append(weakref.ref(a)), mm(a, b))[1])
    dev = torch.device("cpu")
    for keep, alive in ((True, True), (False, False)):
        seen.clear()
        trial, first_s = peaks._matmul(64, "nt", dev, "fp32", keep=keep)
        assert first_s > 0 and len(seen) == 2          # the first try: one untimed matmul, one timed
        trial.run()
        # kept (CPU): the same operands every try, alive between them; not kept (GPU): each try's
        # own, freed when it returns (4 sizes of fp32 at 2048..8192 held ~960 MiB at once before:
        # 2 x 4 B x (2048^2 + 4096^2 + 6144^2 + 8192^2) = 1,006,632,960 B)
        assert len(seen) == 3 and (seen[0]() is not None) == alive and (seen[2]() is not None) == alive
        assert not alive or seen[0]() is seen[2]()    # kept: the very same tensor each try
    assert peaks.keeps_operands(torch.device("cpu")) and not peaks.keeps_operands(torch.device("cuda", 0))
