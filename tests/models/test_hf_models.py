"""Your own model: transformers decoders built from configs (random init, nothing downloaded),
any nn.Module, and torch.compile. FLOP counts are exact against hand counts."""
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config  # noqa: E402

import tunekit  # noqa: E402
from tunekit.core.shapes import model_shape  # noqa: E402
from tunekit.core.toggles import ToggleError  # noqa: E402
from tunekit.lab.lab import Lab  # noqa: E402
from tunekit.models.adapters import adapt  # noqa: E402

transformers.logging.set_verbosity_error()


def llama(L=2, h=64, f=172, nh=4, kv=2, V=256, P=128, **kw):
    return LlamaConfig(vocab_size=V, hidden_size=h, intermediate_size=f, num_hidden_layers=L,
                       num_attention_heads=nh, num_key_value_heads=kv, max_position_embeddings=P, **kw)


def gpt2(L=2, h=64, nh=4, V=256, P=128):
    return GPT2Config(vocab_size=V, n_embd=h, n_layer=L, n_head=nh, n_positions=P)


def build(cfg):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).train()


def counted(model, b, s, attention, ckpt):
    a = adapt(model)
    a.set_attention(attention)
    a.set_checkpointing(ckpt)
    x = torch.randint(0, model.config.vocab_size, (b, s))
    fc = tunekit.count_flops(lambda: a.loss(model, x, x).backward())
    model.zero_grad(set_to_none=True)
    return fc


# --- shapes read from configs are exact ------------------------------------------------------


@pytest.mark.parametrize("cfg", [llama(), llama(L=3, h=96, f=256, nh=6, kv=3, attention_bias=True,
                                               mlp_bias=True, tie_word_embeddings=True),
                                 gpt2(), Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=176,
                                                     num_hidden_layers=2, num_attention_heads=4,
                                                     num_key_value_heads=2)],
                         ids=["llama", "llama-biased-tied", "gpt2", "qwen2"])
def test_parameter_and_matmul_counts_are_exact(cfg):
    model = build(cfg)
    shape = model_shape(cfg)
    assert shape.param_count() == sum(p.numel() for p in model.parameters())
    linear = sum(m.weight.numel() for m in model.modules() if type(m).__name__ in ("Linear", "Conv1D"))
    assert shape.matmul_params() == linear
    est = tunekit.estimate_memory(cfg, micro_batch=1, seq_len=16, precision="fp32", device="cpu")
    assert est.inputs["n_params"] == shape.param_count()


def test_llama_shape_by_hand():
    s = model_shape(llama())
    # per layer q 64*64 + k,v 2*64*32 (2 kv heads of 16) + o 64*64 + MLP 3*64*172 = 45312;
    # x 2 layers + lm_head 256*64 (untied) = 107008 matmul weights
    assert (s.layer_matmul_params(), s.matmul_params()) == (45312, 107008)
    # + embedding 256*64 + 2 RMSNorm weights per layer (2*64) + final norm 64 = 123712
    assert s.param_count() == 107008 + 16384 + 2 * 128 + 64 == 123712


# --- executed FLOPs against hand counts ------------------------------------------------------


@pytest.mark.parametrize("b,s", [(2, 32), (1, 64)])
@pytest.mark.parametrize("attention,ckpt", [("sdpa", False), ("math", False), ("sdpa", True), ("math", True)])
def test_llama_training_step_flops_by_hand(b, s, attention, ckpt):
    model, shape = build(llama()), model_shape(llama())
    fc = counted(model, b, s, attention, ckpt)
    T, L, N = b * s, 2, 107008
    att = b * 4 * s * s * 16                     # b*nh*s^2*hd: one attention matmul's MACs
    # 6TN for the matmuls; attention: SDPA is causal, forward 4 units and backward 10 halved
    # (7); eager counts its full 4 + 8 (12)
    per_layer_attn = 7 * att if attention == "sdpa" else 12 * att
    expected = 6 * T * N + L * per_layer_attn
    recompute = 0
    if ckpt:
        # non-reentrant checkpointing replays each layer up to the last tensor backward needs:
        # every matmul but down_proj (45312 - 64*172 = 34304 weights), and the attention forward
        recompute = L * (2 * T * 34304 + (2 if attention == "sdpa" else 4) * att)
    assert (fc.executed, fc.recompute) == (expected + recompute, recompute)
    # SDPA's backward rebuilds QK^T: 2 of its 10 units (halved: 1 per att), not model work
    assert fc.attention_recompute == (L * att if attention == "sdpa" else 0)
    assert shape.n_layer == L


@pytest.mark.parametrize("b,s", [(2, 32), (1, 64)])
@pytest.mark.parametrize("ckpt", [False, True])
def test_gpt2_training_step_flops_by_hand(b, s, ckpt):
    model = build(gpt2())
    fc = counted(model, b, s, "sdpa", ckpt)
    T, L = b * s, 2
    N_layer = 3 * 64 * 64 + 64 * 64 + 2 * 64 * 256      # c_attn, attn c_proj, c_fc, mlp c_proj
    N = L * N_layer + 256 * 64                           # + lm_head (tied to wte)
    att = b * 4 * s * s * 16
    # transformers' GPT-2 gives SDPA an explicit mask: the masked half is computed (12 units)
    expected = 6 * T * N + L * 12 * att
    recompute = L * (2 * T * N_layer + 4 * att) if ckpt else 0   # the whole block is replayed
    assert (fc.executed, fc.recompute) == (expected + recompute, recompute)


# --- the Lab on a transformers model ---------------------------------------------------------


@pytest.fixture
def hf_lab(make_lab):
    return make_lab(build(llama()), peak_tflops=1.0, micro_batch=2, seq_len=32)


def test_lab_runs_a_transformers_model_without_batch_or_loss_functions(make_lab):
    lab = make_lab(build(llama()), peak_tflops=1.0, micro_batch=2)
    t = lab.resolve()
    assert (t.seq_len, t.attention) == (128, "sdpa")   # within max_position_embeddings=128
    r = lab.run(steps=2, warmup=1)
    assert math.isfinite(r.loss) and 4.5 < r.loss_first < 6.5   # ~ln(256) = 5.55 at init
    assert r.mfu_convention.startswith("analytic")
    with pytest.raises(ToggleError, match=r"position limit \(128"):
        lab.run(seq_len=129)


def test_mfu_is_the_same_for_sdpa_and_eager(hf_lab):
    sdpa = hf_lab.run(steps=1, warmup=0)
    eager = hf_lab.run(steps=1, warmup=0, attention="eager")
    assert eager.attention == "math" and eager.attention_ran == "math"
    # one convention: 6 x 107008 matmul weights + causal attention 12*L*h*s/2 = 6*2*64*32,
    # per token, x 64 tokens
    assert sdpa.model_flops_per_step == eager.model_flops_per_step == (6 * 107008 + 6 * 2 * 64 * 32) * 64
    assert eager.flops_per_step > sdpa.flops_per_step       # HFU: eager computes the masked half
    ckpt = hf_lab.run(steps=1, warmup=0, checkpointing=True)
    assert ckpt.model_flops_per_step == sdpa.model_flops_per_step
    assert ckpt.hfu > ckpt.mfu and ckpt.saved_bytes < 0.5 * sdpa.saved_bytes


def _checkpoint_by_hand(model):
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):   # transformers >= 5.2x's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def test_lab_follows_changes_made_by_hand_and_says_when_a_given_toggle_replaces_one(hf_lab):
    from tunekit.core.notes import of_kind

    first = hf_lab.run(steps=1, warmup=0)
    assert (first.attention, first.checkpointing) == ("sdpa", False)
    hf_lab.model.set_attn_implementation("eager")          # by hand, outside the Lab
    _checkpoint_by_hand(hf_lab.model)
    # attention and checkpointing left out: the run takes the model as it is, and records it
    followed = hf_lab.run(steps=1, warmup=0)
    assert (followed.attention, followed.attention_ran, followed.checkpointing) == ("math", "math", True)
    assert followed.flops_per_step > first.flops_per_step   # eager computes the masked half; the blocks recompute
    assert followed.saved_bytes < first.saved_bytes          # checkpointing keeps only the blocks' inputs
    assert not of_kind(followed.notes, "toggle.over_hand_change")
    assert hf_lab.resolve().checkpointing is True and hf_lab.defaults.checkpointing is None
    # a toggle given explicitly replaces a hand change, and the run says so in a note of its own kind
    hf_lab.model.config._attn_implementation = "sdpa"      # by hand again, through the config
    given = hf_lab.run(steps=1, warmup=0, attention="math", checkpointing=True)   # checkpointing: as it is
    assert given.attention_ran == "math" and given.checkpointing is True
    assert [n.kind for n in of_kind(given.notes, "toggle.over_hand_change")] == ["toggle.over_hand_change"]
    assert "attention" in of_kind(given.notes, "toggle.over_hand_change")[0]
    back = hf_lab.run(steps=1, warmup=0)    # left out again: the model as it was set by hand, nothing to say
    assert (back.attention, back.checkpointing) == ("sdpa", True) and not of_kind(back.notes, "toggle.over_hand_change")
    hf_lab.model.eval()                  # another mode (dropout, caches) may change the work
    assert hf_lab.run(steps=1, warmup=0).flops_source == "counted"
    hf_lab.model.train()
    assert hf_lab.run(steps=1, warmup=0).flops_source == "cached"


def test_measure_memory_uses_the_labs_loss_and_matches_the_estimate(hf_lab):
    rep = tunekit.measure_memory(hf_lab)
    assert rep.measured["activations"] > 0
    assert abs(rep.error("activations")) < 0.10
    assert rep.error("weights") == 0.0


def test_measure_memory_of_a_causal_lm_given_only_its_inputs_trains_on_them_as_labels():
    # was: TypeError: HFAdapter.loss() missing 1 required positional argument: 'y'
    from tunekit.models.adapters import step_loss

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama()).train()
    x = torch.randint(0, 256, (2, 16))
    alone, tensor, paired = (tunekit.measure_memory(model, b).measured for b in [(x,), x, (x, x)])
    # llama(): embed 256*64 = 16384; a layer: q, o 64*64 = 4096 each, k, v 64*32 = 2048 each (2 kv
    # heads of 16), MLP 3*64*172 = 33024, 2 norms 2*64 = 128 -> 45440, x2 = 90880; final norm 64;
    # lm_head 256*64 = 16384 -> 123712 weights in 21 tensors, fp32
    assert alone["weights"] == alone["gradients"] == 4 * 123712 == 494848
    assert alone["optimizer_states"] == 2 * 494848 + 21 * 4   # AdamW's two moments, a 4-byte step each
    assert tensor == alone   # a bare tensor is the same batch
    # (x, x): labels already shifted, x itself; x alone: transformers shifts it into a new
    # (2, 16) int64 labels tensor the loss keeps, 2*16*8 = 256 bytes more
    assert alone["activations"] - paired["activations"] == 256
    # the loss is the Trainer's (labels=input_ids), to the bit
    assert torch.equal(step_loss(model, (x,), "transformers"), model(input_ids=x, labels=x).loss)


@pytest.mark.parametrize("cfg", [llama(L=3, h=128, f=344, nh=8, kv=2, V=512, P=256), gpt2(L=3, h=128, V=512, P=256)],
                         ids=["llama", "gpt2"])
# bf16 with checkpointing under sdpa, both models, in `make test`; the other three settings in `make test-slow`
@pytest.mark.parametrize("precision,ckpt,attention", [pytest.param("fp32", False, "sdpa", marks=pytest.mark.slow),
                                                      pytest.param("bf16", False, "math", marks=pytest.mark.slow),
                                                      ("bf16", True, "sdpa"),
                                                      pytest.param("fp32", True, "math", marks=pytest.mark.slow)])
def test_activation_estimate_within_ten_percent(tmp_path, cfg, precision, ckpt, attention):
    lab = Lab(build(cfg), log_path=tmp_path / "r.jsonl", peak_tflops=1.0, micro_batch=2, seq_len=96,
              precision=precision, checkpointing=ckpt, attention=attention)
    rep = tunekit.measure_memory(lab)
    assert abs(rep.error("activations")) < 0.10, rep.to_frame()


def test_advise_reads_a_llama_config():
    adv = tunekit.advise(llama(h=256, f=688, nh=4, V=32000), micro_batch=4, seq_len=128)
    assert adv["hidden size h divisible by 64"].ok is True
    assert adv["h/a divisible by a high power of 2"].value.startswith("head_dim h/a = 64")
    ffn = adv["SwiGLU d_ff near 8/3*h, well-shaped"]
    assert ffn.ok is False and "704" in ffn.recommendation     # ceil(8/3*256 / 64) * 64


# --- any nn.Module ---------------------------------------------------------------------------


def test_any_module_checkpoints_the_blocks_it_is_told(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                                    torch.nn.Linear(64, 32)) for _ in range(3)])
    lab = Lab(net, batch_fn=lambda b, s: (torch.randn(b, 32), torch.randn(b, 32)),
              loss_fn=lambda m, x, y: (m(x) - y).square().mean(), blocks=list(net),
              log_path=tmp_path / "r.jsonl", peak_tflops=1.0, micro_batch=8)
    base = lab.run(steps=1, warmup=0)
    ckpt = lab.run(steps=1, warmup=0, checkpointing=True)
    # each block replays its first Linear (GELU's backward needs its input): 3 x 2*8*32*64
    assert ckpt.flops_per_step - base.flops_per_step == 3 * 2 * 8 * 32 * 64 == 98304
    assert ckpt.mfu_convention.startswith("counted") and ckpt.model_flops_per_step == base.model_flops_per_step
    lab.run(steps=1, warmup=0, checkpointing=False)
    assert all("forward" not in b.__dict__ for b in net)   # the blocks' own forward is back


# --- torch.compile ---------------------------------------------------------------------------


@pytest.mark.slow
def test_profiling_a_compiled_model_leaves_it_compiled(run, ip):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    run("net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))\n"
        "cnet = torch.compile(net, backend='eager')\nxin = torch.randn(8, 32)")
    for _ in range(2):
        r = run("%%gpuprofile -q -n compiled\ncnet(xin).sum().backward()")
        assert r.error_in_exec is None
    first, second = tunekit.history(all=True).iloc[-2:].to_dict("records")
    # counted on the eager original: forward 2*8*(32*64 + 64*32) = 65536, backward twice the
    # weight grads + the input grad of the 2nd Linear only: 2*65536 - 2*8*32*64 = 98304
    assert (first["flops_source"], first["flops"]) == ("counted", 65536 + 98304)
    assert second["flops_source"] == "cached"
    # Dynamo captured the frame after the counted run: the cached run timed compiled code, and
    # since it compiled there, it says its time includes compiling and gives no TFLOPS
    assert counters["stats"]["calls_captured"] >= 1 and counters["stats"]["unique_graphs"] >= 1
    assert math.isnan(second["tflops"]) and "includes compiling" in second["notes"]
    assert run("%%gpuprofile -q -n compiled\ncnet(xin).sum().backward()").error_in_exec is None
    third = tunekit.history().iloc[-1]
    assert third["flops_source"] == "cached" and third["tflops"] > 0   # compiled, timed cleanly
    torch._dynamo.reset()


def test_gpuprofile_recounts_after_the_attention_changes_by_hand(run, ip):
    ip.user_ns["hf"] = build(llama())
    run("xs = torch.randint(0, 256, (2, 32))")
    cell = "%%gpuprofile -q -n hf_step\nhf(input_ids=xs, labels=xs).loss.backward()"
    run(cell)
    run(cell)
    run("hf.set_attn_implementation('eager')")
    run(cell)
    rows = tunekit.history().iloc[-3:]
    assert rows["flops_source"].tolist() == ["counted", "cached", "counted"]
    sdpa, eager = rows["flops"].iloc[0], rows["flops"].iloc[2]
    # eager computes the masked half of QK^T and AV in forward and backward: per layer
    # (12 - 7) * b*nh*s^2*hd = 5 * 2*4*32*32*16, x 2 layers (shifted labels: same matmuls)
    assert eager - sdpa == 2 * 5 * 2 * 4 * 32 * 32 * 16
    assert any("recounted" in n and "hf" in n for n in tunekit.last().notes)


def test_gemma_is_counted_as_the_gated_decoder_it_is():
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("gemma", vocab_size=128, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=16, max_position_embeddings=64, pad_token_id=0)
    model = build(cfg)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    # per layer q 64*64 + k,v 2*64*32 (2 kv heads of 16) + o 64*64 + gated MLP 3*64*128 = 36864,
    # x 2 layers + lm_head 128*64 = 81920 (a plain 2-matrix MLP would read 65536)
    assert model_shape(cfg).matmul_params() == linear == 2 * 36864 + 128 * 64 == 81920


@pytest.mark.parametrize("qwen", [False, True], ids=["mixtral", "qwen2_moe"])
def test_a_mixture_of_experts_config_holds_every_expert_and_trains_top_k(qwen):
    # estimate_memory(MixtralConfig) read the experts as one dense MLP: weights, gradients and
    # optimizer states of half the model. By hand, h=64, 2 layers, 4 experts, vocab 512, untied:
    # attention 12288 weights (q, o 64*64; k, v 32*64); router 4*64 = 256; norms 2*64.
    # Mixtral: experts 4 * 3*64*128 = 98304; layer 12288+256+98304+128 = 110976, x2 + embed and
    # lm_head 2*512*64 + final norm 64 = 287552. Top 2 of 4 per token: N = 2*(12288+256+49152) + 32768 = 156160.
    # Qwen2-MoE: q,k,v biases 128; experts 4 * 3*64*32 = 24576; shared expert 3*64*64 + gate 64 = 12352;
    # layer 12288+128+256+24576+12352+128 = 49728, x2 + 65536 + 64 = 165056; N = 2*(12288+256+12288+12352)
    # + 32768 = 107136.
    small = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, num_experts_per_tok=2)
    cfg = (transformers.Qwen2MoeConfig(**small, num_experts=4, moe_intermediate_size=32,
                                       shared_expert_intermediate_size=64) if qwen
           else transformers.MixtralConfig(**small, num_local_experts=4))
    n_params, n_matmul = (165056, 107136) if qwen else (287552, 156160)
    model, shape = build(cfg), model_shape(cfg)
    assert shape.param_count() == sum(p.numel() for p in model.parameters()) == n_params
    assert sum(math.prod(s) for s in shape.param_shapes()) == n_params
    assert shape.matmul_params() == adapt(model).matmul_weights() == n_matmul
    assert not shape.notes
    est = tunekit.estimate_memory(cfg, micro_batch=1, seq_len=16, precision="fp32", device="cpu")
    assert est.components["weights"] == 4 * n_params


def _family(name):
    small = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    return {"phi": lambda: transformers.PhiConfig(**small, intermediate_size=128, max_position_embeddings=256),
            "falcon": lambda: transformers.FalconConfig(**small),
            "opt": lambda: transformers.OPTConfig(**small, ffn_dim=128, max_position_embeddings=256,
                                                  word_embed_proj_dim=64),
            "bloom": lambda: transformers.BloomConfig(vocab_size=512, hidden_size=64, n_layer=2, n_head=4),
            "gptj": lambda: transformers.GPTJConfig(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                                                    rotary_dim=8)}[name]()


# By hand, h=64, 2 layers, vocab 512 (embedding 32768), a LayerNorm 128:
# phi: q,k,v,dense 4*(4096+64) + fc1 64*128+128 + fc2 128*64+64 + one norm (parallel block) = 33344, x2
#      + embedding + final norm + lm_head 32768 + its bias 512 = 132864; N = 2*(16384+16384) + 32768 = 98304
# falcon (multi-query: one k/v head of 16, no biases, parallel): qkv 96*64 + dense 4096 + MLP 2*64*256
#      + one norm = 43136, x2 + tied embedding + final norm = 119168; N = 2*43008 + 32768 = 118784
# opt: 4*(4096+64) + 8320 + 8256 + two norms = 33472, x2 + tied embedding + 258*64 positions (2 extra
#      rows) + final norm = 116352; N = 2*32768 + 32768 = 98304
# bloom: fused qkv 192*64+192 + dense 4160 + 256*64+256 + 64*256+64 + two norms = 49984, x2 + tied
#      embedding + its norm + final norm = 132992; N = 2*(12288+4096+32768) + 32768 = 131072
# gptj: q,k,v,out 4*4096 (no biases) + fc_in 16384+256 + fc_out 16384+64 + one norm = 49600, x2 + wte
#      + final norm + lm_head and its bias 33280 = 165376; N = 2*49152 + 32768 = 131072
# (all were read as Llama-style, a gated MLP: falcon's parameters 151872, 27% over)
@pytest.mark.parametrize("name, n_params, n_matmul", [("phi", 132864, 98304), ("falcon", 119168, 118784),
                                                      ("opt", 116352, 98304), ("bloom", 132992, 131072),
                                                      ("gptj", 165376, 131072)])
def test_older_decoder_families_are_read_as_they_are_built(name, n_params, n_matmul):
    cfg = _family(name)
    model, shape = build(cfg), model_shape(cfg)
    assert shape.param_count() == sum(p.numel() for p in model.parameters()) == n_params
    assert sum(math.prod(s) for s in shape.param_shapes()) == n_params
    assert shape.matmul_params() == adapt(model).matmul_weights() == n_matmul
    assert not shape.notes
    assert tunekit.estimate_memory(cfg, micro_batch=1, seq_len=16, precision="fp32",
                                   device="cpu").inputs["n_params"] == n_params


def test_explaining_a_run_whose_plan_has_no_expected_step_says_why():
    # a mixture of experts over fp32 weights: the fake step cannot run torch's bf16-only _grouped_mm
    # meta kernel, so the plan is analytic and has no op-by-op expectation; explain said only "the plan
    # of this run has no expected step", lab.expect said why
    cfg = transformers.Qwen2MoeConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, num_experts=2,
                                      num_experts_per_tok=1, moe_intermediate_size=16,
                                      shared_expert_intermediate_size=16, max_position_embeddings=32)
    lab = Lab(build(cfg), micro_batch=2, seq_len=16, peak_tflops=1.0)
    run = lab.run(steps=1, trace=True)
    with pytest.raises(ValueError, match="^lab.explain: the plan of this run has no expected step on cpu: "
                                         "analytic estimate: the fake step failed because"):
        tunekit.explain(run)


def test_a_mixture_with_dense_layers_says_its_count_takes_every_layer_as_experts():
    cfg = transformers.Qwen2MoeConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                                      num_experts_per_tok=2, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=64, mlp_only_layers=[0])
    assert model_shape(cfg).notes == ("qwen2_moe: mlp_only_layers/decoder_sparse_step make some layers dense; every "
                                      "layer is counted as a mixture of experts here (build the model for its exact "
                                      "counts)",)
