"""The demo GPT: exact parameter counts, attention impls agree, toggles on the live model."""
import sys
import types
import warnings

import pytest
import torch

from tunekit.models import gpt as model_mod
from tunekit.models.gpt import GPT, PRESETS, GPTConfig


def _tiny(**kw):
    return GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, **kw)


def test_cpu_tiny_param_count_exact():
    m = GPT(GPTConfig.preset("cpu-tiny"))
    # d=128, V=256, L=2, ffn=4*128=512, no biases, tied lm_head:
    # wte 256*128 = 32768
    # block: 2 norms 2*128 + qkv 128*384 + proj 128*128 + up 128*512 + down 512*128
    #      = 256 + 49152 + 16384 + 65536 + 65536 = 196864;  x2 = 393728
    # final norm 128  ->  32768 + 393728 + 128 = 426624 (rope: no position table)
    assert m.num_params() == 426624
    assert m.num_params(non_embedding=False) == 426624


def test_gpt2_124m_shapes_param_count():
    with torch.device("meta"):
        m = GPT(GPTConfig.preset("gpt2-124m"))
    # wte 50304*768 = 38633472 (50257 padded to a multiple of 64), wpe 1024*768 = 786432
    # layer: norms 1536 + qkv 768*2304+2304 = 1771776 + proj 768*768+768 = 590592
    #        + up 768*3072+3072 = 2362368 + down 3072*768+768 = 2360064  = 7086336; x12 = 85036032
    # final norm 768 -> total 38633472 + 786432 + 85036032 + 768 = 124456704
    assert m.config.padded_vocab_size == 50304
    assert m.num_params(non_embedding=False) == 124456704
    assert m.num_params() == 124456704 - 786432


def test_gpt_1b_is_about_one_billion():
    with torch.device("meta"):
        m = GPT(GPTConfig.preset("gpt-1b"))
    # wte 256*2048 = 524288; layer: norms 4096 + attn 4*2048^2 = 16777216
    #   + swiglu 3*2048*8192 = 50331648 -> 67112960; x16 = 1073807360; final norm 2048
    assert m.num_params() == 524288 + 1073807360 + 2048 == 1074333696


def test_ffn_dim_rules():
    assert GPTConfig(n_embd=128, n_head=4).ffn_dim == 512                  # 4*d
    assert GPTConfig(n_embd=768, n_head=12, mlp="swiglu").ffn_dim == 2048  # 8/3*768 = 2048 exactly
    # 8/3*4096 = 10922.67 -> next multiple of 64 = 10944 (the fast shape, not 10922)
    assert GPTConfig(n_embd=4096, n_head=32, mlp="swiglu").ffn_dim == 10944
    assert GPTConfig(n_embd=64, n_head=2, mlp="swiglu").ffn_dim == 192    # 170.67 -> 192
    assert GPTConfig(n_embd=64, n_head=2, d_ff=100).ffn_dim == 100
    assert GPTConfig(vocab_size=250, pad_vocab_multiple=64).padded_vocab_size == 256
    assert GPTConfig(n_embd=96, n_head=4).head_dim == 24


def test_bad_config_rejected():
    with pytest.raises(ValueError):
        GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError):
        GPTConfig(attention="fast")
    with pytest.raises(KeyError):
        GPTConfig.preset("gpt-7b")


def test_a_misspelled_preset_names_the_one_meant():
    # a ValueError (what a wrong value is) that is still a KeyError for callers that catch one,
    # its message unquoted and naming the closest preset
    with pytest.raises(ValueError) as info:
        GPTConfig.preset("cpu-tiyn")
    assert isinstance(info.value, KeyError)
    assert str(info.value) == ("unknown preset 'cpu-tiyn': did you mean 'cpu-tiny'? (the presets: "
                               "cpu-small, cpu-tiny, gpt-1b, gpt2-124m, gpt2-350m)")
    # 'gpt2' begins two presets: the first of them, the smaller (difflib scores both 2 * 4 / 13 = 0.62
    # and took the last, 'gpt2-350m')
    with pytest.raises(ValueError, match=r"^unknown preset 'gpt2': did you mean 'gpt2-124m'\? "):
        GPTConfig.preset("gpt2")


@pytest.mark.parametrize("pos,mlp", [("rope", "gelu"), ("learned", "swiglu")])
def test_math_and_sdpa_agree_and_are_causal(pos, mlp):
    torch.manual_seed(0)
    m = GPT(_tiny(pos=pos, mlp=mlp, pad_vocab_multiple=64, vocab_size=200)).eval()
    x = torch.randint(0, 200, (2, 16))
    m.set_attention("math")
    logits_math, _ = m(x)
    assert m.attention_ran == "math"
    m.set_attention("sdpa")
    logits_sdpa, _ = m(x)
    assert m.attention_ran == "sdpa"
    assert logits_sdpa.shape == (2, 16, 256)  # padded vocab columns
    torch.testing.assert_close(logits_math, logits_sdpa, atol=1e-5, rtol=1e-4)
    x2 = x.clone()
    x2[:, 10:] = (x2[:, 10:] + 1) % 200  # change the future: the past must not see it
    torch.testing.assert_close(m(x2)[0][:, :10], logits_sdpa[:, :10])


def test_flash_without_package_falls_back_once(monkeypatch):
    monkeypatch.setattr(model_mod, "_flash_fn", None)
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # "not installed", even where it is
    m = GPT(_tiny())
    m.set_attention("flash")
    x = torch.randint(0, 256, (1, 8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m(x)
        assert m.attention_ran == "sdpa"  # CPU fp32: flash-attn cannot run, SDPA did
        assert model_mod._flash_attn_func() is None
        assert model_mod._flash_attn_func() is None
    assert len([w for w in caught if "flash-attn" in str(w.message)]) == 1  # said once
    # the answer is cached: every layer asks on every forward, a failed import must not retry
    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(flash_attn_func=print))
    assert model_mod._flash_attn_func() is None


def test_padded_vocab_is_out_of_loss_and_sampling():
    torch.manual_seed(0)
    m = GPT(_tiny(vocab_size=200, pad_vocab_multiple=64)).eval()  # 56 padding columns
    # make the padding columns the most likely by far: neither loss nor sampling may see them
    m.lm_head.register_forward_hook(lambda mod, inp, out: out.index_fill(-1, torch.arange(200, 256), 50.0))
    x, y = torch.randint(0, 200, (2, 16)), torch.randint(0, 200, (2, 16))
    logits, loss = m(x, y)
    assert logits.shape[-1] == 256
    expected = torch.nn.functional.cross_entropy(logits[..., :200].reshape(-1, 200), y.reshape(-1))
    torch.testing.assert_close(loss, expected)
    out = m.generate(x[:, :4], max_new_tokens=20, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 24) and int(out.max()) < 200


def test_checkpointing_same_loss_and_grads():
    torch.manual_seed(0)
    m = GPT(_tiny())
    x, y = torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))
    _, loss = m(x, y)
    loss.backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m.set_checkpointing(True)
    _, loss2 = m(x, y)
    loss2.backward()
    assert loss2.item() == pytest.approx(loss.item(), abs=1e-6)
    for g, p in zip(grads, m.parameters()):
        torch.testing.assert_close(p.grad, g)


def test_set_attention_does_not_touch_presets():
    m = GPT(PRESETS["cpu-tiny"])
    m.set_attention("math")
    assert PRESETS["cpu-tiny"].attention == "sdpa"
    with pytest.raises(ValueError):
        m.set_attention("xformers")


def test_too_long_sequence_rejected():
    m = GPT(_tiny())
    with pytest.raises(ValueError, match="block_size"):
        m(torch.zeros(1, 17, dtype=torch.long))


def test_rope_scores_depend_only_on_distance_and_head_is_tied():
    from tunekit.models.gpt import apply_rope, rope_tables
    torch.manual_seed(0)
    cos, sin = rope_tables(head_dim=8, max_len=32)
    q, k = torch.randn(8), torch.randn(8)

    def score(m, n):  # q at position m, k at position n
        qm = apply_rope(q.view(1, 1, 1, 8), cos[m:m + 1], sin[m:m + 1])
        kn = apply_rope(k.view(1, 1, 1, 8), cos[n:n + 1], sin[n:n + 1])
        return float((qm * kn).sum())

    assert score(5, 2) == pytest.approx(score(25, 22), abs=1e-4)  # same distance, same score
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-3)
    assert score(0, 0) == pytest.approx(float(q @ k), abs=1e-5)  # position 0: no rotation
    m = GPT(_tiny())
    assert m.lm_head.weight is m.wte.weight  # tied: one tensor, counted once


def test_the_one_loss_helper_reads_every_kind_of_output():
    from tunekit.models.adapters import loss_of, step_loss

    m = torch.tensor([[1.0, 2.0], [3.0, 4.5]], dtype=torch.bfloat16)
    one = torch.tensor(2.5)
    assert loss_of((m, one)) is one and loss_of((m, None)).dtype == torch.float32   # GPT: (logits, loss)
    assert loss_of(types.SimpleNamespace(loss=one)) is one                          # transformers: .loss
    assert loss_of({"logits": m, "loss": one}) is one                               # a dict's "loss"
    assert loss_of(one) is one                                                      # one number: as it is
    assert loss_of(m).item() == 10.5 and loss_of(m).dtype == torch.float32          # 1+2+3+4.5, in fp32
    assert loss_of(m, reduce=False) is m                                            # the Lab refuses it itself
    with pytest.raises(TypeError, match=r"^the model's output is a dict of \['logits'\], not a tensor"):
        loss_of({"logits": m})
    with pytest.raises(TypeError, match=r"^the model's output is NoneType, not a tensor"):
        loss_of(types.SimpleNamespace(loss=None))
    fed = []

    def model(*args):
        fed.append(args)
        return m

    assert step_loss(model, (1, 2)).item() == 10.5 and step_loss(model, [3]).item() == 10.5
    step_loss(model, "x")
    assert fed == [(1, 2), (3,), ("x",)]   # a tuple or list spread, anything else as one argument
