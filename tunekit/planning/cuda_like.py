"""What a GPU plan's CPU-device fake step must do as CUDA does, and the fake mode's own noise.

Dropout differs by device: CPU's ``F.dropout`` multiplies by a noise tensor of the input's dtype
and keeps it for backward, CUDA's runs ``native_dropout`` and keeps a 1-byte mask; CPU's SDPA
with ``dropout_p > 0`` falls back to the math path and keeps the S x S attention weights, CUDA's
flash and memory-efficient kernels apply dropout inside the kernel and keep only an RNG seed. A
GPT-2 config (dropout 0.1) at 8 x 1024 planned with CPU's kernels needs 25.2 GiB, 11.0 GiB with
CUDA's. `GpuKernels` makes the fake step take CUDA's.
"""
from __future__ import annotations

import contextlib
import logging

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


class GpuKernels(TorchFunctionMode):
    """Dropout as CUDA runs it: ``native_dropout`` (a bool mask kept), and SDPA's dropout inside
    the fused kernel (nothing more kept: the step runs with ``dropout_p=0``). ``seen``: whether
    any dropout ran, so the plan says so only then.

    A checkpointed block's recomputation runs inside autograd's backward, where a function mode
    entered around the step is no longer on the stack: the recomputed dropout would be CPU's (a
    noise tensor where the forward kept a bool mask) and checkpointing refuses the step ("Recomputed
    values ... have different metadata"). So ``F.dropout`` and ``F.scaled_dot_product_attention``
    themselves are swapped while the mode is entered, and the mode catches what bound them earlier."""

    def __init__(self):
        super().__init__()
        self.seen = False
        self._saved = None

    def __enter__(self):
        self._saved = (F.dropout, F.scaled_dot_product_attention)
        dropout, sdpa = self._saved
        F.dropout = lambda *a, **k: self._call(dropout, a, k)
        F.scaled_dot_product_attention = lambda *a, **k: self._call(sdpa, a, k)
        return super().__enter__()

    def __exit__(self, *exc):
        F.dropout, F.scaled_dot_product_attention = self._saved
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
            if p:
                self.seen = True
                args = args[:4] + (0.0,) + tuple(args[5:]) if len(args) > 4 else args
                kwargs = dict(kwargs, dropout_p=0.0) if "dropout_p" in kwargs else kwargs
        return func(*args, **kwargs)

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
