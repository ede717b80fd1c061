"""lab.expect: the calibration's arithmetic on made-up plans and runs, its notes, its refusals, and
one real (uncalibrated, then calibrated) expectation of the cpu-tiny Lab. No real timing is judged."""
import math
from types import SimpleNamespace

import pytest

from tunekit.core.breakdown import Breakdown
from tunekit.core.expected import Expected
from tunekit.core.notes import of_kind
from tunekit.core.setting import Setting
from tunekit.core.toggles import ToggleError, Toggles
from tunekit.lab import expect as ex

MiB = 2**20
HOST = "views, metadata ops, module calls"
CKPT = "checkpoint: saving, recomputing, unpacking"

# the base setting's expected step: 16 ms
#   mm 10 ms, add 2 ms, mul 2 ms (elementwise), host 1 ms, optimizer 1 ms
BASE_ROWS = [("mm", "matmul", 10, 0.010, "compute", ""), ("add", "memory-bound", 20, 0.002, "memory", ""),
             ("mul", "memory-bound", 20, 0.002, "memory", ""), (HOST, "host", 100, 0.001, "launch", ""),
             ("optimizer step", "optimizer", 5, 0.001, "memory", "")]
# the new setting's: mm doubled (20 ms), add and mul doubled (4 ms each), host doubled (2 ms), the
# optimizer the same (1 ms); new: torch's checkpoint (host, 1 ms) and gelu (1.5 ms). 33.5 ms in all.
NEW_ROWS = [("mm", "matmul", 20, 0.020, "compute", ""), ("add", "memory-bound", 40, 0.004, "memory", ""),
            ("mul", "memory-bound", 40, 0.004, "memory", ""), (HOST, "host", 200, 0.002, "launch", ""),
            (CKPT, "host", 10, 0.001, "launch", ""), ("gelu", "memory-bound", 4, 0.0015, "memory", ""),
            ("optimizer step", "optimizer", 5, 0.001, "memory", "")]


def fake_plan(rows, total_bytes, tokens_per_s=2000.0, mfu=0.5):
    step = sum(r[3] for r in rows)
    return SimpleNamespace(expected=Expected(step, tokens_per_s, mfu, rows=list(rows)), total_bytes=total_bytes,
                           notes=[])


def trace():
    """A traced base step of 40 ms wall: mm 20, add 6, copy_ 4 (no expected op of that name), the
    optimizer 3, data loading 4 (nothing expected), and 40 - 37 = 3 ms with no op running."""
    ops = [{"op": "aten::mm", "category": "matmul/linear", "self_s": 0.020, "calls": 10},
           {"op": "aten::add", "category": "activation/elementwise", "self_s": 0.006, "calls": 20},
           {"op": "aten::copy_", "category": "activation/elementwise", "self_s": 0.004, "calls": 5},
           {"op": "Optimizer.step#AdamW.step", "category": "optimizer", "self_s": 0.003, "calls": 1},
           {"op": "tunekit: data", "category": "data loading", "self_s": 0.004, "calls": 1}]
    return Breakdown("cpu", 0.040, {}, ops, untraced_s=0.003)


def fake_run(traced=True, step_s=0.020, peak=300 * MiB):
    return SimpleNamespace(run_id=3, status="ok", parallel=None, device="cpu", toggles=Toggles(), label="run 3",
                           trace=trace() if traced else None, step_s=step_s, conditions=None, peak_mem_bytes=peak)


def fake_lab(device_type="cpu"):
    return SimpleNamespace(device=SimpleNamespace(type=device_type))


def expect_of(run, device_type="cpu"):
    base, new = fake_plan(BASE_ROWS, 100 * MiB), fake_plan(NEW_ROWS, 150 * MiB)
    return ex.expectation(fake_lab(device_type), Setting(), "cpu", new, base, run)


def test_traced_base_run_calibrates_op_by_op():
    e = expect_of(fake_run())
    # the run's step is 20 ms, its trace 40 ms: every traced second counts 20/40 = 0.5
    #   mm: 20 ms * 0.5 / 10 ms = 1.0; add: 6 * 0.5 / 2 = 1.5
    #   elementwise rest: copy_ 4 * 0.5 = 2 ms measured over mul's 2 ms expected = 1.0
    #   optimizer: 3 * 0.5 / 1 = 1.5; no op running: 3 * 0.5 / 1 (host) = 1.5
    #   data loading: 4 * 0.5 = 2 ms, nothing expected: carried as measured
    # new: mm 20*1 + add 4*1.5 + mul 4*1 + host 2*1.5 + optimizer 1*1.5 + new ckpt 1 + new gelu 1.5
    #      + data loading 2 = 20 + 6 + 4 + 3 + 1.5 + 1 + 1.5 + 2 = 39 ms
    assert e.step_s == pytest.approx(0.039)
    by = {r[0]: (r[4], r[6]) for r in e.rows}
    assert by["mm"] == (pytest.approx(1.0), "op")
    assert by["add"] == (pytest.approx(1.5), "op")
    assert by["mul"] == (pytest.approx(1.0), "group")
    assert by[HOST] == (pytest.approx(1.5), "group")
    assert by["optimizer step"] == (pytest.approx(1.5), "group")
    assert by[CKPT] == (1.0, "device model") and by["gelu"] == (1.0, "device model")
    assert e.calibration == "trace" and e.base_run == 3 and e.base_step_s == 0.020
    # the plan's 33.5 ms became 39 ms: tokens/s and MFU scale by 33.5 / 39
    assert e.plan_step_s == pytest.approx(0.0335)
    assert e.tokens_per_s == pytest.approx(2000 * 0.0335 / 0.039)
    assert e.mfu == pytest.approx(0.5 * 0.0335 / 0.039)
    # CPU: the run measured 300 MiB against its plan's 100 (the process: +200 MiB); 150 + 200 = 350
    assert e.peak_bytes == 350 * MiB and e.base_peak_bytes == 300 * MiB
    assert of_kind(e.notes, "expect.new_ops") and of_kind(e.notes, "expect.not_carried")
    # 39 / 20 - 1 = +95%; 350 / 300 - 1 = +17%
    assert e.line == "expected 39.0 ms/step (+95% vs run #3), peak 350.0 MiB (+17%)"
    changes = {op: what for op, _c, _b, _n, what in e.changes}
    assert changes == {"mm": "resized", "add": "resized", "mul": "resized", HOST: "resized",
                       CKPT: "added", "gelu": "added"}


def test_base_setting_expected_as_its_run_measured():
    base = fake_plan(BASE_ROWS, 100 * MiB)
    e = ex.expectation(fake_lab(), Setting(), "cpu", base, base, fake_run())
    # the base run's own setting: every measured second carried back: 10 + 3 + 2 + 1.5 + 1.5 + 2 = 20 ms
    assert e.step_s == pytest.approx(0.020)
    assert e.peak_bytes == 300 * MiB and e.changes == []


def test_step_time_alone_is_one_ratio():
    e = expect_of(fake_run(traced=False, step_s=0.032))
    # 32 ms measured over 16 ms expected: 2.0 for the shared ops; new ckpt 1 ms and gelu 1.5 ms at 1
    # (33.5 - 2.5) * 2 + 2.5 = 64.5 ms
    assert e.step_s == pytest.approx(0.0645)
    assert e.calibration == "step time" and of_kind(e.notes, "expect.step_only")


def test_gpu_peak_is_a_ratio():
    e = expect_of(fake_run(), device_type="cuda")
    # 300 / 100 measured over planned: 150 MiB * 3 = 450 MiB
    assert e.peak_bytes == 450 * MiB


def test_nothing_to_carry_over_is_said():
    e = expect_of(None)
    assert e.step_s == pytest.approx(0.0335) and e.base_run is None and e.calibration == "none"
    assert all(r[6] == "device model" for r in e.rows)
    assert [n.kind for n in e.notes] == ["expect.uncalibrated"]
    # against the base plan's 16 ms and 100 MiB: 33.5 / 16 - 1 = +109% (109.4), 150 / 100 - 1 = +50%
    assert e.line == "expected 33.5 ms/step (+109% vs the Lab's setting), peak 150.0 MiB (+50%)"
    no_peak = expect_of(fake_run(peak=None))
    assert no_peak.peak_bytes == 150 * MiB and of_kind(no_peak.notes, "expect.peak_uncalibrated")


def test_shape_key_leaves_out_lr():
    a, b = Setting(lr=1e-3), Setting(lr=1e-4)
    assert ex.shape_key("cpu", a) == ex.shape_key("cpu", b)
    assert ex.shape_key("cpu", a) != ex.shape_key("cpu", a.replace(micro_batch=16))


def test_bad_keywords_refused_before_any_plan(lab, monkeypatch):
    def no_plan(*a, **k):
        raise AssertionError("planned before refusing")
    monkeypatch.setattr(ex, "cached_plan", no_plan)
    with pytest.raises(TypeError, match="unknown keyword"):
        lab.expect(micro_btach=8)
    with pytest.raises(ToggleError):
        lab.expect(precision="fp16")          # refused on CPU, as lab.run refuses it
    with pytest.raises(ValueError, match="not both"):
        lab.expect(setting=Setting(micro_batch=8), micro_batch=4)
    with pytest.raises(ValueError, match="no run #7"):
        ex.base_run(lab, "cpu", 7)


@pytest.mark.slow
def test_real_lab_expectation_cached_and_calibrated(lab):
    first = lab.expect(micro_batch=8)
    assert first.calibration == "none" and first.step_s > 0 and first.peak_bytes > 0
    again = lab.expect(micro_batch=8, lr=0.5)        # lr leaves the step as it is: the same plan
    assert again.plan_step_s == first.plan_step_s
    run = lab.run(steps=1, warmup=0, verbose=False)
    same = lab.expect()
    # untraced: one ratio, so the run's own setting is expected at its measured step
    assert same.base_run == run.run_id and same.calibration == "step time"
    assert same.step_s == pytest.approx(run.step_s)
    assert not math.isnan(lab.expect(micro_batch=8).step_s)
