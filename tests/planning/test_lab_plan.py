"""``lab.plan(device, ...)`` and the dashboard's "Plan for" picker: the plan of the Lab's model
under the toggles a run would start from, the live model left as it was, what is not modelled said."""
import dataclasses
import html
import inspect

import pytest
import torch

import tunekit
from tunekit.core.fmt import fmt_pct
from tunekit.core.toggles import Toggles
from tunekit.lab import plan as lab_plan
from tunekit.lab.lab import Lab
from tunekit.planning.record import Plan

# cpu-tiny: wte 256x128 (tied head) + 2 blocks x (qkv 384x128 + proj 128x128 + up 512x128 + down 128x512
# + 2 norms of 128) + the final norm: 32768 + 2 x 197888 + 128 = 426624 parameters
N_PARAMS = 426624
FP32_WEIGHTS = 4 * N_PARAMS                  # 1706496
ADAMW_STATES = 2 * FP32_WEIGHTS + 14 * 4     # exp_avg + exp_avg_sq, and one fp32 step per tensor: 3413048


# `lab`: a fresh cpu-tiny Lab, from conftest.py


def test_lab_plan_is_tunekit_plan_of_the_lab_under_its_defaults(lab):
    p, q = lab.plan("cpu"), tunekit.plan(lab, "cpu")
    assert isinstance(p, Plan) and p.device == "cpu"
    assert p.components == q.components
    assert p.notes == q.notes   # nothing of the Lab left out to say
    # the toggles a run starts from: micro_batch 8, the CPU's default sequence (block_size 128)
    assert p.setting == tunekit.Setting(precision="fp32", weights=None, micro_batch=8, seq_len=128,
                                        checkpointing=False, optimizer="adamw", attention="sdpa", device="cpu")
    assert p.tokens == 8 * 128
    assert (p.components["weights"], p.components["gradients"]) == (FP32_WEIGHTS, FP32_WEIGHTS)
    assert p.components["optimizer_states"] == ADAMW_STATES


def test_overrides_are_plans_keywords_and_the_labs_toggles(make_lab):
    lab = make_lab(micro_batch=4, seq_len=64)
    assert lab.plan("cpu").setting.micro_batch == 4 and lab.plan("cpu").tokens == 4 * 64   # its defaults
    kw = dict(precision="bf16", micro_batch=2, seq_len=32, checkpointing=True)
    p = lab.plan("H100 SXM", **kw)
    assert p.components == tunekit.plan(lab, "H100 SXM", **kw).components
    assert p.setting == tunekit.Setting(**kw, optimizer="adamw", attention="sdpa", device="H100 SXM")
    # autocast's bf16 weight copies kept for backward: with checkpointing only the tied head's, 2 x 32768 =
    # 65536 (the blocks' are cast again in the recompute); without, 2 x (2 blocks x (49152 + 16384 + 65536
    # + 65536) + 32768) = 851968
    assert p.components["weight_casts"] == 65536
    assert lab.plan("H100 SXM", **dict(kw, checkpointing=False)).components["weight_casts"] == 851968
    assert p.fixed["cuda_context"][0] == 0.47 * 2**30
    assert lab.plan("H100 SXM", weights="bf16", precision="bf16").components["weights"] == 2 * N_PARAMS
    assert lab.resolve().precision == "fp32" and lab.resolve().micro_batch == 4   # the Lab's own: unchanged
    with pytest.raises(TypeError, match="bogus"):
        lab.plan("cpu", bogus=1)


def test_the_signature_is_plans_then_the_labs_other_toggles():
    plans = list(inspect.signature(tunekit.plan).parameters.values())[1:]     # after the target
    mine = list(inspect.signature(Lab.plan).parameters.values())
    assert mine[0].name == "self"
    assert [(q.name, q.kind, q.default) for q in mine[1:len(plans) + 1]] == \
        [(q.name, q.kind, q.default) for q in plans]
    assert [q.name for q in mine[len(plans) + 1:]] == \
        [f.name for f in dataclasses.fields(Toggles) if f.name not in {q.name for q in plans}]


def test_the_live_model_and_optimizer_are_untouched(lab):
    lab.run(steps=1, warmup=0, verbose=False)   # an optimizer with state, a model with a config
    tensors = dict(lab.model.state_dict(keep_vars=True))
    before = {k: (t.data_ptr(), t.detach().clone(), t.dtype) for k, t in tensors.items()}
    state = [(t.data_ptr(), t.clone()) for s in lab.optimizer.state.values() for t in s.values()
             if torch.is_tensor(t)]
    config = dataclasses.replace(lab.model.config)
    lab.plan("H100 SXM", precision="bf16", weights="bf16", checkpointing=True, search=True, search_limit=8)
    after = dict(lab.model.state_dict(keep_vars=True))
    assert after.keys() == before.keys()
    for k, (ptr, value, dtype) in before.items():
        assert after[k].data_ptr() == ptr and after[k].dtype == dtype and torch.equal(after[k], value), k
    assert all(p.grad is None for p in lab.model.parameters())
    now = [t for s in lab.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    assert [(t.data_ptr(), t) for t in now] and all(t.data_ptr() == ptr and torch.equal(t, v)
                                                   for t, (ptr, v) in zip(now, state))
    assert lab.model.config == config and lab.model.training and not lab.adapter.checkpointing


def test_what_the_plan_does_not_model_is_in_its_notes(lab):
    base = lab.plan("cpu")
    p = lab.plan("cpu", compile=True, grad_accum=4, lr=0.1)
    # grad_accum and lr change neither one micro-step's memory nor its bound: same plan, no note
    assert p.components == base.components and p.bound_step_s == base.bound_step_s
    added = p.notes[len(base.notes):]
    assert added == ["compile=True: the memory is an eager step's (a compiled step often saves fewer activations); "
                     "plan.expected fuses the memory-bound ops"]
    eager = lab.plan("cpu", attention="eager").notes   # transformers' name for math
    if "attention" in inspect.signature(tunekit.plan).parameters:   # plan models it: nothing to say
        assert not any(n.startswith("attention=") for n in eager)
    else:
        assert "attention='math' is not modelled: the plan builds the model with its current attention ('sdpa')" \
            in eager
    assert not any(n.startswith("attention=") for n in lab.plan("cpu", attention="sdpa").notes)


def test_a_model_kept_in_bf16_is_planned_in_bf16(make_lab):
    model = tunekit.GPT(tunekit.GPTConfig.preset("cpu-tiny")).to(torch.bfloat16)
    lab = make_lab(model)
    p = lab.plan("cpu")
    assert p.setting.weights == "bf16" and p.components["weights"] == 2 * N_PARAMS   # 853248
    assert lab.plan("cpu", weights="fp32").components["weights"] == FP32_WEIGHTS   # said: as said


def test_plans_errors_pass_through_unchanged(lab, monkeypatch):
    err = ValueError("tunekit.plan needs a config to build")

    def refuse(*args, **kwargs):
        raise err

    monkeypatch.setattr(lab_plan, "plan", refuse)
    with pytest.raises(ValueError) as caught:
        lab.plan("cpu")
    assert caught.value is err


# --- the dashboard's "Plan for" picker ----------------------------------------------------------


def test_the_picker_lists_cpu_and_the_devices_with_a_memory_size(dash):
    options = dict((label, value) for label, value in dash.plan_picker.options)
    assert list(options)[:2] == ["—", "cpu"] and options["—"] is None and dash.plan_picker.value is None
    assert {"H100 SXM", "A100 40GB", "A100 80GB", "MI300X", "T4"} <= set(options)
    assert "V100 SXM" not in options   # the spec table has no memory size for it
    assert dash.last_plan is None and dash.plan_html.value == ""


def test_picking_a_device_shows_the_plan_and_none_hides_it(dash):
    dash.plan_picker.value = "H100 SXM"
    p = dash.last_plan
    assert p.device == "H100 SXM" and p.components == dash.lab.plan("H100 SXM", micro_batch=4, seq_len=64).components
    shown = html.unescape(dash.plan_html.value)
    # 4 x 64 tokens, fp32: the step's peak + the CUDA context 0.47 GiB + Hopper's 32 MiB cuBLAS
    # workspace, of the 81,559 MiB (79.65 GiB) an H100's driver reports
    assert p.total_bytes == p.peak_bytes + 0.47 * 2**30 + 32 * 2**20 and p.fits
    gib = p.total_bytes / 2**30
    assert f"✓ fits: {gib:.2f} GiB of 79.65 GiB ({81559 / 1024 - gib:.2f} GiB free)" in shown
    assert f"bound (upper limit): ≤ {p.bound_tokens_per_s:,.0f} tokens/s · MFU ≤ {fmt_pct(p.bound_mfu)} of 67 TFLOPS" \
        in shown
    assert "measured on" not in shown and "measured / bound" not in shown   # no run yet (a source may say measured)
    dash.controls["precision"].value = "bf16"   # a plan shown follows the controls
    assert dash.last_plan.setting.precision == "bf16" and "· bf16 ·" in html.unescape(dash.plan_html.value)
    dash.plan_picker.value = None
    assert dash.last_plan is None and dash.plan_html.value == ""


def test_a_run_is_shown_beside_the_bound(dash):
    dash.plan_picker.value = "cpu"
    dash.run_button.click()
    r, p = dash.lab.runs[-1], dash.last_plan
    shown = html.unescape(dash.plan_html.value)
    assert f"measured on {r.device}, run #0 baseline: {r.tokens_per_s:,.0f} tokens/s" in shown
    assert f"measured / bound: {fmt_pct(r.tokens_per_s / p.bound_tokens_per_s)} of the speed of light" in shown
    assert "MFU" in shown.split("measured on")[1]   # the same device: its MFU (of its own peak, 1 TFLOPS)
    dash.controls["micro_batch"].value = 2          # the plan follows; the run does not
    shown = html.unescape(dash.plan_html.value)
    assert "the run's toggles differ from the plan's: no ratio" in shown and "measured / bound" not in shown
    dash.plan_picker.value = "A100 80GB"                 # another device: both, labelled, nothing divided
    shown = html.unescape(dash.plan_html.value)
    assert "bound (upper limit): ≤ " in shown and f"measured on {r.device}" in shown
    assert "measured / bound" not in shown and "no ratio" not in shown
    assert "Traceback" not in dash.message.value


def test_a_plan_that_fails_is_a_sentence_in_the_message_area(dash, monkeypatch):
    def refuse(*args, **kwargs):
        raise ValueError("tunekit.plan needs a config to build")

    monkeypatch.setattr(lab_plan, "plan", refuse)
    dash.plan_picker.value = "cpu"
    failed = "plan for cpu failed: ValueError: tunekit.plan needs a config to build"
    assert failed in dash.message.value and isinstance(dash.last_error, ValueError)
    assert dash.last_plan is None and dash.plan_html.value == ""
    dash.show_plan()
    assert dash.message.value.count(failed) == 1   # said once, not once per try
    monkeypatch.undo()
    dash.plan_picker.value = "A100 80GB"
    assert "failed" not in dash.message.value and dash.last_plan.device == "A100 80GB"
