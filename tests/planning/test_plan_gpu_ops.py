"""A GPU plan shows the GPU's ops: the fake step runs CPU's SDPA kernel, and every table and text the
plan prints names the kernel torch's CUDA dispatch would run in its place (planning/cuda_like.py),
counted by torch's formula for that kernel; a CPU plan keeps the CPU's names."""
import json
import re

import pytest
import torch
import torch.nn.functional as F

import tunekit
from tunekit.planning.cuda_like import GpuKernels, sdpa_backend
from tunekit.planning.ops import RooflineCounter

H100, A100, L4, T4, V100, MI300X = (9, 0), (8, 0), (8, 9), (7, 5), (7, 0), (9, 4)


def pick(cc, dtype="bf16", d=64, dv=None, mask=False, causal=True, sq=1024, sk=None, dropout=0.0, **kw):
    return sdpa_backend(cc, dtype, d, d if dv is None else dv, mask=mask, causal=causal, seq_q=sq,
                        seq_k=sq if sk is None else sk, dropout=dropout, **kw)


def test_the_kernel_is_the_one_torchs_dispatch_picks():
    # torch's default order: flash, then efficient, then math (cuDNN's last, so never)
    assert pick(H100) == "flash" and pick(A100, "fp16") == "flash"
    assert pick(H100, mask=True) == "efficient"                    # flash takes no explicit mask
    assert pick(H100, "fp32") == "efficient"                       # flash: half precision only
    assert pick(H100, "fp32", d=66) == "math"                      # efficient: fp32 head dims % 4 from sm80
    assert pick(A100, d=256) == "flash" and pick(A100, d=264) == "efficient"   # flash up to 256; 264 % 8 == 0
    assert pick(H100, causal=True, sq=128, sk=256) == "efficient"   # flash: no causal flag over unequal lengths
    # sm86-89, trained: flash up to head dim 192, or over 224 without dropout
    assert pick(L4, d=192) == "flash" and pick(L4, d=200) == "efficient"
    assert pick(L4, d=256) == "flash" and pick(L4, d=256, dropout=0.1) == "efficient"
    # before sm80: no flash, and efficient takes no bf16; fp32 head dims need no alignment there
    assert pick(T4, "fp16") == "efficient" and pick(T4, "bf16") == "math" and pick(T4, "fp32", d=65) == "efficient"
    assert pick(V100, "fp16", d=60) == "math"                      # half precision: head dims % 8
    # cuDNN first (a torch with cuDNN newer than 9.15, sm90/sm100) where its checks pass
    assert pick(H100, prefer_cudnn=True) == "cudnn" and pick(H100, mask=True, prefer_cudnn=True) == "cudnn"
    assert pick(H100, dropout=0.1, prefer_cudnn=True) == "flash"    # 0.1 x 16 = 1.6: not a multiple of 1/16
    assert pick(H100, d=256, prefer_cudnn=True) == "flash"           # cuDNN here: head dims up to 128
    assert pick(A100, prefer_cudnn=True) == "flash"                  # sm80: the default order
    assert pick(MI300X, rocm=True, prefer_cudnn=True) == "flash"     # ROCm: no cuDNN


def _counted(kernels, dtype=torch.bfloat16):
    b, h, s, d = 2, 4, 128, 64
    q, k, v = (torch.randn(b, h, s, d, dtype=dtype, requires_grad=True) for _ in range(3))
    with RooflineCounter(kernels) as counter:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    return counter


def test_a_gpu_counts_its_kernel_by_torchs_formula_and_the_cpu_keeps_its_own():
    # forward 4*b*h*s*s*d = 4*2*4*128*128*64 = 33,554,432, causal at half: 16,777,216;
    # backward 2.5x the forward (it rebuilds QK^T): 83,886,080, causal at half: 41,943,040
    with GpuKernels("H100 SXM") as gpu:
        on_gpu = _counted(gpu)
    result = on_gpu.result()
    assert result.by_op == {"aten._scaled_dot_product_flash_attention": 16_777_216,
                            "aten._scaled_dot_product_flash_attention_backward": 41_943_040}
    assert [(r[0], r[1], r[3]) for r in on_gpu.ops if r[1] == "attention"] == [
        ("_scaled_dot_product_flash_attention", "attention", 16_777_216),
        ("_scaled_dot_product_flash_attention_backward", "attention", 41_943_040)]
    assert not any("cpu" in str(n).lower() for n in result.notes)
    assert [n.kind for n in gpu.notes()] == ["plan.attention_kernel"]
    # where a plan's peak is: the op named as the GPU runs it (measure.live.LiveBytes's op_name)
    q = torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16)
    cpu_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    assert gpu.op_name(cpu_op, (q, q, q), {"is_causal": True}) == "_scaled_dot_product_flash_attention.default"
    assert gpu.op_name(torch.ops.aten.mm.default, (q, q), {}) == "mm.default"
    on_cpu = _counted(None).result()
    assert on_cpu.by_op == {"aten._scaled_dot_product_flash_attention_for_cpu": 16_777_216,
                            "aten._scaled_dot_product_flash_attention_for_cpu_backward": 41_943_040}
    assert "added CPU SDPA FLOPs (torch counts 0 for them)" in on_cpu.notes
    with GpuKernels("H100 SXM") as gpu:   # fp32 on an H100: the efficient kernel, the same count
        assert set(_counted(gpu, torch.float32).result().by_op) == {
            "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_efficient_attention_backward"}


# what a GPU plan may say of the CPU: how it was made, never an op of the CPU's
LEGIT = ("a CPU-device fake step placed on the GPU's figures", "reading of a real CPU step",
         "(the CPU's kernels keep a noise tensor")


def _cpu_words(text: str) -> list:
    text = text.replace("&#x27;", "'")
    for phrase in LEGIT:
        text = text.replace(phrase, "")
    return [text[max(0, m.start() - 60):m.end() + 60] for m in re.finditer("cpu", text, re.IGNORECASE)]


def _printed(p) -> str:
    parts = [str(p), repr(p), p._repr_html_(), repr(p.expected), p.expected.by_op.to_string(), p.to_frame().to_string(),
             "\n".join(map(str, p.notes)), p.peak_at, " ".join(op for op, _ in p.bound_by)]
    try:
        parts.append(tunekit.planning.plot_plan(p).to_json())
    except ImportError:   # plotly is an extra
        pass
    return "\n".join(parts)


def _llama():
    return dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_every_table_and_text_of_a_gpu_plan_names_the_gpus_ops(model, tmp_path, capsys):
    from tunekit.cli.main import main

    if model == "gpt":
        cfg, arg = tunekit.GPTConfig.preset("cpu-tiny"), "cpu-tiny"
    else:
        transformers = pytest.importorskip("transformers")
        fields = _llama()
        cfg = transformers.AutoConfig.for_model(**fields)
        arg = str(tmp_path / "llama.json")
        (tmp_path / "llama.json").write_text(json.dumps(fields))
    p = tunekit.plan(cfg, "H100 SXM", precision="bf16", micro_batch=2, seq_len=128)
    ops = set(p.expected.by_op.op)
    assert {"_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward"} <= ops
    assert [n.kind for n in p.notes if getattr(n, "kind", None) == "plan.attention_kernel"] == ["plan.attention_kernel"]
    assert main(["plan", "--model", arg, "--device", "H100 SXM", "--precision", "bf16", "--micro-batch", "2",
                 "--seq-len", "128"]) == 0
    cli = capsys.readouterr().out
    assert "flash SDPA kernel" in cli
    assert _cpu_words(_printed(p) + cli) == []


@pytest.mark.slow   # a CPU plan's expectation measures this CPU first (minutes on a busy machine)
def test_a_cpu_plan_keeps_the_cpus_kernel():
    p = tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "cpu", precision="bf16", micro_batch=2, seq_len=128)
    assert {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"} \
        <= set(p.expected.by_op.op)
    assert "added CPU SDPA FLOPs (torch counts 0 for them)" in p.notes
    assert not [n for n in p.notes if getattr(n, "kind", None) == "plan.attention_kernel"]


def test_a_transformers_llamas_plan_names_silu_backward():
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    by_op = tunekit.plan(cfg, "H100 SXM", precision="bf16", micro_batch=2, seq_len=64, verbose=False).expected.by_op
    calls = dict(zip(by_op.op, by_op.calls))
    # LlamaMLP's act_fn (transformers' SiLUActivation: F.silu) once a layer, 2 layers: 2 forward, 2 backward;
    # its decomposition (sigmoid, fill_, sub_) is not what the GPU runs, and is gone
    assert (calls["silu"], calls["silu_backward"]) == (2, 2)
    assert not {"sigmoid", "fill_", "sub_"} & set(calls)
