"""Which device, and its clock: torch (only if already imported), CUDA (only if already
initialized), synchronization before clock reads, labels and dtype names. Measurement layer.

Measuring must never create a CUDA context (that alone costs hundreds of MiB outside the
allocator), so nothing here initializes CUDA or imports torch on its own.
"""
from __future__ import annotations

import os
import sys
import time

from tunekit.core.registry import TF32
from tunekit.core.registry import dtype as _dtype_entry
from tunekit.core.validate import device as _device_arg


def torch_if_loaded():
    """The torch module if the process imported it, else None (we never import it ourselves)."""
    return sys.modules.get("torch")


def cuda_device_index():
    """The current CUDA device index if CUDA is initialized in this process, else None."""
    torch = torch_if_loaded()
    # initialized implies available; is_available() asks the driver on CUDA builds, every call
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_device()


def synchronize(device=None) -> None:
    """Wait for queued device work so that a clock read covers it (no-op on CPU)."""
    torch = torch_if_loaded()
    if torch is None:
        return
    if device is None:
        if cuda_device_index() is not None:
            torch.cuda.synchronize()
        return
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


def now_s(device=None) -> float:
    """perf_counter after synchronizing the device."""
    synchronize(device)
    return time.perf_counter()


_CPUS = os.cpu_count()  # once: ~10-50 µs a call here, a trivial profiled cell's record asks each time


def device_label(cuda_index=None) -> str:
    """'cuda:0 (NVIDIA H100 80GB HBM3)' or 'cpu (N threads)'."""
    torch = torch_if_loaded()
    if cuda_index is not None and torch is not None:
        return f"cuda:{cuda_index} ({torch.cuda.get_device_name(cuda_index)})"
    threads = torch.get_num_threads() if torch is not None else _CPUS
    return f"cpu ({threads} threads)"


def default_device(device=None):
    """The given device, else cuda when available, else cpu (imports torch)."""
    import torch

    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def existing_device(device, name: str = "device"):
    """``device`` as a torch.device if this machine has it, else ValueError saying what it has
    (imports torch; counting CUDA devices does not create a context)."""
    import torch

    mps = getattr(torch.backends, "mps", None)
    counts = {"cpu": 1, "cuda": torch.cuda.device_count() if torch.cuda.is_available() else 0,
              "mps": 1 if mps is not None and mps.is_available() else 0}
    return torch.device(_device_arg(name, device, counts))


def dtype_name(dtype) -> str | None:
    """tunekit's name of a torch dtype (``torch.bfloat16`` -> ``"bf16"``), None for one it does not
    name (integers, fp64); the inverse of `torch_dtype`, read from the same table (core.registry)."""
    from tunekit.core.registry import DTYPES

    return next((d.name for d in DTYPES.values() if d.name != TF32 and f"torch.{d.torch_name}" == str(dtype)), None)


def weights_dtype(params) -> str | None:
    """The one floating dtype of ``params`` by tunekit's name (``"bf16"`` for a model kept in
    bf16), None when they mix dtypes or hold no floating tensor."""
    dtypes = {p.dtype for p in params if p.is_floating_point()}
    return dtype_name(dtypes.pop()) if len(dtypes) == 1 else None


def torch_dtype(name):
    """torch dtype for a tunekit dtype name or alias (``"bf16"`` -> ``torch.bfloat16``)."""
    import torch

    if isinstance(name, torch.dtype):
        return name
    return getattr(torch, _dtype_entry(name).torch_name)
