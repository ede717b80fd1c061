"""tunekit.Setting: one description of a training step, one meaning per word in every API."""
import dataclasses
import warnings

import pytest

import tunekit
from tunekit import GPTConfig, Setting
from tunekit.core.memory.answer import STATIC
from tunekit.core.setting import memory_layout
from tunekit.planning.planner import COMPILE_NOT_MODELLED

TINY = GPTConfig.preset("cpu-tiny")
N_PARAMS = 426_624     # cpu-tiny's parameters: 1,706,496 B of fp32 weights / 4


@pytest.mark.parametrize("kw,autocast,compute,grads,layout,scaler", [
    (dict(), None, "fp32", "fp32", "fp32", False),
    (dict(precision="tf32"), None, "tf32", "fp32", "tf32", False),
    (dict(precision="bf16"), "bf16", "bf16", "fp32", "amp", False),      # fp32 weights under autocast
    (dict(precision="fp16"), "fp16", "fp16", "fp32", "amp", True),       # ... and a GradScaler
    (dict(weights="bf16"), None, "bf16", "bf16", "bf16", False),         # pure bf16
    (dict(precision="bf16", weights="bf16"), None, "bf16", "bf16", "bf16", False),  # autocast casts nothing
    (dict(precision="fp16", weights="fp16"), None, "fp16", "fp16", "fp16", False),  # no scaler without autocast
    (dict(precision="bf16", weights="fp32"), "bf16", "bf16", "fp32", "amp", False),
])
def test_what_each_word_means(kw, autocast, compute, grads, layout, scaler):
    s = Setting(**kw)
    got = (s.autocast, s.compute, s.grads, s.memory_layout, s.grad_scaler)
    assert got == (autocast, compute, grads, layout, scaler)


def test_tf32_is_fp32_off_cuda_and_a_setting_is_frozen_and_hashable():
    s = Setting(precision="tf32")
    assert s.compute_on("cpu") == "fp32" and s.compute_on("cuda") == "tf32"
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.micro_batch = 4
    assert {s: 1}[Setting(precision="tf32")] == 1
    with pytest.raises(TypeError, match="unknown toggle"):
        s.replace(micro_batches=4)


def test_a_setting_is_toggles_plus_what_a_lab_cannot_change():
    s = Setting(precision="bf16", micro_batch=4, parallel="fsdp", world_size=8)
    assert isinstance(s, tunekit.lab.Toggles)
    assert s.toggles == tunekit.lab.Toggles(precision="bf16", micro_batch=4)
    assert Setting.of(s.toggles, parallel="ddp").parallel == "ddp"


def test_estimate_and_plan_agree_on_one_setting():
    """The reviewer's case: cpu-tiny at 2 x 64. precision='bf16' once meant pure bf16 weights to
    estimate_memory (853,248 B) and fp32 weights under autocast to plan (1,706,496 B); on one
    Setting both now say the same."""
    for s, weights in ((Setting(precision="bf16", micro_batch=2, seq_len=64, device="cpu"), 1_706_496),  # 426,624 x 4
                       (Setting(weights="bf16", micro_batch=2, seq_len=64, device="cpu"), 853_248)):    # 426,624 x 2
        est = tunekit.estimate_memory(TINY, setting=s)
        planned = tunekit.plan(TINY, setting=s)
        assert est.components["weights"] == planned.components["weights"] == weights
        for name in ("gradients", "weight_casts", "activations"):
            assert est.components[name] == planned.components[name], name
        # AdamW's step counts (14 parameter tensors x a 4-byte step each) in both
        assert planned.components["optimizer_states"] == est.components["optimizer_states"]


def test_estimate_memory_refuses_the_word_that_changed_meaning():
    with pytest.raises(ValueError, match=r"precision='bf16' is ambiguous.*weights='bf16'.*weights='fp32'"):
        tunekit.estimate_memory(TINY, precision="bf16", device="cpu")
    # each meaning asked for by name
    pure = tunekit.estimate_memory(TINY, weights="bf16", device="cpu")
    amp = tunekit.estimate_memory(TINY, precision="bf16", weights="fp32", device="cpu")
    assert pure.components["weights"] == N_PARAMS * 2 and amp.components["weights"] == N_PARAMS * 4
    assert amp.inputs["layout"] == "amp" and pure.inputs["layout"] == "bf16"


def test_a_layout_under_precision_still_works_with_a_deprecation():
    with pytest.warns(DeprecationWarning, match="write layout='mixed'"):
        old = tunekit.estimate_memory(TINY, precision="mixed", device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = tunekit.estimate_memory(TINY, layout="mixed", device="cpu")
        default = tunekit.estimate_memory(TINY, device="cpu")
    assert old.components == new.components == default.components
    # 2 half + 4 master + 4 grads + 8 AdamW per parameter, + AdamW's 4-byte step per tensor (14)
    assert new.static_bytes == N_PARAMS * 18 + 14 * 4


@pytest.mark.parametrize("call", [
    lambda s: tunekit.estimate_memory(TINY, micro_batch=4, setting=s),
    lambda s: tunekit.plan(TINY, "cpu", precision="bf16", setting=s),
])
def test_a_setting_and_step_keywords_together_are_refused(call):
    with pytest.raises(ValueError, match="give either setting= or the step keywords"):
        call(Setting())


def test_layout_words_are_checked():
    assert memory_layout(None, None, None) == ("mixed", None)
    assert memory_layout("fp32", None, None) == ("fp32", None)
    assert memory_layout(None, "fp16", None) == ("fp16", None)
    with pytest.raises(ValueError, match="layout= alone"):
        memory_layout("fp32", None, "amp")
    with pytest.raises(ValueError, match="weights must be one of"):
        memory_layout(None, "int8", None)
    with pytest.raises(ValueError, match="precision must be one of"):
        memory_layout("fp64", None, None)
    with pytest.raises(ValueError, match="unknown memory layout 'fp64'"):
        memory_layout(None, None, "fp64")
    with pytest.raises(ValueError, match="precision='bf16' is ambiguous"):   # a dtype's other name, as ambiguous
        memory_layout("bfloat16", None, None)


def test_lab_run_takes_a_setting_and_refuses_what_a_live_model_cannot_be():
    lab = tunekit.Lab()
    s = Setting(precision="bf16", micro_batch=2, seq_len=32)
    r = lab.run(setting=s, steps=1, warmup=0, verbose=False)
    same = lab.run(precision="bf16", micro_batch=2, seq_len=32, steps=1, warmup=0, verbose=False)
    # attention left None in the Setting: the model's own (sdpa), recorded as the keyword run records it
    assert r.toggles == same.toggles == s.replace(attention="sdpa").toggles and r.label == same.label
    assert r.autocast_dtype == "bfloat16"
    before = [p.detach().clone() for p in lab.model.parameters()]
    for bad, why in ((s.replace(weights="bf16"), "round its weights"), (s.replace(device="cuda"), "on cpu"),
                     (s.replace(model="gpt-small"), "the model it was made with")):
        with pytest.raises(tunekit.lab.ToggleError, match=why):
            lab.run(setting=bad, steps=1, verbose=False)
    assert all((a == b).all() for a, b in zip(before, lab.model.parameters()))   # nothing ran
    with pytest.raises(ValueError, match="not both"):
        lab.run(setting=s, micro_batch=4, steps=1, verbose=False)


def test_measure_memory_takes_a_setting():
    lab = tunekit.Lab()
    s = Setting(precision="bf16", micro_batch=2, seq_len=32, checkpointing=True)
    a = tunekit.measure_memory(lab.model, setting=s, estimate=False).measured
    b = tunekit.measure_memory(lab.model, precision="bf16", micro_batch=2, seq_len=32, checkpointing=True,
                               estimate=False).measured
    assert a == b
    with pytest.raises(ValueError, match="a real step measures them as they are"):
        tunekit.measure_memory(lab.model, setting=s.replace(weights="bf16"))


def test_find_max_batch_size_takes_a_setting():
    lab = tunekit.Lab()
    s = Setting(micro_batch=1, seq_len=16)
    found = lab.find_max_batch_size(limit=4, budget_s=None, verbose=False, setting=s)
    assert found.best == 4   # cpu-tiny at 4 x 16 fits in any budget this machine has
    with pytest.raises(tunekit.lab.ToggleError, match="searches one process"):
        lab.find_max_batch_size(limit=4, verbose=False, setting=s.replace(parallel="ddp", world_size=2))


def test_monitor_takes_the_peak_dtype_from_a_setting():
    net = tunekit.GPT(GPTConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=16, block_size=8))
    assert tunekit.Monitor(net, live=False, setting=Setting(precision="bf16")).dtype == "bf16"
    assert tunekit.Monitor(net, live=False, setting=Setting(weights="fp16")).dtype == "fp16"
    with pytest.raises(ValueError, match="not both"):
        tunekit.Monitor(net, live=False, dtype="fp32", setting=Setting())


@pytest.mark.parametrize("s", [Setting(micro_batch=2, seq_len=32, device="cpu"),
                               Setting(precision="bf16", micro_batch=2, seq_len=32, checkpointing=True, device="cpu")],
                         ids=["fp32", "bf16-ckpt"])
def test_the_three_memory_answers_agree_on_one_setting(s):
    """estimate_memory (analytic), plan (a fake step) and measure_memory (a real step here) answer
    one question with the same components, each saying how it found them."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = tunekit.GPT(TINY)
    est = tunekit.estimate_memory(TINY, setting=s)
    planned = tunekit.plan(model, setting=s)
    real = tunekit.measure_memory(model, setting=s.replace(device=None), estimate=False)
    assert (est.method, planned.method, real.method) == ("analytic", "fake step", "measured")
    assert all(isinstance(a, tunekit.planning.MemoryAnswer) for a in (est, planned, real))   # one report type
    assert all(a.static_bytes == sum(a[k] for k in STATIC) for a in (est, planned, real))
    for name in ("weights", "gradients", "weight_casts", "activations"):
        assert est.components[name] == planned.components[name] == real.components[name], name
    # all three hold AdamW's 14 step counts of 4 bytes (the formula by the config's tensor shapes)
    assert planned.components["optimizer_states"] == real.components["optimizer_states"] \
        == est.components["optimizer_states"]


@pytest.mark.parametrize("kw, why", [
    (dict(micro_batch=0), "micro_batch must be a whole number >= 1, got 0"),
    (dict(precision="bfloat16"), "precision must be one of"),
    (dict(weights="int8"), "weights must be None"),
    (dict(optimizer="foo"), "unknown optimizer 'foo'"),
    (dict(parallel="foo"), "parallel must be None"),
    (dict(world_size=2), "describe several ranks"),
    (dict(parallel="hsdp", world_size=3, nodes=2), "not a whole multiple of nodes=2"),
    (dict(lr=float("nan")), "lr must be a finite number"),
    (dict(checkpointing="yes", micro_batch="4"), "micro_batch .*; checkpointing must be True or False"),
])
def test_a_setting_is_checked_when_made(kw, why):
    with pytest.raises(ValueError, match=why):
        Setting(**kw)


@pytest.mark.parametrize("kw", [dict(world_size=0), dict(nodes=-1), dict(world_size="2")])
def test_a_rank_count_that_is_no_whole_number_is_not_also_called_several_ranks(kw):
    with pytest.raises(ValueError) as e:
        Setting(**kw)
    assert "must be a whole number >= 1" in str(e.value) and "several ranks" not in str(e.value)


def test_a_setting_is_made_canonical():
    np = pytest.importorskip("numpy")
    s = Setting(micro_batch=np.int64(4), optimizer="adam", attention="eager", lr=1)
    assert (s.micro_batch, s.optimizer, s.attention, s.lr) == (4, "adamw", "math", 1.0)
    assert type(s.micro_batch) is int and type(s.lr) is float


def test_lab_plan_takes_a_setting_and_plan_says_what_it_does_not_model():
    lab = tunekit.Lab()
    s = Setting(micro_batch=2, seq_len=32, compile=True)
    p = lab.plan("cpu", setting=s)
    # planned as asked, with what it left to the model resolved (the Lab's attention)
    assert p.setting == s.replace(device="cpu", attention="sdpa")
    assert p.components == tunekit.plan(lab, "cpu", setting=s).components
    assert COMPILE_NOT_MODELLED in p.notes     # what the plan leaves unmodelled, said
    with pytest.raises(ValueError, match="not both"):
        lab.plan("cpu", setting=s, micro_batch=4)
    with pytest.raises(ValueError, match="give one"):
        tunekit.plan(TINY, "A100", setting=s.replace(device="cpu"))


def test_estimate_memory_reads_a_spec_table_device_as_cuda():
    est = tunekit.estimate_memory(TINY, setting=Setting(micro_batch=2, seq_len=32, device="H100 SXM"))
    assert est.inputs["device"] == "cuda" and est.components["cuda_context"] > 0


def test_measure_memory_refuses_what_a_real_step_here_cannot_be():
    model = tunekit.GPT(TINY)
    s = Setting(micro_batch=2, seq_len=16)
    for bad, why in ((s.replace(parallel="fsdp", world_size=2), "one process's step"),
                     (s.replace(device="cuda"), "the model is on cpu"),
                     (s.replace(model="gpt2"), "the model it is given")):
        with pytest.raises(ValueError, match=why):
            tunekit.measure_memory(model, setting=bad, estimate=False)
    notes = tunekit.measure_memory(model, setting=s.replace(compile=True, grad_accum=4), estimate=False).notes
    assert any("compile=True is not measured" in n for n in notes) and any("grad_accum=4" in n for n in notes)


def test_run_step_enters_and_leaves_its_observers_by_their_spans():
    torch = pytest.importorskip("torch")
    from tunekit.measure.step import Observer, run_step

    log = []

    class Seen(Observer):
        def __init__(self, name, span):
            self.name, self.span = name, span

        def __enter__(self):
            log.append(f"+{self.name}")
            return self

        def __exit__(self, *exc):
            log.append(f"-{self.name}")
            return False

        def phase(self, name):
            log.append(f"{self.name}:{name}")

    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    loss = run_step(lambda x: (w * x).sum(), lambda i: (torch.ones(2),), accum=2, optimizer=opt,
                    observers=[Seen("a", ("forward", "backward")), Seen("b", ("forward", "backward")),
                               Seen("f", ("forward", "forward")), Seen("o", ("optimizer step", "optimizer step"))])
    assert loss.item() == 2.0   # two micro-batches of (1*1 + 1*1) / 2
    # a span runs from its first phase in the first micro-step to its last phase in the last one
    assert log == ["+a", "+b", "+f", "a:forward", "b:forward", "f:forward",   # micro-batch 1
                   "a:backward", "b:backward", "f:backward",
                   "a:forward", "b:forward", "f:forward", "-f",             # micro-batch 2: f's span ends
                   "a:backward", "b:backward", "-b", "-a",                  # the last entered left first
                   "+o", "o:optimizer step", "-o"]
    assert torch.equal(w.detach(), torch.full((2,), 0.9))   # 1 - 0.1 x (1/2 + 1/2)
