"""Measured memory components against tensor sizes computed by hand, and estimate vs measured
for the built-in GPT."""
import math

import pytest
import torch
import torch.nn as nn

from tunekit.core.memory.estimate import estimate_memory
from tunekit.measure.memory import measure_memory
from tunekit.measure.tally import SavedTensorTally, unique_bytes
from tunekit.models.gpt import GPT, GPTConfig
from tunekit.models.optimizers import state_bytes


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_unique_bytes_counts_views_and_tied_tensors_once():
    a = torch.zeros(10, 10)
    assert unique_bytes([a, a.t(), a[:2], None]) == 400    # one 100-float storage


def test_hand_mlp_fp32_adamw():
    model, x = _mlp(), torch.randn(5, 8)
    before = [p.detach().clone() for p in model.parameters()]
    rep = measure_memory(model, (x,))
    m = rep.measured
    # params 8*16 + 16 + 16*4 + 4 = 212 floats = 848 bytes; grads the same
    assert m["weights"] == 848 and m["gradients"] == 848
    # AdamW: two moments 2*848 + a 4-byte `step` tensor for each of the 4 param tensors = 1712
    assert m["optimizer_states"] == 1712
    # the estimate of the module (its tensors' shapes) counts the steps too: 8 B x 212 + 4 x 4 B = 1712
    est = estimate_memory(model, layout="fp32", optimizer="adamw", device="cpu")
    assert est.components["optimizer_states"] == m["optimizer_states"] == 1712
    sgd = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9)
    model(x).sum().backward()
    sgd.step()   # one momentum buffer per parameter, no step tensor: 4 B x 212 = 848
    assert estimate_memory(model, layout="fp32", optimizer="sgd", device="cpu").components["optimizer_states"] \
        == state_bytes(sgd) == 848
    model.zero_grad(set_to_none=True)
    # saved: the input x (5*8*4 = 160) for the first weight's grad, the ReLU output
    # (5*16*4 = 320) for ReLU and the second Linear (one storage) -> 480
    assert m["activations"] == 480 and m["weight_casts"] == 0
    assert rep.layout == "fp32"
    # AdamW(lr=0) leaves the weights as they were; grads are dropped afterwards
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    assert rep.error("weights") == 0.0 and rep.error("gradients") == 0.0
    assert math.isnan(rep.estimate["activations"])     # a bare module has no activation formula


def test_hand_mlp_sgd_momentum_under_autocast():
    model, x = _mlp(), torch.randn(5, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9)
    rep = measure_memory(model, (x,), optimizer=opt, precision="bf16")
    m = rep.measured
    assert rep.layout == "amp"
    assert m["optimizer_states"] == 848                  # one momentum buffer per param
    assert rep.estimate["optimizer_states"] == 848       # the "sgd" (momentum) formula: 4 B/param
    # bf16 copies: x cast (5*8*2 = 80) + ReLU output (5*16*2 = 160) = 240; the second weight's
    # cast (4*16*2 = 128) is kept for the input grad; the first weight's is not (x needs no grad)
    assert m["activations"] == 240 and m["weight_casts"] == 128


def test_saved_tensor_tally_excludes_parameters():
    lin = nn.Linear(4, 4, bias=False)
    x = torch.randn(3, 4, requires_grad=True)
    with SavedTensorTally(list(lin.parameters())) as tally:
        y = lin(x).sum()
    # mm saves x (3*4*4 = 48 bytes) and the weight (a parameter: excluded)
    assert tally.activation_bytes == 48
    y.backward()


@pytest.fixture(scope="module")
def tiny_cfg():
    return GPTConfig.preset("cpu-tiny")


def test_gpt_fp32_measured_equals_hand_count(tiny_cfg):
    rep = measure_memory(GPT(tiny_cfg), micro_batch=2, seq_len=64)
    # see tests/core/test_anatomy.py::test_gpt_activation_whole_model_and_checkpointing
    assert rep.measured["activations"] == 2957828
    assert rep.measured["buffers"] == 32768           # rotary tables 2 * 128 * 32 * 4
    n = sum(p.numel() for p in GPT(tiny_cfg).parameters())
    assert rep.measured["weights"] == 4 * n == rep.estimate["weights"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_gpt_estimate_within_targets(tiny_cfg, precision, checkpointing):
    rep = measure_memory(GPT(tiny_cfg), precision=precision, checkpointing=checkpointing,
                         micro_batch=2, seq_len=64)
    static = ("weights", "gradients", "optimizer_states")
    est = sum(rep.estimate[k] for k in static)
    meas = sum(rep.measured[k] for k in static)
    assert abs(est - meas) / meas < 0.10
    for k in ("activations", "weight_casts"):
        e, m = rep.estimate[k], rep.measured[k]
        assert (e == m == 0) or abs(e - m) / m < 0.15, (k, e, m)


def test_checkpointing_is_restored_and_shrinks_activations(tiny_cfg):
    model = GPT(tiny_cfg)
    full = measure_memory(model, micro_batch=2, seq_len=64).measured["activations"]
    ck = measure_memory(model, checkpointing=True, micro_batch=2, seq_len=64).measured["activations"]
    assert model.checkpointing is False
    assert ck == 461316 < full          # 2 block inputs 131072 + 330244 outside the blocks


def test_gpt_variants_match_estimate_exactly():
    # learned positions, biases, SwiGLU and math attention each change what autograd keeps
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=64, block_size=32, pos="learned", bias=True,
                    mlp="swiglu", attention="math")
    for precision in ("fp32", "bf16"):
        rep = measure_memory(GPT(cfg), precision=precision, micro_batch=2, seq_len=32)
        assert rep.measured["activations"] == rep.estimate["activations"], precision
        assert rep.measured["weight_casts"] == rep.estimate["weight_casts"], precision


def test_report_frame_and_figure(tiny_cfg):
    rep = measure_memory(GPT(tiny_cfg), micro_batch=1, seq_len=16)
    df = rep.to_frame()
    assert list(df.columns) == ["estimated_bytes", "measured_bytes", "error"]
    assert df.loc["activations", "error"] == 0.0
    assert len(rep.figure().data) >= 4
    alone = measure_memory(GPT(tiny_cfg), micro_batch=1, seq_len=16, estimate=False)
    # no estimate: its side has no bars, never 0-byte ones (issue 33)
    assert all(bar.y[0] is None and bar.y[1] > 0 for bar in alone.figure().data)
    if not torch.cuda.is_available():
        assert rep.cuda == {} and any("CUDA" in n for n in rep.notes)


def test_measure_a_lab(make_lab):
    lab = make_lab(preset="cpu-tiny", micro_batch=2, seq_len=32)
    rep = measure_memory(lab)
    assert rep.layout == "fp32" and rep.measured["activations"] > 0
    assert lab.optimizer is None          # the Lab's own optimizer was not created or stepped
    # micro_batch=2, seq_len=32 from the Lab's defaults: the estimate uses the same shapes
    assert rep.estimate.inputs["micro_batch"] == 2 and rep.estimate.inputs["seq_len"] == 32
    assert rep.error("activations") == 0.0


@pytest.mark.gpu
def test_gpu_readings(tiny_cfg):
    rep = measure_memory(GPT(tiny_cfg).cuda(), precision="bf16", micro_batch=4, seq_len=128)
    assert rep.cuda["allocator_peak"] > rep.measured["weights"]
    assert rep.cuda["allocator_reserved"] >= rep.cuda["allocator_peak"]
    assert abs(rep.error("activations")) < 0.15


def test_callers_grads_optimizer_and_weights_are_left_alone():
    model, x = _mlp(), torch.randn(5, 8)
    model(x).sum().backward()                           # grads mid-accumulation
    grads = [p.grad.clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = [p.detach().clone() for p in model.parameters()]
    rep = measure_memory(model, (x,), optimizer=opt)
    assert rep.measured["optimizer_states"] == 848      # measured on a stand-in with lr=0
    assert opt.state == {} and opt.param_groups[0]["lr"] == 0.1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))


def test_given_lr0_optimizer_state_is_not_advanced():
    model, x = _mlp(), torch.randn(5, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    model(x).sum().backward()
    opt.step()
    steps = [float(s["step"]) for s in opt.state.values()]
    avg = [s["exp_avg"].clone() for s in opt.state.values()]
    measure_memory(model, (x,), optimizer=opt)
    assert [float(s["step"]) for s in opt.state.values()] == steps == [1.0] * 4
    assert all(torch.equal(a, s["exp_avg"]) for a, s in zip(avg, opt.state.values()))


def test_half_weights_with_autocast_word_are_pure_half():
    model = nn.Linear(8, 8).to(torch.bfloat16)
    rep = measure_memory(model, (torch.randn(4, 8, dtype=torch.bfloat16),), precision="bf16")
    # 8*8 + 8 = 72 bf16 params = 144 bytes; the estimate must read pure bf16, not autocast's fp32
    assert rep.layout == "bf16" and rep.measured["weights"] == 144
    assert rep.error("weights") == 0.0 and rep.error("gradients") == 0.0


def test_tally_ignores_tensors_freed_during_the_forward():
    x = torch.randn(32, 64, requires_grad=True)
    with SavedTensorTally([]) as tally:
        for _ in range(3):
            dropped = torch.relu(x * 2.0)    # relu saves its output; the branch is dropped
            del dropped
        y = torch.tanh(x * 3.0).sum()        # tanh keeps its output: 32*64*4 = 8192 bytes
    assert tally.activation_bytes == 8192
    y.backward()


def test_rng_state_is_not_advanced():
    model, x = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)), torch.randn(4, 8)
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    measure_memory(model, (x,), estimate=False)      # dropout draws inside a forked RNG
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("precision,checkpointing,attention",
                         [(p, c, a) for p in ("fp32", "bf16") for c in (False, True) for a in ("sdpa", "math")])
def test_lab_and_measure_memory_share_one_saved_activation_tally(make_lab, precision, checkpointing, attention):
    lab = make_lab(preset="cpu-tiny", peak_tflops=1.0, micro_batch=2,
                   seq_len=32, precision=precision, checkpointing=checkpointing, attention=attention)
    run = lab.run(steps=1, warmup=0)
    measured = measure_memory(lab).measured
    # the same tally on the same shapes: equal to the byte, weight casts kept apart
    assert run.saved_bytes == measured["activations"] > 0
    assert run.weight_cast_bytes == measured["weight_casts"]
    assert (run.weight_cast_bytes > 0) == (precision == "bf16")


def test_estimate_of_a_module_with_frozen_parameters_counts_the_trained_ones_as_measured():
    # estimate_memory(module) charged gradients and AdamW states to every parameter, frozen ones
    # too, while measure_memory and plan count the trained ones. Two Linear(64, 64): 4160 each, the
    # first frozen. Weights 8320 x 4 B = 33280; gradients 4160 x 4 = 16640; AdamW 2 x 16640 + a 4 B
    # step for each of the 2 trained tensors = 33288 (the estimate: (2 x 33280 + 16) x 4160/8320)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    model[0].requires_grad_(False)
    est = estimate_memory(model, precision="fp32", n_layer=1, n_embd=64, n_head=1, seq_len=1, device="cpu")
    measured = measure_memory(model, (torch.randn(8, 64),), precision="fp32").measured
    for k, v in dict(weights=33280, gradients=16640, optimizer_states=33288, master_weights=0).items():
        assert est.components[k] == v == measured[k]
    assert "4,160 of 8,320 parameters are trained" in " ".join(est.notes)
