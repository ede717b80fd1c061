"""tunekit.explain: a traced step against its expectation, from records built by hand (exact
numbers) and from a real Lab run (only what holds on a busy machine is asserted)."""
import math
import pickle

import pytest

import tunekit
from tunekit.core.breakdown import ATTENTION, ELEMENTWISE, MATMUL, OPTIMIZER, Breakdown
from tunekit.core.conditions import Conditions
from tunekit.core.expected import Expected
from tunekit.core.explain import explain_trace
from tunekit.core.fmt import fmt_ms
from tunekit.core.toggles import Toggles


def _trace(ops, wall_s, untraced_s=0.0):
    return Breakdown(device="cpu", wall_s=wall_s, seconds={}, untraced_s=untraced_s,
                     top_ops=[{"op": o, "category": c, "self_s": s, "calls": n} for o, c, s, n in ops])


# 10 ms measured: 4 ms of mm, a math attention's 1 ms of bmm and 2 ms of softmax (in an attention
# module, so the trace files them under attention), 1 ms of mul, 1 ms in the optimizer's scope, 1 ms
# between ops. The expectation: mm 3 ms, bmm 0.4 ms, softmax 0.2 ms, mul 0.5 ms, optimizer 0.9 ms
TRACE = _trace([("aten::mm", MATMUL, 0.004, 12), ("aten::bmm", ATTENTION, 0.001, 4),
                ("aten::_softmax", ATTENTION, 0.002, 2), ("aten::mul", ELEMENTWISE, 0.001, 30),
                ("aten::mul_", OPTIMIZER, 0.0006, 14), ("Optimizer.step#AdamW.step", OPTIMIZER, 0.0004, 1),
                ("nn.Module: Block", "other", 0.0, 2)], wall_s=0.010, untraced_s=0.001)
EXPECTED = Expected(step_s=0.005, tokens_per_s=0.0, mfu=0.0, rows=[
    ("mm", "matmul", 12, 0.003, "compute", "MAMF"), ("bmm", "matmul", 4, 0.0004, "compute", "MAMF"),
    ("_softmax", "memory-bound", 2, 0.0002, "memory", "copy bandwidth"),
    ("mul", "memory-bound", 30, 0.0005, "memory", "copy bandwidth"),
    ("optimizer step", "optimizer", 14, 0.0009, "memory", "copy bandwidth")])


def test_both_sides_are_grouped_alike_and_the_gaps_are_said_largest_first():
    e = explain_trace(TRACE, EXPECTED, setting=Toggles(attention="math"), label="run #3 (math)")
    t = e.table.set_index("group")
    # grouped by op name on both sides: bmm is a matmul, softmax elementwise, wherever they ran
    figures = ["measured_s", "expected_s", "efficiency", "share"]
    assert t.loc["matmul", figures].tolist() == pytest.approx([0.005, 0.0034, 0.68, 0.5])   # 4+1 ms, 3+0.4 ms
    assert t.loc["elementwise, norms, copies", figures].tolist() == pytest.approx([0.003, 0.0007, 0.7 / 3, 0.3])
    assert t.loc["optimizer", figures].tolist() == pytest.approx([0.001, 0.0009, 0.9, 0.1])
    # 1 ms between ops where the plan foresaw none: not foreseen, no expected time nor efficiency (not 0)
    between = t.loc["no op running"]
    assert between.measured_s == pytest.approx(0.001) and math.isnan(between.expected_s)
    assert math.isnan(between.efficiency) and not between.foreseen and t.foreseen.sum() == 3
    assert "attention" not in t.index                                      # no fused attention kernel ran
    assert e.efficiency == pytest.approx(0.5)                              # 5 ms expected of 10 measured
    # gaps over 5% of the step (0.5 ms): elementwise 2.3 ms, matmul 1.6 ms, between ops 1 ms; the
    # optimizer's 0.1 ms is not one
    assert e.gaps == [
        "the elementwise ops, norms and copies take 30% of the step at 23% of the expected speed: eager: each "
        "elementwise op is a kernel of its own (torch.compile fuses them)",
        "the matmuls take 50% of the step at 68% of the expected speed: with the math attention's score matmuls "
        "(a fused backend runs them in one kernel)",
        "the time between ops takes 10% of the step, not foreseen by the plan: Python between ops: the step is "
        "host-bound (small ops or a small batch)"]
    assert e.summary.splitlines()[0] == ("run #3 (math): 10.0 ms per step, 50% of the expected speed (5.0 ms "
                                         "expected by the device model, uncalibrated)")
    assert list(e.op_table.op[:3]) == ["_softmax", "mm", "bmm"]        # lost 1.8, 1 and 0.6 ms
    assert e.notes == []


def test_an_op_the_plan_did_not_foresee_is_said_so_never_given_an_expected_time_of_0():
    # TRACE plus 1.5 ms of copy_ (6 calls) and 0.2 ms of clone: ops the expected step does not make
    copies = _trace([(o["op"], o["category"], o["self_s"], o["calls"]) for o in TRACE.top_ops]
                    + [("aten::copy_", ELEMENTWISE, 0.0015, 6), ("aten::clone", ELEMENTWISE, 0.0002, 2)],
                    wall_s=0.0117, untraced_s=0.001)
    e = explain_trace(copies, EXPECTED, top=10)
    ops = e.op_table.set_index("op")
    copy = ops.loc["copy_"]
    assert copy.measured_s == pytest.approx(0.0015) and copy.calls == 6 and not copy.foreseen
    assert math.isnan(copy.expected_s) and math.isnan(copy.efficiency)       # neither 0 nor 0.0
    assert ops.foreseen.tolist() == [o in ("_softmax", "mm", "bmm", "mul") for o in ops.index]
    assert not (ops.expected_s == 0).any() and not (ops.efficiency == 0).any()
    assert [(op, round(s, 6), c) for op, s, c in e.unforeseen] == [("copy_", 0.0015, 6), ("clone", 0.0002, 2)]
    assert "- ops the plan did not foresee: copy_ 1.5 ms (6 calls), clone 0.2 ms (2 calls)" in e.summary.splitlines()
    # the elementwise group still has its foreseen ops' expectation: 0.7 ms against 4.7 ms measured (3 + 1.5 + 0.2)
    assert e.table.set_index("group").loc["elementwise, norms, copies", "efficiency"] == pytest.approx(0.7 / 4.7)


def test_the_autograd_engine_s_own_time_is_time_between_ops_not_an_unforeseen_op():
    # TRACE plus the engine's glue of a backward: MmBackward0's node 0.3 ms, its evaluate_function range
    # 0.2 ms, AccumulateGrad 0.1 ms (a transformers model's explain listed them as ops not foreseen)
    glue = _trace([(o["op"], o["category"], o["self_s"], o["calls"]) for o in TRACE.top_ops]
                  + [("MmBackward0", "other", 0.0003, 12),
                     ("autograd::engine::evaluate_function: MmBackward0", "other", 0.0002, 12),
                     ("torch::autograd::AccumulateGrad", "other", 0.0001, 8)], wall_s=0.0106, untraced_s=0.001)
    e = explain_trace(glue, EXPECTED, top=10)
    assert e.unforeseen == [] and "MmBackward0" not in set(e.op_table.op)
    # between ops: the 1 ms untraced + 0.3 + 0.2 + 0.1 ms of glue = 1.6 ms
    assert e.table.set_index("group").loc["no op running", "measured_s"] == pytest.approx(0.0016)


def test_a_speed_is_never_said_as_0_percent_for_a_group_that_ran():
    from tunekit.core.explain import speed_pct

    assert [speed_pct(x) for x in (0.404, 0.01, 0.004, 0.0004)] == ["40%", "1%", "0.4%", "under 0.1%"]
    # 40 ms of optimizer against 0.12 ms expected: 0.3%
    slow = _trace([("aten::mm", MATMUL, 0.003, 12), ("aten::mul_", OPTIMIZER, 0.040, 14)], wall_s=0.043)
    expected = Expected(step_s=0.00312, tokens_per_s=0.0, mfu=0.0, rows=[
        ("mm", "matmul", 12, 0.003, "compute", "MAMF"), ("optimizer step", "optimizer", 14, 0.00012, "memory", "bw")])
    e = explain_trace(slow, expected)
    assert e.gaps == ["the optimizer step takes 93% of the step at 0.3% of the expected speed"]
    assert e.head == ("43.0 ms per step, 7% of the expected speed (3.1 ms expected by the device model, "
                      "uncalibrated)")   # 3.12 / 43 ms


def test_a_fused_attention_kernel_is_its_own_group_and_several_steps_are_divided():
    sdpa = "aten::_scaled_dot_product_flash_attention_for_cpu"
    slow_attention = _trace([(sdpa, ATTENTION, 0.006, 8), ("aten::mm", MATMUL, 0.002, 24)], wall_s=0.008)
    expected = Expected(step_s=0.002, tokens_per_s=0.0, mfu=0.0, rows=[
        ("_scaled_dot_product_flash_attention_for_cpu", "attention", 4, 0.0004, "compute", "measured"),
        ("mm", "matmul", 12, 0.0016, "compute", "MAMF")])
    e = explain_trace(slow_attention, expected, steps=2, setting=Toggles(attention="sdpa"))
    assert e.measured_s == pytest.approx(0.004)                            # two steps in the trace
    assert e.gaps[0] == "the attention ops take 75% of the step at 13% of the expected speed"  # 0.4 / 3 ms
    assert e.op_table.calls.tolist()[0] == 4                                # 8 calls over 2 steps


class _Shown:
    def __repr__(self):
        return "tunekit Lab\n  model    GPT · 426.6k params"


def test_a_busy_run_is_said_and_what_cannot_be_explained_is_refused():
    busy = Conditions(verdict="busy", reason="other processes used 1.0 of 2 CPUs")
    e = explain_trace(TRACE, EXPECTED, conditions=busy)
    assert [n.kind for n in e.notes] == ["explain.busy"]
    with pytest.raises(ValueError, match="nothing traced to explain"):
        explain_trace(None, EXPECTED)
    with pytest.raises(ValueError, match="no expectation"):
        explain_trace(TRACE, None)
    with pytest.raises(ValueError, match="needs the plan"):
        tunekit.explain(TRACE)
    with pytest.raises(TypeError, match=r"explains a traced run: a Lab's RunResult .* or a Breakdown; got int 42"):
        tunekit.explain(42)      # not a run: said so, not that a plan is missing
    with pytest.raises(TypeError) as refused:  # a multi-line repr (a Lab's, a list of runs): its first line
        tunekit.explain(["run #0 baseline\n  speed 1 tokens/s"])
    assert str(refused.value).endswith("got list ['run #0 baseline\\n  speed 1 tokens/s']")
    with pytest.raises(TypeError) as refused:
        tunekit.explain(_Shown())
    assert str(refused.value).endswith("got _Shown tunekit Lab ...") and "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="steps must be a whole number"):
        tunekit.explain(TRACE, EXPECTED, steps=0)
    assert tunekit.explain(TRACE, EXPECTED).efficiency == pytest.approx(0.5)


def test_a_lab_explains_its_traced_run_against_its_own_plan():
    lab = tunekit.Lab(seq_len=32)
    with pytest.raises(ValueError, match="no traced run"):
        lab.explain()
    r = lab.run(steps=2, warmup=1, micro_batch=2, trace=True, verbose=False)
    e = lab.explain()
    assert e.label == f"run #{r.run_id} ({r.label})"
    assert e.measured_s == r.step_s and e.expected_s > 0   # the headline: the step timed without the profiler
    groups = e.table.set_index("group")
    assert {"matmul", "optimizer", "elementwise, norms, copies"} <= set(groups.index)
    assert (groups.measured_s > 0).all() and math.isclose(groups.share.sum(), 1.0, rel_tol=0.25)
    assert lab.explain(r.run_id).rows == e.rows
    with pytest.raises(ValueError, match="no run #99"):
        lab.explain(99)
    # the run plans itself through the Lab that ran it: its model, setting and device
    assert tunekit.explain(r).rows == e.rows and tunekit.explain(r).label == e.label
    back = pickle.loads(pickle.dumps(r))          # saved or read back: no Lab to plan with, said
    assert back.explainer is None
    with pytest.raises(ValueError, match="needs the plan"):
        tunekit.explain(back)


def test_a_run_read_back_from_a_log_is_told_the_plan_call_of_its_own_step():
    from tunekit.core.results import RunResult

    # `tunekit run --trace --log runs.jsonl`, then tunekit.explain(RunLog.load(...)[1]): the run knows
    # its device and setting, so the message writes the call ("tunekit.plan(model, 'cpu', ...)" left
    # the reader to find each keyword)
    r = RunResult.from_dict({"run_id": 1, "label": "ckpt", "device": "cpu (2 threads)", "model": "GPT",
                             "n_params": 426624, "precision": "fp32", "checkpointing": True, "micro_batch": 8,
                             "grad_accum": 1, "seq_len": 128, "optimizer": "adamw", "attention": "sdpa",
                             "compile": False, "lr": 0.001})
    with pytest.raises(ValueError) as info:
        tunekit.explain(r)
    assert str(info.value) == (
        "tunekit.explain needs the plan of the step run #1 (ckpt) ran, and a run read back from a log has no Lab "
        "to plan it: tunekit.explain(run, tunekit.plan(model, 'cpu', precision='fp32', checkpointing=True, "
        "micro_batch=8, grad_accum=1, seq_len=128, optimizer='adamw', attention='sdpa', compile=False)), "
        "model: its GPT (426,624 parameters)")


def test_the_one_line_carries_the_largest_gap_and_what_the_figures_carry_besides():
    busy = Conditions(verdict="busy", reason="other processes used 1.0 of 2 CPUs")
    gap = ("the elementwise ops, norms and copies take 30% of the step at 23% of the expected speed: eager: each "
           "elementwise op is a kernel of its own (torch.compile fuses them)")
    head = "10.0 ms per step, 50% of the expected speed (5.0 ms expected by the device model, uncalibrated)"
    assert explain_trace(TRACE, EXPECTED).line == f"{head}; {gap}"
    assert explain_trace(TRACE, EXPECTED, conditions=busy).line == f"{head}; {gap} · ⚠ taken on a busy machine"
    slowed = _trace([("aten::mm", MATMUL, 0.004, 12)], wall_s=0.010)
    slowed.overhead = 0.5                                  # the traced step took 1.5x the untraced one
    e = explain_trace(slowed, EXPECTED)
    assert e.line.endswith(" · the profiler slowed the traced step by 50%")
    assert [n.kind for n in e.notes] == ["explain.profiler"]
    slowed.overhead = 0.04                                 # under 5%: neither said nor noted
    assert " · " not in explain_trace(slowed, EXPECTED).line
    quick = _trace([("aten::mm", MATMUL, 0.0034, 12)], wall_s=0.005)   # the matmuls as expected: no gap
    assert explain_trace(quick, EXPECTED).line == ("5.0 ms per step, 100% of the expected speed (5.0 ms expected "
                                                   "by the device model, uncalibrated)")


def test_a_traced_lab_run_keeps_its_one_line_and_an_untraced_one_plans_nothing(monkeypatch):
    import dataclasses

    from tunekit.core.efficiency import Figures
    from tunekit.core.notes import of_kind
    from tunekit.lab import plan as lab_plans
    from tunekit.lab.explain import run_line

    lab = tunekit.Lab(seq_len=32)

    def no_plan(*a, **k):
        raise AssertionError("an untraced run plans nothing")

    monkeypatch.setattr(lab, "plan", no_plan)
    plain = lab.run(steps=1, warmup=0, micro_batch=2, verbose=False)
    assert plain.explained is None and of_kind(plain.notes, "explain.none") == []
    assert not any(line.startswith("  traced") for line in repr(plain).splitlines())
    monkeypatch.undo()

    r = lab.run(steps=1, warmup=0, micro_batch=2, trace=True, verbose=False)
    assert r.explained == lab.explain(r).line                  # the same plan, made after the steps
    assert r.explained.startswith(f"{fmt_ms(r.step_s)} per step, ")   # the run's own step, not the traced one
    assert f"  traced   {r.explained}" in repr(r).splitlines()
    assert lab.runs[-1].explained == r.explained               # kept in the log

    # what cannot be planned is said in a note of its own kind, the run stands without its line
    def why(run):
        line, notes = run_line(lab, run)
        assert line is None and [n.kind for n in notes] == ["explain.none"]
        return str(notes[0]).removeprefix("no expected step to set this traced run against: ")

    assert why(dataclasses.replace(r, parallel="ddp")) == ("lab.explain explains a one-process run (each "
                                                          "rank's trace is its own)")
    assert why(dataclasses.replace(r, device="NVIDIA Imaginary 9000")) == (
        "no spec-table row for 'NVIDIA Imaginary 9000': nothing to expect this run's step on")
    on_gpu = dataclasses.replace(r, device="NVIDIA H100 80GB HBM3", toggles=r.toggles.replace(precision="bf16"))
    gpu, notes = run_line(lab, on_gpu)                         # planned on the spec table's bf16 figures
    assert notes == [] and gpu.startswith(f"{fmt_ms(r.step_s)} per step, ")
    bare = Figures(name="cpu", peak_tflops=None, mamf_tflops=None, mamf_source="", bandwidth_tbs=None,
                   bandwidth_source="", launch_s=0.0, launch_source="", host_bound=True)
    monkeypatch.setattr("tunekit.planning.expect.cpu_figures", lambda *a, **kw: bare)   # a CPU with no figures
    lab_plans._PLANS.pop(lab, None)    # planned afresh: the Lab's cache holds this shape's plan (lab.plan.cached_plan)
    assert why(r).startswith("no expected step on cpu (fp32): tunekit has no figure for its maximum achievable "
                             "matmul TFLOPS (MAMF)")

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(lab, "plan", boom)
    lab_plans._PLANS.pop(lab, None)
    failed = lab.run(steps=1, warmup=0, micro_batch=2, trace=True, verbose=False)
    assert failed.status == "ok" and failed.explained is None and failed.trace is not None
    assert [str(n) for n in of_kind(failed.notes, "explain.none")] == [
        "no expected step to set this traced run against: planning its step failed (RuntimeError: boom)"]


def test_a_profiled_block_with_a_plan_shows_its_line_and_bad_plans_are_refused_before_it():
    import torch

    w = torch.randn(64, 64, requires_grad=True)
    with tunekit.profile(name="mm", flops="never", trace=True, plan=EXPECTED, steps=2) as rec:
        for _ in range(2):
            (torch.randn(32, 64) @ w).sum().backward()
    assert rec.explained == tunekit.explain(rec, EXPECTED, steps=2).line
    assert rec.explained.startswith(f"{fmt_ms(rec.trace.wall_s / 2)} per step, ")    # two steps in the block
    assert "(5.0 ms expected by the device model, uncalibrated)" in rec.explained and "  vs plan" in repr(rec)
    for kw, words in ((dict(plan=EXPECTED), "add trace=True"), (dict(trace=True, plan=3), "int, not a Plan"),
                      (dict(trace=True, plan=EXPECTED, steps=0), "steps is how many"), (dict(steps=2), "with plan")):
        with pytest.raises(ValueError, match=words):
            tunekit.profile(name="bad", **kw)


def test_an_untraced_cluster_run_is_its_whole_step_against_the_plan_and_says_where_it_ran():
    from tunekit.core.explain import explain_step, job_words
    from tunekit.core.results import RunResult

    job = {"engine": "slurm", "id": "12", "nodes": "n[0-1]", "partition": "gpu", "state": "COMPLETED",
           "ranks": [{"rank": 0, "node": "n0", "cpus": [0, 1, 2, 5]}, {"rank": 1, "node": "n1", "cpus": None}]}
    words = job_words(job)
    assert words == "slurm job 12 on n[0-1] (partition gpu, COMPLETED); rank 0 on n0 (CPUs 0-2,5), rank 1 on n1"
    e = explain_step(EXPECTED, step_s=0.02, label="run #4 (ddp 2x1)", where=words)
    # the whole step: 5 ms expected of 20 ms measured = 25% of the expected speed; the plan's groups
    # beside it, their measured side unknown: matmul 3 + 0.4 ms, elementwise 0.2 + 0.5 ms, optimizer 0.9 ms
    t = e.table
    assert t.loc[0, ["group", "measured_s", "expected_s", "efficiency", "share"]].tolist() == \
        pytest.approx(["whole step", 0.02, 0.005, 0.25, 1.0])
    assert dict(zip(t["group"][1:], t["expected_s"][1:])) == pytest.approx(
        {"matmul": 0.0034, "elementwise, norms, copies": 0.0007, "optimizer": 0.0009})
    assert t["measured_s"][1:].isna().all()
    assert e.summary.splitlines()[:2] == ["run #4 (ddp 2x1): 20.0 ms per step, 25% of the expected speed (5.0 ms "
                                          "expected by the device model, uncalibrated)", f"note: {words}"]
    r = RunResult.from_dict({"label": "ddp 2x1", "step_s": 0.02, "job": job})    # read back from a log
    assert str(tunekit.explain(r, EXPECTED).notes[0]) == words
    with pytest.raises(ValueError, match="nothing traced to explain"):        # not a cluster run: as before
        tunekit.explain(RunResult.from_dict({"label": "x", "step_s": 0.02}), EXPECTED)


# a small CNN's step as a CPU trace shows it: 100 ms in oneDNN's convolution kernel under the
# conv2d > convolution > _convolution chain (one call, 0.1 ms of self time each level), 8 ms in
# its backward, 10 ms of batch norm, 1.7 ms of relu; the plan's step: convolution 60 ms,
# convolution_backward 6 ms (compute), native_batch_norm 5 ms, relu 1 ms (memory-bound)
CNN = _trace([("aten::mkldnn_convolution", MATMUL, 0.100, 1), ("aten::conv2d", "other", 0.0001, 1),
              ("aten::convolution", MATMUL, 0.0001, 1), ("aten::_convolution", MATMUL, 0.0001, 1),
              ("aten::convolution_backward", MATMUL, 0.008, 1), ("aten::native_batch_norm", "normalization", 0.010, 1),
              ("aten::relu", ELEMENTWISE, 0.0017, 1)], wall_s=0.120)
CNN_EXPECTED = Expected(step_s=0.072, tokens_per_s=0.0, mfu=0.0, rows=[
    ("convolution", "compute", 1, 0.060, "compute", "MAMF"),
    ("convolution_backward", "compute", 1, 0.006, "compute", "MAMF"),
    ("_native_batch_norm_legit", "memory-bound", 1, 0.005, "memory", "copy bandwidth"),   # the fake step's name
    ("relu", "memory-bound", 1, 0.001, "memory", "copy bandwidth")])


def test_a_convolution_is_compute_of_its_own_and_its_kernels_are_the_plans_convolution():
    e = explain_trace(CNN, CNN_EXPECTED, label="cnn")
    t = e.table.set_index("group")
    # 100 + 3 x 0.1 + 8 = 108.3 ms measured, 60 + 6 = 66 ms expected: 66 / 108.3 = 0.6094
    assert t.loc["convolution", ["measured_s", "expected_s"]].tolist() == pytest.approx([0.1083, 0.066])
    assert t.loc["elementwise, norms, copies", "measured_s"] == pytest.approx(0.0117)   # 10 + 1.7 ms
    assert "matmul" not in t.index
    # 108.3 / 120 = 90% of the step at 61% of the expected speed
    assert e.gaps[0] == "the convolutions take 90% of the step at 61% of the expected speed"
    # mkldnn_convolution is the plan's convolution (one call), its _native_batch_norm_legit the run's native_batch_norm
    assert e.unforeseen == []
    assert e.ops[0][0] == "convolution" and e.ops[0][4] == 1


def test_a_convolutions_flops_are_counted():
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    by_op = tunekit.count_flops(lambda: net(x).sum().backward()).by_op
    # 2 x N x Cout x Hout x Wout x Cin x kh x kw = 2 x 2 x 8 x 6 x 6 x 3 x 3 x 3 = 31104 forward;
    # backward: the input's and the weight's gradients, 2 x 31104 = 62208
    assert (by_op["aten.convolution"], by_op["aten.convolution_backward"]) == (31104, 62208)
