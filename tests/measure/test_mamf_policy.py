"""The MAMF cache is keyed by libgomp's wait policy on a CPU, as the stream record is (issue 39): a CPU's
matmuls on a few threads run at another speed under another policy (measure.conditions_gomp), so a
sweep taken under one is never read under another. A GPU's key holds no policy."""
import dataclasses
import json
import time

import pytest
import torch

from tunekit.measure import mamf_cache, peaks


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(peaks, "_resolved", {})
    monkeypatch.setattr(peaks, "_rechecked", {})
    monkeypatch.setattr(peaks, "_remeasured", set())
    return tmp_path / "mamf.json"


def _entry(policy):
    name = peaks.device_name("cpu")
    cal = peaks.Calibration(device=name, dtype="fp32", tflops=7.0, best_shape=(64, 64, 64),
                            sweep=[(64, 64, 64, 7.0)], seconds=0.1, torch_version=torch.__version__,
                            threads=torch.get_num_threads(), layout="nt", taken_at=time.time(), wait_policy=policy)
    key = mamf_cache.entry_key(name, "fp32", torch.__version__, torch.get_num_threads(), policy)
    return key, json.loads(json.dumps(dataclasses.asdict(cal)))   # as the file holds it (lists)


def test_the_key_holds_the_policy_where_one_is_given():
    assert mamf_cache.entry_key("EPYC", "fp32", "2.13.0", 2) == "EPYC|fp32|torch 2.13.0|2 threads"
    assert (mamf_cache.entry_key("EPYC", "fp32", "2.13.0", 2, "OMP_WAIT_POLICY=PASSIVE")
            == "EPYC|fp32|torch 2.13.0|2 threads|omp OMP_WAIT_POLICY=PASSIVE")


def test_a_cpu_calibration_of_another_policy_is_not_read(cache, monkeypatch):
    key, entry = _entry("OMP_WAIT_POLICY=PASSIVE")
    cache.write_text(json.dumps({key: entry}))
    monkeypatch.setattr(peaks, "policy", lambda: "default")
    assert peaks.cached_calibration("cpu", "fp32") is None
    monkeypatch.setattr(peaks, "policy", lambda: "OMP_WAIT_POLICY=PASSIVE")
    assert peaks.cached_calibration("cpu", "fp32").tflops == 7.0


def test_an_entry_must_sit_under_its_own_policys_key():
    key, entry = _entry("default")
    assert mamf_cache.is_calibration(key, entry)
    # recorded under default, filed under PASSIVE: not a calibration tunekit wrote
    assert not mamf_cache.is_calibration(key.replace("|omp default", "|omp OMP_WAIT_POLICY=PASSIVE"), entry)
    assert not mamf_cache.is_calibration(key, {**entry, "wait_policy": 3})
    # an entry from before the policy was recorded: under the old key or any policy's (never looked up
    # under the old one again: measured anew once); under another device's key, not
    old = {k: v for k, v in entry.items() if k != "wait_policy"}
    base = key.removesuffix("|omp default")
    assert mamf_cache.is_calibration(base, old) and mamf_cache.is_calibration(key, old)
    assert not mamf_cache.is_calibration(base.replace("|fp32|", "|bf16|"), old)


def test_calibrate_records_its_policy_and_files_it_under_it(cache, monkeypatch):
    monkeypatch.setattr(peaks, "default_sizes", lambda device_type: [64])
    monkeypatch.setattr(peaks, "policy", lambda: "GOMP_SPINCOUNT=1000")
    cal = peaks.calibrate("fp32", "cpu")
    assert cal.wait_policy == "GOMP_SPINCOUNT=1000"
    (key,) = json.loads(cache.read_text())
    assert key.endswith("|2 threads|omp GOMP_SPINCOUNT=1000".replace("2", str(torch.get_num_threads())))
    assert peaks._cache_key("NVIDIA H100 80GB HBM3", "bf16", cpu=False).endswith(" threads")   # a GPU's: no policy
