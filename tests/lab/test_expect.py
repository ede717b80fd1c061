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
from tunekit.lab import expect_peak
from tunekit.lab import plan as lab_plans
from tunekit.lab.expect_trace import untimed

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


def fake_plan(rows, total_bytes, tokens=32, mfu=0.5):
    step = sum(r[3] for r in rows)   # ``tokens`` a micro-batch: the plan's rate is tokens / step
    return SimpleNamespace(expected=Expected(step, tokens / step, mfu, rows=list(rows)), total_bytes=total_bytes,
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


def fake_run(traced=True, step_s=0.0363, peak=300 * MiB):
    return SimpleNamespace(run_id=3, status="ok", parallel=None, device="cpu", toggles=Toggles(), label="run 3",
                           trace=trace() if traced else None, step_s=step_s, conditions=None, peak_mem_bytes=peak)


@pytest.fixture(autouse=True)
def no_floor_under_a_made_up_lab(monkeypatch):
    """A made-up Lab (no model, no process of its own) has no floor below its plan: 0 bytes."""
    real = expect_peak.lab_floor_bytes
    monkeypatch.setattr(expect_peak, "lab_floor_bytes",
                        lambda lab: 0.0 if isinstance(lab, SimpleNamespace) else real(lab))


def fake_lab(device_type="cpu"):
    return SimpleNamespace(device=SimpleNamespace(type=device_type))


def expect_of(run, device_type="cpu"):
    base, new = fake_plan(BASE_ROWS, 100 * MiB), fake_plan(NEW_ROWS, 150 * MiB)
    return ex.expectation(fake_lab(device_type), Setting(), "cpu", new, base, run)


def test_profiler_time_taken_out_per_op_call():
    # the trace's 40 ms over a 36.3 ms step: 3.7 ms of profiler over 10 + 20 + 5 + 1 + 1 = 37 op calls,
    # 0.1 ms a call: mm 20 - 1 = 19, add 6 - 2 = 4, copy_ 4 - 0.5 = 3.5, optimizer 3 - 0.1 = 2.9,
    # data 4 - 0.1 = 3.9; with 3 ms untraced: 36.3 ms, the step: nothing left to scale (1.0)
    out, scale = untimed(trace(), 0.0363)
    assert [o["self_s"] for o in out.top_ops] == pytest.approx([0.019, 0.004, 0.0035, 0.0029, 0.0039])
    assert out.wall_s == pytest.approx(0.0363) and scale == pytest.approx(1.0)
    # a 26 ms step: 14 ms over 37 calls; add (20 calls, 20 * 14/37 = 7.6 ms of its 6) would go below
    # nothing: kept at 0, the rest scaled to the step: mm 20 - 10 * 14/37, copy_ 4 - 5 * 14/37,
    # optimizer and data 3 and 4 - 14/37
    out, scale = untimed(trace(), 0.026)
    per = 0.014 / 37
    kept = [0.020 - 10 * per, 0.0, 0.004 - 5 * per, 0.003 - per, 0.004 - per]
    assert [o["self_s"] for o in out.top_ops] == pytest.approx(kept)
    assert scale == pytest.approx(0.026 / (sum(kept) + 0.003))
    # a traced step faster than the untraced (noise): nothing taken out, all scaled up: 44 / 40 = 1.1
    out, scale = untimed(trace(), 0.044)
    assert out.top_ops == trace().top_ops and scale == pytest.approx(1.1)


def test_traced_base_run_calibrates_op_by_op():
    e = expect_of(fake_run())
    # the trace less its profiler (test_profiler_time_taken_out_per_op_call): mm 19, add 4, copy_ 3.5,
    # optimizer 2.9, data 3.9, no op running 3 ms: the step's 36.3 ms
    #   mm: 19 / 10 = 1.9; add: 4 / 2 = 2.0
    #   elementwise rest: copy_ 3.5 ms measured over mul's 2 ms expected = 1.75
    #   optimizer: 2.9 / 1 = 2.9; no op running: 3 / 1 (host) = 3.0
    #   data loading: 3.9 ms, nothing expected: carried as measured
    # new: mm 20*1.9 + add 4*2 + mul 4*1.75 + host 2*3 + optimizer 1*2.9 + new ckpt 1 + new gelu 1.5
    #      + data loading 3.9 = 38 + 8 + 7 + 6 + 2.9 + 1 + 1.5 + 3.9 = 68.3 ms
    assert e.step_s == pytest.approx(0.0683)
    by = {r[0]: (r[4], r[6]) for r in e.rows}
    assert by["mm"] == (pytest.approx(1.9), "op")
    assert by["add"] == (pytest.approx(2.0), "op")
    assert by["mul"] == (pytest.approx(1.75), "group")
    assert by[HOST] == (pytest.approx(3.0), "group")
    assert by["optimizer step"] == (pytest.approx(2.9), "group")
    assert by[CKPT] == (1.0, "device model") and by["gelu"] == (1.0, "device model")
    assert e.calibration == "trace" and e.base_run == 3 and e.base_step_s == 0.0363
    # the plan's 33.5 ms became 68.3 ms: tokens/s (32 tokens over the plan's 33.5 ms) and MFU scale by 33.5 / 68.3
    assert e.plan_step_s == pytest.approx(0.0335)
    assert e.tokens_per_s == pytest.approx(32 / 0.0683)
    assert e.mfu == pytest.approx(0.5 * 0.0335 / 0.0683)
    # CPU: the run measured 300 MiB against its plan's 100 (the process: +200 MiB); 150 + 200 = 350
    assert e.peak_bytes == 350 * MiB and e.base_peak_bytes == 300 * MiB
    assert of_kind(e.notes, "expect.new_ops") and of_kind(e.notes, "expect.not_carried")
    # 68.3 / 36.3 - 1 = +88%; 350 / 300 - 1 = +17%
    # the line says which figure: calibrated by run #3, beside the device model's own 33.5 ms (lab.explain's)
    assert e.line == ("expected 68.3 ms/step calibrated by run #3 (+88% vs run #3; 33.5 ms by the device model, "
                      "uncalibrated), peak 350.0 MiB (+17%)")
    changes = {op: what for op, _c, _b, _n, what in e.changes}
    assert changes == {"mm": "resized", "add": "resized", "mul": "resized", HOST: "resized",
                       CKPT: "added", "gelu": "added"}


def test_base_setting_expected_as_its_run_measured():
    base = fake_plan(BASE_ROWS, 100 * MiB)
    e = ex.expectation(fake_lab(), Setting(), "cpu", base, base, fake_run())
    # the base run's own setting: every measured second carried back: 19 + 4 + 3.5 + 3 + 2.9 + 3.9 = 36.3 ms
    assert e.step_s == pytest.approx(0.0363)
    assert e.peak_bytes == 300 * MiB and e.changes == []


def test_a_step_of_another_size_is_also_said_per_token_and_a_busy_base_as_uncertain():
    from tunekit.measure.conditions import Conditions

    run = fake_run()
    run.tokens_per_step = 32
    big = ex.expectation(fake_lab(), Setting(), "cpu", fake_plan(NEW_ROWS, 150 * MiB, tokens=64),
                         fake_plan(BASE_ROWS, 100 * MiB), run)
    # 68.3 ms (test_traced_base_run_calibrates_op_by_op) for 64 tokens against 36.3 ms for 32:
    # +88% a step, (68.3 / 64) / (36.3 / 32) - 1 = -5.9% a token
    assert big.line == ("expected 68.3 ms/step calibrated by run #3 (+88% vs run #3, -6% per token; 33.5 ms by the "
                        "device model, uncalibrated), peak 350.0 MiB (+17%)")
    # a model of your own counting samples (its batch_fn's): said per sample, its rate in samples/s
    samples = fake_plan(NEW_ROWS, 150 * MiB, tokens=64)
    samples.unit = "samples"
    own = ex.expectation(fake_lab(), Setting(), "cpu", samples, fake_plan(BASE_ROWS, 100 * MiB), run)
    assert own.line == ("expected 68.3 ms/step calibrated by run #3 (+88% vs run #3, -6% per sample; 33.5 ms by the "
                        "device model, uncalibrated), peak 350.0 MiB (+17%)")
    assert own.summary().splitlines()[1].startswith("937 samples/s")   # 64 samples / 68.3 ms = 937
    run.conditions = Conditions("busy", "load 9.0 on 2 CPUs")
    e = expect_of(run)
    assert e.base_busy and of_kind(e.notes, "expect.busy")
    assert e.line == ("expected 68.3 ms/step calibrated by run #3 (+88% vs run #3; 33.5 ms by the device model, "
                      "uncalibrated; run #3 was busy: uncertain), peak 350.0 MiB (+17%)")


def test_step_time_alone_is_one_ratio():
    e = expect_of(fake_run(traced=False, step_s=0.032))
    # 32 ms measured over 16 ms expected: 2.0 for the shared ops; new ckpt 1 ms and gelu 1.5 ms at 1
    # (33.5 - 2.5) * 2 + 2.5 = 64.5 ms
    assert e.step_s == pytest.approx(0.0645)
    assert e.calibration == "step time" and of_kind(e.notes, "expect.step_only")


def test_grad_accum_repeats_the_micro_batch_not_the_update():
    base = fake_plan(BASE_ROWS, 100 * MiB)
    e = ex.expectation(fake_lab(), Setting(grad_accum=2), "cpu", base, base, fake_run())
    # the base calibrated as in test_base_setting_expected_as_its_run_measured: mm 19, add 4, mul 3.5,
    # host 3, optimizer 2.9, data 3.9 ms; two micro-batches, one update:
    # (19 + 4 + 3.5 + 3 + 3.9) * 2 + 2.9 = 66.8 + 2.9 = 69.7 ms
    assert e.step_s == pytest.approx(0.0697)
    # the plan's step: (16 - 1) * 2 + 1 = 31 ms; tokens/s: the plan's micro-batch tokens (32) twice over 69.7 ms
    assert e.plan_step_s == pytest.approx(0.031)
    assert e.tokens_per_s == pytest.approx(32 * 2 / 0.0697)
    assert {op: what for op, _c, _b, _n, what in e.changes} == {"mm": "resized", "add": "resized", "mul": "resized",
                                                                 HOST: "resized"}
    # measured with grad_accum=2 itself, the run's step is two micro-batches: back to one, (36.3 - 2.9) / 2 + 2.9
    twice = fake_run()
    twice.toggles = Toggles(grad_accum=2)
    one = ex.expectation(fake_lab(), Setting(), "cpu", base, base, twice)
    # factors against the doubled rows: mm 19 / 20, ...: every micro-batch second halved, the update kept
    assert one.step_s == pytest.approx((0.0363 - 0.0029) / 2 + 0.0029)
    # the step time alone: 32 ms over the plan's 16: 2.0; (16 - 1) * 2 * 2 + 1 * 2 = 62 ms
    assert ex.expectation(fake_lab(), Setting(grad_accum=2), "cpu", base, base,
                          fake_run(traced=False, step_s=0.032)).step_s == pytest.approx(0.062)


def test_the_median_step_calibrates_not_the_mean():
    run = fake_run(traced=False, step_s=0.040)
    run.step_s_median = 0.032    # one slow step pulled the mean to 40 ms; the steps settled at 32
    e = expect_of(run)
    # as test_step_time_alone_is_one_ratio: 32 / 16 = 2.0 for the shared ops: (33.5 - 2.5) * 2 + 2.5 = 64.5 ms
    assert e.step_s == pytest.approx(0.0645) and e.base_step_s == 0.032
    run.step_s_median = math.nan  # a log written before the median was kept: the mean
    # 40 / 16 = 2.5: 31 * 2.5 + 2.5 = 80 ms
    assert expect_of(run).step_s == pytest.approx(0.080)


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
    assert e.line == ("expected 33.5 ms/step by the device model, uncalibrated (+109% vs the Lab's setting), "
                      "peak 150.0 MiB (+50%)")
    no_peak = expect_of(fake_run(peak=None))
    assert no_peak.peak_bytes == 150 * MiB and of_kind(no_peak.notes, "expect.peak_uncalibrated")


def test_shape_key_leaves_out_lr():
    a, b = Setting(lr=1e-3), Setting(lr=1e-4)
    assert lab_plans.shape_key("cpu", a) == lab_plans.shape_key("cpu", b)
    assert lab_plans.shape_key("cpu", a) != lab_plans.shape_key("cpu", a.replace(micro_batch=16))


def test_plans_cached_by_shape(monkeypatch):
    class Planner:
        model = object()

        def __init__(self):
            self.planned = []

        def plan(self, device, setting, verbose):
            self.planned.append(setting.micro_batch)
            return setting.micro_batch

    monkeypatch.setattr(lab_plans, "KEPT_PLANS", 2)
    lab = Planner()
    for mb, lr in ((4, 1e-3), (4, 1e-4), (8, 1e-3), (4, 1e-3), (16, 1e-3), (4, 1e-3)):
        lab_plans.cached_plan(lab, "cpu", Setting(micro_batch=mb, lr=lr))
    # 4 planned; 4 again at another lr: cached; 8 planned; 4 cached (now the latest asked); 16
    # planned, 8 (asked least recently of the two kept) dropped for it; 4 still cached
    assert lab.planned == [4, 8, 16]


def test_bad_keywords_refused_before_any_plan(lab, monkeypatch):
    def no_plan(*a, **k):
        raise AssertionError("planned before refusing")
    monkeypatch.setattr(ex, "cached_plan", no_plan)
    with pytest.raises(TypeError, match="micro_btach"):   # Lab.expect's keyword check names it (and micro_batch)
        lab.expect(micro_btach=8)
    with pytest.raises(ToggleError):
        lab.expect(precision="fp16")          # refused on CPU, as lab.run refuses it
    with pytest.raises(ValueError, match="not both"):
        lab.expect(setting=Setting(micro_batch=8), micro_batch=4)
    with pytest.raises(ValueError, match="one-process step"):
        lab.expect(setting=Setting(parallel="ddp", world_size=2))
    with pytest.raises(ValueError, match="no run #7"):
        ex.base_run(lab, "cpu", 7)
    # no run yet: said so, and what to do (not "the runs are " and an empty list)
    with pytest.raises(ValueError, match=r"no run #7: this Lab has no run yet \(lab.run\(\) first"):
        ex.base_run(lab, "cpu", 7)
    with pytest.raises(ValueError, match="finished one-process run"):
        ex.base_run(lab, "cpu", fake_run().__class__(status="failed", parallel=None, step_s=math.nan,
                                                     device="cpu"))


def test_a_setting_that_cannot_fit_here_is_said_so(lab, monkeypatch):
    from tunekit.measure import memavail

    # a 30 MiB plan on a machine with 20 MiB free beyond what the process holds: lab.run would refuse it
    # (the cheap line lab.expect refuses by before planning, 16.2 MiB at micro_batch=8, lets it through)
    monkeypatch.setattr(ex, "cached_plan", lambda lab, device, s, verbose=False: fake_plan(BASE_ROWS, 30 * MiB))
    monkeypatch.setattr(expect_peak, "lab_floor_bytes", lambda lab: 0.0)
    monkeypatch.setattr(ex, "in_use_bytes", lambda lab: 0.0)
    monkeypatch.setattr(memavail, "available", lambda *a: memavail.Available(20 * MiB, "MemAvailable"))
    e = lab.expect(micro_batch=8)
    assert not e.fits and e.line.endswith("peak 30.0 MiB (+0%): does not fit, 20.0 MiB available")
    [note] = of_kind(e.notes, "expect.wont_fit")
    assert note == ("the step needs 30.0 MiB more than the process holds now, 20.0 MiB is available "
                    "(MemAvailable): lab.run refuses it (lab.find_max_batch_size finds the largest micro_batch "
                    "that fits)")
    monkeypatch.setattr(memavail, "available", lambda *a: memavail.Available(64 * MiB, "MemAvailable"))
    assert lab.expect(micro_batch=8).fits


def test_the_line_names_what_its_base_run_ran_that_the_setting_does_not(lab, monkeypatch):
    # a run at seq_len 32, then lab.expect(checkpointing=True) at the Lab's own 64: "+88% vs run #3" alone
    # read as checkpointing's cost; the line names what the run ran otherwise (seq 32, no checkpointing)
    monkeypatch.setattr(ex, "cached_plan", lambda lab, device, s, verbose=False: fake_plan(BASE_ROWS, 30 * MiB))
    run = fake_run(traced=False, step_s=0.008)
    run.toggles = lab.resolve(seq_len=32)
    monkeypatch.setattr(ex, "base_run", lambda lab, device, base: run)
    e = lab.expect(checkpointing=True)
    # untraced: 8 ms measured over the plan's 16 ms carries to the same 16 ms: 8 ms, +0%
    assert e.line.startswith("expected 8.0 ms/step calibrated by run #3 (+0% vs run #3 (ckpt off T=32); ")
    assert e.summary().splitlines()[1].endswith("calibrated by run #3's step time (one ratio)")
    same = lab.expect(seq_len=32)   # the run's own setting: nothing to name
    assert "vs run #3; 16.0 ms by the device model" in same.line   # no "(ckpt off T=32)" after it


def test_explaining_a_run_plans_its_step_once_through_the_labs_plan_cache(lab, monkeypatch):
    from tunekit.lab.explain import explained

    # lab.explain(run) re-planned the run's step on every call (35 s each on a busy 2-core machine);
    # it takes the plan lab.expect caches by shape (and lab.expect then finds it there)
    base = fake_plan(BASE_ROWS, 100 * MiB)
    asked = []
    monkeypatch.setattr(lab, "plan", lambda device, setting=None, verbose=True: asked.append(setting) or base)
    run = fake_run()
    run.toggles = lab.resolve(micro_batch=4)
    for _ in range(2):
        e = explained(lab, run, "run 3")
        assert e.expected_s == pytest.approx(0.016)       # the base plan's 16 ms
    assert len(asked) == 1 and asked[0].micro_batch == 4
    lab.expect(setting=asked[0])                          # the same shape: no plan more
    assert len(asked) == 1


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


# --- the run log, the results table, the dashboard's line ----------------------------------------


def test_a_run_keeps_the_expectation_of_its_setting(tmp_path):
    from tunekit.core.results import RunResult, results_frame
    from tunekit.lab.runlog import RunLog

    log = RunLog(tmp_path / "runs.jsonl")
    t = Toggles(micro_batch=4)
    log.expecting(Setting.of(t), 0.040, 300 * MiB, 2)
    log.expecting(Setting.of(t.replace(micro_batch=8)), 0.080, 400 * MiB, 2)   # another setting: not this run's
    run = RunResult.from_dict({"label": "mb4", **t.asdict(), "step_s": 0.050})
    log.add(run)
    assert (run.expected_step_s, run.expected_peak_bytes, run.expected_from) == (0.040, 300 * MiB, 2)
    assert log.expectations == {}     # the next run's answers come after this one
    later = RunResult.from_dict({"label": "mb8", **t.replace(micro_batch=8).asdict(), "step_s": 0.1})
    log.add(later)
    df = results_frame(RunLog.load(log.path))     # read back from the file: the log kept both
    # 40 ms expected / 50 ms measured - 1 = -20%; the second run had no expectation: NaN
    assert df["expected_ms"].iloc[0] == pytest.approx(40.0) and df["expect_error"].iloc[0] == pytest.approx(-0.2)
    assert math.isnan(df["expected_ms"].iloc[1]) and math.isnan(df["expect_error"].iloc[1])


def test_results_columns_and_view(tmp_path):
    from tunekit.core.results import RESULT_COLUMNS, RunResult, results_frame, runs_view

    none = RunResult.from_dict({"label": "a", "step_s": 0.05})
    assert {"expected_ms", "expect_error"} <= set(RESULT_COLUMNS)
    assert "expected vs median step" not in runs_view(results_frame([none])).columns   # only where a run has one
    some = RunResult.from_dict({"label": "b", "step_s": 0.05, "expected_step_s": 0.06})
    # the expectation's error against the measurement: 60 / 50 - 1 = +20% (expected 20% slower than measured)
    view = runs_view(results_frame([none, some]))
    assert view["expected (ms)"].iloc[1] == pytest.approx(60.0)
    assert view["expected vs median step"].iloc[1] == pytest.approx(0.2)
    # the error is against the median step, not the mean the "step (ms)" column shows: the header says
    # so (a reader saw 6,700.9 expected beside 6,014.3 and "+85.6%"): 60 / 40 - 1 = +50%, the mean 50
    skewed = RunResult.from_dict({"label": "c", "step_s": 0.05, "step_s_median": 0.04, "expected_step_s": 0.06})
    view = runs_view(results_frame([skewed]))
    assert view["step (ms)"].iloc[0] == pytest.approx(50.0) and view["expected vs median step"].iloc[0] == \
        pytest.approx(0.5)


def test_predicted_line_of_a_run():
    from tunekit.core.results import RunResult, results_frame
    from tunekit.lab.expect_line import predicted_line

    r = RunResult.from_dict({"label": "a", "step_s": 0.050, "expected_step_s": 0.040, "expected_from": 3})
    # 40 / 50 - 1 = -20.0%
    assert predicted_line(r) == "predicted 40.0 ms/step, measured 50.0 ms: -20.0% off (calibrated by run #3)"
    assert predicted_line(RunResult.from_dict({"label": "b", "step_s": 0.05})) == ""
    # against the steady (median) step where the run has one: 40 / 45 - 1 = -11.1%
    steady = RunResult.from_dict({"label": "c", "step_s": 0.050, "step_s_median": 0.045, "expected_step_s": 0.040})
    assert steady.steady_step_s == 0.045
    assert predicted_line(steady) == ("predicted 40.0 ms/step, measured 45.0 ms: -11.1% off (by the device model, "
                                      "uncalibrated)")
    assert results_frame([steady])["expect_error"].iloc[0] == pytest.approx(0.040 / 0.045 - 1)


def fake_answers(monkeypatch, lab, gate=None):
    """lab.expect answering at once from made-up plans: step = micro_batch ms against a base of
    4 ms (so a line says which request it answers); fp16 refused as lab.expect refuses it;
    ``gate``: each answer waits on it. Returns the micro-batches answered, in order."""
    asked = []

    def answer(setting=None, base=None, **changes):
        if gate is not None:
            gate.wait(10)
        if changes.get("precision") == "fp16":
            raise ToggleError(["fp16 training is refused on CPU"])
        mb = changes["micro_batch"]
        asked.append(mb)
        new, old = [("mm", "matmul", 1, mb / 1e3, "compute", "")], [("mm", "matmul", 1, 0.004, "compute", "")]
        return ex.expectation(fake_lab(), Setting(), "cpu", fake_plan(new, mb * MiB), fake_plan(old, 4 * MiB), None)
    monkeypatch.setattr(lab, "expect", answer)
    return asked


def test_dashboard_line_follows_the_controls_newest_wins(make_lab, monkeypatch):
    import threading

    lab = make_lab(peak_tflops=1.0, micro_batch=4, seq_len=64)
    from tunekit.lab.dashboard import Dashboard

    fake_answers(monkeypatch, lab)
    d = Dashboard(lab, expect=True)   # the line a widget frontend gets (plain Python gets none)
    assert d.expect_line.wait(10)
    # micro_batch 4: 4 ms, against the base plan's 4 ms and 4 MiB: +0%
    assert ("expected 4.0 ms/step by the device model, uncalibrated (+0% vs the Lab&#x27;s setting), "
            "peak 4.0 MiB (+0%)") in d.expect_html.value
    gate = threading.Event()
    asked = fake_answers(monkeypatch, lab, gate)
    for mb in (8, 16, 32):                      # three changes while the first is still being answered
        d.controls["micro_batch"].value = mb
    gate.set()
    assert d.expect_line.wait(10)
    # 32 / 4 - 1 = +700%, 32 MiB / 4 MiB - 1 = +700%: the newest answer shown, the last one computed,
    # and not every request answered (one asked while another computes replaces the one waiting)
    assert ("expected 32.0 ms/step by the device model, uncalibrated (+700% vs the Lab&#x27;s setting), "
            "peak 32.0 MiB (+700%)") in d.expect_html.value
    assert asked[-1] == 32 and len(asked) < 3
    d.controls["precision"].value = "fp16"      # refused: said in the line, never raised into the callback
    assert d.expect_line.wait(10)
    assert "expected: n/a (fp16 training is refused on CPU)" in d.expect_html.value
    assert isinstance(d.expect_line.last_error, ToggleError)


@pytest.mark.slow
def test_dashboard_run_says_predicted_against_measured(dash):
    assert dash.expect_line.wait(60)
    dash.run_button.click()
    r = dash.lab.runs[-1]
    assert r.expected_step_s > 0 and "predicted" in dash.message.value
    assert dash.lab.results()["expect_error"].notna().all()


def test_only_a_run_of_this_model_calibrates():
    import torch
    model = torch.nn.Linear(2, 2)   # 2 x 2 weights + 2 biases = 6 parameters

    def run(run_id, n_params):
        return SimpleNamespace(run_id=run_id, status="ok", parallel=None, step_s=0.01, device="cpu",
                               session=None, n_params=n_params)
    # a resumed log: run #4 (the newest) is of another model, run #2 of this one
    lab = SimpleNamespace(model=model, runs=[run(2, 6), run(4, 1_000)], log=SimpleNamespace(session=None))
    assert ex.base_run(lab, "cpu").run_id == 2
    with pytest.raises(ValueError, match=r"this Lab's model \(6 parameters\)"):
        ex.base_run(lab, "cpu", base=4)
    lab.runs = [run(4, 1_000)]
    assert ex.base_run(lab, "cpu") is None


class _Broken:
    """An Expectation whose line cannot be built (a model of the user's may fail in any way)."""
    base_run = None

    @property
    def line(self):
        raise ValueError("no line")


class _Widget:
    def __init__(self, refuse=False):
        self.refuse, self._value = refuse, ""

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, v):
        if self.refuse:
            raise RuntimeError("widget closed")
        self._value = v


def test_the_expect_line_answers_when_building_its_text_fails():
    from types import SimpleNamespace

    from tunekit.lab.expect_line import ExpectLine

    lab = SimpleNamespace(expect=lambda **kw: _Broken())
    line = ExpectLine(lab, _Widget())
    line.request({"checkpointing": True})
    assert line.wait(30)
    assert "ValueError: no line" in line.html.value and line.last is None
    lab.expect = lambda **kw: SimpleNamespace(base_run=1, line="expected 31 ms/step")
    line.request({})                       # a later request is still answered: the line is not stuck
    assert line.wait(30) and "expected 31 ms/step" in line.html.value


def test_the_expect_line_answers_when_the_widget_refuses_the_text():
    from types import SimpleNamespace

    from tunekit.lab.expect_line import ExpectLine

    widget = _Widget(refuse=True)
    line = ExpectLine(SimpleNamespace(expect=lambda **kw: SimpleNamespace(base_run=1, line="x")), widget)
    line.request({})
    assert line.wait(30)                   # wait() returns: the thread counted the request answered
    assert isinstance(line.last_error, RuntimeError)
    widget.refuse = False
    line.request({})
    assert line.wait(30) and "x" in widget.value


def test_an_ops_factor_carries_while_it_stays_near_its_measured_size():
    from tunekit.lab.expect import calibrated_rows
    from tunekit.lab.expect_trace import OTHER  # memory-bound ops' group

    # rows: (op, category, calls, expected s, bound, source); the base trace measured _to_copy at
    # 30x its plan (a fixed cost per tiny call) and memory-bound ops at 1.5x as a group
    base = [("aten::_to_copy", "memory-bound", 1, 4e-6, "memory", "s"),
            ("aten::mul", "memory-bound", 2, 1e-3, "memory", "s")]
    factors = ({"_to_copy": 30.0, "mul": 1.2}, {OTHER: 1.5}, {}, "trace")
    new = [("aten::_to_copy", "memory-bound", 1, 1.2e-3, "memory", "s"),    # 300x per call: group's 1.5
           ("aten::mul", "memory-bound", 2, 3e-3, "memory", "s")]            # 3x per call: its own 1.2
    rows, added, other = calibrated_rows(new, base, factors)
    got = [(r[0], r[4], r[6]) for r in rows]
    assert got == [("aten::_to_copy", 1.5, "group"), ("aten::mul", 1.2, "op")] and added == [] == other
    assert rows[0][5] == 1.2e-3 * 1.5          # 1.8 ms, not 1.2 ms x 30 = 36 ms


FP32, BF16 = ("float32",), ("bfloat16",)
UPDATE = ("float32 params, fp32 grads",)   # the optimizer's row: fp32 parameters under bf16 autocast too


def test_a_factor_measured_at_one_dtype_does_not_carry_to_another_dtypes_kernel():
    # the base setting's plan at fp32, the new one the same sizes under bf16 autocast: mm runs bf16,
    # add takes a bf16 and an fp32 tensor (a residual), mul stays fp32, the update fp32
    base = fake_plan(BASE_ROWS, 100 * MiB)
    base.expected.dtypes = {"mm": FP32, "add": FP32, "mul": FP32, "optimizer step": UPDATE}
    new = fake_plan(BASE_ROWS, 100 * MiB)
    new.expected.dtypes = {"mm": BF16, "add": ("bfloat16,float32>float32",), "mul": FP32, "optimizer step": UPDATE}
    e = ex.expectation(fake_lab(), Setting(precision="bf16"), "cpu", new, base, fake_run())
    # factors as in test_traced_base_run_calibrates_op_by_op: mm 1.9, add 2.0 (ops), elementwise rest
    # 1.75, host 3.0, optimizer 2.9, data loading 3.9 ms carried.
    # mm: another kernel, and the matmul group measured only fp32 ones: not its own 1.9, the base's
    # kernels' together (the host and the update aside): (10 x 1.9 + 2 x 2.0 + 2 x 1.75) / 14 = 26.5 / 14;
    # add: another kernel, its signature not among the elementwise group's (float32): the same;
    # mul: the same kernel, no factor of its own: the group's 1.75 -> 3.5 ms; host 1 x 3.0;
    # the update the same kernel: 1 x 2.9; (10 + 2) x 26.5 / 14 + 3.5 + 3 + 2.9 + 3.9 = 35.996 ms
    k = 26.5 / 14
    by = {r[0]: (r[4], r[6]) for r in e.rows}
    assert by["mm"] == (pytest.approx(k), "step") and by["add"] == (pytest.approx(k), "step")
    assert by["mul"] == (pytest.approx(1.75), "group") and by[HOST] == (pytest.approx(3.0), "group")
    assert by["optimizer step"] == (pytest.approx(2.9), "group")
    assert e.step_s == pytest.approx(0.012 * k + 0.0133)
    note = of_kind(e.notes, "expect.other_dtype")
    assert "mm (float32 -> bfloat16), add (float32 -> bfloat16,float32>float32)" in str(note[0])
    # the same plan with the same signatures on both sides: the base run exactly (36.3 ms)
    new.expected.dtypes = dict(base.expected.dtypes)
    same = ex.expectation(fake_lab(), Setting(), "cpu", new, base, fake_run())
    assert same.step_s == pytest.approx(0.0363) and not of_kind(same.notes, "expect.other_dtype")
    # measured by its step time alone (36.3 ms over the plan's 16): that one ratio for every row, bf16
    # or not (each kernel's as the base took it): 36.3 ms, and the note says which ops run other kernels
    new.expected.dtypes = {"mm": BF16, "add": BF16, "mul": FP32, "optimizer step": UPDATE}
    step = ex.expectation(fake_lab(), Setting(), "cpu", new, base, fake_run(traced=False))
    assert step.step_s == pytest.approx(0.0363) and of_kind(step.notes, "expect.other_dtype")


def test_a_group_factor_carries_to_another_signature_its_group_measured():
    from tunekit.lab.expect_trace import OTHER, calibrated_rows

    base = [("add", "memory-bound", 2, 1e-3, "memory", ""), ("mul", "memory-bound", 2, 1e-3, "memory", "")]
    new = [("add", "memory-bound", 2, 1e-3, "memory", ""), ("mul", "memory-bound", 2, 1e-3, "memory", "")]
    factors = ({"add": 1.2, "mul": 1.4}, {OTHER: 1.5}, {}, "trace")
    # the base's add ran fp32 and int64 kernels, the new one only fp32: not its own factor (another
    # mix), but the group measured fp32 kernels: its 1.5; mul from int64 to float32: the group's
    # kernels include float32 too, so 1.5; were it bf16, the base's whole step's: (1 x 1.2 + 1 x 1.4) / 2 = 1.3
    rows, added, other = calibrated_rows(new, base, factors, {"add": FP32, "mul": FP32},
                                         {"add": ("float32", "int64"), "mul": ("int64",)})
    assert [(r[0], r[4], r[6]) for r in rows] == [("add", 1.5, "group"), ("mul", 1.5, "group")]
    assert added == [] == other
    rows, _, other = calibrated_rows(new, base, factors, {"add": FP32, "mul": BF16},
                                     {"add": ("float32", "int64"), "mul": ("int64",)})
    assert [(r[0], r[4], r[6]) for r in rows] == [("add", 1.5, "group"), ("mul", pytest.approx(1.3), "step")]
    assert other == [("mul", ("int64",), BF16)]


def loaded_run(ops, untraced=0.003):
    """A traced run whose trace needs no profiler time taken out: its steady step is the trace's wall
    (the ops' self times plus ``untraced``), so each op's measured seconds are its own."""
    wall = sum(o["self_s"] for o in ops) + untraced
    run = fake_run(step_s=wall)
    run.trace = Breakdown("cpu", wall, {}, ops, untraced_s=untraced)
    return run


def op(name, cat, secs, calls):
    return {"op": name, "category": cat, "self_s": secs, "calls": calls}


def test_a_group_slowed_far_past_the_rest_of_the_step_takes_the_rests_factor():
    base = fake_plan(BASE_ROWS, 100 * MiB)
    # under load the update measured 36 ms against its 1 ms expected (36x); the other groups: mm 20 / 10
    # = 2.0, elementwise (add 6 + copy_ 4) / (add 2 + mul 2) = 2.5, host 3 / 1 = 3.0: their median 2.5, and
    # 36 / 2.5 = 14x (over FAR_GROUP, 8x): the update takes the other groups'
    # (20 + 10 + 3) / (10 + 4 + 1) = 2.2;
    # each of those within 8x of the median of the rest (the matmuls' 2.0 against median(2.5, 36, 3) = 3)
    run = loaded_run([op("aten::mm", "matmul/linear", 0.020, 10), op("aten::add", "activation/elementwise", 0.006, 20),
                      op("aten::copy_", "activation/elementwise", 0.004, 5),
                      op("Optimizer.step#AdamW.step", "optimizer", 0.036, 1)])
    e = ex.expectation(fake_lab(), Setting(), "cpu", base, base, run)
    by = {r[0]: (r[4], r[6]) for r in e.rows}
    # the others carry their own: mm 2.0 (op), add 3.0 (op: within 4x of the group's 2.5), mul the
    # rest (10 - 6) / (4 - 2) = 2.0, host 3.0
    assert by["optimizer step"] == (pytest.approx(2.2), "group")
    assert by["mm"] == (pytest.approx(2.0), "op") and by["add"] == (pytest.approx(3.0), "op")
    assert by["mul"] == (pytest.approx(2.0), "group") and by[HOST] == (pytest.approx(3.0), "group")
    # carried op by op: 20 + 6 + 4 + 3 + 2.2 = 35.2 ms; the other 69 - 35.2 = 33.8 ms of the loaded
    # update is kept as measured (not multiplied into other ops): the base setting is its run's 69 ms
    assert e.step_s == pytest.approx(0.069) and e.base_step_s == pytest.approx(0.069)
    assert e.rows[-1][0] == "run #3, not carried op by op" and e.rows[-1][5] == pytest.approx(0.0338)
    assert of_kind(e.notes, "expect.kept")
    note = str(of_kind(e.notes, "expect.outlier")[0])
    assert "optimizer 36.0x (the other groups' 2.20x)" in note
    # the new setting (NEW_ROWS): mm 20 x 2.0 + add 4 x 3.0 + mul 4 x 2.0 + host 2 x 3.0 + the update 1 x 2.2
    # + new ckpt 1 + gelu 1.5 = 70.7 ms, and the 33.8 kept: 104.5 ms, never below the run's 69 (it was
    # 70.7 ms against 69 measured: +2.5% for a step with twice the work)
    new = ex.expectation(fake_lab(), Setting(), "cpu", fake_plan(NEW_ROWS, 150 * MiB), base, run)
    assert new.step_s == pytest.approx(0.1045)
    # an update at 15 ms (15x, 15 / 2.5 = 6x the others' median: within 8x) is the group's own, carried
    run.trace.top_ops[-1]["self_s"] = 0.015
    run.trace.wall_s = run.step_s = 0.048
    again = ex.expectation(fake_lab(), Setting(), "cpu", base, base, run)
    assert {r[0]: r[4] for r in again.rows}["optimizer step"] == pytest.approx(15.0)
    assert not of_kind(again.notes, "expect.outlier")


def test_an_op_far_past_its_group_leaves_its_time_to_the_groups_rest():
    from tunekit.lab.expect_trace import FAR_GROUP, SANE_CARRY

    assert (SANE_CARRY, FAR_GROUP) == (4.0, 8.0)
    rows = [*BASE_ROWS, ("neg", "memory-bound", 2, 0.0002, "memory", "")]
    base = fake_plan(rows, 100 * MiB)
    # neg measured 4 ms against 0.2 ms (20x); its group: (add 6 + copy_ 4 + neg 4) / (2 + 2 + 0.2) = 14 / 4.2
    # = 3.33x, and 20 / 3.33 = 6x past it: neg's time stays in the rest: (14 - 6) / (4.2 - 2) = 3.636..
    run = loaded_run([op("aten::mm", "matmul/linear", 0.020, 10), op("aten::add", "activation/elementwise", 0.006, 20),
                      op("aten::copy_", "activation/elementwise", 0.004, 5),
                      op("aten::neg", "activation/elementwise", 0.004, 2),
                      op("Optimizer.step#AdamW.step", "optimizer", 0.002, 1)])
    e = ex.expectation(fake_lab(), Setting(), "cpu", base, base, run)
    by = {r[0]: (r[4], r[6]) for r in e.rows}
    rest = 8 / 2.2
    assert by["neg"] == (pytest.approx(rest), "group") and by["mul"] == (pytest.approx(rest), "group")
    assert by["add"] == (pytest.approx(3.0), "op")
    # the base setting: mm 20, add 6, mul and neg (2 + 0.2) x 8 / 2.2 = 8, host 3, the update 2: 39 ms, the run's own
    assert e.step_s == pytest.approx(0.039)
    assert "neg 20.0x (elementwise, norms, copies's 3.33x)" in str(of_kind(e.notes, "expect.outlier")[0])
    # far BELOW its group is its own (load only slows): neg at 0.02 ms of its 0.2 (0.1x) carries as measured
    run.trace.top_ops[3]["self_s"] = 0.00002
    run.trace.wall_s = run.step_s = 0.03502
    low = ex.expectation(fake_lab(), Setting(), "cpu", base, base, run)
    assert {r[0]: (r[4], r[6]) for r in low.rows}["neg"] == (pytest.approx(0.1), "op")
    assert not of_kind(low.notes, "expect.outlier")


def test_a_size_no_memory_here_holds_is_refused_before_any_plan(lab, monkeypatch):
    from tunekit.lab.fit import WontFitError

    def no_plan(*a, **k):
        raise AssertionError("planned before refusing")
    monkeypatch.setattr(ex, "cached_plan", no_plan)
    # 10**9 samples of the cpu-tiny GPT: petabytes of activations, past any machine's memory; refused
    # by lab.run's own check (tunekit.lab.fit), said the same way, before a fake step
    with pytest.raises(WontFitError, match=r"^lab.expect: this setting does not fit: micro_batch=1000000000 "):
        lab.expect(micro_batch=10**9)


def test_a_step_many_times_the_base_is_said_as_a_multiple_not_a_giant_percentage():
    # 0.036 s -> 36,000,000 s (grad_accum=10**9): 10**9 times, not "+99999999900%"; 0.036 -> 0.072: +100%
    assert ex.times_or_pct(36_000_000.0, 0.036) == "1e+09x"
    assert ex.times_or_pct(0.072, 0.036) == "+100%"
    assert ex.times_or_pct(0.54, 0.0036) == "150x"   # 0.54 / 0.0036 = 150
