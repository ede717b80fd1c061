"""train.record: the figures a run's timed steps are summarized by (no timing of its own)."""
import math

import pytest

from tunekit.core.results import RunResult
from tunekit.train.record import iqr


def test_iqr_of_the_timed_steps():
    # "inclusive" quartiles of 1..5: q1 = 2, q3 = 4; 4 - 2 = 2
    assert iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == 2.0
    # of 10, 20, 30, 100 (one slow step): q1 = 10 + 0.75 * 10 = 17.5, q3 = 30 + 0.25 * 70 = 47.5; 30
    assert iqr([0.010, 0.020, 0.030, 0.100]) == pytest.approx(0.030)
    assert iqr([0.5]) == 0.0


def test_steady_step_is_the_median_where_kept():
    r = RunResult.from_dict({"label": "a", "step_s": 0.040, "step_s_median": 0.032, "step_s_iqr": 0.002})
    assert r.steady_step_s == 0.032 and r.step_s_iqr == 0.002
    old = RunResult.from_dict({"label": "b", "step_s": 0.040})   # a log line from before: the mean
    assert math.isnan(old.step_s_median) and old.steady_step_s == 0.040


def test_a_cpu_run_records_its_openmp_wait_policy_in_the_log_the_table_and_its_lines(make_lab, monkeypatch):
    from tunekit.lab.lab import Lab
    from tunekit.train import record

    # the reader is conditions_gomp.policy, the one a calibration's record and cache key use
    monkeypatch.setattr(record, "policy", lambda: "OMP_WAIT_POLICY=PASSIVE")
    lab = make_lab(peak_tflops=1.0, micro_batch=2, seq_len=16)
    r = lab.run(steps=1, warmup=0)
    assert r.wait_policy == "OMP_WAIT_POLICY=PASSIVE"
    assert lab.results(all=True)["wait_policy"].tolist() == ["OMP_WAIT_POLICY=PASSIVE"]
    back = Lab.load_results(lab.log.path, all=True)   # the run log keeps it
    assert back["wait_policy"].tolist() == ["OMP_WAIT_POLICY=PASSIVE"]
    machine = [line for line in str(r).splitlines() if line.lstrip().startswith("machine")]
    assert len(machine) == 1 and machine[0].endswith("· OpenMP wait policy OMP_WAIT_POLICY=PASSIVE")


def test_a_gpu_run_records_no_openmp_wait_policy(monkeypatch):
    import torch

    from tunekit.core.setting import Setting
    from tunekit.measure.peaks import Peak
    from tunekit.train import record

    monkeypatch.setattr(record, "policy", lambda: "default")

    class Adapter:   # no analytic shape: no model FLOPs, no rates to compute
        attention_ran = None

        def model_flops(self, seq_len, tokens, counted):
            return None, None, []

    def one(device):
        m = record.Steps([0.01], [2.0], None, "none")
        s, peak = Setting(micro_batch=1, seq_len=4), Peak(None, "none", None)
        r, _ = record.run_result(s, m, None, Adapter(), peak, torch.device(device), label="a", warmup=0,
                                 notes=[], recheck=False, params_bytes=0, grads_bytes=0, optimizer_bytes=0,
                                 model="m", n_params=0)
        return r.wait_policy

    assert one("cpu") == "default" and one("cuda") is None   # the GPU's kernels wait on no libgomp pool
    assert RunResult.from_dict({"label": "old"}).wait_policy is None   # a log line from before: not known


def test_the_page_fault_note_is_made_on_a_cpu_run_only(monkeypatch):
    import torch

    from tunekit.core.notes import kind_of
    from tunekit.core.setting import Setting
    from tunekit.measure.peaks import Peak
    from tunekit.train import record

    class Adapter:   # no analytic shape: no model FLOPs, no rates to compute
        attention_ran = None

        def model_flops(self, seq_len, tokens, counted):
            return None, None, []

    def kinds(device):
        # 1 step of 10 ms, 100,000 minor faults: at ~1 us each 0.1 s, 1000% of the step on a CPU
        m = record.Steps([0.01], [2.0], None, "none", minor_faults=100_000)
        s, peak = Setting(micro_batch=1, seq_len=4), Peak(None, "none", None)
        r, _ = record.run_result(s, m, None, Adapter(), peak, torch.device(device), label="a", warmup=0,
                                 notes=[], recheck=False, params_bytes=0, grads_bytes=0, optimizer_bytes=0,
                                 model="m", n_params=0)
        return [kind_of(n) for n in r.notes]

    assert "measure.page_faults" in kinds("cpu")
    # on a GPU the host's page faults are not the step's cost: the device's kernels are
    assert "measure.page_faults" not in kinds("cuda")
