"""Model-shape arithmetic shared by the demo GPT, the memory estimate and the advisor. Pure.

    >>> padded_vocab(50257)          # GPT-2 pads 50257 to 786 x 64
    50304
    >>> swiglu_d_ff(4096)            # ceil(8/3 * 4096 / 64) * 64: tensor-core friendly
    10944
"""
from __future__ import annotations

from collections.abc import Mapping

# A100 tensor cores are fully used when GEMM dims are multiples of 128 bytes: 64 fp16/bf16
# elements (V100: 16 bytes = 8 elements). The documents recommend 64.
TENSOR_CORE_MULTIPLE = 64


def round_to_multiple(x: float, m: int, mode: str = "nearest") -> int:
    """x rounded to a multiple of m (nearest; ties go up), or "up"/"down"."""
    lo = int(x // m) * m
    if mode == "down" or lo == x:
        return lo
    if mode == "up":
        return lo + m
    return lo + m if x - lo >= (lo + m) - x else lo


def padded_vocab(vocab_size: int, multiple: int = TENSOR_CORE_MULTIPLE) -> int:
    """Vocab rounded up to a multiple (1: unpadded)."""
    return round_to_multiple(vocab_size, max(1, int(multiple or 1)), "up")


def swiglu_d_ff(h: int, multiple: int = TENSOR_CORE_MULTIPLE) -> int:
    """8/3 * h rounded *up* to a multiple: about a GELU MLP's parameters, with matmul-friendly
    shapes (h=4096 gives 10944, not the slow 10922; h=768 gives exactly 2048)."""
    return -(-(8 * h) // (3 * multiple)) * multiple


def gelu_d_ff(h: int) -> int:
    """The classic 4h MLP width."""
    return 4 * h


def cfg_get(cfg, name: str, default=None):
    """A field of a config object or dict (None-safe): the estimators read both."""
    if isinstance(cfg, Mapping):
        return cfg.get(name, default)
    return getattr(cfg, name, default)
