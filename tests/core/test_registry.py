"""The registry is the one declaration of optimizers, dtypes, precisions and attention kinds;
everything that lists or sizes them reads it."""
import pytest
import torch

from tunekit.core import registry, toggles
from tunekit.core.memory.estimate import optimizer_bytes_per_param
from tunekit.measure.device import torch_dtype
from tunekit.models.optimizers import build_optimizer, state_bytes, unavailable_optimizers


def test_lab_lists_come_from_the_registry():
    assert toggles.OPTIMIZERS == tuple(n for n, o in registry.OPTIMIZERS.items() if o.factory)
    assert toggles.PRECISIONS == ("fp32", "tf32", "bf16", "fp16")
    assert toggles.ATTENTIONS == ("math", "sdpa", "flash")


@pytest.mark.parametrize("name", [n for n in registry.LAB_OPTIMIZERS
                                  if n not in unavailable_optimizers("cpu")])
def test_every_buildable_optimizer_holds_the_state_the_registry_declares(name):
    net = torch.nn.Linear(64, 32, bias=False)  # 2048 fp32 parameters
    opt = build_optimizer(name, net.parameters(), lr=1e-3)
    net(torch.randn(4, 64)).sum().backward()
    opt.step()
    declared = registry.optimizer(name).state_bytes_per_param(4) * 2048
    if name == "adafactor":
        # torch factors the second moment into a row (32 x 1) and a column (1 x 64) variance, fp32,
        # plus a 0-dim fp32 step: 4 x (32 + 64) + 4 = 388; the per-param figure is its bound
        assert state_bytes(opt) == registry.optimizer(name).state_bytes_of([(32, 64)], 4) == 388
    else:
        # adamw (fused or not): 2 x 4 B x 2048 = 16384 + a 4-byte fp32 step tensor = 16388;
        # sgd momentum: 4 B x 2048 = 8192 and no step; the registry counts the step exactly
        assert state_bytes(opt) == registry.optimizer(name).state_bytes_of([(32, 64)], 4) \
            == declared + registry.optimizer(name).step_bytes
        assert state_bytes(opt) == {"adamw": 16388, "adamw_fused": 16388, "sgd": 8192}.get(name, state_bytes(opt))
    assert optimizer_bytes_per_param(name, "fp32") * 2048 == declared


def test_aliases_resolve_to_one_entry():
    assert registry.optimizer("adamw-8bit") is registry.OPTIMIZERS["adamw_8bit"]
    assert registry.optimizer("Adam").name == "adamw"
    assert registry.optimizer_for_class("SGD", momentum=0.0).name == "sgd_nomomentum"
    assert registry.optimizer_for_class("AdamW8bit").name == "adamw_8bit"
    assert optimizer_bytes_per_param("adamw-8bit") == 2   # 2 states x 1 byte
    with pytest.raises(ValueError, match="unknown optimizer"):
        registry.optimizer("rmsprop")


def test_dtypes_map_to_torch():
    assert [torch_dtype(n) for n in ("fp32", "tf32", "bf16", "fp16", "bfloat16")] == [
        torch.float32, torch.float32, torch.bfloat16, torch.float16, torch.bfloat16]
    assert all(torch_dtype(n).itemsize == d.bytes for n, d in registry.DTYPES.items())
    with pytest.raises(ValueError, match="unknown dtype"):
        registry.dtype("int4")


def test_unavailable_optimizers_say_why():
    why = unavailable_optimizers("cpu")
    assert "adamw_8bit" in why and ("bitsandbytes" in why["adamw_8bit"])
    assert set(why) <= set(registry.LAB_OPTIMIZERS)


@pytest.mark.parametrize("typed, meant", [
    ("bfloat16", "bf16"), ("torch.float16", "fp16"), ("half", "fp16"), ("float32", "fp32"), ("BF-16", "bf16"),
    ("fp8", None), (8, None),   # fp8 is a dtype but no training precision; 8 is no name at all
])
def test_a_precision_s_other_name_is_the_precision_meant(typed, meant):
    assert registry.precision_meant(typed) == meant


def test_a_refused_value_names_the_one_probably_meant():
    from tunekit.core.setting import Toggles, word_problems
    from tunekit.core.toggles import Env, problems

    assert word_problems(Toggles(precision="bfloat16"))[0] == [
        "precision must be one of ('fp32', 'tf32', 'bf16', 'fp16'), got 'bfloat16' (the training precision; "
        "weights= names the parameters' dtype): did you mean 'bf16'?"]
    with pytest.raises(ValueError, match=r"'adamq'; one of \[.*\]: did you mean 'adamw'\?$"):   # not its alias 'adam'
        registry.optimizer("adamq")
    with pytest.raises(ValueError, match=r"\(or \('eager', 'flash_attention_2'\)\): did you mean 'eager'\?$"):
        registry.attention("eagr")
    with pytest.raises(ValueError, match=r"'rmsprop'; one of \[[^]]*\]$"):   # nothing close: no guess
        registry.optimizer("rmsprop")
    lab_only = "optimizer must be one of ('adamw', 'adamw_fused', 'sgd', 'adafactor', 'lion', 'adamw_8bit') in a Lab "
    assert problems(Toggles(optimizer="adam"), Env()) == [  # the alias a Lab does not take: its registry name
        lab_only + "(those it can build), got 'adam': did you mean 'adamw'?"]
    assert problems(Toggles(optimizer="adamw_bf16"), Env()) == [  # a registry name no Lab builds: no other guessed
        lab_only + "(those it can build), got 'adamw_bf16'."]
