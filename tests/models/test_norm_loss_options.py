"""GPTConfig's norm and loss options (norm, norm_precision, loss_precision): llm-foundry's MPT choices
(LPLayerNorm, flash-attn's fused cross-entropy) as options of the demo GPT; exact counts and values."""
import pytest
import torch
import torch.nn.functional as F

from tunekit.core.shapes import model_shape
from tunekit.models.gpt import GPT, GPTConfig, LayerNorm, LogitsCrossEntropy


def _tiny(**kw):
    return GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, **kw)


def test_layer_norm_param_counts_exact():
    # d=32, V=256, L=2, ffn 128, rope (no position table), tied lm_head; wte 256*32 = 8192
    # with biases: block = 2 norms 2*(32+32) + qkv 32*96+96 + proj 32*32+32 + up 32*128+128 + down 128*32+32
    #            = 128 + 3168 + 1056 + 4224 + 4128 = 12704; x2 = 25408; final norm 64 -> 8192 + 25408 + 64 = 33664
    # without: block = 2*32 + 3072 + 1024 + 4096 + 4096 = 12352; x2 = 24704; final 32 -> 8192 + 24704 + 32 = 32928
    for cfg, n in ((_tiny(norm="layer", bias=True), 33664), (_tiny(norm="layer"), 32928)):
        assert GPT(cfg).num_params() == n and model_shape(cfg).param_count() == n
    assert isinstance(GPT(_tiny(norm="layer")).norm_f, LayerNorm)


def test_logits_cross_entropy_is_cross_entropy():
    torch.manual_seed(0)
    x = torch.randn(6, 11, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 11, (6,))
    fused = LogitsCrossEntropy.apply(x, t)
    (g_fused,) = torch.autograd.grad(fused, x)
    ref = F.cross_entropy(x, t)
    (g_ref,) = torch.autograd.grad(ref, x)
    assert abs(fused.item() - ref.item()) < 1e-12
    assert torch.allclose(g_fused, g_ref, atol=1e-14)


def _saved_logit_sized(cfg, b=3, t=16):   # 3*16*256 = 12288: no weight (256*32) has that size
    """dtypes of the tensors autograd saves that hold b*t*vocab numbers (the logits' size), under bf16."""
    torch.manual_seed(0)
    m, idx = GPT(cfg), torch.randint(0, cfg.vocab_size, (b, t))
    seen = []

    def pack(x):
        if x.numel() == b * t * cfg.vocab_size:
            seen.append(x.dtype)
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x), torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = m(idx, idx)
    loss.backward()
    return seen, loss


def test_logits_loss_keeps_no_fp32_copy_of_the_logits():
    # the fp32 loss saves the fp32 log-softmax (and its input); the fused one only the bf16 logits
    fp32_seen, _ = _saved_logit_sized(_tiny())
    fused_seen, loss = _saved_logit_sized(_tiny(loss_precision="logits"))
    assert torch.float32 in fp32_seen
    assert fused_seen == [torch.bfloat16] and loss.dtype == torch.float32


def test_compute_precision_norm_runs_in_the_autocast_dtype():
    torch.manual_seed(0)
    norm = LayerNorm(32, precision="compute", bias=True)
    x = torch.randn(4, 32)                                   # an fp32 residual stream under bf16 autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x)
    want = F.layer_norm(x.bfloat16(), (32,), norm.weight.bfloat16(), norm.bias.bfloat16(), 1e-5)
    assert y.dtype == torch.bfloat16 and torch.equal(y, want)
    assert LayerNorm(32)(x).dtype == torch.float32            # "fp32": the input's dtype back


@pytest.mark.parametrize("field, value", [("norm", "batch"), ("norm_precision", "bf16"),
                                          ("loss_precision", "compute")])
def test_bad_option_rejected(field, value):
    with pytest.raises(ValueError, match=f"{field} must be one of"):
        _tiny(**{field: value})


@pytest.mark.parametrize("options", [dict(norm="layer"), dict(norm="layer", norm_precision="compute"),
                                     dict(norm_precision="compute", loss_precision="logits"),
                                     dict(norm="layer", norm_precision="compute", loss_precision="logits")])
def test_the_estimate_counts_what_autograd_keeps(options):
    from tunekit import measure_memory

    # tests/measure/test_memory.py's exact variant (learned positions, biases, SwiGLU, math attention)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=64, block_size=32, pos="learned", bias=True, mlp="swiglu",
                    attention="math", **options)
    for precision in ("fp32", "bf16"):
        for checkpointing in (False, True):
            rep = measure_memory(GPT(cfg), precision=precision, micro_batch=2, seq_len=32,
                                 checkpointing=checkpointing)
            assert rep.measured["activations"] == rep.estimate["activations"], (precision, checkpointing)
