"""A profiled block's model FLOPs come from the shape of the model it ran, as the Lab computes
them (one MFU convention whatever attention kernel ran), and fall back to the count, saying why,
when the shape cannot give them. Transformers models are built from configs (nothing downloaded)."""
import pytest
import torch

import tunekit
from tunekit.core.formulas import MFU_ANALYTIC, MFU_COUNTED
from tunekit.models.adapters import adapt
from tunekit.models.gpt import GPT, GPTConfig
from tunekit.profiling.fingerprint import modules_seen
from tunekit.profiling.probe import Probe

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

transformers.logging.set_verbosity_error()

# The Llama below (test_hf_models.llama()): N = 107008 matmul weights (2 layers of 45312 + lm_head
# 256*64), L = 2, q width 64. Per token, trained: 6*107008 + 12*2*64*S/2 = 642048 + 768*S;
# forward only: 2*107008 + 4*2*64*S/2 = 214016 + 256*S.
N, TRAIN_PER_TOKEN, FORWARD_PER_TOKEN = 107008, {32: 666624, 64: 691200}, {32: 222208, 64: 230400}


def llama(attention="sdpa", seed=0, positions=128):
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).train()
    model.set_attn_implementation(attention)
    return model


def tokens(b, s):
    return torch.randint(0, 256, (b, s), generator=torch.Generator().manual_seed(s))


@pytest.mark.parametrize("s", [32, 64])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_llama_training_cell_gets_the_labs_model_flops_whatever_the_attention(attention, s):
    model, x = llama(attention), tokens(2, s)
    assert adapt(model).matmul_weights() == N
    with tunekit.profile(name="step", flops="always") as rec:
        model(input_ids=x, labels=x).loss.backward()
    # 2*32 tokens * 666624 = 42663936; 2*64 * 691200 = 88473600
    expected = {32: 42663936, 64: 88473600}[s]
    assert expected == 2 * s * TRAIN_PER_TOKEN[s]
    assert rec.model_flops == expected == adapt(model).model_flops(s, 2 * s, None)[0]  # the Lab's
    assert rec.mfu_convention == MFU_ANALYTIC
    assert not model._forward_pre_hooks and not model._forward_hooks  # removed with the counter
    assert f"MFU from the shape of `model` (LlamaForCausalLM), as the Lab: 1 forward call(s), " \
           f"{2 * s} tokens at S={s} forward+backward" in rec.notes
    # executed FLOPs (HFU) are still the count's, unchanged; the count's model FLOPs are the same
    # figure (eager attention's masked half is found and left out: 768*S per token, x 2*S tokens)
    model.zero_grad(set_to_none=True)
    fc = tunekit.count_flops(lambda: model(input_ids=x, labels=x).loss.backward())
    assert rec.flops == fc.executed and fc.model == rec.model_flops
    assert fc.masked_attention == ({32: 768 * 32 * 64, 64: 768 * 64 * 128}[s] if attention == "eager" else 0)


def test_built_in_gpt_training_cell_gets_the_labs_model_flops():
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=64, attention="math"))
    x = tokens(2, 64)
    with tunekit.profile(name="gpt", flops="always") as rec:
        model(x, x)[1].backward()
    # N per layer: qkv 64*192 + proj 64*64 + MLP 2*64*256 = 49152; x2 + lm_head 256*64 = 114688
    # per token 6*114688 + 12*2*64*64/2 = 688128 + 49152 = 737280; x 128 tokens = 94371840
    assert adapt(model).matmul_weights() == 114688
    assert rec.model_flops == 94371840 == adapt(model).model_flops(64, 128, None)[0]
    assert rec.mfu_convention == MFU_ANALYTIC


def test_inference_counts_2n_per_token_and_mixed_calls_add_up():
    model, x = llama(), tokens(2, 64)
    with tunekit.profile(name="infer", flops="always") as rec:
        with torch.no_grad():
            model(input_ids=x)
    # forward only: 128 tokens * 230400 = 29491200
    assert rec.model_flops == 29491200 == adapt(model).model_flops(64, 128, None, backward=False)[0]
    assert rec.mfu_convention == MFU_ANALYTIC and "128 tokens at S=64 forward only" in rec.notes[-2]
    # a training step, then an evaluation with grad on but no backward through it:
    # 88473600 + 1*32 * 222208 = 88473600 + 7110656 = 95584256
    y = tokens(1, 32)
    with tunekit.profile(name="mixed", flops="always") as rec:
        model(input_ids=x, labels=x).loss.backward()
        model(input_ids=y).logits.sum().item()
    assert rec.model_flops == 95584256
    assert "2 forward call(s), 32 tokens at S=32 forward only, 128 tokens at S=64 forward+backward" in rec.notes[-2]


def test_a_cached_run_keeps_the_shape_model_flops():
    model, x = llama("eager"), tokens(2, 32)
    recs = []
    for _ in range(2):
        with tunekit.profile(name="loop") as rec:
            model(input_ids=x, labels=x).loss.backward()
        recs.append(rec)
    assert [r.flops_source for r in recs] == ["counted", "cached"]
    assert [r.model_flops for r in recs] == [42663936, 42663936]  # 64 tokens * 666624
    assert [r.mfu_convention for r in recs] == [MFU_ANALYTIC, MFU_ANALYTIC]


def test_a_compiled_model_and_explicit_inputs_are_seen():
    model, x = llama(), tokens(2, 32)
    compiled = torch.compile(model)  # counted runs run it eagerly: nothing is compiled here
    with tunekit.profile(name="compiled", flops="always", inputs=(compiled, x)) as rec:
        compiled(input_ids=x, labels=x).loss.backward()
    assert rec.model_flops == 42663936 and rec.mfu_convention == MFU_ANALYTIC
    assert "`inputs` (LlamaForCausalLM)" in rec.notes[-2]


# --- fallbacks: the count's convention, and the reason ------------------------------------------


def counted_model(fn):
    return tunekit.count_flops(fn).model


def test_two_models_fall_back_to_the_count():
    student, teacher, x = llama(seed=0), llama(seed=1), tokens(2, 32)

    def step():
        with torch.no_grad():
            target = teacher(input_ids=x).logits
        (student(input_ids=x).logits - target).pow(2).mean().backward()

    with tunekit.profile(name="distill", flops="always") as rec:
        step()
    assert rec.mfu_convention == MFU_COUNTED and rec.model_flops == counted_model(step)
    assert "MFU from the count: several models ran (`student` (LlamaForCausalLM), `teacher` " \
           "(LlamaForCausalLM)), so no one model's shape gives the block's model FLOPs" in rec.notes


def test_decoding_with_a_kv_cache_falls_back_to_the_count():
    model, x = llama(), tokens(1, 16)
    with torch.no_grad():
        cache = model(input_ids=x, use_cache=True).past_key_values
    nxt = x[:, -1:]

    def decode():
        with torch.no_grad():
            model(input_ids=nxt, past_key_values=cache, use_cache=False)

    with tunekit.profile(name="decode", flops="always", inputs=(model, nxt)) as rec:
        decode()
    assert rec.mfu_convention == MFU_COUNTED
    assert "MFU from the count: the tokens of a call of `inputs` are unknown (the model was called " \
           "with a filled KV cache (decoding))" in rec.notes
    with tunekit.profile(name="generate", flops="always", inputs=(model, x)) as rec:
        model.generate(x, max_new_tokens=2, do_sample=False)
    assert rec.mfu_convention == MFU_COUNTED and "are unknown (the model was called with logits_to_keep" \
        in next(n for n in rec.notes if n.startswith("MFU from the count"))


def test_a_model_of_unknown_shape_or_one_that_did_not_run_falls_back_with_a_note():
    net, x = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()), torch.randn(4, 64)
    with tunekit.profile(name="net", flops="always") as rec:
        net(x).sum().backward()
    assert rec.mfu_convention == MFU_COUNTED
    assert "MFU from the count: `net` (Sequential) has no shape tunekit knows" in rec.notes
    model, h = llama(), torch.randn(2, 64)
    with tunekit.profile(name="head", flops="always") as rec:
        model.lm_head(h).sum().backward()  # a submodule: the model's own forward never ran
    assert rec.mfu_convention == MFU_COUNTED
    assert "MFU from the count: `model` (LlamaForCausalLM) ran no forward here" in rec.notes


def test_a_failed_block_keeps_the_count_and_leaves_no_hooks():
    model, x = llama(), tokens(2, 32)
    with pytest.raises(RuntimeError):
        with tunekit.profile(name="fails", flops="always") as rec:
            model(input_ids=x)
            raise RuntimeError("boom")
    assert rec.mfu_convention == MFU_COUNTED and rec.error == "RuntimeError: boom"
    assert not model._forward_pre_hooks and not model._forward_hooks


def test_given_model_flops_win_and_the_shape_is_not_consulted():
    model, x = llama(), tokens(2, 32)
    with tunekit.profile(name="given", flops="always", model_flops=1e9) as rec:
        model(input_ids=x, labels=x).loss.backward()
    assert (rec.model_flops, rec.mfu_convention) == (1e9, "given (--model-flops)")
    assert not any(n.startswith("MFU from") for n in rec.notes)


def test_models_option_is_checked_and_modules_are_found_where_the_fingerprint_looks():
    with pytest.raises(ValueError, match="models must be None or a callable"):
        Probe("x", models=[("m", torch.nn.Linear(2, 2))])
    model, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)

    def step():
        return model

    class Holder:
        def __init__(self):
            self.net = other

    ns = {"step": step, "model": model, "h": Holder(), "pair": (1, other), "n": 3}
    seen = modules_seen(ns, ["step", "h", "pair", "n"])
    assert [(label, m is model, m is other) for label, m in seen] == [
        ("h.net", False, True), ("model", True, False)]  # names walked in sorted order: h, n, pair, step


@pytest.mark.parametrize("qwen", [False, True])
def test_a_mixture_of_experts_counts_its_routed_experts_and_its_router(qwen):
    # N of 6N, by hand, h=64, 2 layers, 4 experts, top 2, vocab 512:
    # attention q 64*64 + k, v 2*32*64 + o 64*64 = 12288;
    # router 4*64 = 256 (a bare parameter of *TopKRouter: it was left out);
    # Mixtral experts 3*64*128 each, 2 of 4 used: 49152. Layer 61696, x2 + lm_head 512*64 = 156160.
    # Qwen2-MoE experts 3*64*32 each, 2 used: 12288; shared expert 3*64*64 = 12288 and its gate 64:
    # layer 12288+256+12288+12288+64 = 37184, x2 + 32768 = 107136.
    small = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, num_experts_per_tok=2)
    cfg = (transformers.Qwen2MoeConfig(**small, num_experts=4, moe_intermediate_size=32,
                                       shared_expert_intermediate_size=64) if qwen
           else transformers.MixtralConfig(**small, num_local_experts=4))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    n = 107136 if qwen else 156160
    assert adapt(model).matmul_weights() == n
    # and the count agrees: each token runs exactly top-2 experts, so the counted model FLOPs are
    # 6N per token + causal attention 6*L*64*S = 6*2*64*64 per token, x 2*64 tokens
    x = torch.randint(0, 512, (2, 64))
    fc = tunekit.count_flops(lambda: model(input_ids=x, labels=x).loss.backward())
    assert fc.model == adapt(model).model_flops(64, 128, None)[0] == 128 * (6 * n + 6 * 2 * 64 * 64)


def test_frozen_matmul_weights_take_the_counted_model_flops_not_6n():
    # only lm_head trains: 6N gave every weight a gradient, 88.1 MFLOP for a step of 33.7 (MFU 2.6x
    # over). The count, by hand (T = 2*64 tokens): forward 2 x 107008 x 128 = 27394048; causal
    # attention forward 2 layers x (QK^T + AV) 2 x 2*2*64*64*64 / 2 = 2097152; backward only lm_head's
    # weight gradient 2 x 16384 x 128 = 4194304 (below it nothing trains: no input gradient). 33685504
    model, x = llama(), tokens(2, 64)
    for p in model.model.parameters():
        p.requires_grad_(False)
    fc = tunekit.count_flops(lambda: model(input_ids=x, labels=x).loss.backward())
    assert fc.model == fc.executed == 27394048 + 2097152 + 4194304
    flops, convention, notes = adapt(model).model_flops(64, 128, fc.model)
    assert (flops, convention) == (fc.model, MFU_COUNTED)
    # frozen: every matmul weight but lm_head, 107008 - 256*64 = 90624
    assert notes[0].startswith("MFU from the counted FLOPs: 90,624 of the 107,008 matmul weights are frozen")
    # the same in a profiled cell (its model FLOPs from the count) and in a plan
    model.zero_grad(set_to_none=True)
    with tunekit.profile(name="frozen", flops="always") as rec:
        model(input_ids=x, labels=x).loss.backward()
    assert rec.model_flops == fc.model and rec.mfu_convention == MFU_COUNTED
    p = tunekit.plan(model, "cpu", micro_batch=2, seq_len=64, precision="fp32", verbose=False)
    assert p.model_flops == p.executed_flops == fc.model
