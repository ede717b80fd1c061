"""A CPU elementwise op over mixed dtypes copies each input that is not at its common dtype into a
temporary first (ATen's TensorIterator on a CPU), then runs its kernel at that dtype: under bf16
autocast the bf16 output of a linear added to the fp32 residual, rotary's bf16 q times its fp32 cos.
A fake tensor's meta kernel makes no such copy; the plan's CPU step counts it (planning.ops:
promoted_inputs) and holds it while its op runs (issue 42: a real bf16 step ran casts the plan did not
count). A GPU's kernels cast as they load: a GPU plan counts none."""
import collections
import contextlib

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.profiler import ProfilerActivity, profile

import tunekit
from tunekit.core.setting import Setting
from tunekit.measure.live import LiveBytes
from tunekit.planning.cuda_like import GpuKernels
from tunekit.planning.ops import RooflineCounter, promoted_bytes
from tunekit.planning.step import fake_step
from tunekit.planning.target import build


def _residual(lin, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return x + lin(x)   # fp32 (4, 8) + the linear's bf16 (4, 8): the sum is fp32


def _records(kernels=None):
    with FakeTensorMode():
        lin, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
        with RooflineCounter(kernels) as counter:
            _residual(lin, x)
    return [(o[0], o[4], o[8]) for o in counter.ops]


def test_a_cpu_add_over_bf16_and_fp32_copies_the_bf16_input_first_and_adds_in_fp32():
    # autocast's casts to bf16: the bias 8 x (4 + 2) = 48 B, the weight 64 x 6 = 384 B, x 32 x 6 = 192 B;
    # addmm reads 16 + 64 + 128 B and writes 64 B = 272 B
    head = [("_to_copy", 48, "float32>bfloat16"), ("_to_copy", 384, "float32>bfloat16"),
            ("_to_copy", 192, "float32>bfloat16"), ("addmm", 272, "bfloat16")]
    # the add: its bf16 input copied to fp32 (32 x 2 B read + 32 x 4 B written = 192 B), then the fp32 kernel
    # reads x 128 B and the copy 128 B and writes 128 B = 384 B
    assert _records() == head + [("_to_copy", 192, "bfloat16>float32"), ("add", 384, "float32")]
    # a GPU's add casts as it loads: no copy, the bf16 input read at 64 B (128 + 64 + 128 = 320 B)
    with GpuKernels("H100 SXM") as gpu:
        assert _records(gpu) == head + [("add", 320, "bfloat16,float32>float32")]


def test_the_live_bytes_hold_the_copy_beside_the_ops_output():
    def peak(scratch):
        with FakeTensorMode():
            lin, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
            with LiveBytes(lin, scratch=scratch) as live:
                _residual(lin, x)
        return live.peak, live.peak_at[2]
    # the casts 16 + 128 + 64 B, addmm's 64 B, the sum's 128 B = 400 B; with the add's fp32 copy 128 B: 528 B
    assert peak(None) == (400, "add.Tensor")
    assert peak(promoted_bytes) == (528, "add.Tensor")


def _real_casts(model, x, y, precision) -> int:
    """The casts a real CPU forward and backward of ``model`` runs on tensors (torch's profiler sees the
    copies a kernel makes, which no dispatch mode does), a Python number's 0-dim copy left out."""
    ac = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with ac:
            _, loss = model(x, y)
        loss.backward()
    return sum(1 for e in prof.events() if e.name == "aten::_to_copy" and e.input_shapes and e.input_shapes[0])


def _planned_casts(cfg, precision) -> collections.Counter:
    """The casts the plan's fake step counts (its op records), by phase and dtype signature."""
    with FakeTensorMode():
        step = fake_step(build(cfg, "gpt", None), "gpt", cfg, Setting(precision=precision, micro_batch=2, seq_len=32),
                         2, components=False)
    return collections.Counter((r[2], r[8]) for r in step.ops if r[0] == "_to_copy")


def test_the_plans_cpu_step_casts_every_tensor_a_real_cpu_step_does():
    cfg = tunekit.GPTConfig.preset("cpu-tiny")   # 2 blocks of 128, 4 heads, rotary positions
    torch.manual_seed(0)
    model = tunekit.GPT(cfg)
    x, y = torch.randint(0, cfg.vocab_size, (2, 2, 32))
    assert _planned_casts(cfg, "fp32") == {} and _real_casts(model, x, y, "fp32") == 0
    planned = _planned_casts(cfg, "bf16")
    # autocast: each of the 9 linears (2 blocks x qkv, proj, fc, fc2; the lm_head) casts its input and weight to
    # bf16: 18; the loss takes the logits in fp32: 1; the CPU's copies ahead of a mixed op, per block the rotary's
    # bf16 q and k times its fp32 cos and sin (4 muls) and the fp32 residual plus a bf16 output (2 adds):
    # 2 x 6 = 12 (the fake step counted none of them). Backward: each cast's gradient cast back, 18 + 1, and the
    # 12 gradients of the mixed ops' bf16 inputs cast to bf16 (autograd's engine): 18 and 13
    assert planned == {("forward", "float32>bfloat16"): 18, ("forward", "bfloat16>float32"): 1 + 12,
                       ("backward", "bfloat16>float32"): 18, ("backward", "float32>bfloat16"): 1 + 12}
    assert sum(planned.values()) == _real_casts(model, x, y, "bf16") == 62
