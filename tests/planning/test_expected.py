"""Plan.expected: the op model (core.expected) on hand-made ops, the plan's op count, a device
without the figures, and the CPU's expectation against a measured run (issue 31)."""
import math
import warnings

import pytest
import torch

import tunekit
from tunekit.core.efficiency import Figures, gpu_figures, wave_efficiency
from tunekit.core.expected import agreement, expect, matmul_tflops
from tunekit.core.notes import of_kind
from tunekit.planning.ops import RooflineCounter


def _fig(**kw):
    base = dict(name="toy", peak_tflops=100.0, mamf_tflops=80.0, mamf_source="m", bandwidth_tbs=1.0,
                bandwidth_source="b", launch_s=5e-6, launch_source="l", host_bound=False)
    return Figures(**{**base, **kw})


MM = ("mm", "matmul", "forward", 2 * 1024**3, 3 * 1024 * 1024 * 2, (1024, 1024, 1024, 1), 2)
ADD = ("add", "memory", "backward", 0, 10**6, None, 2)
# its fp32 twin: a CPU times a 2-byte elementwise op at 4 bytes an element (core.expected.fp32_width;
# tests/planning/test_plan_half_cpu.py), so the CPU tests below take the fp32 add to keep their bytes
ADD32 = ADD[:6] + (4,)


def test_expect_adds_compute_memory_launch_and_the_optimizer():
    e = expect([MM, ADD], _fig(), tokens=1000, model_flops=2 * 1024**3, backend=None, params=1000, param_bytes=4,
               grad_bytes=4, state_bytes=8000, optimizer_kernels=4)
    rows = {r[0]: r for r in e.rows}
    # mm: 2*1024^3 = 2147483648 FLOPs at 80 TFLOPS = 2.68435456e-05 s (its 6291456 bytes take 6.29e-06 s)
    assert rows["mm"][3] == pytest.approx(2.68435456e-05) and rows["mm"][4] == "compute"
    # add: 1e6 bytes at 1 TB/s = 1e-06 s, under the 5e-06 s launch: launch-bound
    assert rows["add"][3] == pytest.approx(5e-6) and rows["add"][4] == "launch"
    # optimizer: 1000 x (2*4 + 4) + 2*8000 = 28000 bytes = 2.8e-08 s, under 4 launches = 2e-05 s
    assert rows["optimizer step"][3] == pytest.approx(2e-5)
    assert e.step_s == pytest.approx(2.68435456e-05 + 5e-6 + 2e-5)
    # MFU: 2147483648 / 5.18435456e-05 s / 100e12 = 0.41422...
    assert e.mfu == pytest.approx(2 * 1024**3 / 5.18435456e-05 / 100e12)
    assert e.tokens_per_s == pytest.approx(1000 / 5.18435456e-05)
    df = e.by_op
    assert list(df.columns) == ["op", "category", "calls", "expected_s", "share", "bound", "source"]
    assert df.share.sum() == pytest.approx(1.0)


def test_a_cpu_adds_each_ops_dispatch_and_reads_bandwidth_by_size():
    fig = _fig(host_bound=True, bandwidth_tbs=None, bandwidth_sweep=((1000, 0.5), (10**6, 0.1)))
    e = expect([ADD32], fig, tokens=1, model_flops=0, backend=None, params=0, param_bytes=4, grad_bytes=4,
               state_bytes=0, optimizer_kernels=0)
    # 1e6 bytes at the 1e6-byte size's 0.1 TB/s = 1e-05 s, plus the 5e-06 s dispatch
    assert {r[0]: r[3] for r in e.rows}["add"] == pytest.approx(1.5e-5)
    # between the sizes in log-log: 5000 bytes is log(5)/log(1000) = 0.233 of the way, 0.5 x 0.2^0.233 = 0.34365
    assert fig.tbs_at(999) == 0.5 and fig.tbs_at(10**7) == 0.1
    assert fig.tbs_at(5000) == pytest.approx(0.5 * 0.2 ** (math.log(5) / math.log(1000)))
    assert fig.tbs_at(5000) == pytest.approx(0.34365, abs=1e-5)


def test_a_cpu_adds_the_hosts_time_for_views_and_module_calls():
    fig = _fig(host_bound=True, view_s=1e-6, module_s=2e-6, host_source="h")
    e = expect([ADD32], fig, tokens=1, model_flops=0, backend=None, params=0, param_bytes=4, grad_bytes=4,
               state_bytes=0, optimizer_kernels=0, host_calls=dict(no_kernel=300, modules=40))
    # 300 views at 1 us + 40 module calls at 2 us = 3.8e-04 s, one row of its own
    host = [r for r in e.rows if r[1] == "host"]
    assert host == [("views, metadata ops, module calls", "host", 340, pytest.approx(3.8e-4), "launch", "h")]
    # the add: 1e6 bytes at 1 TB/s = 1e-06 s plus its 5e-06 s dispatch; then the host's 3.8e-04 s
    assert e.step_s == pytest.approx(6e-6 + 3.8e-4)
    # a GPU's host runs ahead of its kernels: no such row
    gpu = expect([ADD], _fig(view_s=1e-6, module_s=2e-6), tokens=1, model_flops=0, backend=None, params=0,
                 param_bytes=4, grad_bytes=4, state_bytes=0, optimizer_kernels=0,
                 host_calls=dict(no_kernel=300, modules=40))
    assert [r[1] for r in gpu.rows] == ["memory-bound", "optimizer"]


def test_the_plan_counts_a_steps_module_calls_and_views():
    cfg = tunekit.GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=16)
    plain = tunekit.plan(cfg, "cpu", micro_batch=2, seq_len=16).expected
    ck = tunekit.plan(cfg, "cpu", micro_batch=2, seq_len=16, checkpointing=True).expected
    host = {r[0]: r[2] for r in plain.rows if r[1] == "host"}, {r[0]: r[2] for r in ck.rows if r[1] == "host"}
    views = "views, metadata ops, module calls"
    assert 0 < host[0][views] < host[1][views]   # the recompute calls the blocks' modules and views again
    assert list(host[0]) == [views]               # nothing checkpointed: no checkpoint row
    # two blocks checkpointed: two segments recomputed, and the tensors their recompute saves (26
    # per block: what a block's forward saves for its backward); calls = 2 segments + 52 tensors
    assert host[1]["checkpoint: saving, recomputing, unpacking"] == 2 + 2 * 26


def test_checkpoint_costs_per_segment_and_saved_tensor():
    fig = _fig(host_bound=True, checkpoint_s=(80e-6, 10e-6), checkpoint_source="c")
    e = expect([ADD], fig, tokens=1, model_flops=0, backend=None, params=0, param_bytes=4, grad_bytes=4,
               state_bytes=0, optimizer_kernels=0, host_calls=dict(segments=4, saved=120))
    # 4 segments at 80 us + 120 saved tensors at 10 us = 3.2e-04 + 1.2e-03 = 1.52e-03 s
    assert [r for r in e.rows if r[1] == "host"] == [
        ("checkpoint: saving, recomputing, unpacking", "host", 124, pytest.approx(1.52e-3), "launch", "c")]


def test_an_op_reads_cold_what_the_cache_no_longer_holds():
    from tunekit.core.expected import cold_reads

    a = ("a", "memory", "forward", 0, 10, None, 4, ((), ((1, 10),)))               # writes storage 1
    b = ("b", "memory", "forward", 0, 20, None, 4, (((1, 10),), ((2, 10),)))      # reads it next: 0 bytes between
    c = ("c", "memory", "forward", 0, 100, None, 4, (((3, 50),), ((4, 50),)))     # 3: never touched in the step
    d = ("d", "memory", "backward", 0, 20, None, 4, (((1, 10),), ((5, 10),)))     # 1 again, after c's 100 bytes
    # the step moves 10 + 20 + 100 + 20 = 150 bytes: storage 3 counts as touched 150 bytes ago
    assert cold_reads([a, b, c, d], 50) == [False, False, True, True]
    assert cold_reads([a, b, c, d], 200) == [False, False, False, False]   # all of it in the cache
    assert cold_reads([a, b, c, d], None) == [False] * 4
    # on a CPU with a cold sweep: d's 20 bytes at 0.01 TB/s (cold) instead of 0.1 (in cache)
    fig = _fig(host_bound=True, bandwidth_tbs=None, bandwidth_sweep=((1, 0.1),), cold_sweep=((1, 0.01),),
               cold_source="cold", cache_bytes=50, launch_s=0.0)
    rows = {r[0]: r for r in expect([a, b, c, d], fig, tokens=1, model_flops=0, backend=None, params=0,
                                    param_bytes=4, grad_bytes=4, state_bytes=0, optimizer_kernels=0).rows}
    assert rows["d"][3] == pytest.approx(20 / 0.01e12) and rows["d"][5] == "cold"
    assert rows["b"][3] == pytest.approx(20 / 0.1e12) and rows["b"][5] == "b"


def test_matmul_shape_efficiency():
    h100 = gpu_figures("H100 SXM", "bf16", 989, 3.35, compiled=False)
    assert h100.mamf_tflops == 794.5 and h100.bandwidth_tbs == pytest.approx(3.0)
    # torchtitan's 500 W H100: its 2.4 TB/s HBM2e at the HBM3 card's measured share, 3.0 / 3.35
    titan = gpu_figures("H100 SXM 96GB", "bf16", 912.25, 2.4, compiled=False)
    assert titan.bandwidth_tbs == pytest.approx(2.4 * 3.0 / 3.35)
    # its MAMF: the SXM's share of its peak put to this card's, 912.25 * 794.5 / 989 = 732.84, and said so
    assert titan.mamf_tflops == pytest.approx(912.25 * 794.5 / 989) and "H100 SXM" in titan.borrowed[0]
    # 8192 x 8192 in 128 x 128 tiles: 4096 tiles over 132 SMs = 32 waves (31.03): 4096 / (32 * 132) = 0.9697
    assert wave_efficiency(8192, 8192, 1, 132) == pytest.approx(4096 / 4224)
    assert wave_efficiency(256, 256, 1, 132) == 1.0   # 4 tiles: split along k
    odd = ("mm", "matmul", "forward", 2 * 4096 * 4096 * 10922, 0, (4096, 4096, 10922, 1), 2)
    even = ("mm", "matmul", "forward", 2 * 4096 * 4096 * 10944, 0, (4096, 4096, 10944, 1), 2)
    t_odd, t_even = (expect([r], h100, tokens=1, model_flops=0, backend=None, params=0, param_bytes=2,
                            grad_bytes=2, state_bytes=0, optimizer_kernels=0).step_s for r in (odd, even))
    assert t_odd / t_even > 1.4   # 10922 is not a multiple of 8: the sweep's 398.4 / 272.7 = 1.46x slower


def test_matmuls_at_training_shapes_where_a_row_has_the_figure():
    # Transformer Engine's GEMM guide: a layer's Fprop, Dgrad and Wgrad at hidden 4096, intermediate 16384 over
    # 15,872 tokens, 3 x 2 x 15872 x 4096 x (12288 + 4096 + 16384 + 16384) = 1.91727e13 FLOPs, in 32.014 ms on an
    # H200 NVL: 598.886 TFLOPS, 0.716799 of its 835.5 dense; put to the H100 SXM's 989: 708.915
    h100 = gpu_figures("H100 SXM", "bf16", 989, 3.35, compiled=False)
    assert h100.gemm_tflops == pytest.approx(708.915, abs=1e-3) and "gemm_profiling.rst" in h100.gemm_source
    assert gpu_figures("H200 SXM", "fp16", 989, 4.8, compiled=False).gemm_tflops == h100.gemm_tflops
    # torchtitan's 96 GB H100 at its own 912.25: 0.716799 x 912.25 = 653.900
    titan = gpu_figures("H100 SXM 96GB", "bf16", 912.25, 2.4, compiled=False)
    assert titan.gemm_tflops == pytest.approx(653.900, abs=1e-3)
    # a B200 at a B300's 12.758 ms for the same layer: 1.91727e13 / 12.758e-3 = 1502.80 TFLOPS of 2250, put to its 2250
    assert gpu_figures("B200", "bf16", 2250, 8.0, compiled=False).gemm_tflops == pytest.approx(1502.80, abs=0.01)
    # an 8192^3 bf16 matmul on the H100 SXM: 708.915 x 4096 / (32 x 132) = 687.43 (4096 tiles, 32 waves), not the MAMF
    rate, src = matmul_tflops(h100, (8192, 8192, 8192, 1), 2, "forward")
    assert rate == pytest.approx(708.915 * 4096 / 4224, abs=1e-3) and src.startswith(h100.gemm_source)
    # no such figure for an A100 or in fp32: the MAMF's, 271.2 x 4096 / (38 x 108) = 270.68 (4096 tiles, 38 waves)
    a100 = gpu_figures("A100 80GB", "bf16", 312, 2.0, compiled=False)
    assert a100.gemm_tflops is None and gpu_figures("H100 SXM", "fp32", 67, 3.35, compiled=False).gemm_tflops is None
    assert matmul_tflops(a100, (8192, 8192, 8192, 1), 2, "forward")[0] == pytest.approx(271.2 * 4096 / 4104)


def test_counter_keeps_kernels_not_views():
    a, b = torch.ones(64, 32), torch.ones(32, 16)
    with RooflineCounter() as c:
        y = a @ b
        y.view(-1)
        y.t()
        torch.relu(y)
    assert [r[0] for r in c.ops] == ["mm", "relu"]
    assert (c.no_kernel, c.module_calls) == (2, 0)   # view, t: counted, not kept
    # mm: reads 64*32*4 + 32*16*4 = 10240 bytes, writes 64*16*4 = 4096: 14336; its dims (m, k, n, batch)
    assert c.ops[0][3:6] == (2 * 64 * 32 * 16, 14336, (64, 32, 16, 1))
    assert c.ops[1][4] == 2 * 64 * 16 * 4


def test_an_in_place_scatter_moves_the_indexed_elements_only():
    g, index, src = torch.zeros(64, 1000), torch.zeros(64, 1, dtype=torch.int64), torch.ones(64, 1)
    with RooflineCounter() as c:
        g.scatter_add_(-1, index, src)
    # index 64*8 = 512 and src 64*4 = 256 bytes read, 64 of g's elements read and written 2*64*4 = 512:
    # 1280 bytes (not g's 256000 twice)
    assert [(r[0], r[4]) for r in c.ops] == [("scatter_add_", 1280)]


def test_each_record_says_which_kernel_by_its_dtypes():
    from tunekit.planning.expect import kernel_dtypes

    a, i = torch.ones(8, 8), torch.arange(4)
    with RooflineCounter() as c:
        a @ a
        a.to(torch.bfloat16) @ a.to(torch.bfloat16)
        i.to(torch.float32)
        a[i]                       # an index: a float32 tensor and an int64 one in, float32 out
    assert [(r[0], r[8]) for r in c.ops] == [
        ("mm", "float32"), ("_to_copy", "float32>bfloat16"), ("_to_copy", "float32>bfloat16"),
        ("mm", "bfloat16"), ("_to_copy", "int64>float32"), ("index", "float32,int64>float32")]
    assert kernel_dtypes(c.ops, "float32 params, fp32 grads") == {
        "mm": ("bfloat16", "float32"), "_to_copy": ("float32>bfloat16", "int64>float32"),
        "index": ("float32,int64>float32",), "optimizer step": ("float32 params, fp32 grads",)}


def test_a_device_without_figures_gets_the_bound_and_a_note():
    p = tunekit.plan(tunekit.GPTConfig(), "L4", precision="bf16", micro_batch=2, seq_len=64)
    assert p.expected is None and p.bound_step_s > 0
    (note,) = of_kind(p.notes, "expected.missing")
    assert "MAMF" in note


def test_gpu_plan_expects_slower_than_its_bound():
    p = tunekit.plan(tunekit.GPTConfig(), "H100 SXM", precision="bf16", micro_batch=4, seq_len=128)
    e = p.expected
    assert e.step_s > p.bound_step_s and 0 < e.mfu < p.bound_mfu
    cats = set(e.by_op.category)
    assert {"matmul", "attention", "memory-bound", "optimizer"} <= cats
    assert "expected" in repr(p)


def test_gpt2_dropout_survives_checkpointing_on_a_gpu_plan():
    from transformers import GPT2Config

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=64)   # dropout 0.1 by default
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = tunekit.plan(cfg, "H100 SXM", precision="bf16", micro_batch=2, seq_len=64, checkpointing=True)
    assert p.method == "fake step" and p.expected is not None


def test_agreement_words():
    assert agreement(1.1, 1.0, "quiet") == "within"     # 10% off, tolerance 20%
    assert agreement(1.3, 1.0, "quiet") == "off"
    assert agreement(1.3, 1.0, "busy") == "uncertain"
    assert agreement(math.nan, 1.0, "quiet") == "uncertain"


@pytest.mark.slow   # ~25 s quiet (the MAMF and bandwidth sweeps twice), 60-90 s on a loaded 2-core machine
@pytest.mark.parametrize("precision, checkpointing", [("fp32", False), ("bf16", True)])
def test_cpu_expectation_against_a_measured_run(precision, checkpointing):
    """The Lab's built-in GPT on this CPU, its expected step against the measured one, side by
    side: the figures the plan reads (the MAMF sweep, the bandwidth sweep) measured just before
    the run and again just after it, the expectation the mean of the plans from each; judged only
    when all five (the run, both sweeps twice) were quiet, else "uncertain".

    The issue's target is within 20%. Measured quiet on 2026-11-28 (benchmarks/RESULTS.md), with
    the host's time without a kernel (views, module calls, torch's checkpoint) and cold reads
    modelled, the expectation runs 0.82-0.91 of the measured mean step when the VM holds its speed,
    lower when it slows mid-run (which no verdict sees: 0.70 once): this test holds the model to
    0.65-1.2, and fails on a regression (an op class dropped, a sweep that reads a hot cache
    again). The figures were once read from the session's cache, measured whenever an earlier
    test first planned on the CPU: a VM that changed speed since (no verdict sees that either)
    moved the ratio with no regression. Measured around the run, a change of speed moves both
    sides alike."""
    from tunekit.measure.peaks import calibrate
    from tunekit.measure.stream import measure_stream

    lab = tunekit.Lab()
    dtype = "bf16" if precision == "bf16" else "fp32"

    def figures_and_plan():
        sweeps = (measure_stream(refresh=True), calibrate(dtype, "cpu", force=True))
        return [s.verdict for s in sweeps], tunekit.plan(lab, "cpu", precision=precision,
                                                          checkpointing=checkpointing).expected.step_s

    before, expected_before = figures_and_plan()
    r = lab.run(steps=10, precision=precision, checkpointing=checkpointing, verbose=False)
    after, expected_after = figures_and_plan()
    expected = (expected_before + expected_after) / 2
    verdicts = {r.conditions.verdict if r.conditions else "unknown", *before, *after}
    verdict = "busy" if verdicts - {"quiet"} else "quiet"
    if verdict != "quiet":
        assert agreement(expected, r.step_s, verdict) == "uncertain"
    else:
        assert 0.65 <= expected / r.step_s <= 1.2, (expected_before, r.step_s, expected_after)


def test_a_compiled_step_fuses_memory_bound_runs():
    # x -> mul -> y -> add -> z (z read later by a matmul), y read only inside the run:
    # fused, it reads x (100 bytes) and writes z (100): 200 bytes, not 400, in one launch
    mul = ("mul", "memory", "forward", 0, 200, None, 2, (((1, 100),), ((2, 100),)))
    add = ("add", "memory", "forward", 0, 200, None, 2, (((2, 100),), ((3, 100),)))
    mm = ("mm", "matmul", "forward", 0, 0, (8, 8, 8, 1), 2, (((3, 100),), ((4, 100),)))
    from tunekit.core.expected import FUSED, fused

    out = fused([mul, add, mm])
    assert [r[0] for r in out] == [FUSED, "mm"] and out[0][4] == 200
    # an in-place write (a gradient's add_) is kept even when nothing reads it after the run
    acc = ("add_", "memory", "backward", 0, 200, None, 2, (((5, 100), (6, 100)), ((5, 100),)))
    neg = ("neg", "memory", "backward", 0, 200, None, 2, (((7, 100),), ((8, 100),)))
    assert fused([acc, neg])[0][4] == 100 + 100 + 100 + 100 + 100   # reads 5, 6, 7; writes 5 and 8 (never read)


def test_the_a100_variants():
    from tunekit.core.efficiency import gpu_figures

    # "A100" names the 80 GB card: every figure measured; the 40 GB card borrows both as shares of its own
    assert not gpu_figures("A100 80GB", "bf16", 312, 2.0, compiled=False).borrowed
    small = gpu_figures("A100 40GB", "bf16", 312, 1.555, compiled=False)
    assert small.missing() == []
    # MAMF: 312 x 271.2 / 312 = 271.2 (the same peak); bandwidth: 1.555 TB/s x 1.80 / 2.04 = 1.372059 TB/s
    assert small.mamf_tflops == pytest.approx(271.2) and small.bandwidth_tbs == pytest.approx(1.372059, abs=1e-6)
    (words,) = small.borrowed
    assert words.startswith("its MAMF from the A100 80GB (271.2 of 312 TFLOPS bf16: 271.2 of its 312); its streaming "
                            "bandwidth from the A100 80GB (88.2% of the data sheet's: 1.37 of its 1.555 TB/s)")


def test_a_card_without_a_measured_figure_borrows_one_or_says_what_to_do():
    cfg = tunekit.GPTConfig()
    small = tunekit.plan(cfg, "A100 40GB", precision="bf16", micro_batch=2, seq_len=64)
    (note,) = of_kind(small.notes, "expected.borrowed")
    assert small.expected is not None and "from the A100 80GB" in note and not of_kind(small.notes, "expected.missing")
    for card in ("L4", "T4", "RTX 4090"):
        p = tunekit.plan(cfg, card, precision="fp16", micro_batch=2, seq_len=64)
        (note,) = of_kind(p.notes, "expected.missing")
        assert p.expected is None and not of_kind(p.notes, "expected.borrowed")
        assert "MAMF" in note and "tunekit.calibrate('fp16')" in note and "bandwidth_share" in note


def test_attention_share_by_head_dim_and_sequence():
    from tunekit.core.efficiency import attention_share
    from tunekit.core.specs import gpu

    def rows_of(kernel, card):   # the card's row's figure for the kernel
        return gpu(card).attention[kernel].value

    a100 = rows_of("flash", "A100 80GB")
    # the bars of flash-attention's assets/flash2_a100_fwd_bwd_benchmark.png (causal, fwd+bwd), over 312:
    # FA2 at head dim 64, seq 2048: 140 TFLOPS, 140 / 312 = 0.448718; at 128 held flat outside 512-16k:
    # 99 / 312 = 0.317308 below, 189 / 312 = 0.605769 above
    assert attention_share(a100, 64, 2048) == pytest.approx(0.448718, abs=1e-6)
    assert attention_share(a100, 128, 256) == pytest.approx(0.317308, abs=1e-6)
    assert attention_share(a100, 128, 65536) == pytest.approx(0.605769, abs=1e-6)
    # between two bars, in log(seq): 128 at 3000 is log2(3000 / 2048) = 0.550747 of the way from 155 to 173:
    # (155 + 18 x 0.550747) / 312 = 0.528569
    assert attention_share(a100, 128, 3000) == pytest.approx(0.528569, abs=1e-6)
    # FA2 on Hopper, PR #1791 (hdim 128, seq 8192, causal): 3.5 x 284.1 x 1.935 / (1.935 + 4.788) = 286.19 TFLOPS
    # fwd+bwd, / 989 = 0.289375; FA3: 3.5 x 630.0 x 0.873 / 3.458 = 556.67, / 989 = 0.562862
    assert attention_share(rows_of("flash", "H100 SXM"), 128, 8192) == pytest.approx(0.289375, abs=1e-6)
    assert attention_share(rows_of("fa3", "H100 SXM"), 128, 8192) == pytest.approx(0.562862, abs=1e-6)
    # the Triton kernel: the CUDA FlashAttention(-1) bars, "slightly slower than CUDA" an upper bound. A100,
    # 64 at 2048: 77 / 312 = 0.246795; 128 from 16k on: 83 / 312 = 0.266026 (MPT-30b's 112: the nearest, 128)
    assert attention_share(rows_of("triton", "A100 80GB"), 64, 2048) == pytest.approx(0.246795, abs=1e-6)
    assert attention_share(rows_of("triton", "A100 40GB"), 112, 65536) == pytest.approx(0.266026, abs=1e-6)
    # the H100 image's bars over 989: 64 at 2048, 136 / 989 = 0.137513; 128 from 16k on, 137 / 989 = 0.138524
    assert attention_share(rows_of("triton", "H100 SXM"), 64, 2048) == pytest.approx(0.137513, abs=1e-6)
    assert attention_share(rows_of("triton", "H200 SXM"), 128, 32768) == pytest.approx(0.138524, abs=1e-6)
    # the rows of the nearest head dim (a tie: the smaller), interpolated between two sequences
    rows = ((64, 1000, 0.2), (128, 1000, 0.4), (128, 4000, 0.6))
    assert attention_share(rows, 96, 1000) == 0.2 and attention_share(rows, 100, 1000) == 0.4
    assert attention_share(rows, 128, 2000) == pytest.approx(0.5)   # 2000 is halfway from 1000 to 4000 in log


def test_attention_op_at_its_shapes_share():
    fig = _fig(attention={"flash": (((None, 512, 0.5), (None, 16384, 0.73)), "fa2")})
    # (seq_q, seq_k, head_dim, batch x heads); 1e12 FLOPs at 0.592 x 100 TFLOPS = 0.016892 s
    att = ("sdpa", "attention", "forward", 10**12, 0, (2048, 2048, 64, 8), 2)
    e = expect([att], fig, tokens=1, model_flops=0, backend="flash", params=0, param_bytes=2, grad_bytes=2,
               state_bytes=0, optimizer_kernels=0)
    assert {r[0]: r[3] for r in e.rows}["sdpa"] == pytest.approx(1e12 / 59.2e12)


def test_counter_keeps_an_attentions_shape():
    q = torch.ones(2, 3, 16, 8, requires_grad=True)
    with RooflineCounter() as c:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    att = [r for r in c.ops if r[1] == "attention"]
    # forward and backward: seq_q 16, seq_k 16, head dim 8, batch x heads 2 x 3 = 6
    assert len(att) == 2 and all(r[5] == (16, 16, 8, 6) for r in att)


def test_overlapped_collectives_slow_the_compute():
    from tunekit.core.efficiency import OVERLAP_SLOWDOWN

    # FSDP over one unit: 10 ms of collectives, the first gather (10 / 2 = 5 ms) exposed before any
    # compute, the other 5 ms hidden behind 1 s of compute (8e13 FLOPs at 80 TFLOPS)
    big = ("mm", "matmul", "forward", 8 * 10**13, 0, (65536, 65536, 65536, 1), 2)
    e = expect([big], _fig(sms=None), tokens=1, model_flops=0, backend=None, params=0, param_bytes=2,
               grad_bytes=2, state_bytes=0, optimizer_kernels=0, comm={"all_gather/intra": 0.01}, parallel="fsdp",
               units=1)
    rows = {r[0]: r[3] for r in e.rows}
    s = OVERLAP_SLOWDOWN[0]
    assert s == 0.189
    assert rows["collectives (exposed)"] == pytest.approx(0.005)
    # the 5 ms hidden cost 0.005 x 0.189 / 1.189 = 0.000794785 s of slower compute
    assert rows["compute slowed by overlapped collectives"] == pytest.approx(0.005 * 0.189 / 1.189)
    assert e.step_s == pytest.approx(1.0 + 0.005 + 0.005 * 0.189 / 1.189)


def test_plan_takes_the_attention_kernel():
    cfg = tunekit.GPTConfig(n_layer=1, n_head=8, n_embd=512, vocab_size=256, block_size=512)
    flash, triton = (tunekit.plan(cfg, "A100", precision="bf16", micro_batch=16, seq_len=512, attention_kernel=k)
                     for k in (None, "triton"))

    def attention_s(p):
        return p.expected.by_op.query("category == 'attention'").expected_s.sum()
    # seq 512, head dim 64: FA2's causal fwd+bwd bar 88 TFLOPS, the Triton kernel's (FlashAttention-1's) 58: 88 / 58
    # the time (the forward's 4 x 16 x 512^2 x 512 / 2 = 4.3 GFLOPs take 48.8 us at 88 TFLOPS: over the 5 us launch)
    assert attention_s(triton) == pytest.approx(88 / 58 * attention_s(flash))
    assert any("Triton" in n for n in triton.expected.notes)
    with pytest.raises(ValueError, match="attention_kernel"):
        tunekit.plan(cfg, "A100", precision="bf16", micro_batch=2, seq_len=64, attention_kernel="fa9")


def test_a_cpu_sweep_is_read_between_its_sizes_in_log_log():
    from tunekit.core.efficiency import log_interpolated

    sweep = ((256, 0.1), (512, 0.2), (1024, 0.4))
    assert log_interpolated(sweep, 256 * 2**0.5) == pytest.approx(0.1 * 2**0.5)   # halfway in log size: x sqrt(2)
    assert log_interpolated(sweep, 512 * 2**0.5) == pytest.approx(0.2 * 2**0.5)
    assert log_interpolated(sweep, 64) == 0.1 and log_interpolated(sweep, 4096) == 0.4   # each end beyond it
    # a rate 3.5x higher at 4x the size: at 1.41x the size 3.5^0.25 = 1.368x, a time 1.41 / 1.368 = 1.034x, not
    # the 1.41 / 1.625 = 0.87x a rate linear in log size gave; times by size never fall (sizes 1 .. 8 by 1/8)
    steep = ((1, 1.0), (4, 3.5))
    assert log_interpolated(steep, 2**0.5) == pytest.approx(3.5**0.25)
    times = [s / log_interpolated(steep, s) for s in (1 + i / 8 for i in range(57))]
    assert times == sorted(times)
    # a cold read is never faster than the same op from cache, whatever the two sweeps measured
    fig = _fig(host_bound=True, bandwidth_tbs=None, bandwidth_sweep=((1, 0.1),), cold_sweep=((1, 0.2),))
    assert fig.tbs_at(100, cold=True) == 0.1


def test_a_cpu_batched_matmul_is_read_in_the_sweep_at_its_whole_calls_work():
    from tunekit.core.expected import call_size, matmul_tflops

    # a bf16-like sweep: its small cubes pay a kernel's fixed cost per call (0.034 TFLOPS at 64)
    fig = _fig(host_bound=True, mamf_sweep=((64, 0.034), (128, 0.163), (256, 0.335)), mamf_source="sweep")
    # the Lab GPT's attention scores: 32 matrices of 128 x 32 x 128 in one call, 32 x 2^19 = 2^24 m k n:
    # read at the cube 2^8 = 256 (0.335), not at one matrix's cube root 2^(19/3) = 80.6 (below 0.163)
    assert call_size((128, 32, 128, 32)) == pytest.approx(256)
    assert matmul_tflops(fig, (128, 32, 128, 32), 2, "forward") == (pytest.approx(0.335), "sweep")
    # the small Llama's: 16 x 64 x 32 x 64 = 2^21, the cube 2^7 = 128
    assert matmul_tflops(fig, (64, 32, 64, 16), 2, "backward")[0] == pytest.approx(0.163)
    # one matrix is its own call: 64^3 at the 64-cube's 0.034
    assert call_size((64, 64, 64, 1)) == pytest.approx(64)
    assert matmul_tflops(fig, (64, 64, 64, 1), 2, None)[0] == pytest.approx(0.034)


def test_a_cpu_plan_takes_step_like_matmuls_and_the_mamf_sweep_only_above_them(monkeypatch):
    from types import SimpleNamespace

    from tunekit.measure import peaks, rng, stream
    from tunekit.planning.expect import cpu_figures

    cal = SimpleNamespace(tflops=0.5, verdict="quiet", conditions=None,
                          sweep=[(512, 0, 0, 0.45), (1024, 0, 0, 0.48), (2048, 0, 0, 0.5)])
    st = SimpleNamespace(verdict="quiet", conditions=None, op_s=4e-6, sweep=[(2**20, 0.05)], gelu={"fp32": 1e9},
                         attention={"fp32": 0.1}, view_s=1e-6, module_s=1e-6, cold=[(2**20, 0.02)],
                         checkpoint_s=(1e-5, 1e-6), shapes={"fp32": [("forward", 512, 128, 0.12)]},
                         warm=[(2**20, 0.03)], matmuls={"fp32": [(256, 0.15), (512, 0.17), (1024, 0.18)]})
    monkeypatch.setattr(peaks, "calibrate", lambda dtype, device: cal)
    monkeypatch.setattr(stream, "measure_stream", lambda **kw: st)
    monkeypatch.setattr(rng, "measure_rng", lambda: {"rates": {"fp32": 2e8}, "verdict": "quiet"})
    fig = cpu_figures(0.6, "fp32")
    assert fig.rng_rate == 2e8
    # the hot MAMF figures at 512 and 1024 (0.45, 0.48) are not a step's: only 2048 is taken from it
    assert fig.mamf_sweep == ((256, 0.15), (512, 0.17), (1024, 0.18), (2048, 0.5))
