"""Sizing rules and the all-reduce bandwidth convention (pure)."""
import pytest

from tunekit.core.advisor import advise, pow2_factor, swiglu_dff_candidates
from tunekit.core.formulas import algbw, allreduce_busbw
from tunekit.core.shapes import padded_vocab, round_to_multiple

GPT2 = dict(vocab_size=50257, pad_vocab_multiple=64, padded_vocab_size=50304, n_layer=12,
            n_head=12, n_embd=768, block_size=1024, mlp="gelu")
BAD = dict(vocab_size=50257, n_embd=4096, n_head=48, block_size=1000, mlp="swiglu", d_ff=10922)


def test_pow2_factor():
    assert pow2_factor(96) == 32      # 96 = 3 * 2^5
    assert pow2_factor(768) == 256    # 768 = 3 * 2^8
    assert pow2_factor(0) == 0


def test_rounding_and_padding():
    assert padded_vocab(50257) == 50304            # 786 * 64
    assert round_to_multiple(100, 64, "down") == 64
    assert round_to_multiple(100, 64, "up") == 128


def test_swiglu_candidates_match_the_documents():
    c = swiglu_dff_candidates(4096)
    assert c["8/3*h"] == pytest.approx(10922.667, abs=1e-3)
    assert c["x64"] == 10944      # 171*64: the H100 search's fastest (398 vs 273 TFLOPS)
    assert c["x128"] == 10880     # 85*128, also in the search's top five
    assert c["x256"] == 11008     # 43*256: Llama-2-7B's intermediate size


def test_well_shaped_config_passes():
    adv = advise(GPT2, micro_batch=8)
    assert adv.problems == []
    assert adv["h/a divisible by a high power of 2"].value.startswith("head_dim h/a = 64")


def test_bad_config_gets_concrete_numbers():
    adv = advise(BAD, micro_batch=3, tp=3)
    assert "50304" in adv["vocab divisible by 64"].recommendation
    # 4096/48 is not whole; the nearest head count with head_dim a multiple of 64 (fewer heads
    # on a tie: larger h/a is better) is 32 -> head_dim 128
    assert adv["h/a divisible by a high power of 2"].recommendation == "use 32 heads (head_dim 128)"
    # b*s = 3000 = 2^3 * 375; micro-batch 8 gives 8000 = 2^6 * 125
    bs = adv["b*s divisible by a high power of 2"]
    assert bs.ok is False and "micro-batch 8" in bs.recommendation and "s = 1024" in bs.recommendation
    assert adv["h/t divisible by a high power of 2"].ok is False           # 4096 / 3
    assert adv["(b*a)/t an integer"].ok is True                              # 3*48/3 = 48
    ffn = adv["SwiGLU d_ff near 8/3*h, well-shaped"]
    assert ffn.ok is False and "10944" in ffn.recommendation and "swiglu_dff_search(4096)" in ffn.recommendation
    assert all(r.reason for r in adv.rules)


def test_ba_over_t_not_integral():
    adv = advise(dict(n_embd=4096, n_head=32), micro_batch=1, tp=3)
    assert adv["(b*a)/t an integer"].ok is False       # 1*32/3


def test_swiglu_llama_size_is_accepted():
    adv = advise(dict(n_embd=4096, n_head=32, mlp="swiglu", d_ff=11008))
    assert adv["SwiGLU d_ff near 8/3*h, well-shaped"].ok is True   # 11008 is 0.8% above 8/3*h


def test_a_swiglu_width_off_the_multiple_says_so():
    # issue 33: Llama with intermediate_size=688 at h=256: near 8/3*h (682.7) but 688 = 10*64 + 48
    ffn = advise(dict(n_embd=256, n_head=4, mlp="swiglu", d_ff=688))["SwiGLU d_ff near 8/3*h, well-shaped"]
    assert ffn.ok is False and ffn.value == "d_ff = 688 (2.688*h; 8/3*h = 682.7); not a multiple of 64 (688 % 64 = 48)"
    assert ffn.recommendation.startswith("use d_ff = 704 (x64)")   # ceil(682.7 / 64) * 64


def test_missing_inputs_are_not_checked():
    adv = advise(dict(n_embd=256, n_head=4))
    assert adv["b*s divisible by a high power of 2"].ok is None


def test_to_frame():
    df = advise(GPT2, micro_batch=8).to_frame()
    assert set(df["status"]) <= {"ok", "FIX", "n/a"} and "reason" in df.columns


def test_allreduce_bandwidth_convention():
    assert algbw(1e9, 0.5) == 2e9
    assert allreduce_busbw(2e9, 8) == pytest.approx(3.5e9)   # 2e9 * 2*7/8
    assert allreduce_busbw(2e9, 2) == 2e9                    # 2*(2-1)/2 = 1
    assert allreduce_busbw(2e9, 1) == 0.0


def test_vocab_padding_from_pad_multiple_in_a_dict():
    # the model pads 50257 up to 50304 itself: no FIX even without padded_vocab_size
    adv = advise(dict(vocab_size=50257, pad_vocab_multiple=64, n_embd=768, n_head=12))
    assert adv["vocab divisible by 64"].ok is True and "50304" in adv["vocab divisible by 64"].value
