"""Trace breakdown, memory timeline and energy (issue 13, items 1-3); shares that add up to 100% and
no negative profiler overhead (issue 18)."""
import json
import math
import pathlib
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

import tunekit
from tunekit.core import breakdown as bd
from tunekit.core.breakdown import categorize
from tunekit.core.summary import to_text
from tunekit.measure import energy
from tunekit.measure.trace import MARK, Tracer, breakdown_from_events


@pytest.fixture(autouse=True)
def _traces_in_tmp(tmp_path, monkeypatch):
    # Chrome traces and snapshots go under core.paths.traces_dir(): each test its own
    monkeypatch.setenv("TUNEKIT_DATA_DIR", str(tmp_path))


# --- the rules: exact categories for op names ------------------------------------------------------

CASES = [
    (["aten::mm", "aten::matmul", "aten::linear"], bd.MATMUL),
    (["aten::as_strided", "aten::transpose", "aten::linear"], bd.MATMUL),      # inside linear
    (["aten::addmm"], bd.MATMUL),
    (["aten::mm", "MmBackward0", "autograd::engine::evaluate_function: MmBackward0"], bd.MATMUL),
    (["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"], bd.MATMUL),                  # a CUDA kernel name
    (["aten::mm", "nn.Module: Linear", "nn.Module: CausalSelfAttention"], bd.MATMUL),  # q/k/v projection
    (["aten::_scaled_dot_product_flash_attention_for_cpu", "aten::scaled_dot_product_attention"], bd.ATTENTION),
    (["aten::empty", "aten::_scaled_dot_product_efficient_attention"], bd.ATTENTION),
    (["aten::_scaled_dot_product_flash_attention_for_cpu_backward",
      "ScaledDotProductFlashAttentionForCpuBackward0"], bd.ATTENTION),
    (["aten::mul", "nn.Module: CausalSelfAttention"], bd.ATTENTION),          # rotary / scaling
    (["aten::native_layer_norm", "aten::layer_norm"], bd.NORM),
    (["aten::native_layer_norm_backward", "NativeLayerNormBackward0"], bd.NORM),
    (["aten::pow", "nn.Module: RMSNorm", "nn.Module: Block"], bd.NORM),        # hand-written RMSNorm
    (["aten::mul", "MulBackward0", "autograd::engine::evaluate_function: MulBackward0",
      "aten::mul", "nn.Module: RMSNorm"], bd.NORM),                            # its backward, via the forward chain
    (["aten::gelu"], bd.ELEMENTWISE),
    (["aten::gelu_backward", "GeluBackward0"], bd.ELEMENTWISE),
    (["aten::silu", "nn.Module: LlamaMLP"], bd.ELEMENTWISE),
    (["aten::add", "nn.Module: Block"], bd.ELEMENTWISE),
    (["aten::_log_softmax", "aten::log_softmax", "aten::cross_entropy_loss"], bd.ELEMENTWISE),
    (["aten::mul_", "Optimizer.step#AdamW.step"], bd.OPTIMIZER),
    (["aten::mm", "Optimizer.step#Muon.step"], bd.OPTIMIZER),                  # a matmul of the optimizer
    (["aten::_foreach_lerp_", "Optimizer.step#AdamW.step"], bd.OPTIMIZER),
    (["aten::zero_", "Optimizer.zero_grad#AdamW.zero_grad"], bd.OPTIMIZER),
    (["c10d::allreduce_"], bd.COMM),
    (["record_param_comms", "c10d::allreduce_"], bd.COMM),
    (["ncclDevKernel_AllReduce_Sum_f32_RING_LL"], bd.COMM),
    (["aten::copy_", "nccl:all_reduce"], bd.COMM),
    (["Memcpy HtoD (Pageable -> Device)", "aten::copy_", "aten::_to_copy", "aten::to"], bd.MEMCPY),
    (["Memcpy DtoH (Device -> Pinned)", "aten::copy_"], bd.MEMCPY),
    (["aten::index", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"], bd.DATA),
    (["aten::embedding"], bd.OTHER),
    (["aten::view"], bd.OTHER),
    (["nn.Module: GPT"], bd.OTHER),
    ([], bd.OTHER),
]


@pytest.mark.parametrize("chain,expected", CASES, ids=[" < ".join(c[:2]) or "empty" for c, _ in CASES])
def test_each_op_gets_exactly_one_category_from_the_rules(chain, expected):
    assert categorize(chain) == expected


def test_every_rule_names_a_known_category_and_pass():
    assert {p for p, _, _ in bd.RULES} == {"scope", "op", "module", "pointwise"}
    assert {c for _, c, _ in bd.RULES} <= set(bd.CATEGORIES)


# --- a real trace of a cpu-tiny training step ------------------------------------------------------


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = tunekit.Lab(micro_batch=2, seq_len=32, log_path=tmp_path_factory.mktemp("runs") / "log.jsonl")
    t = lab.resolve()
    lab.apply(t)
    lab.train_step(t)  # the optimizer state exists: the traced step is a steady one
    return lab


def _traced_step(lab, tmp_path, memory=False, tracer=False, **changes):
    t = lab.resolve(**changes)
    tr = Tracer("step", trace=True, memory=memory, folder=tmp_path).start()
    wall = tunekit.measure.time_repeats(lambda: lab.train_step(t), warmup=0, repeats=1)[0]
    out = tr.stop(wall)
    return (*out, tr) if tracer else out


def test_breakdown_of_a_training_step_counts_every_op_once(lab, tmp_path):
    # what holds however busy the machine is: every op's self time lands in exactly one category,
    # and the profiled ops all ran inside the timed call, so their self times add up to at most its
    # wall time. How much of it they cover is a measurement (a busy machine descheduling the
    # process between ops leaves more to untraced_s): shown, never asserted
    b, tl, tr = _traced_step(lab, tmp_path, tracer=True)
    # the ops of the block's thread (the one the start marker is on; another thread's ops ran beside
    # the block, not in its time), without Python-function events (the interpreter: untraced_s)
    events = tr.prof.events()
    mine = next(e.thread for e in events if e.name == MARK)
    self_s = sum(e.self_cpu_time_total for e in events if e.thread == mine and e.name != MARK
                 and not e.name.startswith("[") and not getattr(e, "is_python_function", False)) / 1e6
    # ... scaled down to the wall time when the profiler's window was a hair wider than our clock
    assert b.total_s() == pytest.approx(min(self_s, b.wall_s), rel=1e-12) and 0 < b.total_s() <= b.wall_s
    assert math.isclose(b.untraced_s, b.wall_s - b.total_s())
    assert tl is None and b.device == "cpu" and bd.IDLE not in b.seconds
    # after torch.compile ran anywhere in this process (earlier tests) the tracer installs no module
    # scopes and says so; the GPT's hand-written LayerNorm ops then count as elementwise
    scoped = not any("torch.compile in use" in n for n in b.notes)
    for cat in (bd.MATMUL, bd.ATTENTION, bd.ELEMENTWISE, bd.OPTIMIZER) + ((bd.NORM,) if scoped else ()):
        assert b.seconds[cat] > 0, cat
    assert b.seconds[bd.COMM] == b.seconds[bd.MEMCPY] == b.seconds[bd.DATA] == 0  # none on one CPU
    # the top ops: largest first, aten::mm among them as a matmul; 27 mm calls: forward 9 linears
    # (2 blocks x 4 + lm head), backward 2 per linear (input and weight grads) = 9 + 18
    selfs = [r["self_s"] for r in b.top_ops]
    assert selfs == sorted(selfs, reverse=True)
    mm = [r for r in b.top_ops if r["op"] == "aten::mm"]
    assert mm and mm[0]["category"] == bd.MATMUL and sum(r["calls"] for r in mm) == 27
    trace = json.loads(pathlib.Path(b.path).read_text())
    assert pathlib.Path(b.path).parent == tmp_path and any(e.get("name") == "aten::mm" for e in trace["traceEvents"])


def test_the_profiler_is_off_and_the_module_ranges_removed_after_stop(lab, tmp_path):
    from torch.nn.modules import module

    hooks = len(module._global_forward_pre_hooks), len(module._global_forward_hooks)
    _traced_step(lab, tmp_path)
    assert not torch.autograd.profiler._is_profiler_enabled
    assert (len(module._global_forward_pre_hooks), len(module._global_forward_hooks)) == hooks


def test_memory_timeline_shows_parameters_gradients_optimizer_state_and_activations(lab, tmp_path):
    _, tl = _traced_step(lab, tmp_path, memory=True)
    params = list(lab.model.parameters())
    p_bytes = sum(p.numel() * p.element_size() for p in params)
    peak = {c: max(v) for c, v in tl.bytes.items()}
    assert set(peak) == set(bd.MEMORY_CATEGORIES)
    assert peak["parameters"] == p_bytes                  # fp32 weights, alive throughout
    assert peak["gradients"] == p_bytes                   # one fp32 gradient per weight
    # AdamW: exp_avg and exp_avg_sq per weight (2 x params) plus a 4-byte fp32 `step` per tensor
    assert peak["optimizer state"] == 2 * p_bytes + 4 * len(params)
    assert peak["activations"] > 0
    assert len(tl.times_s) == len(tl.bytes["parameters"]) and tl.times_s[0] == 0
    assert "no allocator snapshot on CPU" in " ".join(tl.notes)


def test_profile_traces_the_first_run_and_counts_flops_on_an_untraced_one(lab):
    # what is asked for comes first (issue 33): the first traced run is traced; it counts no FLOPs
    # (the counter would be traced as the work), an untraced run counts them, a traced one reuses them
    t = lab.resolve()
    for traced in (True, False, True):
        with tunekit.profile(name="step", trace=traced, inputs=(lab.model, t)):
            lab.train_step(t)
    first, counted, last = tunekit.history(all=True).to_dict("records")[-3:]
    assert first["flops_source"] == "none" and first["trace"].startswith(bd.CATEGORIES + (bd.UNTRACED,))
    assert "no FLOPs: this traced run counts none" in first["notes"] and "not counted yet" in first["notes"]
    assert counted["flops_source"] == "counted" and pd.isna(counted["trace"])
    assert last["flops_source"] == "cached" and last["trace"].startswith(bd.CATEGORIES + (bd.UNTRACED,))
    assert math.isnan(last["tflops"]) and "timed under torch.profiler" in last["notes"]
    assert tunekit.last().trace.path.endswith(".json")


def test_counting_every_run_and_tracing_exclude_each_other():
    for kw in ({"trace": True}, {"memory": True}):
        with pytest.raises(ValueError, match="flops='always' counts every run, and a traced run counts none"):
            tunekit.profile(name="x", flops="always", **kw)


@pytest.mark.parametrize("untraced_s", [1e-9, 1e9])  # the traced run is certainly slower / faster
def test_overhead_is_measured_against_the_last_untraced_run(lab, untraced_s):
    from tunekit.measure import history

    t = lab.resolve()
    for traced in (False, True):  # one block (one line), run untraced then traced
        with tunekit.profile(name="s", flops="never", trace=traced) as rec:
            lab.train_step(t)
        (key,) = history.LAST_WALLS  # the untraced run's time, replaced by one the test controls
        history.LAST_WALLS[key] = untraced_s
    assert rec.trace.untimed_wall_s == untraced_s
    if untraced_s < rec.wall_s:
        assert rec.trace.overhead == rec.wall_s / untraced_s - 1 and rec.trace.overhead_text().startswith("+")
    else:  # a faster traced run is noise: no negative overhead anywhere
        assert math.isnan(rec.trace.overhead) and "faster than the untraced one" in " ".join(rec.trace.notes)
        assert rec.trace.overhead_text() == "lost in noise (the traced run was the faster)"
        assert "profiler overhead lost in noise" in to_text(rec)
        assert "-" not in tunekit.view.plot_breakdown(rec).layout.title.text


def test_trace_arguments_are_checked_before_any_work():
    with pytest.raises(ValueError, match="trace must be True or False"):
        tunekit.profile(trace="yes")
    with pytest.raises(ValueError, match="trace and memory"):
        Tracer("x", memory=1)


@pytest.mark.slow
def test_lab_run_traces_one_extra_step_and_logs_it(lab):
    r = lab.run(steps=1, warmup=0, trace=True, memory=True)
    assert r.steps == 1 and r.trace.wall_s > 0 and r.memory.bytes["parameters"][0] > 0
    # the breakdown is the median of TRACED_STEPS (3) traced steps; the timeline and the Chrome trace the first's
    assert any("median of 3 traced steps" in n for n in r.trace.notes) and pathlib.Path(r.trace.path).exists()
    over = bd.profiler_overhead(r.trace.wall_s, r.trace.untimed_wall_s)  # NaN when the traced step was faster
    assert r.trace.overhead == over or (math.isnan(over) and math.isnan(r.trace.overhead))
    assert math.isnan(r.energy_j) and math.isnan(r.j_per_token) and r.energy_source is None
    row = lab.results(all=True).iloc[-1]
    assert row["trace"] == r.trace.short() and row["memory"] == r.memory.short()
    back = tunekit.lab.runlog.RunLog.load(lab.log.path)[-1]  # the JSONL log keeps them as dicts
    assert back.trace["seconds"] == pytest.approx(r.trace.seconds) and bd.short(back.trace) == r.trace.short()
    with pytest.raises(tunekit.core.toggles.ToggleError, match="trace must be True or False"):
        lab.run(steps=1, trace="yes")


def test_max_batch_search_says_no_snapshot_on_cpu_and_saves_one_on_a_cuda_oom(lab, monkeypatch, tmp_path):
    from tunekit.lab import maxbatch

    found = lab.find_max_batch_size(limit=2, seq_len=16)
    assert "no allocator snapshot on cpu" in " ".join(found.notes)
    # the CUDA path with torch's snapshot dump mocked: a trial that runs out of memory leaves a file
    monkeypatch.setenv("TUNEKIT_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(tunekit.measure.torch_private, "cuda_memory_snapshot",
                        lambda p: pathlib.Path(p).write_text("x") and str(p))

    def oom(t):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(lab, "train_step", oom)
    trial = maxbatch._trial(lab, lab.resolve(micro_batch=4), 0, None, [], history=True)
    assert not trial.fits and trial.reason.startswith("OOM") and trial.reason.kind == "trial.oom"
    assert pathlib.Path(trial.snapshot).parent == tmp_path / "traces" and "oom-mb4" in trial.snapshot


# --- fake profiler events: the CPU path's arithmetic, the GPU path (unverified on a real GPU here) --


def _ev(name, parent=None, kernels=(), seq=-1, device="CPU", start=0.0, end=0.0, self_us=0.0):
    return SimpleNamespace(name=name, cpu_parent=parent, kernels=list(kernels), sequence_nr=seq,
                           device_type=SimpleNamespace(name=device), time_range=SimpleNamespace(start=start, end=end),
                           self_cpu_time_total=self_us, is_python_function=False)


def test_cpu_breakdown_is_self_time_by_category_and_the_rest_untraced():
    # fake events (the clock injected): linear 10 us around mm 600 us; layer_norm 100 us; an
    # optimizer step range 50 us around _foreach_mul_ 200 us; the run took 1200 us
    linear = _ev("aten::linear", self_us=10.0)
    mm = _ev("aten::mm", linear, self_us=600.0)
    norm = _ev("aten::native_layer_norm", self_us=100.0)
    opt = _ev("Optimizer.step#AdamW.step", self_us=50.0)
    foreach = _ev("aten::_foreach_mul_", opt, self_us=200.0)
    b = breakdown_from_events([linear, mm, norm, opt, foreach], wall_s=1.2e-3, device="cpu")
    # matmul 10 + 600 = 610 us, norm 100 us, optimizer 50 + 200 = 250 us: 960 us traced,
    # untraced 1200 - 960 = 240 us (Python between ops)
    assert b.seconds[bd.MATMUL] == pytest.approx(610e-6) and b.seconds[bd.NORM] == pytest.approx(100e-6)
    assert b.seconds[bd.OPTIMIZER] == pytest.approx(250e-6) and b.total_s() == pytest.approx(960e-6)
    assert b.untraced_s == pytest.approx(240e-6) and bd.IDLE not in b.seconds
    assert [(r["op"], r["calls"]) for r in b.top_ops] == [
        ("aten::mm", 1), ("aten::_foreach_mul_", 1), ("aten::native_layer_norm", 1),
        ("Optimizer.step#AdamW.step", 1), ("aten::linear", 1)]


def test_gpu_breakdown_is_kernel_time_by_category_plus_idle():
    k = lambda name, us: SimpleNamespace(name=name, duration=us)  # noqa: E731
    linear = _ev("aten::linear")
    mm = _ev("aten::mm", linear, [k("sm90_xmma_gemm", 600.0)])
    copy = _ev("aten::copy_", None, [k("Memcpy HtoD (Pageable -> Device)", 100.0)])
    opt = _ev("Optimizer.step#AdamW.step")
    foreach = _ev("aten::_foreach_mul_", opt, [k("multi_tensor_apply_kernel", 200.0)])
    gpu = [_ev("sm90_xmma_gemm", device="CUDA", start=100, end=700),
           _ev("Memcpy HtoD", device="CUDA", start=0, end=100),
           _ev("multi_tensor_apply_kernel", device="CUDA", start=800, end=1000)]
    b = breakdown_from_events([linear, mm, copy, opt, foreach, *gpu], wall_s=1.2e-3, device="cuda")
    # kernels: 600 us matmul, 100 us memcpy, 200 us optimizer; busy = union 0-700 + 800-1000 = 900 us
    # idle = 1200 - 900 = 300 us
    assert b.seconds[bd.MATMUL] == pytest.approx(600e-6) and b.seconds[bd.MEMCPY] == pytest.approx(100e-6)
    assert b.seconds[bd.OPTIMIZER] == pytest.approx(200e-6) and b.seconds[bd.IDLE] == pytest.approx(300e-6)
    assert b.total_s() == pytest.approx(b.wall_s) and math.isnan(b.untraced_s)
    assert b.top_ops[0] == {"op": "aten::mm", "category": bd.MATMUL, "self_s": pytest.approx(600e-6), "calls": 1}


def test_gpu_tracer_records_kernels_and_a_memory_snapshot_with_torch_mocked(monkeypatch, tmp_path):
    from tunekit.measure import torch_private, trace

    calls = []
    monkeypatch.setattr(torch_private, "cuda_memory_history", lambda on, **kw: calls.append(on))
    monkeypatch.setattr(torch_private, "cuda_memory_snapshot", lambda p: calls.append(str(p)) or str(p))
    seen = {}
    real = torch.profiler.profile

    def fake_profile(activities, **kw):
        seen["activities"] = activities
        return real(activities=[torch.profiler.ProfilerActivity.CPU], **kw)

    monkeypatch.setattr(torch.profiler, "profile", fake_profile)
    monkeypatch.setattr(trace, "timeline_from_profile", lambda prof, dev: bd.MemoryTimeline(dev, [0.0], {}))
    tr = Tracer("gpu step", trace=False, memory=True, cuda_index=0, folder=tmp_path).start()
    torch.ones(4).sum()
    _, tl = tr.stop(1e-3)
    assert torch.profiler.ProfilerActivity.CUDA in seen["activities"]
    assert calls[0] is True and calls[-1] is False and calls[1].endswith(".pickle")
    assert tl.device == "cuda:0" and tl.snapshot_path == calls[1]


def test_a_snapshot_not_written_is_said_in_the_timeline_found_by_its_note_s_kind(monkeypatch, tmp_path, reworded):
    from tunekit.measure import torch_private, trace

    def full_disk(path):
        raise OSError(28, "No space left on device")

    real = torch.profiler.profile
    monkeypatch.setattr(torch.profiler, "profile", lambda activities, **kw: real(
        activities=[torch.profiler.ProfilerActivity.CPU], **kw))
    monkeypatch.setattr(torch_private, "cuda_memory_history", lambda on, **kw: None)
    monkeypatch.setattr(torch_private, "cuda_memory_snapshot", full_disk)
    monkeypatch.setattr(trace, "timeline_from_profile", lambda prof, dev: bd.MemoryTimeline(dev, [0.0], {}))
    said = []
    for words in ("as written", "reworded"):
        if words == "reworded":
            reworded(trace)
        tr = Tracer("gpu step", trace=False, memory=True, cuda_index=0, folder=tmp_path).start()
        tr.notes.append("a plain note that speaks of a snapshot")   # its words alone: not the timeline's
        torch.ones(4).sum()
        _, tl = tr.stop(1e-3)
        assert tl.snapshot_path is None
        said.append(tl.notes)
    assert said == [["no memory snapshot: [Errno 28] No space left on device"], ["REWORDED trace.snapshot"]]


# --- energy --------------------------------------------------------------------------------------


def _powercap(root, packages):
    for name, (uj, max_uj) in packages.items():
        d = root / name
        d.mkdir(parents=True)
        (d / "energy_uj").write_text(f"{uj}\n")
        (d / "max_energy_range_uj").write_text(f"{max_uj}\n")


def test_rapl_energy_sums_packages_skips_subdomains_and_handles_wrap_around(tmp_path):
    _powercap(tmp_path, {"intel-rapl:0": (999_000_000, 1_000_000_000), "intel-rapl:1": (5_000_000, 1_000_000_000),
                         "intel-rapl:0:0": (0, 1_000_000_000)})
    m = energy.EnergyMeter(powercap=tmp_path).start()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("2000000\n")    # wrapped: 1e9 - 999e6 + 2e6 = 3e6 uJ
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("6000000\n")    # 1e6 uJ
    (tmp_path / "intel-rapl:0:0" / "energy_uj").write_text("900000000\n")  # part of package 0: not added
    e = m.stop(wall_s=2.0)
    assert (e.joules, e.source, e.mean_w) == (4.0, "rapl", 2.0)  # (3e6 + 1e6) uJ = 4 J over 2 s = 2 W


def test_nvml_energy_counter_mocked_adds_to_rapl(tmp_path, monkeypatch):
    _powercap(tmp_path, {"intel-rapl:0": (0, 10**9)})
    readings = iter([1_000, 6_000])  # mJ since the driver loaded
    monkeypatch.setattr(energy, "_nvml_mj", lambda index: next(readings))
    m = energy.EnergyMeter(cuda_index=0, powercap=tmp_path).start()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("500000")
    e = m.stop(wall_s=0.5)
    assert (e.joules, e.source, e.mean_w) == (5.5, "nvml+rapl", 11.0)  # 5 J GPU + 0.5 J CPU over 0.5 s


def test_no_readable_counter_is_nan_with_a_note_never_zero(tmp_path, monkeypatch):
    def unsupported(index):
        raise RuntimeError("NVMLError_NotSupported")

    monkeypatch.setattr(energy, "_nvml_mj", unsupported)
    e = energy.EnergyMeter(cuda_index=0, powercap=tmp_path / "missing").start().stop(1.0)
    assert math.isnan(e.joules) and math.isnan(e.mean_w) and e.source is None
    assert "NVML has no energy counter" in e.note and "no RAPL" in e.note


def test_rapl_on_this_machine_is_reported_as_it_is():
    readable = energy.rapl_packages()
    e = energy.EnergyMeter().start().stop(1.0)
    assert (e.source == "rapl") == bool(readable)
    if not readable:
        assert math.isnan(e.joules) and energy.rapl_reason() in e.note


# --- the magic ---------------------------------------------------------------------------------------

STEP = "%%gpuprofile -q -n traced --trace\nx = torch.randn(batch_size, 128)\nmodel(x).sum().backward()"


def test_magic_trace_and_memory_in_a_real_shell(run):
    run(STEP)   # the first run: traced, as asked; no FLOPs (none counted yet)
    first = tunekit.last()
    assert first.trace.seconds[bd.MATMUL] > 0 and first.flops_source == "none"
    run(STEP.replace(" --trace", ""))   # an untraced run counts
    run(STEP.replace("--trace", "--trace --memory"))
    rec = tunekit.last()
    assert rec.flops_source == "cached" and rec.trace.seconds[bd.MATMUL] > 0
    assert rec.memory.bytes["parameters"][0] == 128 * 128 * 4  # the Linear's fp32 weight: 65536 bytes
    assert pathlib.Path(rec.trace.path).is_file()
    row = tunekit.history(all=True).iloc[-1]
    assert row["trace"] == rec.trace.short() and row["memory"] == rec.memory.short()


def test_magic_shows_the_breakdown_chart_and_top_ops(run, capsys):
    run("%%gpuprofile -n shown --trace --flops never\nmodel(torch.randn(8, 128)).sum().backward()")
    out = capsys.readouterr().out
    assert "Chrome trace:" in out and "aten::mm" in out


def test_a_failing_cell_with_trace_is_recorded_and_the_profiler_stopped(run):
    r = run("%%gpuprofile -q -n boom --trace --flops never\nmodel(torch.randn(8, 128)).sum()\nraise ValueError('boom')")
    assert isinstance(r.error_in_exec, ValueError)
    rec = tunekit.last()
    assert rec.name == "boom" and rec.error == "ValueError: boom" and rec.trace.seconds[bd.MATMUL] > 0
    assert "the trace covers it up to the failure" in " ".join(rec.notes)
    assert not torch.autograd.profiler._is_profiler_enabled


def test_trace_is_for_one_cell_not_for_every_cell(run):
    r = run("%gpuprofile on --trace")
    assert r.error_in_exec is not None and "for one cell" in str(r.error_in_exec)


def test_a_trace_writes_nothing_to_stderr(tmp_path):
    # kineto prints "USDT: ... profiler_start" on stderr unless its log level is raised (a notebook
    # cell shows that as an error): the Tracer raises it, and keeps a level the user set
    import os
    import subprocess
    import sys

    # and the memory profiler's C++ "Memory block of unknown size was allocated before the
    # profiling started" line, written when a tensor made before the trace is freed in it
    code = ("import tunekit, torch, time\nfrom tunekit.measure.trace import Tracer\n"
            "x = torch.randn(100_000)\n"
            f"tr = Tracer('x', memory=True, folder=__import__('pathlib').Path({str(tmp_path)!r})).start()\n"
            "del x\ntorch.ones(8).sum()\ntr.stop(1e-3)\nimport os; print(os.environ.get('KINETO_LOG_LEVEL'))")
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stderr == "" and out.stdout.strip() == "None"


def test_nothing_is_imported_while_the_tracer_starts(tmp_path):
    # an import while the memory profiler records Python frames garbles torch's event names
    # (UnicodeDecodeError reading them, the trace lost); record_function's first call in a process
    # imports torch code, so the tracer's marker runs once before the profiler starts
    import subprocess
    import sys

    code = ("import sys, pathlib, torch, tunekit\nfrom tunekit.measure.trace import Tracer\n"
            "enter, seen = torch.profiler.profile.__enter__, []\n"
            "def spy(self):\n    out = enter(self)\n    seen.append(set(sys.modules))\n    return out\n"
            "torch.profiler.profile.__enter__ = spy\n"
            f"tr = Tracer('x', memory=True, folder=pathlib.Path({str(tmp_path)!r})).start()\n"
            "late = sorted(set(sys.modules) - seen[0])\ntr.stop(1e-3)\nprint(late)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- on a real GPU (run with the device tool; skipped without CUDA) ----------------------------------


@pytest.mark.gpu
def test_gpu_trace_of_a_training_step_has_idle_and_adds_up(tmp_path):
    lab = tunekit.Lab(micro_batch=4, seq_len=64, log_path=tmp_path / "log.jsonl")
    r = lab.run(steps=3, warmup=1, trace=True, memory=True)
    b = r.trace
    assert b.device == "cuda" and b.seconds[bd.IDLE] >= 0 and b.seconds[bd.MATMUL] > 0
    assert abs(b.total_s() - b.wall_s) <= 0.10 * b.wall_s
    assert r.gpu_alloc_retries == 0 and r.gpu_ooms == 0
    assert r.memory.snapshot_path and pathlib.Path(r.memory.snapshot_path).stat().st_size > 0


def test_gpu_records_carry_allocator_retries_and_ooms_over_the_block(monkeypatch):
    # torch.cuda mocked (no GPU here): the counters are cumulative, the record keeps the delta
    from tunekit.measure import meters

    stats = iter([{"num_alloc_retries": 3, "num_ooms": 1}, {"num_alloc_retries": 5, "num_ooms": 1}])
    monkeypatch.setattr(meters, "cuda_device_index", lambda: 0)
    monkeypatch.setattr(meters, "torch_if_loaded", lambda: torch)
    for name, value in (("memory_allocated", 0), ("max_memory_allocated", 0), ("memory_reserved", 0)):
        monkeypatch.setattr(torch.cuda, name, lambda index=None, v=value: v)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda index=None: None)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda index=None: next(stats))
    m = meters.CudaMeter()
    m.start()
    got = m.stop()
    assert (got["gpu_alloc_retries"], got["gpu_ooms"]) == (2, 0)  # 5 - 3 retries, 1 - 1 OOMs


# --- the figures (UI: records in, plotly out) -------------------------------------------------------


def test_breakdown_and_timeline_figures_draw_what_the_records_hold():
    b = bd.Breakdown("cpu", wall_s=0.010, seconds={bd.MATMUL: 0.006, bd.OPTIMIZER: 0.003, bd.OTHER: 0.0},
                     untraced_s=0.001, overhead=0.05)
    fig = tunekit.view.plot_breakdown(b)
    # one bar per category with time, then the gap between ops: 6 + 3 + 1 = 10 ms
    assert [(t.name, t.x[0]) for t in fig.data] == [(bd.MATMUL, 6.0), (bd.OPTIMIZER, 3.0),
                                                    ("between ops (Python)", 1.0)]
    assert "+5%" in fig.layout.title.text
    tl = bd.MemoryTimeline("cpu", [0.0, 0.5, 1.0], {c: [0, 2**20, 0] for c in bd.MEMORY_CATEGORIES})
    fig = tunekit.view.plot_memory_timeline(tl)
    assert [t.name for t in fig.data] == list(bd.MEMORY_CATEGORIES) and list(fig.data[0].y) == [0, 1, 0]
    assert tl.peak() == (0.5, 5.0 * 2**20, {c: 2**20 for c in bd.MEMORY_CATEGORIES})  # 5 categories x 1 MiB
    with pytest.raises(ValueError, match="--trace"):
        tunekit.view.plot_breakdown(tunekit.ProfileRecord(name="untraced"))


def test_no_module_hooks_once_torch_compile_is_in_use(monkeypatch, tmp_path):
    # Dynamo guards on global module hooks: adding them would recompile a compiled model mid-trace
    from torch.nn.modules import module

    from tunekit.measure import torch_private

    monkeypatch.setattr(torch_private, "compiled_graphs", lambda: 1)
    hooks = len(module._global_forward_pre_hooks)
    tr = Tracer("compiled", folder=tmp_path).start()
    assert len(module._global_forward_pre_hooks) == hooks
    torch.nn.Linear(4, 4)(torch.randn(2, 4))
    b, _ = tr.stop(1e-3)
    assert "torch.compile in use" in " ".join(b.notes)


# --- shares add up to 100% (issue 18) ------------------------------------------------------------------------


def _cpu(name, self_us, thread=1, parent=None, python=False):
    return SimpleNamespace(name=name, cpu_parent=parent, kernels=[], sequence_nr=-1,
                           device_type=SimpleNamespace(name="CPU"), self_cpu_time_total=self_us,
                           is_python_function=python, thread=thread)


def test_cpu_shares_count_the_blocks_thread_and_ops_only():
    step = _cpu("Optimizer.step#AdamW.step", 50.0)
    events = [_cpu(MARK, 0.0), _cpu("aten::mm", 600.0), step, _cpu("aten::mul_", 100.0, parent=step),
              _cpu("ipython/history.py(1174): writeout_cache", 5000.0, thread=2, python=True),  # another thread
              _cpu("cell(3): <module>", 900.0, python=True),    # the interpreter: kept as untraced time
              _cpu("aten::add", 300.0, thread=2)]               # an op on another thread, beside the block
    b = breakdown_from_events(events, wall_s=1e-3)
    # block's ops: mm 600 us, optimizer 50 + 100 = 150 us; between ops 1000 - 750 = 250 us
    assert b.seconds[bd.MATMUL] == pytest.approx(600e-6) and b.seconds[bd.OPTIMIZER] == pytest.approx(150e-6)
    assert b.untraced_s == pytest.approx(250e-6) and b.total_s() <= b.wall_s
    assert sum(b.shares().values()) == pytest.approx(1.0)
    assert b.short() == "matmul/linear 60% · between ops (Python) 25% · optimizer 15%"
    assert "0.3 ms of ops on other threads ran beside the block (most: aten::add)" in " ".join(b.notes)
    assert b.frame()["share"].sum() == pytest.approx(1.0)


def test_gpu_shares_of_overlapping_kernels_add_up_to_the_wall():
    k = lambda name, us: SimpleNamespace(name=name, duration=us)  # noqa: E731
    mm = _cpu("aten::mm", 0.0)
    mm.kernels = [k("sm90_xmma_gemm", 600.0)]
    copy = _cpu("aten::copy_", 0.0)
    copy.kernels = [k("Memcpy HtoD (Pageable -> Device)", 400.0)]
    gpu = [SimpleNamespace(name=n, device_type=SimpleNamespace(name="CUDA"), time_range=SimpleNamespace(start=a, end=e),
                           cpu_parent=None, kernels=[], sequence_nr=-1) for n, a, e in
           (("sm90_xmma_gemm", 0, 600), ("Memcpy HtoD", 100, 500))]   # two streams: the copy under the matmul
    b = breakdown_from_events([mm, copy, *gpu], wall_s=1e-3, device="cuda")
    # kernels 600 + 400 = 1000 us in a busy union of 600 us: each scaled by 0.6 -> 360 and 240 us; idle 400 us
    assert b.seconds[bd.MATMUL] == pytest.approx(360e-6) and b.seconds[bd.MEMCPY] == pytest.approx(240e-6)
    assert b.seconds[bd.IDLE] == pytest.approx(400e-6) and b.total_s() == pytest.approx(b.wall_s)
    assert b.short() == "idle 40% · matmul/linear 36% · memory copy 24%" and "scaled" in " ".join(b.notes)


def test_printed_shares_are_whole_percents_that_add_up_to_100():
    # 50 + 25 + 12.5 + 6.25 + 6.25: floors 50 25 12 6 6 = 99, the largest remainder (12.5) gets the last 1
    b = bd.Breakdown("cpu", wall_s=1.0, seconds={bd.MATMUL: 0.5, bd.OPTIMIZER: 0.25, bd.ELEMENTWISE: 0.125,
                                                 bd.OTHER: 0.0625}, untraced_s=0.0625)
    assert bd.whole_percents(b.shares()) == {bd.MATMUL: 50, bd.OPTIMIZER: 25, bd.ELEMENTWISE: 13,
                                             bd.OTHER: 6, bd.UNTRACED: 6}
    assert b.short() == "matmul/linear 50% · optimizer 25% · activation/elementwise 13% · rest 12%"
    # rounding each third alone would print 33 + 33 + 33 = 99
    assert bd.whole_percents({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}) == {"a": 34, "b": 33, "c": 33}
    assert bd.Breakdown("cpu", wall_s=math.nan, seconds={bd.MATMUL: 0.1}).short() == ""  # no wall: no shares


SHARES_STEP = "%%gpuprofile -q -n traced {opts}\nx = torch.randn(batch_size, 128)\nmodel(x).sum().backward()"


@pytest.mark.parametrize("opts", ["--trace", "--trace --memory"])
def test_magic_trace_shares_add_up_to_100_percent(run, opts):
    # --memory traces Python frames too; they were once counted as op time and the summary line
    # read 'other 101% · ...' (200% in all) where tunekit.profile summed to ~100%
    run(SHARES_STEP.format(opts=opts))   # traced from the first run on
    b = tunekit.last().trace
    assert b.total_s() <= b.wall_s and sum(b.shares().values()) == pytest.approx(1.0)
    printed = [int(part.rsplit(" ", 1)[1].rstrip("%")) for part in b.short().split(" · ")]
    assert sum(printed) == 100 and tunekit.history(all=True).iloc[-1]["trace"] == b.short()
    assert f"trace      {b.short()} · profiler overhead" in to_text(tunekit.last())


# --- the profiler's overhead is never negative -----------------------------------------------------------


def test_profiler_overhead_is_never_negative():
    assert bd.profiler_overhead(3.0, 2.0) == 0.5           # 3 / 2 - 1
    assert math.isnan(bd.profiler_overhead(1.0, 2.0))      # traced faster: noise, not -50%
    assert math.isnan(bd.profiler_overhead(math.nan, 2.0)) and math.isnan(bd.profiler_overhead(1.0, 0.0))
    b = bd.Breakdown("cpu", wall_s=0.8, seconds={bd.MATMUL: 0.5}, untraced_s=0.3)
    b.compare_with(1.0)
    assert math.isnan(b.overhead) and b.untimed_wall_s == 1.0
    assert b.notes == ["the traced run was 20.0% faster than the untraced one: run-to-run noise hides the "
                       "profiler's overhead"]
    assert b.overhead_text() == "lost in noise (the traced run was the faster)"
    assert "profiler overhead lost in noise" in tunekit.view.plot_breakdown(b).layout.title.text
    b.compare_with(0.5)
    assert b.overhead == pytest.approx(0.6) and b.overhead_text() == "+60%"   # 0.8 / 0.5 - 1
