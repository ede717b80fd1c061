"""What a GPU plan's CPU-device fake step must do as CUDA does, and the fake mode's own noise.

Dropout differs by device: CPU's ``F.dropout`` multiplies by a noise tensor of the input's dtype
and keeps it for backward, CUDA's runs ``native_dropout`` and keeps a 1-byte mask; CPU's SDPA
with ``dropout_p > 0`` falls back to the math path and keeps the S x S attention weights, CUDA's
flash and memory-efficient kernels apply dropout inside the kernel and keep only an RNG seed. A
GPT-2 config (dropout 0.1) at 8 x 1024 planned with CPU's kernels needs 25.2 GiB, 11.0 GiB with
CUDA's. `GpuKernels` makes the fake step take CUDA's.

The fake step's SDPA is CPU's kernel (`_scaled_dot_product_flash_attention_for_cpu` and its
backward): `sdpa_backend` says which kernel CUDA's dispatch would run in its place on the planned
device, and `GpuKernels.kernel` turns the CPU call into that kernel's call, so that the plan's op
records, FLOP count and peak name the GPU's op and count it with torch's formula for it.
"""
from __future__ import annotations

import contextlib
import functools
import logging

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from tunekit.core.notes import Note
from tunekit.core.registry import BF16, FP16, FP32
from tunekit.core.specs import find_spec
from tunekit.measure.device import dtype_name
from tunekit.measure.torch_private import op_argument_names

aten = torch.ops.aten

# the rule's source: sdp_utils.cpp as read at pytorch commit 001f694aef6f (select_sdp_backend, can_use_*)
SDP_UTILS = "pytorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, select_sdp_backend"
# the CUDA ops of each backend: (forward, backward); the math path is a composite of matmuls and a softmax
KERNELS = {"flash": (aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_flash_attention_backward),
           "efficient": (aten._scaled_dot_product_efficient_attention,
                         aten._scaled_dot_product_efficient_attention_backward),
           "cudnn": (aten._scaled_dot_product_cudnn_attention, aten._scaled_dot_product_cudnn_attention_backward)}
_CPU_SDPA = {aten._scaled_dot_product_flash_attention_for_cpu: 0,
             aten._scaled_dot_product_flash_attention_for_cpu_backward: 1}
_SAME = {"attn_bias": "attn_mask", "grad_out_": "grad_out"}   # a CUDA op's argument -> the CPU op's


def sdpa_backend(capability, dtype: str, d_qk: int, d_v: int, *, mask: bool, causal: bool, seq_q: int, seq_k: int,
                 dropout: float = 0.0, rocm: bool = False, prefer_cudnn: bool = False) -> str:
    """The SDPA kernel torch runs for a training step's dense attention: "flash", "efficient",
    "cudnn" or "math", by the checks of torch's dispatch (SDP_UTILS) in its default order, flash,
    then efficient, then math (cuDNN's kernel comes last, so never, unless ``prefer_cudnn``: torch
    tries it first on sm90/sm100/sm103 when its runtime cuDNN is newer than 9.15, in
    `check_prefer_cudnn_attention`, which a spec cannot say).

    flash: no explicit mask, one head dim for q, k and v up to 256 (512 on ROCm's AOTriton),
    sm80 to sm121, fp16 or bf16, no causal flag over unequal sequences, and on sm86-89/sm120-121 a
    trained head dim up to 192 (or over 224 without dropout). efficient: sm50 to sm121, head dims
    a multiple of the GEMM alignment (8 at half precision; 4 in fp32 from sm80, 1 before), fp16,
    fp32 or bf16 (no bf16 before sm80), up to 512 on ROCm. cuDNN: sm80 to sm121, fp16 or bf16, head dims multiples
    of 8 up to 128 (192 with 128 on sm90/sm10x), dropout a multiple of 1/16, a key longer than 1.
    Tensors are taken as dense and laid out as the kernels need (unit last stride, aligned)."""
    major = capability[0]
    low = (FP16, BF16) if major >= 8 or rocm else (FP16,)
    in_range = rocm or (8, 0) <= tuple(capability) <= (12, 1)

    def flash():
        trained_ok = True
        if not rocm and ((8, 6) <= tuple(capability) <= (8, 9) or (12, 0) <= tuple(capability) <= (12, 1)):
            trained_ok = d_qk <= 192 or (not dropout and d_qk > 224)
        return (not mask and d_qk == d_v and d_qk <= (512 if rocm else 256) and in_range and trained_ok
                and not (causal and seq_q != seq_k) and dtype in low)

    def efficient():
        half = dtype in (FP16, BF16)
        align = (8 if half else 4) if rocm or major >= 8 else (8 if half else 1) if major >= 7 else 1
        dtypes = (FP16, FP32, BF16) if rocm or major >= 8 else (FP16, FP32)
        fits = max(d_qk, d_v) <= 512 if rocm else (5, 0) <= tuple(capability) <= (12, 1)
        return fits and d_qk % align == 0 and d_v % align == 0 and dtype in dtypes

    def cudnn():
        wide = (major == 9 and capability[1] == 0) or major == 10
        limit = 192 if wide and (d_qk, d_v) == (192, 128) else 128
        return (not rocm and in_range and dtype in low and float(dropout * 16).is_integer() and d_qk <= limit
                and d_v <= limit and d_qk % 8 == 0 and d_v % 8 == 0 and seq_k != 1 and not (dropout and seq_q == 1))

    first = prefer_cudnn and not rocm and major in (9, 10) and capability[1] in (0, 3)
    order = (cudnn, flash, efficient) if first else (flash, efficient)
    return next((f.__name__ for f in order if f()), "math")


class GpuKernels(TorchFunctionMode):
    """Dropout as CUDA runs it: ``native_dropout`` (a bool mask kept), and SDPA's dropout inside
    the fused kernel (nothing more kept: the step runs with ``dropout_p=0``). ``seen``: whether
    any dropout ran, so the plan says so only then. ``kernel``: the CUDA SDPA call that stands
    for a CPU one on ``device`` (a name of the spec table); ``chosen``: the kernels it named.

    A checkpointed block's recomputation runs inside autograd's backward, where a function mode
    entered around the step is no longer on the stack: the recomputed dropout would be CPU's (a
    noise tensor where the forward kept a bool mask) and checkpointing refuses the step ("Recomputed
    values ... have different metadata"). So ``F.dropout`` and ``F.scaled_dot_product_attention``
    themselves are swapped while the mode is entered, and the mode catches what bound them earlier.
    For the same reason the step's counters find the entered one by `GpuKernels.current`."""

    _entered: list = []

    def __init__(self, device: str):
        super().__init__()
        self.device = device
        row = find_spec(device)   # its GPU row: the compute capability torch's SDPA dispatch checks
        self.rocm = row is not None and row.platform == "rocm"
        self.capability = (0, 0) if self.rocm else row.capability.value if row is not None else None
        self.seen = False
        self.chosen = {}   # backend -> (dtype, head dim, mask) of its first call
        self._saved = None
        self._dropout = 0.0   # the last SDPA call's dropout_p, as asked (the step runs it at 0)

    @classmethod
    def current(cls) -> GpuKernels | None:
        """The GpuKernels entered now (a GPU plan's fake step), None on a CPU plan."""
        return cls._entered[-1] if cls._entered else None

    def __enter__(self):
        self._saved = (F.dropout, F.scaled_dot_product_attention)
        dropout, sdpa = self._saved
        F.dropout = lambda *a, **k: self._call(dropout, a, k)
        F.scaled_dot_product_attention = lambda *a, **k: self._call(sdpa, a, k)
        entered = super().__enter__()
        GpuKernels._entered.append(self)
        return entered

    def __exit__(self, *exc):
        F.dropout, F.scaled_dot_product_attention = self._saved
        GpuKernels._entered.remove(self)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self._call(func, args, kwargs or {})

    def _call(self, func, args, kwargs):
        dropout, sdpa = self._saved
        if func is dropout:
            x, p = args[0], kwargs.get("p", args[1] if len(args) > 1 else 0.5)
            training = kwargs.get("training", args[2] if len(args) > 2 else True)
            if training and p > 0:
                self.seen = True
                return torch.native_dropout(x, p, True)[0]
        elif func is sdpa:
            p = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
            self._dropout = p
            if p:
                self.seen = True
                args = args[:4] + (0.0,) + tuple(args[5:]) if len(args) > 4 else args
                kwargs = dict(kwargs, dropout_p=0.0) if "dropout_p" in kwargs else kwargs
        return func(*args, **kwargs)

    def kernel(self, packet, args, kwargs) -> tuple | None:
        """(the op's name on the GPU, the CUDA op whose FLOP formula counts it, its arguments in
        that op's order) for a CPU SDPA op; None for any other op or without a known device. The
        math path is a composite (its matmuls, softmax and mask), named as torch names it and
        counted by the efficient kernel's formula, the same sum of matmuls (a FLOP count's
        ``by_op`` keys it under that kernel)."""
        phase = _CPU_SDPA.get(packet)
        if phase is None or self.capability is None:
            return None
        given = dict(zip(op_argument_names(packet), args), **kwargs)
        q, k, v = given["query"], given["key"], given["value"]
        dtype, mask = dtype_name(q.dtype) or str(q.dtype), given.get("attn_mask") is not None
        pick = functools.partial(sdpa_backend, self.capability, dtype, q.shape[-1], v.shape[-1], mask=mask,
                                 causal=bool(given.get("is_causal")), seq_q=q.shape[-2], seq_k=k.shape[-2],
                                 dropout=self._dropout, rocm=self.rocm)
        backend = pick()
        if backend not in self.chosen:
            self.chosen[backend] = (dtype, int(q.shape[-1]), mask, pick(prefer_cudnn=True) == "cudnn")
        counted = KERNELS.get(backend, KERNELS["efficient"])[phase]
        name = str(counted)[5:] if backend in KERNELS else "_scaled_dot_product_attention_math"
        return name, counted, tuple(given.get(_SAME.get(n, n)) for n in op_argument_names(counted))

    def op_name(self, func, args, kwargs) -> str:
        """An op's name as the GPU runs it (``func`` an overload: its name without "aten.")."""
        mapped = self.kernel(func.overloadpacket, args, kwargs or {})
        return str(func).removeprefix("aten.") if mapped is None else f"{mapped[0]}.{func._overloadname}"

    def notes(self) -> list:
        """What the plan says of the attention kernels it named."""
        out = []
        for backend, (dtype, head_dim, mask, cudnn) in self.chosen.items():
            what = f"{dtype}, head dim {head_dim}" + (", with a mask" if mask else "")
            if backend == "math":
                out.append(Note("plan.attention_kernel", f"attention: no fused SDPA kernel of torch takes {what} on "
                                f"{self.device}: it runs the math path (matmuls and a softmax, the S x S weights "
                                "kept), planned as one fused op: its FLOPs a fused kernel's, those weights not in "
                                f"the memory (torch's SDPA dispatch: {SDP_UTILS})"))
                continue
            also = (f"; a torch whose cuDNN is newer than 9.15 runs cuDNN's kernel first on {self.device} "
                    "(check_prefer_cudnn_attention)" if cudnn and backend != "cudnn" else "")
            out.append(Note("plan.attention_kernel", f"attention planned as torch's {backend} SDPA kernel for "
                            f"{what} on {self.device} (torch's SDPA dispatch: {SDP_UTILS}){also}"))
        return out

    NOTE = ("dropout planned as CUDA runs it: a 1-byte mask for each dropout, attention's inside the fused "
            "SDPA kernel (the CPU's kernels keep a noise tensor and the S x S weights)")


@contextlib.contextmanager
def quiet_fake_logs():
    """A meta kernel that refuses an op logs a traceback before the error reaches the plan (which
    then plans analytically and says why): keep the log quiet meanwhile."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)
