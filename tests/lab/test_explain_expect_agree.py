"""lab.explain and lab.expect say the same device-model figure for a run's step, in the same words,
grad_accum included (issue 39: explain read "1.0 ms expected" beside lab.expect's "234 ms
expected", neither saying which figure it was). Made-up plans; no real timing is judged."""
from types import SimpleNamespace

import pytest

from tunekit.core.breakdown import Breakdown
from tunekit.core.expected import Expected
from tunekit.lab import expect as ex

MiB = 2**20
# one micro-batch and one update: mm 10 ms, add 2 ms, the optimizer 1 ms = 13 ms
ROWS = [("mm", "matmul", 10, 0.010, "compute", ""), ("add", "memory-bound", 20, 0.002, "memory", ""),
        ("optimizer step", "optimizer", 5, 0.001, "memory", "")]


def test_explain_and_expect_set_out_the_same_device_model_figure_for_a_grad_accum_step(lab, monkeypatch):
    from tunekit.lab.explain import explained

    plan = SimpleNamespace(expected=Expected(0.013, 32 / 0.013, 0.5, rows=list(ROWS)), total_bytes=100 * MiB,
                           notes=[])
    monkeypatch.setattr(lab, "plan", lambda device, setting=None, verbose=True: plan)
    trace = Breakdown("cpu", 0.2, {}, [
        {"op": "aten::mm", "category": "matmul/linear", "self_s": 0.15, "calls": 40},
        {"op": "aten::add", "category": "activation/elementwise", "self_s": 0.04, "calls": 80},
        {"op": "Optimizer.step#AdamW.step", "category": "optimizer", "self_s": 0.01, "calls": 1}], untraced_s=0.0)
    run = SimpleNamespace(run_id=5, status="ok", parallel=None, device="cpu", toggles=lab.resolve(grad_accum=4),
                          label="run 5", trace=trace, step_s=0.2, step_times=[0.2], conditions=None,
                          peak_mem_bytes=100 * MiB, n_params=0, tokens_per_step=0)
    monkeypatch.setattr(ex, "base_run", lambda lab, device, base: run)
    e = explained(lab, run, "run #5")
    # 4 micro-batches: (10 + 2) x 4 = 48 ms, the update once: 1 ms; 49 ms (not one micro-batch's 13)
    assert e.expected_s == pytest.approx(0.049)
    # 49 / 200 ms = 24.5%: "24%"
    assert e.head == "200.0 ms per step, 24% of the expected speed (49.0 ms expected by the device model, uncalibrated)"
    x = lab.expect(grad_accum=4)
    assert x.plan_step_s == pytest.approx(0.049)
    # calibrated by the run itself: its own step; the device model's figure beside it, explain's words
    assert x.line.startswith("expected 200.0 ms/step calibrated by run #5 (+0% vs run #5; 49.0 ms by the device "
                             "model, uncalibrated)")
