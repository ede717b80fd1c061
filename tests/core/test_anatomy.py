"""Memory-anatomy formulas against the documents' numbers (pure: no tensors needed)."""
import math
import subprocess
import sys

import pytest

from tunekit.core.memory.estimate import (
    bytes_per_param,
    estimate_memory,
    full_recompute_activation_bytes,
    korthikanti_activation_bytes,
    optimizer_bytes_per_param,
    worked_example_147m,
)
from tunekit.core.memory.gpt_count import gpt_activation_bytes, gpt_layer_activation_bytes, gpt_param_count

GPT1 = dict(n_layer=12, n_embd=768, n_head=12, seq_len=512)
TINY = dict(vocab_size=256, n_layer=2, n_head=4, n_embd=128, block_size=128, mlp="gelu",
            attention="sdpa", pos="rope", bias=False, dropout=0.0)


def test_pure_modules_import_nothing_heavy():
    code = ("import sys; from tunekit.core.memory.estimate import estimate_memory; import tunekit.core.advisor as a;"
            "e = estimate_memory(1e6, device='cpu'); str(e); str(a.advise({'n_embd': 64, 'n_head': 4}));"
            "print(','.join(m for m in ('torch', 'IPython', 'pandas', 'plotly') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_mixed_precision_adamw_is_18_bytes_per_param():
    # 2 (half weights) + 4 (fp32 master) + 4 (fp32 grads) + 8 (two fp32 moments) = 18
    per = bytes_per_param("mixed", "adamw")
    assert per == {"weights": 2, "master_weights": 4, "gradients": 4, "optimizer_states": 8}
    assert sum(per.values()) == 18
    assert estimate_memory(1_000_000, layout="bf16-mixed", device="cpu").static_bytes == 18_000_000


def test_other_precisions_per_param():
    assert sum(bytes_per_param("fp32", "adamw").values()) == 16      # 4 + 4 + 8
    # pure bf16 with bf16 AdamW: "only 8 bytes per parameter ... Instead of 18!" = 2 + 2 + 4
    assert sum(bytes_per_param("bf16", "adamw").values()) == 8
    assert sum(bytes_per_param("amp", "adamw").values()) == 16       # autocast: fp32 params/grads


@pytest.mark.parametrize("name, expected", [("adamw", 8), ("sgd", 4), ("lion", 4), ("adafactor", 4),
                                            ("adamw-8bit", 2), ("adamw_8bit", 2), ("adamw-bf16", 4),
                                            ("sgd-nomomentum", 0)])
def test_optimizer_state_bytes(name, expected):
    assert optimizer_bytes_per_param(name, "fp32") == expected


def test_unknown_names_raise():
    with pytest.raises(ValueError):
        optimizer_bytes_per_param("adamax")
    with pytest.raises(ValueError):
        bytes_per_param("int4")


def test_korthikanti_gpt1_example():
    # 512*768*12*(10 + 24 + 5*12*512/768) = 4718592 * 74 = 349175808 bytes per sample
    assert korthikanti_activation_bytes(512, 1, 768, 12, 12) == 349175808
    assert korthikanti_activation_bytes(512, 64, 768, 12, 12) == 64 * 349175808  # 22347251712


def test_korthikanti_tensor_and_sequence_parallel():
    # t=2: 4718592 * (10 + 12 + 5*12*512/(768*2)) = 4718592 * 42 = 198180864
    assert korthikanti_activation_bytes(512, 1, 768, 12, 12, t=2) == 198180864
    # sequence parallel splits the 10 too: 4718592 * (34/2 + 20) = 174587904
    assert korthikanti_activation_bytes(512, 1, 768, 12, 12, t=2, sequence_parallel=True) == 174587904
    # full recompute keeps each layer's fp16 input: 2*512*768*12 = 9437184
    assert full_recompute_activation_bytes(512, 1, 768, 12) == 9437184


def test_worked_example_147m_both_readings():
    ex = worked_example_147m(64)
    printed = ex["as printed (20 B/param)"]
    # 147e6 * (2 + (4 + 12) + 2) = 2940e6; + 64 * 349175808 = 25287251712 -> "~25.3G"
    assert printed.static_bytes == pytest.approx(2.94e9)
    assert printed.total_bytes == pytest.approx(25287251712)
    assert round(printed.total_bytes / 1e9, 1) == 25.3
    # the fp32 copy charged once: 147e6 * 16 = 2352e6 -> 24699251712
    assert ex["fp32 copy once (16 B/param)"].total_bytes == pytest.approx(24699251712)
    # fp32 grads as in the 18 B/param rule: 147e6 * 18 = 2646e6 -> 24993251712
    assert ex["fp32 grads (18 B/param)"].total_bytes == pytest.approx(24993251712)


def test_twenty_percent_overhead_gives_30_3_gb():
    e = estimate_memory(147e6, optimizer_bytes=12, grad_bytes=2, micro_batch=64, device="cpu",
                        activations="korthikanti", overhead_fraction=0.2, **GPT1)
    assert e.total_bytes == pytest.approx(25287251712 * 1.2)   # 30344702054.4 -> "~30.3G"


def test_checkpointed_estimate_keeps_layer_inputs_plus_one_layer():
    e = estimate_memory(147e6, micro_batch=1, checkpointing=True, device="cpu",
                        activations="korthikanti", **GPT1)
    assert e["activations"] == 9437184                 # 2*s*b*h*L
    assert e["recompute"] == 349175808 / 12            # one layer rebuilt during backward


def test_sharding_divides_the_static_lines():
    n = 1_000_000
    z1 = estimate_memory(n, dp=4, zero_stage=1, device="cpu")
    # weights 2 + grads 4 whole; master 4 and AdamW 8 split four ways: 6 + 12/4 = 9 B/param
    assert z1.static_bytes == 9 * n
    assert estimate_memory(n, dp=4, zero_stage=2, device="cpu").static_bytes == 6 * n   # 2 + 16/4
    assert estimate_memory(n, dp=4, zero_stage=3, device="cpu").static_bytes == 4.5 * n  # 18/4
    assert estimate_memory(n, tp=2, pp=2, device="cpu").static_bytes == 4.5 * n         # 18/(2*2)


def test_cuda_context_and_distributed_lines():
    e = estimate_memory(1e6, device="cuda", dp=2)
    assert e["cuda_context"] == 0.47 * 2**30   # core.memory.options.CUDA_CONTEXT, a plan's figure too
    assert "0.47 GiB" in e.formulas["cuda_context"] and "stas00/ml-engineering" in e.formulas["cuda_context"]
    assert estimate_memory(1e6, device="cuda", cuda_context_bytes=1e9).formulas["cuda_context"].endswith("(as given)")
    assert e["distributed"] == 1.5 * 2**30
    # lines that do not exist there are left out, never 0-byte rows (issue 33)
    cpu = estimate_memory(1e6, device="cpu")
    assert "cuda_context" not in cpu.components and "distributed" not in cpu.components
    assert not {"cuda_context", "distributed"} & set(cpu.to_frame().index)
    assert "distributed" not in estimate_memory(1e6, device="cuda").components   # one device


def _no_nvidia_driver():
    import os
    import shutil

    from tunekit.core.memory.options import NVIDIA_DRIVER_FILE

    return not os.path.exists(NVIDIA_DRIVER_FILE) and shutil.which("nvidia-smi") is None


@pytest.mark.skipif(not _no_nvidia_driver(), reason="this machine has an NVIDIA driver: the default is cuda")
def test_default_device_on_this_cpu_machine_adds_no_cuda_context():
    """No device given: this machine's. Here (no driver, torch without CUDA) that is the CPU, so
    the 1M-param mixed/AdamW total is its 18 bytes per param, with no 0.47 GiB of CUDA context."""
    import torch

    assert not torch.cuda.is_available()   # imported (by the tests): its answer decides
    e = estimate_memory(1e6)
    assert e.inputs["device"] == "cpu"
    assert e.inputs["device_source"] == "torch is imported and sees no CUDA device"
    assert "cuda_context" not in e.components and "distributed" not in e.components
    assert e.total_bytes == 18e6
    assert ("device='cpu' assumed: this machine's (torch is imported and sees no CUDA device); pass "
            "device= to plan for another (device='cuda' adds the CUDA context)") in e.notes
    # a sharded run on CPU: no NCCL buffers either
    assert "distributed" not in estimate_memory(1e6, dp=2).components   # on CPU: no such line
    # given, the device is not second-guessed, and no note is added
    g = estimate_memory(1e6, device="cuda")
    assert (g.inputs["device"], g.inputs["device_source"]) == ("cuda", "given")
    assert g.total_bytes == 18e6 + 0.47 * 2**30
    assert not any("assumed" in n for n in g.notes)


@pytest.mark.skipif(not _no_nvidia_driver(), reason="this machine has an NVIDIA driver: the default is cuda")
def test_default_device_without_torch_imported_is_read_from_the_driver():
    """The pure layer never imports torch: in a process that has not, no driver means cpu."""
    code = ("import sys; from tunekit.core.memory.estimate import estimate_memory; e = estimate_memory(1e6);"
            "print(e.inputs['device'], e.total_bytes, e.inputs['device_source'], 'torch' in sys.modules, sep='|')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "cpu|18000000.0|torch is not imported and no NVIDIA driver is visible|False"


def test_default_device_follows_torch_then_the_driver(monkeypatch):
    from types import SimpleNamespace

    from tunekit.core.memory import options

    def torch_with_cuda(available):
        return SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: available))

    monkeypatch.setitem(sys.modules, "torch", torch_with_cuda(True))
    e = estimate_memory(1e6)
    assert (e.inputs["device"], e.inputs["device_source"]) == ("cuda", "torch is imported and sees a CUDA device")
    assert e.total_bytes == 18e6 + 0.47 * 2**30
    assert estimate_memory(1e6, dp=2)["distributed"] == 1.5 * 2**30
    # torch's answer wins over a driver (a CPU build of torch on a GPU machine trains on the CPU)
    monkeypatch.setattr(options.os.path, "exists", lambda path: path == options.NVIDIA_DRIVER_FILE)
    monkeypatch.setitem(sys.modules, "torch", torch_with_cuda(False))
    assert estimate_memory(1e6).inputs["device"] == "cpu"
    # torch not imported: the driver decides, the file first, then nvidia-smi
    monkeypatch.delitem(sys.modules, "torch")
    assert options.this_machine_device() == (
        "cuda", "torch is not imported; an NVIDIA driver is loaded (/proc/driver/nvidia/version)")
    monkeypatch.setattr(options.os.path, "exists", lambda path: False)
    monkeypatch.setattr(options.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    assert options.this_machine_device() == (
        "cuda", "torch is not imported; an NVIDIA driver is installed (nvidia-smi on PATH)")
    monkeypatch.setattr(options.shutil, "which", lambda name: None)
    assert options.this_machine_device() == ("cpu", "torch is not imported and no NVIDIA driver is visible")


def test_bare_param_count_has_nan_activations_not_zero():
    e = estimate_memory(1e6, device="cpu")
    assert math.isnan(e["activations"]) and e.notes
    assert e.total_bytes == 18e6   # NaN lines are left out of the total


def test_gpt_param_count_by_hand():
    # per layer 2h + 4h^2 + 2hf = 256 + 65536 + 131072 = 196864; x2 = 393728
    # outside: V*h + h = 32768 + 128 = 32896 -> 426624
    assert gpt_param_count(TINY) == 426624
    # learned positions, biases, SwiGLU f=384 (8/3*128 rounded up to 64):
    # layer 2h + 4h^2 + 3hf + (3h + h + 2f + h) = 256 + 65536 + 147456 + 1408 = 214656; x2 = 429312
    # outside 32768 + 128 + 128*128 = 49280 -> 478592
    cfg = dict(TINY, pos="learned", bias=True, mlp="swiglu")
    assert gpt_param_count(cfg) == 478592


def test_gpt_layer_activation_fp32_sdpa_gelu():
    # b=2, s=64: T=128 tokens, T*h = 16384
    # norms 2*(T*h*(4+4+4) + 4T) = 2*197120 = 394240; attention 6*T*h*4 + 4*b*a*s = 395264;
    # GELU MLP 2*T*f*4 = 524288 -> 1313792
    assert gpt_layer_activation_bytes(2, 64, 128, 4, 512) == 1313792


def test_gpt_activation_whole_model_and_checkpointing():
    full = gpt_activation_bytes(TINY, 2, 64, 4)
    # 2 layers x 1313792 + idx 8T 1024 + final norm 197120 + log-softmax 4*T*V 131072
    # + targets 1024 + loss weight 4 = 2957828 (the measured figure in test_memory)
    assert full["saved"] == 2957828
    ck = gpt_activation_bytes(TINY, 2, 64, 4, checkpointing=True)
    # block inputs 2 * 4*T*h = 131072 + the same 330244 outside the blocks
    assert ck["saved"] == 461316 and ck["recompute"] == 1313792


def test_estimate_from_config_uses_gpt_count_and_figure():
    e = estimate_memory(TINY, precision="fp32", micro_batch=2, seq_len=64, device="cpu")
    assert e.inputs["activations"] == "gpt" and e["activations"] == 2957828
    assert e["buffers"] == 2 * 128 * 32 * 4     # rotary cos+sin: 2 x block_size x head_dim fp32
    df = e.to_frame()
    assert df.loc["total", "bytes"] == pytest.approx(e.total_bytes)
    assert df.loc["activations", "GB"] == pytest.approx(2957828 / 1e9)
    fig = e.figure()
    assert {bar.name for bar in fig.data} >= {"weights", "gradients", "optimizer_states", "activations"}


def test_bad_parallel_sizes_raise():
    for kw in (dict(tp=0), dict(dp=-1), dict(pp=1.5), dict(zero_stage=4)):
        with pytest.raises(ValueError):
            estimate_memory(1e6, device="cpu", **kw)


def test_pipeline_does_not_divide_activations_in_either_mode():
    # 1F1B: the first stage holds pp micro-batches of L/pp layers = L layers' activations
    k1 = estimate_memory(147e6, micro_batch=1, device="cpu", activations="korthikanti", **GPT1)
    k4 = estimate_memory(147e6, micro_batch=1, pp=4, device="cpu", activations="korthikanti", **GPT1)
    assert k4["activations"] == k1["activations"] == 349175808
    g1 = estimate_memory(TINY, precision="fp32", micro_batch=2, seq_len=64, device="cpu")
    g4 = estimate_memory(TINY, precision="fp32", micro_batch=2, seq_len=64, pp=4, device="cpu")
    assert g4["activations"] == g1["activations"] == 2957828
    assert g4["weights"] == g1["weights"] / 4 and any("1F1B" in n for n in g4.notes)
    g2 = estimate_memory(TINY, precision="fp32", micro_batch=2, seq_len=64, tp=2, device="cpu")
    assert g2["activations"] == 2957828 / 2


def test_estimate_memory_takes_exactly_the_options_fields():
    """The documented keyword signature and MemoryOptions stay one list: same names, same order,
    same defaults (the options dataclass is where each is checked)."""
    import dataclasses
    import inspect

    from tunekit.core.memory.options import MemoryOptions

    params = list(inspect.signature(estimate_memory).parameters.values())
    assert params[0].name == "model" and params[0].default is None
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:])
    assert params[-1].name == "setting"   # a tunekit.Setting instead of the step keywords
    assert [(p.name, p.default) for p in params[1:-1]] == [
        (f.name, f.default) for f in dataclasses.fields(MemoryOptions)]


def test_options_are_checked_when_made():
    from tunekit.core.memory.options import MemoryOptions

    with pytest.raises(ValueError, match="zero_stage must be 0, 1, 2 or 3, got 4"):
        MemoryOptions(zero_stage=4)
    with pytest.raises(ValueError, match="activations must be auto, gpt, hf or korthikanti, got 'x'"):
        MemoryOptions(activations="x")
    assert MemoryOptions(parallel="hsdp", world_size=8, nodes=2).sharded[:2] == (3, 4)


def test_adafactor_state_is_what_torchs_adafactor_allocates_for_a_small_model():
    import torch

    from tunekit.core.shapes import model_shape
    from tunekit.models.gpt import GPT, GPTConfig
    from tunekit.models.optimizers import state_bytes

    def real(model):   # the state torch's Adafactor makes at its first step
        opt = torch.optim.Adafactor(model.parameters(), lr=1e-3)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        return state_bytes(opt)

    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8, 2))
    # per tensor a 4-byte step; conv weight (8, 3, 3, 3): rows (8, 3, 3, 1) 72 + columns (8, 3, 1, 3) 72;
    # bias (8,) 8; linear weight (2, 8): 2 + 8; bias (2,) 2. 4 x 4 + 4 x (144 + 8 + 10 + 2) = 672
    assert real(conv) == 672
    assert estimate_memory(conv, optimizer="adafactor", layout="fp32", device="cpu")["optimizer_states"] == 672
    cfg = GPTConfig.preset("cpu-tiny")
    gpt = GPT(cfg)
    assert sorted(model_shape(cfg).param_shapes()) == sorted(tuple(p.shape) for p in gpt.parameters())
    made = real(gpt)
    # 2 layers x (qkv 384 x 128, proj, up 512 x 128, down, 2 norms) + wte 256 x 128 + norm_f: 14 tensors,
    # 14 x 4 + 4 x (2 x (512 + 256 + 640 + 640 + 2 x 128) + 384 + 128) = 56 + 20,480 = 20,536 (not 4 x 426,624)
    assert made == 20_536
    assert estimate_memory(gpt, optimizer="adafactor", layout="fp32", device="cpu")["optimizer_states"] == made
    assert estimate_memory(cfg, optimizer="adafactor", layout="fp32", device="cpu")["optimizer_states"] == made
    # the optimizer steps mixed precision's fp32 master weights: the same bytes
    assert estimate_memory(cfg, optimizer="adafactor", layout="mixed", device="cpu")["optimizer_states"] == made
    # a bare count has no shapes: the bound, and a note that says so
    bare = estimate_memory(426_624, optimizer="adafactor", layout="fp32", device="cpu")
    assert bare["optimizer_states"] == 4 * 426_624 and "optimizer.bound" in [n.kind for n in bare.notes]


@pytest.mark.parametrize("cfg", [
    dict(model_type="gpt2", n_embd=64, n_head=4, n_layer=2, vocab_size=100, n_positions=32),
    dict(model_type="llama", hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
         vocab_size=100, intermediate_size=128, tie_word_embeddings=False),
    dict(model_type="gpt_neox", hidden_size=64, num_attention_heads=4, num_hidden_layers=2, vocab_size=100,
         intermediate_size=128, attention_bias=True, tie_word_embeddings=False),
], ids=["gpt2", "llama", "gpt_neox"])
def test_a_configs_parameter_shapes_add_up_to_its_count(cfg):
    from tunekit.core.shapes import model_shape

    s = model_shape(cfg)
    assert sum(math.prod(t) for t in s.param_shapes()) == s.param_count()
