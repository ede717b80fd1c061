"""The precision contexts a training step runs under.

    >>> with matmul_precision(t, device), autocast(t, device):
    ...     loss = model(x, y)[1]
"""
from __future__ import annotations

import contextlib

import torch

from tunekit.core.registry import TF32
from tunekit.core.toggles import Toggles
from tunekit.measure.device import torch_dtype


def autocast(t: Toggles, device: torch.device):
    """torch.autocast to the run's half dtype (bf16/fp16), or nothing (fp32/tf32)."""
    ac = t.autocast
    if ac is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch_dtype(ac))


@contextlib.contextmanager
def matmul_precision(t: Toggles, device: torch.device):
    """tf32 matmuls for a tf32 run on CUDA ("high"), full fp32 otherwise; restored after.
    On CPU nothing is touched (a tf32 run there is recorded as fp32)."""
    if device.type != "cuda":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if t.precision == TF32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)
