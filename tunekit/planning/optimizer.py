"""The optimizer a plan's fake step takes: the Lab's own (`models.optimizers.build_optimizer`), or,
for one whose package cannot run under fake CPU tensors (bitsandbytes' 8-bit AdamW: CUDA kernels),
a stand-in that allocates the same state and moves the same bytes.

bitsandbytes' ``AdamW8bit`` (``Optimizer2State.init_state``, block-wise, its defaults): a parameter of
at least ``min_8bit_size`` = 4,096 elements keeps both moments in uint8 (1 byte each) and one fp32
``absmax`` per block of 256 elements for each; a smaller one keeps both in fp32. The two 256-entry
quantization maps are shared by every parameter (2 KiB in all): left out.
"""
from __future__ import annotations

import torch

from tunekit.models.optimizers import build_optimizer

MIN_8BIT_SIZE = 4096   # bitsandbytes' default: smaller parameters keep fp32 moments
BLOCK = 256            # block-wise quantization: one fp32 absmax per 256 elements


class AdamW8bitState(torch.optim.Optimizer):
    """bitsandbytes' AdamW8bit's state, allocated as it allocates it, and an update that reads and
    writes each parameter and its moments (the values are not bitsandbytes': a plan reads bytes)."""

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.0, min_8bit_size: int = MIN_8BIT_SIZE):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, min_8bit_size=min_8bit_size))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    eight = p.numel() >= group["min_8bit_size"]
                    dtype = torch.uint8 if eight else torch.float32
                    state["state1"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
                    state["state2"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
                    if eight:
                        blocks = -(-p.numel() // BLOCK)
                        state["absmax1"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
                        state["absmax2"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
                p.add_(p.grad, alpha=-group["lr"])
        return None


STAND_INS = {"adamw_8bit": AdamW8bitState}


def plan_optimizer(name: str, params, lr: float = 0.0) -> torch.optim.Optimizer:
    """The optimizer ``name`` for a fake step: its stand-in where it has one, else the Lab's."""
    if name in STAND_INS:
        return STAND_INS[name](list(params), lr=lr)
    return build_optimizer(name, params, lr=lr)
