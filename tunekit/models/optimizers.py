"""The Lab's optimizers, built from their registry entries; optional packages are reported,
never required. Models layer.

    >>> unavailable_optimizers("cpu")      # {'lion': 'needs the lion-pytorch package ...', ...}
    >>> opt = build_optimizer("adamw_fused", model.parameters(), lr=1e-3)

Names, state sizes and requirements live in tunekit.core.registry.OPTIMIZERS.
"""
from __future__ import annotations

import importlib

import torch

from tunekit.core.registry import LAB_OPTIMIZERS, OPTIMIZERS, module_available


def _why_unavailable(name: str, device_type: str) -> str | None:
    spec = OPTIMIZERS[name]
    module, cls = spec.factory.split(":")
    if module.split(".")[0] == "torch":
        if not hasattr(importlib.import_module(module), cls):
            return f"torch {torch.__version__} has no {module}.{cls}."
    elif not module_available(module.split(".")[0]):
        gpu = " and a CUDA GPU" if spec.cuda_only else ""
        return f"needs the {spec.package} package (pip install {spec.package}){gpu}."
    if spec.cuda_only and device_type != "cuda":
        return f"{spec.package or name} runs on CUDA GPUs only."
    return None


def unavailable_optimizers(device_type: str) -> dict[str, str]:
    """Optimizer name -> why it cannot run on this machine (absent names can run)."""
    out = {}
    for name in LAB_OPTIMIZERS:
        why = _why_unavailable(name, device_type)
        if why:
            out[name] = why
    return out


def build_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    """A fresh optimizer of a registry entry, with its settings and this learning rate."""
    spec = OPTIMIZERS.get(name)
    if spec is None or spec.factory is None:
        raise ValueError(f"unknown optimizer {name!r}; one of {LAB_OPTIMIZERS}")
    module, cls = spec.factory.split(":")
    return getattr(importlib.import_module(module), cls)(list(params), lr=lr, **dict(spec.kwargs))


def state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes held in the optimizer's per-parameter state tensors (0 before the first step)."""
    total = 0
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size()
    return total
