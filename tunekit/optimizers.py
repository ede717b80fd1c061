"""Building the Lab's optimizers by name; optional packages are reported, never required.

    >>> unavailable_optimizers("cpu")      # {'lion': 'needs the lion-pytorch package ...', ...}
    >>> opt = build_optimizer("adamw_fused", model.parameters(), lr=1e-3)

Bytes of optimizer state per parameter (fp32 params): adamw 8, sgd (momentum) 4, lion 4,
adafactor ~4/side-length (factored second moment), adamw_8bit 2.
"""

from __future__ import annotations

import importlib.util

import torch


def _has(module: str) -> bool:
    # find_spec does not import: checking must not pay (or crash on) a heavy CUDA import
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def unavailable_optimizers(device_type: str) -> dict[str, str]:
    """Optimizer name -> why it cannot run on this machine (absent names can run)."""
    out = {}
    if not hasattr(torch.optim, "Adafactor"):
        out["adafactor"] = f"torch {torch.__version__} has no torch.optim.Adafactor (added in 2.5)."
    if not _has("lion_pytorch"):
        out["lion"] = "needs the lion-pytorch package (pip install lion-pytorch)."
    if not _has("bitsandbytes"):
        out["adamw_8bit"] = "needs the bitsandbytes package (pip install bitsandbytes) and a CUDA GPU."
    elif device_type != "cuda":
        out["adamw_8bit"] = "bitsandbytes' 8-bit AdamW runs on CUDA GPUs only."
    return out


def build_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    """A fresh optimizer; weight decay 0.1 for the AdamW family (GPT-2/3 practice)."""
    params = list(params)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.1)
    if name == "adamw_fused":
        # one kernel per parameter group instead of a loop of small ops (CPU and CUDA in torch>=2.4)
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.1, fused=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=lr)
    if name == "lion":
        from lion_pytorch import Lion
        return Lion(params, lr=lr, weight_decay=0.1)
    if name == "adamw_8bit":
        import bitsandbytes as bnb
        return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=0.1)
    raise ValueError(f"unknown optimizer {name!r}")


def state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes held in the optimizer's per-parameter state tensors (0 before the first step)."""
    total = 0
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size()
    return total

