"""Cases found by an outside review of tunekit.plan (one test per fix)."""
import pytest
import torch

import tunekit

TINY = tunekit.GPTConfig.preset("cpu-tiny")


def test_half_weights_without_autocast_are_bounded_at_the_half_peak():
    # weights="bf16" with precision fp32 (no autocast): the matmuls run in bf16, so the speed of
    # light is the bf16 peak, not fp32's 67 TFLOPS (a bound 15x too slow, which a real run beats)
    pure = tunekit.plan(TINY, "H100 SXM", precision="fp32", weights="bf16", micro_batch=4, seq_len=64)
    both = tunekit.plan(TINY, "H100 SXM", precision="bf16", weights="bf16", micro_batch=4, seq_len=64)
    assert pure.peak_tflops == 989
    assert pure.bound_step_s == pytest.approx(both.bound_step_s, rel=0.05)
    assert any("bf16 peak" in n for n in pure.notes)


@pytest.mark.parametrize("name", ["L4 48GB", "NVIDIA A100-SXM4-20GB", "H100 94GB"])
def test_a_device_named_with_another_memory_size_is_refused(name):
    # a size the table's card does not have: "A100 40GB" was once planned against 79.2 GiB and "fit"
    with pytest.raises(ValueError, match="GB"):
        tunekit.plan(TINY, name, micro_batch=1, seq_len=8)


@pytest.mark.parametrize("name", ["A100 40", "a100-40g", "A100 40G"])
def test_a_bare_memory_size_is_read_as_one_and_the_card_of_that_size_named(name):
    # "A100 40" was planned on the A100 80GB (80 GiB, "fits") with only a note saying so
    with pytest.raises(ValueError, match=r"names 40 GB, but the spec table's A100 80GB has 80 GB: "
                                         r"did you mean 'A100 40GB'\?"):
        tunekit.plan(TINY, name, micro_batch=1, seq_len=8)


def test_a_model_number_is_not_a_memory_size():
    assert tunekit.plan(TINY, "RTX 4090", micro_batch=1, seq_len=8).device == "RTX 4090"


def test_a_device_named_with_its_own_memory_size_is_planned():
    assert tunekit.plan(TINY, "NVIDIA H100 80GB HBM3", micro_batch=1, seq_len=8).device == "H100 SXM"


def test_an_encoder_decoder_config_plans_the_whole_model():
    # T5Config raised transformers' "Unrecognized configuration class ... AutoModelForCausalLM";
    # BartConfig planned BartForCausalLM, the decoder alone
    transformers = pytest.importorskip("transformers")
    t5 = transformers.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=1000,
                               decoder_start_token_id=0, pad_token_id=0)
    p = tunekit.plan(t5, "cpu", micro_batch=2, seq_len=32)
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(t5)
    x = torch.randint(0, 1000, (2, 32))
    real = tunekit.measure_memory(model, (x, x), optimizer="adamw", precision="fp32", estimate=False).measured
    assert p.method == "fake step" and p.components == {k: float(real[k]) for k in p.components}
    assert "encoder-decoder" in p.notes[0]
    bart = transformers.BartConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                   decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                   vocab_size=1000, max_position_embeddings=64)
    whole = transformers.AutoModelForSeq2SeqLM.from_config(bart)
    n = sum(t.numel() for t in whole.parameters())
    assert tunekit.plan(bart, "cpu", micro_batch=2, seq_len=32).components["weights"] == 4 * n


def test_grouped_mm_flops_are_counted():
    # transformers' mixture-of-experts layers run torch._grouped_mm, which torch's counter has no
    # formula for: a Mixtral's expert FLOPs counted 0 (bound, MFU and executed FLOPs ~3x too low)
    from tunekit.measure.flops import count_flops

    x = torch.randn(10, 16, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(3, 16, 8, dtype=torch.bfloat16, requires_grad=True)
    offs = torch.tensor([4, 7, 10], dtype=torch.int32)

    def step():
        (torch.nn.functional.grouped_mm(x, w, offs=offs).float() ** 2).sum().backward()

    # forward 2*10*16*8, backward: dW (the groups split the 10 rows) and dX, as much again each
    assert count_flops(step).executed == 3 * 2 * 10 * 16 * 8


def test_a_mixture_of_experts_counts_its_experts():
    transformers = pytest.importorskip("transformers")
    shape = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 vocab_size=1000, max_position_embeddings=256)
    kw = dict(precision="bf16", weights="bf16", micro_batch=2, seq_len=128)
    moe = tunekit.plan(transformers.MixtralConfig(**shape, intermediate_size=256, num_local_experts=4,
                                                  num_experts_per_tok=2), "H100 SXM", **kw)
    dense = tunekit.plan(transformers.MistralConfig(**shape, intermediate_size=512), "H100 SXM", **kw)
    # top-2 of 256-wide experts does the work of one 512-wide MLP (+ the router's few)
    assert moe.method == "fake step"
    assert moe.executed_flops == pytest.approx(dense.executed_flops, rel=0.03)
    # and N of 6N counts the stacked experts at the share a token uses, 2 of 4: the same model
    # FLOPs but the router's 4 x 128 per layer (their bounds differ: the grouped matmul reads
    # every expert's weights, a bandwidth cost)
    assert moe.model_flops == pytest.approx(dense.model_flops, rel=0.01)


class _DictOut(torch.nn.Module):
    def __init__(self, key):
        super().__init__()
        self.lin, self.key = torch.nn.Linear(8, 8), key

    def forward(self, x):
        y = self.lin(x)
        return {self.key: y.sum() if self.key == "loss" else y}


def test_a_module_returning_a_dict_is_planned_or_told_to_give_a_loss():
    # a forward returning {"logits": ...} raised AttributeError: 'dict' object has no attribute 'grad_fn'
    batch = dict(micro_batch=4, batch_fn=lambda b, s: (torch.randn(b, 8),))
    with pytest.raises(TypeError, match=r"dict of \['logits'\].*loss_fn"):
        tunekit.plan(_DictOut("logits"), "cpu", **batch)
    assert tunekit.plan(_DictOut("loss"), "cpu", **batch).components["gradients"] == 4 * (64 + 8)


def test_tunekit_plan_help_says_each_default_once():
    import contextlib
    import io

    from tunekit.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(out.getvalue().split())
    assert "(default: cpu-tiny)" in text and text.count("(default: cpu-tiny)") == 1
    assert text.count("(default: H100 SXM)") == 1 and "(default: adamw) (default: adamw)" not in text


def test_the_dashboards_plan_of_a_batch_of_samples_says_samples(tmp_path):
    import html

    from tunekit.lab.lab import Lab

    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    lab = Lab(model=net, batch_fn=lambda b, s: (torch.randn(b, 16), torch.randint(0, 4, (b,))),
              loss_fn=lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y), log_path=tmp_path / "r.jsonl",
              micro_batch=8)
    dash = lab.dashboard()
    dash.plan_picker.value = "A100 80GB"
    shown = html.unescape(dash.plan_html.value)
    assert dash.last_plan.unit == "samples" and "samples/s" in shown.split("<details>")[0]
    assert "tokens/s" not in shown.split("<details>")[0]


def test_a_ddp_plan_does_not_speak_of_fsdp_shards():
    # the note said "ddp: rank 0's memory (FSDP2 gives it ceil(rows / 1) of each parameter)"
    p = tunekit.plan(TINY, "H100 SXM", micro_batch=1, seq_len=8, parallel="ddp", world_size=4)
    note = next(n for n in p.notes if n.startswith("ddp:"))
    assert "FSDP2" not in note and "whole model" in note


def test_a_search_stopped_by_its_limit_says_so():
    # search_limit=3 on a model where far more fits printed "largest micro-batch that fits: 3"
    p = tunekit.plan(TINY, "H100 SXM", micro_batch=1, seq_len=8, search=True, search_limit=3)
    assert p.max_micro_batch == 3 and any("search_limit=3" in n for n in p.notes)
    assert "search_limit=3" in repr(p)


def test_a_mixture_of_experts_over_fp32_weights_is_planned_analytically_and_says_why(caplog):
    # torch's meta kernel of _grouped_mm takes bf16 only, the CPU kernel fp32 too: over fp32
    # weights the fake step cannot run the experts, so the plan is analytic and says why (quietly:
    # no page of torch's own log)
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                     max_position_embeddings=256, num_local_experts=4, num_experts_per_tok=2)
    with caplog.at_level("ERROR"):
        p = tunekit.plan(cfg, "H100 SXM", precision="bf16", micro_batch=2, seq_len=64)
    assert p.method == "analytic" and "BF16" in p.notes[0]
    assert not [r for r in caplog.records if "failed while attempting to run meta" in r.getMessage()]
    assert tunekit.plan(cfg, "H100 SXM", precision="bf16", weights="bf16", micro_batch=2, seq_len=64).method \
        == "fake step"


def test_a_shape_bug_in_the_step_is_raised_not_planned():
    class Bad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(8, 4)   # b should take 16

        def forward(self, x):
            return self.b(self.a(x)).sum()

    with pytest.raises(RuntimeError, match="same reduction dim"):   # torch's meta kernel's words
        tunekit.plan(Bad(), "cpu", batch_fn=lambda b, s: (torch.randn(b, 8),))


def test_a_plan_leaves_the_users_config_and_the_labs_model_as_they_were():
    # the fake model was built on the user's config object: attention="eager" set eager on it, and
    # lab.expect(attention="eager") made the Lab's next plain run eager (recorded as a hand change)
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    before = cfg._attn_implementation
    tunekit.plan(cfg, "cpu", attention="eager", micro_batch=2, seq_len=16, verbose=False)
    assert cfg._attn_implementation == before
    lab = tunekit.Lab(transformers.AutoModelForCausalLM.from_config(cfg), micro_batch=2, seq_len=16,
                      peak_tflops=1.0)
    own, hf = lab.resolve().attention, lab.model.config._attn_implementation
    lab.expect(attention="math")
    assert (lab.resolve().attention, lab.model.config._attn_implementation) == (own, hf)
