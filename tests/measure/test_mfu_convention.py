"""One meaning for "model FLOPs": tunekit's MFU convention (6 x matmul weights x tokens + causal
attention at half, no recompute) whatever attention kernel ran, from the count (count_flops,
a model of unknown shape) as from the shape (the Lab, the Monitor, a profiled cell, plan).
Transformers models are built from configs (random init, nothing downloaded)."""
import math

import pytest
import torch
import torch.nn.functional as F

import tunekit
from tunekit.core.formulas import MFU_ANALYTIC, MFU_COUNTED
from tunekit.models.adapters import adapt
from tunekit.models.gpt import GPT, GPTConfig

transformers = pytest.importorskip("transformers")
from tests.measure.test_model_flops import llama as tiny_llama  # noqa: E402
from tests.measure.test_model_flops import tokens as ids  # noqa: E402

transformers.logging.set_verbosity_error()

# The Llama: per layer q 64*64 + k,v 2*64*32 + o 64*64 + MLP 3*64*172 = 45312; x 2 + lm_head
# 256*64 = 107008 matmul weights, L = 2, q width 64 (4 heads of 16).
# Trained, per token: 6*107008 + 12*2*64*S/2 = 642048 + 768*S; x B*S tokens (B = 2):
#   S=64: 691200 * 128 = 88473600;   S=256: 838656 * 512 = 429391872
# Eager attention runs the masked half too (HFU): 768*S per token: 6291456 at S=64, 100663296 at S=256
LLAMA = {64: 88473600, 256: 429391872}
LLAMA_MASKED = {64: 6291456, 256: 100663296}


def llama(attention):
    return tiny_llama(attention, positions=256)   # test_model_flops's model, with room for S=256


@pytest.mark.parametrize("s", [64, 256])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_count_flops_model_is_the_convention_for_eager_and_sdpa_llama(attention, s):
    model, x = llama(attention), ids(2, s)
    assert LLAMA[s] == 2 * s * (6 * 107008 + 768 * s)
    fc = tunekit.count_flops(lambda: model(input_ids=x, labels=x).loss.backward())
    assert fc.model == LLAMA[s] == adapt(model).model_flops(s, 2 * s, None)[0]
    # what ran differs, in HFU only: eager the masked half, SDPA's backward rebuilding QK^T
    # (2*B*nh*S^2*hd = 2*2*4*S*S*16 = 256*S^2 per layer, causal: half, x L=2 layers = 256*S^2)
    if attention == "eager":
        assert (fc.executed - fc.model, fc.masked_attention) == (LLAMA_MASKED[s], LLAMA_MASKED[s])
        assert any("causal attention ran in full" in n for n in fc.notes)
    else:
        assert (fc.executed - fc.model, fc.masked_attention) == (256 * s * s, 0)


def test_forward_only_and_checkpointed_eager_llama_are_the_convention_too():
    model, x = llama("eager"), ids(2, 64)
    with torch.no_grad():
        fc = tunekit.count_flops(lambda: model(input_ids=x))
    # forward only: (2*107008 + 4*2*64*64/2) * 128 = 230400 * 128 = 29491200; masked: a third of 6291456
    assert (fc.model, fc.masked_attention) == (29491200, 2097152)
    for reentrant in (False, True):  # the recomputed forward is left out once, not twice
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        fc = tunekit.count_flops(lambda: model(input_ids=x, labels=x).loss.backward())
        model.zero_grad(set_to_none=True)
        assert fc.model == LLAMA[64] and fc.recompute > 0 and fc.masked_attention == LLAMA_MASKED[64]


def test_a_padded_batch_keeps_the_causal_half():
    model, x = llama("eager"), ids(2, 64)
    keep = torch.ones(2, 64, dtype=torch.long)
    keep[1, :5] = 0   # left padding: more is masked than the upper triangle, still causal
    fc = tunekit.count_flops(lambda: model(input_ids=x, attention_mask=keep, labels=x).loss.backward())
    assert fc.model == LLAMA[64]


# tunekit's GPT (2 layers, 4 heads, width 64): per layer qkv 64*192 + proj 64*64 + MLP 2*64*256 =
# 49152; x 2 + lm_head 256*64 = 114688. Per trained token 6*114688 + 768*S = 688128 + 768*S:
#   S=64: 737280 * 128 = 94371840;   S=128: 786432 * 256 = 201326592
GPT_FLOPS = {64: 94371840, 128: 201326592}


@pytest.mark.parametrize("s", [64, 128])
@pytest.mark.parametrize("attention", ["math", "sdpa"])
@pytest.mark.parametrize("ckpt", [False, True])
def test_count_flops_model_is_the_convention_for_gpt_math_and_sdpa(attention, s, ckpt):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=128, attention=attention))
    model.set_checkpointing(ckpt)
    x = ids(2, s)
    fc = tunekit.count_flops(lambda: model(x, x)[1].backward())
    assert fc.model == GPT_FLOPS[s] == adapt(model).model_flops(s, 2 * s, None)[0]
    # math's masked half: 768*S per token, x 2*S tokens: 6291456 at S=64, 25165824 at S=128
    assert fc.masked_attention == (1536 * s * s if attention == "math" else 0)


# --- SDPA given a mask, and masks that are not causal --------------------------------------------


def _sdpa(mask=None, causal=False):
    q = torch.randn(2, 4, 64, 16, requires_grad=True)
    return lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=mask, is_causal=causal).sum().backward()


def test_sdpa_given_a_causal_mask_has_the_model_flops_of_is_causal():
    # B=2, H=4, S=64, D=16: forward 2*2*4*64*64*32 = 2097152, backward 2*2*4*64*64*80 = 5242880.
    # Model: both halved, less the backward's QK^T rebuild (16/80 of it): 1048576 + 2621440 - 524288
    keep = torch.ones(64, 64, dtype=torch.bool).tril()
    by_flag = tunekit.count_flops(_sdpa(causal=True))
    assert (by_flag.executed, by_flag.model) == (3670016, 3145728)   # the kernel skips the half
    for mask in (keep, torch.zeros(64, 64).masked_fill(~keep, float("-inf"))):
        fc = tunekit.count_flops(_sdpa(mask))
        assert (fc.executed, fc.model, fc.masked_attention) == (7340032, 3145728, 3670016)


def _eager(mask_fn):
    q = torch.randn(2, 4, 64, 16, requires_grad=True)

    def run():
        att = mask_fn(q @ q.transpose(-2, -1))
        (att.softmax(-1) @ q).sum().backward()
    return run


@pytest.mark.parametrize("mask_fn", [
    lambda a: a,                                                                      # no mask
    lambda a: a.masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(2), float("-inf")),  # leaks j = i+1
    lambda a: a + torch.zeros(64, 64),                                                # a zero bias
    lambda a: a.masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1), 0.0),       # filled, not masked
], ids=["none", "not-causal", "zero-bias", "zero-fill"])
def test_eager_attention_without_a_causal_mask_counts_in_full(mask_fn):
    # 4 bmms of 2*2*4*64*64*16 = 1048576 forward and backward: 2 + 4 = 6 -> 6291456, all model work
    fc = tunekit.count_flops(_eager(mask_fn))
    assert (fc.executed, fc.model, fc.masked_attention) == (6291456, 6291456, 0)


def test_eager_causal_attention_by_hand_and_a_mask_without_values_is_noted():
    causal = _eager(lambda a: a.masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1), float("-inf")))
    fc = tunekit.count_flops(causal)
    assert (fc.executed, fc.model, fc.masked_attention) == (6291456, 3145728, 3145728)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = _eager(lambda a: a.masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1), float("-inf")))
        fc = tunekit.count_flops(fake)
    assert (fc.executed, fc.model) == (6291456, 6291456)  # nothing to read: counted as it ran, and said
    assert any(n.startswith("1 attention mask(s) without values") for n in fc.notes)


# --- the Lab, the Monitor, a profiled cell: the same figure ---------------------------------------


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_lab_monitor_and_profile_give_the_convention_for_both_attentions(make_lab, attention):
    s = 64
    lab = make_lab(llama("sdpa"), peak_tflops=1.0, micro_batch=2, seq_len=s)
    r = lab.run(steps=1, warmup=0, attention=attention)
    assert (r.model_flops_per_step, r.mfu_convention) == (LLAMA[s], MFU_ANALYTIC)
    model, x = llama(attention), ids(2, s)
    mon = tunekit.Monitor(model, live=False, warmup=0)
    for _ in range(2):
        with mon.step():
            model(input_ids=x, labels=x).loss.backward()
    assert mon.close().mfu_convention == MFU_ANALYTIC
    assert [row["model_flops"] for row in mon.rows] == [LLAMA[s]] * 2
    with tunekit.profile(name="cell", flops="always") as rec:
        model(input_ids=x, labels=x).loss.backward()
    assert (rec.model_flops, rec.mfu_convention) == (LLAMA[s], MFU_ANALYTIC)


class Wrapped(torch.nn.Module):
    """A module tunekit knows no shape of: its model FLOPs can only come from the count."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(input_ids=x, labels=x).loss


def test_a_model_of_unknown_shape_counts_the_convention_for_eager_attention(make_lab):
    s, x = 64, ids(2, 64)
    net = Wrapped(llama("eager"))
    mon = tunekit.Monitor(net, live=False, warmup=0, tokens=2 * s)
    for _ in range(2):
        with mon.step():
            net(x).backward()
    assert mon.close().mfu_convention == MFU_COUNTED
    assert [row["model_flops"] for row in mon.rows] == [LLAMA[s]] * 2   # the count, masked half out
    assert mon.rows[0]["flops"] == LLAMA[s] + LLAMA_MASKED[s]           # what ran (HFU)
    with tunekit.profile(name="wrapped", flops="always") as rec:
        net(x).backward()
    assert (rec.model_flops, rec.mfu_convention) == (LLAMA[s], MFU_COUNTED)
    lab = make_lab(Wrapped(llama("eager")), peak_tflops=1.0, micro_batch=2,
                   seq_len=s, batch_fn=lambda b, n: (ids(b, n), None), loss_fn=lambda m, x, y: m(x))
    r = lab.run(steps=1, warmup=0)
    assert (r.model_flops_per_step, r.mfu_convention) == (LLAMA[s], MFU_COUNTED)
    assert math.isfinite(r.mfu)
