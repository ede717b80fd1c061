"""Plan.expected: the op model (core.expected) on hand-made ops, the plan's op count, a device
without the figures, and the CPU's expectation against a measured run (issue 31)."""
import math
import warnings

import pytest
import torch

import tunekit
from tunekit.core.efficiency import Figures, gpu_figures, wave_efficiency
from tunekit.core.expected import agreement, expect
from tunekit.core.notes import of_kind
from tunekit.planning.ops import RooflineCounter


def _fig(**kw):
    base = dict(name="toy", peak_tflops=100.0, mamf_tflops=80.0, mamf_source="m", bandwidth_tbs=1.0,
                bandwidth_source="b", launch_s=5e-6, launch_source="l", host_bound=False)
    return Figures(**{**base, **kw})


MM = ("mm", "matmul", "forward", 2 * 1024**3, 3 * 1024 * 1024 * 2, (1024, 1024, 1024, 1), 2)
ADD = ("add", "memory", "backward", 0, 10**6, None, 2)


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
    e = expect([ADD], fig, tokens=1, model_flops=0, backend=None, params=0, param_bytes=4, grad_bytes=4,
               state_bytes=0, optimizer_kernels=0)
    # 1e6 bytes at the 1e6-byte size's 0.1 TB/s = 1e-05 s, plus the 5e-06 s dispatch
    assert {r[0]: r[3] for r in e.rows}["add"] == pytest.approx(1.5e-5)
    assert fig.tbs_at(999) == 0.5 and fig.tbs_at(5000) == 0.5 and fig.tbs_at(10**7) == 0.1


def test_matmul_shape_efficiency():
    h100 = gpu_figures("H100 SXM", "bf16", 989, 3.35, compiled=False)
    assert h100.mamf_tflops == 794.5 and h100.bandwidth_tbs == pytest.approx(3.0)
    # 8192 x 8192 in 128 x 128 tiles: 4096 tiles over 132 SMs = 32 waves (31.03): 4096 / (32 * 132) = 0.9697
    assert wave_efficiency(8192, 8192, 1, 132) == pytest.approx(4096 / 4224)
    assert wave_efficiency(256, 256, 1, 132) == 1.0   # 4 tiles: split along k
    odd = ("mm", "matmul", "forward", 2 * 4096 * 4096 * 10922, 0, (4096, 4096, 10922, 1), 2)
    even = ("mm", "matmul", "forward", 2 * 4096 * 4096 * 10944, 0, (4096, 4096, 10944, 1), 2)
    t_odd, t_even = (expect([r], h100, tokens=1, model_flops=0, backend=None, params=0, param_bytes=2,
                            grad_bytes=2, state_bytes=0, optimizer_kernels=0).step_s for r in (odd, even))
    assert t_odd / t_even > 1.4   # 10922 is not a multiple of 8: the sweep's 398.4 / 272.7 = 1.46x slower


def test_counter_keeps_kernels_not_views():
    a, b = torch.ones(64, 32), torch.ones(32, 16)
    with RooflineCounter() as c:
        y = a @ b
        y.view(-1)
        y.t()
        torch.relu(y)
    assert [r[0] for r in c.ops] == ["mm", "relu"]
    # mm: reads 64*32*4 + 32*16*4 = 10240 bytes, writes 64*16*4 = 4096: 14336; its dims (m, k, n, batch)
    assert c.ops[0][3:6] == (2 * 64 * 32 * 16, 14336, (64, 32, 16, 1))
    assert c.ops[1][4] == 2 * 64 * 16 * 4


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


@pytest.mark.slow   # ~10 s quiet (a MAMF and a bandwidth sweep the first time), 35-45 s on a loaded 2-core machine
@pytest.mark.parametrize("precision, checkpointing", [("fp32", False), ("bf16", True)])
def test_cpu_expectation_against_a_measured_run(precision, checkpointing):
    """The Lab's built-in GPT on this CPU: the expected step within 20% of the measured one when
    the machine was quiet throughout (the run, the MAMF sweep, the bandwidth sweep); else "uncertain"."""
    from tunekit.measure.peaks import calibrate
    from tunekit.measure.stream import measure_stream

    lab = tunekit.Lab()
    p = tunekit.plan(lab, "cpu", precision=precision, checkpointing=checkpointing)
    r = lab.run(steps=10, precision=precision, checkpointing=checkpointing, verbose=False)
    dtype = "bf16" if precision == "bf16" else "fp32"
    verdicts = {r.conditions.verdict if r.conditions else "unknown", measure_stream().verdict,
                calibrate(dtype, "cpu").verdict}
    verdict = "busy" if verdicts - {"quiet"} else "quiet"
    word = agreement(p.expected.step_s, r.step_s, verdict)
    if verdict != "quiet":
        assert word == "uncertain"
    else:
        assert word == "within", (p.expected.step_s, r.step_s)


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

    # "A100" names the 80 GB card: every figure; the 40 GB card shares its compute, not a measured bandwidth
    assert not gpu_figures("A100 80GB", "bf16", 312, 2.0, compiled=False).missing()
    assert gpu_figures("A100 40GB", "bf16", 312, 1.555, compiled=False).missing() == [
        "the memory bandwidth a streaming kernel reaches"]
