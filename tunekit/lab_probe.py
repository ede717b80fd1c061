"""Measurements the Lab takes outside its timed steps. Measurement layer; never prints.

- ``probe_step``: one forward+backward under the FLOP counter that also sums the bytes autograd
  saves for backward (what activation checkpointing shrinks). Run once per configuration and
  never timed: the counter slows the step.
- ``free_memory`` / ``memory_now_bytes``: give memory back after an OOM trial and read where the
  process stands, on CUDA (torch's allocator) or CPU (RSS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import saved_tensors_hooks

from .flops import FlopCount, count_flops
from .meters import cpu_rss_bytes


@dataclass
class ProbeResult:
    flops: FlopCount                  # per micro-batch
    saved_bytes: int                  # saved for backward, one micro-batch, parameters excluded
    attention_ran: str | None
    notes: list = field(default_factory=list)


def probe_step(model: torch.nn.Module, loss_of, x, y, autocast) -> ProbeResult:
    """Count FLOPs and saved-activation bytes of one forward+backward; gradients are cleared.

    ``loss_of(x, y)`` returns the scalar loss; ``autocast()`` returns a fresh context manager.
    Example: ``probe_step(lab.model, lambda x, y: lab.model(x, y)[1], x, y, nullcontext)``.
    """
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}  # storage pointer -> bytes, so views of one buffer count once

    def remember(t):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            s = t.untyped_storage()
            if s.data_ptr() not in param_ptrs:
                saved[s.data_ptr()] = s.nbytes()

    def pack(t):
        remember(t)
        return t

    # Under non-reentrant checkpointing the block's own saves go to torch's inner hooks, and
    # what stays alive is each block's input (kept to recompute from): count those instead.
    handles = []
    if getattr(model, "checkpointing", False) and hasattr(model, "blocks"):
        for block in model.blocks:
            handles.append(block.register_forward_pre_hook(lambda mod, args: remember(args[0])))

    def step():
        with saved_tensors_hooks(pack, lambda t: t), autocast():
            loss = loss_of(x, y)
        loss.backward()

    try:
        fc = count_flops(step)
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    notes = list(fc.notes)
    if handles:
        notes.append("saved bytes with checkpointing = block inputs kept for recomputation "
                     "+ what lives outside the checkpointed blocks")
    return ProbeResult(fc, sum(saved.values()), getattr(model, "attention_ran", None), notes)


def add_flash_flops(res: ProbeResult, cfg, batch: int, seq_len: int, checkpointing: bool) -> None:
    """flash-attn's kernels are invisible to torch's FLOP counter: add their causal FLOPs.

    Same accounting as tunekit.flops for SDPA: forward 4*B*nh*T^2*hs, backward 10*B*nh*T^2*hs,
    halved for the causal mask; checkpointing runs the forward once more (recompute).
    """
    from .flops import sdpa_backward_flops, sdpa_forward_flops

    shape = (batch, cfg.n_head, seq_len, cfg.head_dim)  # (B, nh, T, hs)
    fwd = sdpa_forward_flops(shape, shape, shape) // 2 * cfg.n_layer
    bwd = sdpa_backward_flops(shape, shape, shape) // 2 * cfg.n_layer
    redo = fwd if checkpointing else 0
    res.flops.executed += fwd + bwd + redo
    res.flops.recompute += redo
    # the counter listed flash-attn's custom ops as uncounted: they are accounted for now
    res.flops.uncounted_ops = [op for op in res.flops.uncounted_ops if not op.startswith("flash_attn")]
    res.flops.notes = [n for n in res.flops.notes if not (n.startswith("not counted") and "flash_attn" in n)]
    res.notes.append("added flash-attn FLOPs (torch's counter cannot see them): causal, analytic")


_libc = None


def _malloc_trim() -> bool:
    """Ask glibc to return freed heap pages to the OS; without it RSS stays at its high mark."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            _libc = ctypes.CDLL(name) if name else False
        except OSError:
            _libc = False
    if _libc and hasattr(_libc, "malloc_trim"):
        return bool(_libc.malloc_trim(0))
    return False


def free_memory(device: torch.device) -> None:
    """Collect garbage and hand cached memory back (CUDA cache, or glibc's heap on CPU)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        _malloc_trim()


def memory_now_bytes(device: torch.device) -> int:
    """Bytes in use now: torch-allocated on CUDA, process RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    return cpu_rss_bytes()


def is_oom(exc: BaseException) -> bool:
    """True for CUDA OOM and for the CPU allocator's 'not enough memory' errors."""
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower()
                                              or "DefaultCPUAllocator: can't allocate" in text
                                              or "not enough memory" in text)
