"""tunekit.plan on any nn.Module (a fake twin stepped on the user's batch_fn and loss_fn), on
transformers families and an encoder, and the analytic plan when a fake step cannot run. On the
CPU each fake step is compared with `measure_memory` on a real step of the same model and batch:
byte-exact everywhere but one LayerNorm of BERT under bf16 autocast (said below)."""
import json
import math
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tunekit
from tunekit.models.adapters import ModuleAdapter
from tunekit.planning.record import COMPONENTS


def real_components(model, batch, **kw):
    return {k: float(v) for k, v in tunekit.measure_memory(model, batch, estimate=False, **kw).measured.items()
            if k in COMPONENTS}


def planned(p):
    return {k: p.components[k] for k in COMPONENTS}


# --- transformers: decoders from their configs, an encoder as a module ------------------------

SMALL = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def _config(family, attention):
    transformers = pytest.importorskip("transformers")
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                       attn_implementation=attention)
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[family]
    return cls(**SMALL, attn_implementation=attention)


@pytest.mark.parametrize("family, attention, precision, checkpointing", [
    *[("llama", a, p, c) for a in ("eager", "sdpa") for p in ("fp32", "bf16") for c in (False, True)],
    *[(f, "sdpa", p, False) for f in ("qwen2", "gpt2") for p in ("fp32", "bf16")],
])
def test_a_transformers_plan_equals_a_real_step_to_the_byte(family, attention, precision, checkpointing):
    transformers = pytest.importorskip("transformers")
    cfg = _config(family, attention)
    p = tunekit.plan(cfg, "cpu", precision=precision, micro_batch=2, seq_len=32, checkpointing=checkpointing)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert model.config._attn_implementation == attention
    x = torch.randint(0, 256, (2, 32))
    real = real_components(model, (x, x), optimizer="adamw", precision=precision, checkpointing=checkpointing)
    assert planned(p) == real
    assert p.method == "fake step" and p.tokens == 2 * 32 and p.unit == "tokens"


@pytest.mark.parametrize("family", ["llama", "gpt2"])   # gpt2 ties lm_head to the embedding: one fake for both
def test_a_transformers_module_real_or_on_meta_plans_as_its_config(family):
    transformers = pytest.importorskip("transformers")
    cfg = _config(family, "sdpa")
    torch.manual_seed(0)
    real = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.device("meta"):
        meta = transformers.AutoModelForCausalLM.from_config(cfg)
    kw = dict(precision="bf16", micro_batch=2, seq_len=32, checkpointing=True)
    from_config = planned(tunekit.plan(cfg, "cpu", **kw))
    assert planned(tunekit.plan(real, "cpu", **kw)) == from_config
    assert planned(tunekit.plan(meta, "cpu", **kw)) == from_config
    # loaded in bf16 (a buffer may stay fp32, as Llama's inv_freq does): planned as it is, pure bf16
    half = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    x = torch.randint(0, 256, (2, 32))
    p = tunekit.plan(half, "cpu", micro_batch=2, seq_len=32)
    assert p.setting.weights == "bf16" and planned(p) == real_components(half, (x, x), optimizer="adamw")
    # checkpointing was applied: without it the same step keeps more
    assert tunekit.plan(meta, "cpu", **dict(kw, checkpointing=False)).components["activations"] > \
        from_config["activations"]


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_bert_an_encoder_plans_as_a_module(attention):
    # pytorch#126738: torch's fake-tensor estimator failed on HF BERT because transformers' old
    # _prepare_4d_attention_mask_for_sdpa read a value (torch.all(mask == 1)). transformers 5
    # builds masks without reading values, so the fake step runs; were one read, the plan would
    # fall back to the analytic estimate and say why.
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    bert = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=64, attn_implementation=attention))
    x = torch.randint(0, 256, (2, 32))
    for precision in ("fp32", "bf16"):
        p = tunekit.plan(bert, "cpu", precision=precision, micro_batch=2, seq_len=32)
        real = real_components(bert, (x, x), optimizer="adamw", precision=precision)
        assert p.method == "fake step" and p.model == "Bert (hidden=64, layers=2)"
        diff = {k: real[k] - p.components[k] for k in COMPONENTS if real[k] != p.components[k]}
        if precision == "fp32":
            assert diff == {}
        else:
            # the MLM head's LayerNorm takes a bf16 input with fp32 weights: the CPU kernel keeps its
            # saved mean and rstd (2 x 32 each) in fp32, torch's fake kernel in bf16:
            # 2 tensors x 64 elements x (4 - 2) bytes = 256 bytes of ~0.5 MB (0.05%)
            assert diff == {"activations": 2 * 64 * 2}
    # with an attention mask and a loss of the user's: the Lab's batch_fn/loss_fn contract
    masked = tunekit.plan(bert, "cpu", micro_batch=2, seq_len=32,
                          batch_fn=lambda b, s: (torch.randint(0, 256, (b, s)), torch.ones(b, s, dtype=torch.long)),
                          loss_fn=lambda m, x, mask: m(input_ids=x, attention_mask=mask, labels=x).loss)
    assert masked.method == "fake step" and masked.model == "BertForMaskedLM (92,224 parameters)"
    assert (masked.tokens, masked.unit) == (64, "tokens")
    assert masked.components["weights"] == 92_224 * 4


# --- a model tunekit has no table for: a small mixture of experts -------------------------------

class Expert(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class GatherMoE(nn.Module):
    """Top-k routing by gather: every expert runs on every token, each token keeps its top k
    outputs (static shapes: a fake tensor can take it)."""

    def __init__(self, d, n_experts=4, k=2):
        super().__init__()
        self.k, self.router = k, nn.Linear(d, n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(d) for _ in range(n_experts))

    def forward(self, x):                                                    # (B, S, d)
        w, idx = self.router(x).softmax(-1).topk(self.k, dim=-1)            # (B, S, k)
        outs = torch.stack([e(x) for e in self.experts], dim=-2)             # (B, S, E, d)
        picked = outs.gather(-2, idx[..., None].expand(*idx.shape, x.shape[-1]))   # (B, S, k, d)
        return (w[..., None] * picked).sum(-2)


class DispatchMoE(GatherMoE):
    """Token dispatch: each expert runs on the tokens routed to it, found with torch.where (how
    many is data: a fake tensor cannot take it)."""

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        w, idx = self.router(flat).softmax(-1).topk(self.k, dim=-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(idx == e)
            out = out.index_add(0, token, w[token, slot, None] * expert(flat[token]))
        return out.reshape(x.shape)


class Block(nn.Module):
    def __init__(self, d, moe):
        super().__init__()
        self.norm, self.moe = nn.LayerNorm(d), moe(d)

    def forward(self, h):
        return h + self.moe(self.norm(h))


class MoENet(nn.Module):
    def __init__(self, moe, vocab=64, d=32, n_layer=2):
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab, d), nn.Linear(d, vocab)
        self.layers = nn.ModuleList(Block(d, moe) for _ in range(n_layer))

    def forward(self, x, y):
        h = self.embed(x)
        for block in self.layers:
            h = block(h)
        return F.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


def tokens(b, s):
    return torch.randint(0, 64, (b, s)), torch.randint(0, 64, (b, s))


# embed 64*32 + head 32*64+64 + 2 layers x (norm 64 + router 32*4 + 4 experts x (32*128+128 + 128*32+32))
MOE_PARAMS = 64 * 32 + 32 * 64 + 64 + 2 * (64 + 32 * 4 + 4 * (32 * 128 + 128 + 128 * 32 + 32))   # 71,360


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_fakeable_mixture_of_experts_plans_to_the_byte(checkpointing):
    torch.manual_seed(0)
    net = MoENet(GatherMoE)
    p = tunekit.plan(net, "cpu", batch_fn=tokens, blocks="layers", micro_batch=2, seq_len=16,
                     checkpointing=checkpointing)
    live = ModuleAdapter(net, "layers")   # the real step, checkpointed the same way
    live.set_checkpointing(checkpointing)
    try:
        real = real_components(net, tokens(2, 16), optimizer="adamw")
    finally:
        live.set_checkpointing(False)
    assert planned(p) == real and p.method == "fake step"
    if checkpointing:   # each block keeps only its input: far less than the experts' saved tensors
        assert p.components["activations"] < tunekit.plan(net, "cpu", batch_fn=tokens, micro_batch=2, seq_len=16
                                                           ).components["activations"] / 10
    assert p.components["weights"] == MOE_PARAMS * 4 == 285_440
    # AdamW: two fp32 moments per parameter and a 4-byte step count per tensor (41 tensors)
    assert p.components["optimizer_states"] == 8 * MOE_PARAMS + 4 * 41
    assert (p.tokens, p.unit) == (32, "tokens") and p.model == "MoENet (71,360 parameters)"


def test_a_data_dependent_mixture_of_experts_is_planned_analytically_and_says_so():
    net = MoENet(DispatchMoE)
    p = tunekit.plan(net, "cpu", batch_fn=tokens, micro_batch=2, seq_len=16)
    assert p.method == "analytic"
    assert p.notes[0].startswith("analytic estimate: the fake step failed because an op's output shape depends "
                                 "on tensor values (aten.nonzero.default")
    # fp32 AdamW from the parameter count: 4 + 4 + 8 bytes per parameter, no buffers
    assert {k: v for k, v in p.components.items() if k != "activations"} == dict(
        weights=4 * MOE_PARAMS, master_weights=0.0, gradients=4 * MOE_PARAMS, optimizer_states=8 * MOE_PARAMS,
        weight_casts=0.0, buffers=0.0)
    assert math.isnan(p.components["activations"]) and p.unknown == ["activations"]
    assert p.total_bytes == 16 * MOE_PARAMS and p.fits        # the known part, said to be so
    assert math.isnan(p.bound_step_s) and math.isnan(p.executed_flops)   # no speed bound without a count
    text = repr(p)
    assert "· analytic" in text.splitlines()[0] and "method     analytic estimate" in text.splitlines()[1]
    # 'unknown' ends where the figures do: 17 for the names, 14 for the figure (it stood 4 places left)
    assert "at least 0.00 GiB (activations unknown)" in text and "activations             unknown" in text


def test_a_plan_leaves_out_measure_memory_s_notes_by_their_kinds_whatever_their_words(reworded):
    # what measure_memory says of a real step does not hold for the plan's (it checkpoints the
    # blocks itself, plans a device, builds the optimizer it was named): left out by kind
    from tunekit.core.notes import of_kind
    from tunekit.measure import memory

    reworded(memory)
    net, kinds = MoENet(GatherMoE), ("ckpt.not_applied", "memory.cpu", "memory.shadow_optimizer")
    said = of_kind(tunekit.measure_memory(net, tokens(2, 16), checkpointing=True, estimate=False).notes, *kinds)
    assert sorted(said) == [f"REWORDED {k}" for k in kinds]
    p = tunekit.plan(net, "cpu", batch_fn=tokens, blocks="layers", micro_batch=2, seq_len=16, checkpointing=True)
    assert p.method == "fake step" and not [n for n in p.notes if "REWORDED" in n]


def test_an_analytic_plan_leaves_out_the_estimate_s_device_and_activation_notes_by_kind(monkeypatch, reworded):
    from tunekit.core.memory import estimate
    from tunekit.core.notes import Note
    from tunekit.planning import analytic

    reworded(estimate)
    said = []

    def estimate_memory(*args, **kwargs):   # and as if it had assumed the device (the plan names one)
        est = estimate.estimate_memory(*args, **kwargs)
        est.notes.append(Note("device.assumed", "REWORDED device.assumed"))
        said.extend(est.notes)
        return est

    monkeypatch.setattr(analytic, "estimate_memory", estimate_memory)
    p = tunekit.plan(MoENet(DispatchMoE), "cpu", batch_fn=tokens, micro_batch=2, seq_len=16)
    assert p.method == "analytic" and {"REWORDED activations.unknown", "REWORDED device.assumed"} <= set(said)
    assert not [n for n in p.notes if "REWORDED" in n]


def test_a_step_that_reads_a_value_is_planned_analytically_from_the_config(monkeypatch):
    # Adafactor's .item() with the fake step's answer to it turned off (test_plan_adafactor.py: on)
    from tunekit.measure import torch_private

    # the one check both steps ask (torch_private.fake_scalar_reads_for)
    monkeypatch.setattr(torch_private, "has_fake_params", lambda opt: False)
    cfg = tunekit.GPTConfig.preset("cpu-tiny")
    p = tunekit.plan(cfg, "cpu", optimizer="adafactor", micro_batch=2, seq_len=32)
    assert p.method == "analytic" and "reads a tensor's value (aten._local_scalar_dense.default" in p.notes[0]
    n = 426_624   # cpu-tiny's parameters
    # fp32: 4 B weights, 4 B gradients; Adafactor's state by the config's tensor shapes, as torch
    # allocates it: the fake step's own figure (tests/core/test_anatomy.py: 14 tensors, 20,536 B)
    assert (p.components["weights"], p.components["gradients"]) == (4 * n,) * 2
    assert p.components["optimizer_states"] == 20_536
    # the activations from tunekit's GPT table: the same bytes a fake step of this forward saves (AdamW runs)
    assert p.components["activations"] == tunekit.plan(cfg, "cpu", micro_batch=2, seq_len=32).components[
        "activations"] == 1_478_916
    # the bound: the MFU convention's FLOPs at the peak, 64 tokens x (6 x 425,984 matmul weights +
    # 12 x 2 layers x 128 x 32 / 2 causal attention) = 64 x 2,605,056
    assert p.model_flops == 64 * 2_605_056
    assert p.bound_step_s == pytest.approx(p.model_flops / (p.peak_tflops * 1e12)) and math.isnan(p.bound_mfu)


# --- the live module: untouched, and none of its memory --------------------------------------

def test_the_live_module_is_left_bit_identical():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
    net[0].weight.grad = torch.ones_like(net[0].weight)
    net[3].weight.requires_grad_(False)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    params = list(net.parameters())
    p = tunekit.plan(net, "cpu", batch_fn=lambda b, s: (torch.randn(b, 16),), micro_batch=8, optimizer="sgd")
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)   # BatchNorm's running stats too
    assert list(net.parameters()) == params and all(type(q) is nn.Parameter for q in params)
    assert torch.equal(net[0].weight.grad, torch.ones(32, 16)) and net[3].weight.grad is None
    assert not net[3].weight.requires_grad and net.training
    # the frozen Linear(32, 4) has no gradient: 16*32+32 + 2*32 + 4 trained of 16*32+32 + 2*32 + 32*4+4
    assert p.components["gradients"] == (16 * 32 + 32 + 2 * 32 + 4) * 4
    assert (p.tokens, p.unit) == (8, "samples") and "samples/s" in repr(p)


def test_a_500mb_module_plans_without_its_memory():
    # in a process of its own: its peak RSS during the plan is the plan's, not this test session's
    code = textwrap.dedent('''
        import hashlib, json, warnings
        warnings.filterwarnings("ignore")
        import torch, tunekit

        def status(field):
            return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field))

        torch.manual_seed(0)
        net = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)])
        digest = lambda: [hashlib.sha256(memoryview(t.detach().numpy())).hexdigest() for t in net.state_dict().values()]
        before = digest()
        tunekit.plan(torch.nn.Linear(4, 4), "H100 SXM", batch_fn=lambda b, s: (torch.randn(b, 4),))   # imports
        open("/proc/self/clear_refs", "w").write("5")   # VmHWM from here
        start = status("VmRSS:")
        p = tunekit.plan(net, "H100 SXM", batch_fn=lambda b, s: (torch.randn(b, 4096),), micro_batch=4,
                         precision="fp32")   # an H100's own default is bf16 (core.setting.best_precision)
        print(json.dumps(dict(grew_kib=status("VmHWM:") - start, same=digest() == before,
                              weights=p.components["weights"], activations=p.components["activations"])))
    ''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    # 8 x (4096*4096 + 4096) = 134,250,496 fp32 parameters: 537,001,984 bytes planned, ~0.4 MiB taken (seen)
    assert r["weights"] == 8 * (4096 * 4096 + 4096) * 4 == 537_001_984
    assert r["grew_kib"] < 64 * 1024 and r["same"]
    # the 4 x 4096 inputs of the 8 Linears (each saved for its weight's gradient), 4 bytes each
    assert r["activations"] == 8 * 4 * 4096 * 4


def test_real_tensors_from_batch_fn_and_live_checkpoint_wrappers_are_taken_as_the_twins():
    torch.manual_seed(0)
    net = MoENet(GatherMoE)
    data = torch.randint(0, 64, (2, 17))   # real tensors made before the plan, sliced or returned as they are
    batch_fn = lambda b, s: (data[:b, :s], data[:b, 1:s + 1].clone())   # noqa: E731
    live = ModuleAdapter(net, "layers")
    live.set_checkpointing(True)   # the live blocks' forwards are wrappers of the live blocks
    try:
        p = tunekit.plan(net, "cpu", batch_fn=batch_fn, blocks="layers", micro_batch=2, seq_len=16)
        assert all("forward" in block.__dict__ for block in net.layers)   # still the live module's
        real = real_components(net, batch_fn(2, 16), optimizer="adamw")   # checkpointed, as it is live
    finally:
        live.set_checkpointing(False)
    # the plan stepped the twin without checkpointing (its setting), on fakes of the real batch
    assert p.components["activations"] > real["activations"]
    assert planned(p) == real_components(net, batch_fn(2, 16), optimizer="adamw")


# --- a Lab on a module of the user's ---------------------------------------------------------

def test_a_lab_on_a_custom_module_plans_through_its_batch_fn_loss_fn_and_blocks(tmp_path):
    torch.manual_seed(0)
    net = MoENet(GatherMoE)
    lab = tunekit.Lab(net, batch_fn=tokens, loss_fn=lambda m, x, y: m(x, y), blocks="layers",
                      log_path=tmp_path / "runs.jsonl", micro_batch=2, seq_len=16)
    for checkpointing in (False, True):
        p = tunekit.plan(lab, "cpu", checkpointing=checkpointing)
        real = {k: float(v) for k, v in tunekit.measure_memory(lab, checkpointing=checkpointing).measured.items()
                if k in COMPONENTS}
        assert planned(p) == real and p.setting.micro_batch == 2 and p.setting.seq_len == 16
        assert planned(lab.plan("cpu", checkpointing=checkpointing)) == real   # lab.plan: the same plan


class TokenNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(256, 16), nn.Linear(16, 256)

    def forward(self, x, y):
        return F.cross_entropy(self.head(self.embed(x)).flatten(0, 1), y.flatten())


def test_a_lab_on_a_custom_module_with_the_built_in_batches_plans_them(make_lab):
    lab = make_lab(TokenNet(), micro_batch=2, seq_len=8)
    p = tunekit.plan(lab, "cpu")
    real = {k: float(v) for k, v in tunekit.measure_memory(lab).measured.items() if k in COMPONENTS}
    assert planned(p) == real and (p.tokens, p.unit) == (16, "tokens")


def test_a_lab_on_tunekits_gpt_plans_its_config(make_lab):
    lab = make_lab(micro_batch=2, seq_len=32)
    p = tunekit.plan(lab, "cpu")
    assert p.model == "GPT (n_layer=2, n_embd=128)" and (p.tokens, p.setting.micro_batch) == (64, 2)
    assert planned(p) == planned(tunekit.plan(lab.config, "cpu", micro_batch=2, seq_len=32))


def test_without_seq_len_a_module_batch_fn_gets_1_as_in_a_lab():
    p = tunekit.plan(MoENet(GatherMoE), "cpu", batch_fn=tokens, micro_batch=2)
    assert p.setting.seq_len == 1 and (p.tokens, p.unit) == (2, "tokens")
    assert p.notes[0].startswith("seq_len not given: batch_fn was called with seq_len=1")


# --- bad input: refused before any work ------------------------------------------------------

def _net():
    return MoENet(GatherMoE)


@pytest.mark.parametrize("call, error, match", [
    (lambda: tunekit.plan(MoENet, "cpu"), TypeError, "an instance, got the class MoENet"),
    (lambda: tunekit.plan(tunekit.GPTConfig, "cpu"), TypeError, "an instance, got the class GPTConfig"),
    (lambda: tunekit.plan(_net(), "cpu"), TypeError, "needs batch_fn=lambda micro_batch, seq_len"),
    (lambda: tunekit.plan(_net(), "cpu", batch_fn=5), TypeError, "batch_fn must be a function"),
    (lambda: tunekit.plan(_net(), "cpu", batch_fn=tokens, loss_fn="mse"), TypeError, "loss_fn must be a function"),
    (lambda: tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "cpu", batch_fn=tokens), TypeError,
     "go with an nn.Module target"),
    (lambda: tunekit.plan(_net(), "H900", batch_fn=tokens), ValueError, "unknown device 'H900'"),
    (lambda: tunekit.plan(_net(), "cpu", batch_fn=tokens, blocks="blocks"), ValueError, "not an attribute path"),
    (lambda: tunekit.plan(_net(), "cpu", batch_fn=tokens, checkpointing=True), ValueError, "blocks='layers'"),
    (lambda: tunekit.plan(_net(), "cpu", batch_fn=tokens, optimizer="adamq"), ValueError, "unknown optimizer"),
    (lambda: tunekit.plan(42, "cpu"), TypeError, "got int"),
])
def test_bad_input_to_a_module_plan_is_refused_before_any_work(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_bug_in_the_step_is_raised_not_planned_analytically():
    class NoForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Linear(4, 4)

    with pytest.raises(NotImplementedError, match="forward"):
        tunekit.plan(NoForward(), "cpu", batch_fn=lambda b, s: (torch.randn(b, 4),))
    with pytest.raises(RuntimeError, match="same reduction dim"):   # torch's meta kernel words it so
        tunekit.plan(nn.Linear(4, 4), "cpu", batch_fn=lambda b, s: (torch.randn(b, 5),))


def test_a_loss_fn_that_does_not_use_the_model_it_gets_is_refused():
    net = _net()
    with pytest.raises(ValueError, match="loss_fn's loss does not reach the model it is given"):
        tunekit.plan(net, "cpu", batch_fn=tokens, loss_fn=lambda m, x, y: net(x, y), micro_batch=2, seq_len=8)
