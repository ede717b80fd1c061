"""The demo GPT: a small, readable decoder-only transformer that the Lab trains.

Byte-level (256 ids, no tokenizer to download), RMSNorm (or LayerNorm), rotary or learned positions, a GELU or
SwiGLU MLP, and three attention implementations that can be switched on the live model:

    >>> from tunekit.models.gpt import GPT, GPTConfig
    >>> model = GPT(GPTConfig.preset("cpu-tiny"))
    >>> model.set_attention("math"); model.set_checkpointing(True)
    >>> logits, loss = model(idx, targets)          # idx, targets: (B, T) int64

Presets run from ``cpu-tiny`` (trains in seconds on 2 CPU cores) to ``gpt-1b`` (large GPUs).
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tunekit.core.registry import FP32
from tunekit.models.gpt_config import ATTENTION_IMPLS, MLP_KINDS, POS_KINDS, PRESETS, GPTConfig  # noqa: F401


class RMSNorm(nn.Module):
    """x / rms(x) * weight (``kind="rms"``) or LayerNorm (``"layer"``: a weight and, with ``bias``, a bias).
    ``precision="fp32"`` computes in fp32 so bf16/fp16 activations do not lose the scale; ``"compute"``
    casts the input and the weights to the step's compute dtype (autocast's, else the input's) and
    normalizes there, autocast off: llm-foundry's LPLayerNorm (GPTConfig.norm_precision)."""

    def __init__(self, dim: int, eps: float = 1e-5, kind: str = "rms", precision: str = FP32,
                 bias: bool = False):
        super().__init__()
        self.eps, self.kind, self.precision = eps, kind, precision
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias and kind == "layer" else None

    def forward(self, x):
        if self.precision == "compute":
            dev = x.device.type
            dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
            w, b = (None if t is None else t.to(dtype) for t in (self.weight, self.bias))
            with torch.autocast(dev, enabled=False):
                return self._normed(x.to(dtype), w, b)
        if self.kind == "layer":
            b = None if self.bias is None else self.bias.float()
            return self._normed(x.float(), self.weight.float(), b).type_as(x)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight

    def _normed(self, x, w, b):
        if self.kind == "layer":
            return F.layer_norm(x, x.shape[-1:], w, b, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w


class LogitsCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy on the logits' own dtype (GPTConfig.loss_precision="logits"), the passes of a
    fused kernel: flash-attn's CrossEntropyLoss (Dao-AILab/flash-attention flash_attn/losses/cross_entropy.py,
    csrc/xentropy), llm-foundry's default loss. Forward reads the logits once and keeps one log-sum-exp a
    row; backward writes their gradient in their dtype (softmax, minus one at each target, times the loss's
    gradient: the scale is a second pass here, fused in the kernel). No fp32 copy of the logits is made."""

    @staticmethod
    def forward(ctx, logits, targets):  # logits (N, V), targets (N,) int64
        lse = torch.logsumexp(logits, dim=-1)  # (N,)
        picked = logits.gather(-1, targets[:, None]).squeeze(-1)
        ctx.save_for_backward(logits, targets)
        acc = torch.promote_types(logits.dtype, torch.float32)   # the kernel accumulates in fp32
        return (lse.to(acc) - picked.to(acc)).mean()

    @staticmethod
    def backward(ctx, grad):
        logits, targets = ctx.saved_tensors
        g = torch.softmax(logits, dim=-1)
        g.scatter_add_(-1, targets[:, None], torch.full_like(targets[:, None], -1, dtype=g.dtype))
        return g.mul_((grad / logits.shape[0]).to(g.dtype)), None


def rope_tables(head_dim: int, max_len: int, base: float = 10000.0):
    """cos and sin tables, each (max_len, head_dim), for rotary positions (rotate-half layout)."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # (T, hs/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, hs)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate pairs (x_i, x_{i+hs/2}) of x (B, nh, T, hs) by the position's angle."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).type_as(x)


_flash_fn = None  # flash_attn.flash_attn_func once imported; False once known to be missing


def _flash_attn_func():
    """flash_attn.flash_attn_func, or None after one notice that the package is missing.

    The answer is cached: every layer asks on every forward, and a failing import would search
    sys.path each time (and break torch.compile's graph)."""
    global _flash_fn
    if _flash_fn is None:
        try:
            from flash_attn import flash_attn_func
            _flash_fn = flash_attn_func
        except Exception as exc:  # ImportError, or a broken CUDA build of the package
            _flash_fn = False
            warnings.warn(f"attention='flash' needs the flash-attn package ({exc}); "
                          "falling back to torch SDPA (recorded as attention_ran='sdpa').",
                          stacklevel=3)
    return _flash_fn or None


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.impl = cfg.attention
        # what the last forward actually used: private, an outcome and not a setting (a profiled
        # cell's FLOP count is reused while the public settings of its modules stay the same)
        self._ran: str | None = None

    def forward(self, x, rope=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
                   for t in (q, k, v))  # (B, nh, T, hs)
        if rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        p = self.dropout if self.training else 0.0
        y = None
        if self.impl == "flash":
            y = self._flash(q, k, v, p)
        if y is None and self.impl == "math":
            y = self._math(q, k, v, p)
            self._ran = "math"
        elif y is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            self._ran = "sdpa"
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.proj(y)

    def _math(self, q, k, v, p):
        T = q.shape[-2]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, nh, T, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        att = att.masked_fill(~causal, float("-inf"))
        att = F.softmax(att.float(), dim=-1).type_as(q)  # softmax in fp32 for stability
        att = F.dropout(att, p=p, training=p > 0)
        return att @ v  # (B, nh, T, hs)

    def _flash(self, q, k, v, p):
        # flash-attn runs only on CUDA in fp16/bf16; anything else falls back to SDPA.
        if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
            return None
        fn = _flash_attn_func()
        if fn is None:
            return None
        self._ran = "flash"
        y = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
               dropout_p=p, causal=True)  # takes and returns (B, T, nh, hs)
        return y.transpose(1, 2)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.kind, d, f = cfg.mlp, cfg.n_embd, cfg.ffn_dim
        if self.kind == "swiglu":
            self.gate = nn.Linear(d, f, bias=cfg.bias)
        self.up = nn.Linear(d, f, bias=cfg.bias)
        self.down = nn.Linear(f, d, bias=cfg.bias)

    def forward(self, x):
        if self.kind == "swiglu":
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class LayerNorm(RMSNorm):
    """RMSNorm's ``kind="layer"`` under its own name (a trace's module names say which norm ran)."""

    def __init__(self, dim: int, eps: float = 1e-5, precision: str = FP32, bias: bool = False):
        super().__init__(dim, eps, "layer", precision, bias)


def norm_of(cfg: GPTConfig) -> RMSNorm:
    """The config's norm (GPTConfig.norm, norm_precision, bias)."""
    if cfg.norm == "layer":
        return LayerNorm(cfg.n_embd, precision=cfg.norm_precision, bias=cfg.bias)
    return RMSNorm(cfg.n_embd, precision=cfg.norm_precision)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.norm1, self.attn = norm_of(cfg), CausalSelfAttention(cfg)
        self.norm2, self.mlp = norm_of(cfg), MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, rope=None):
        x = x + self.drop(self.attn(self.norm1(x), rope))
        return x + self.drop(self.mlp(self.norm2(x)))


class GPT(nn.Module):
    """Decoder-only transformer; ``forward(idx, targets=None) -> (logits, loss)``.

    Example: ``logits, loss = GPT(GPTConfig.preset("cpu-tiny"))(x, y)`` with x, y (B, T) int64.
    Logits have ``padded_vocab_size`` columns; those past ``vocab_size`` are padding, left out
    of the loss and of ``generate``.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        # a private copy: set_attention() edits it, and presets must stay untouched
        self.config = cfg = dataclasses.replace(config)
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd) if cfg.pos == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm_f = norm_of(cfg)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.padded_vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        if cfg.pos == "rope":
            cos, sin = rope_tables(cfg.head_dim, cfg.block_size)
            # not persistent: derived from the config, so state_dicts stay free of them
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.checkpointing = False
        self.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer)
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count. ``non_embedding`` drops the position table; the token table stays
        because it is tied to ``lm_head`` and so is a real matmul (nanoGPT's convention)."""
        n = sum(p.numel() for p in self.parameters())  # the tied weight is counted once
        if non_embedding and self.wpe is not None:
            n -= self.wpe.weight.numel()
        return n

    def set_attention(self, impl: str) -> None:
        """Switch every block to ``math``, ``sdpa`` or ``flash``; ``attention_ran`` says what ran."""
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention must be one of {ATTENTION_IMPLS}, got {impl!r}")
        self.config.attention = impl
        for block in self.blocks:
            block.attn.impl, block.attn._ran = impl, None

    def set_checkpointing(self, enabled: bool) -> None:
        """Recompute each block's activations in backward (non-reentrant torch checkpoint)."""
        self.checkpointing = bool(enabled)

    @property
    def attention_ran(self) -> str | None:
        """The attention implementation the last forward used (None before any forward)."""
        return self.blocks[0].attn._ran if len(self.blocks) else None

    def forward(self, idx, targets=None):
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} > block_size {self.config.block_size}")
        x = self.wte(idx)  # (B, T, C)
        rope = None
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        else:
            rope = (self.rope_cos[:T], self.rope_sin[:T])  # each (T, hs)
        x = self.drop(x)
        for block in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, rope, use_reentrant=False)
            else:
                x = block(x, rope)
        logits = self.lm_head(self.norm_f(x))  # (B, T, Vpad)
        loss = None
        if targets is not None:
            # padding columns are no tokens: leave them out of the softmax, not just unused
            real = logits[..., : self.config.vocab_size]  # (B, T, V)
            if self.config.loss_precision == "logits":
                with torch.autocast(idx.device.type, enabled=False):
                    loss = LogitsCrossEntropy.apply(real.reshape(-1, real.size(-1)), targets.reshape(-1))
            else:
                loss = F.cross_entropy(real.float().reshape(-1, real.size(-1)), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, generator=None):
        """Sample ``max_new_tokens`` after ``idx`` (B, T); padded vocab ids are never drawn.

        Example: ``bytes(m.generate(torch.tensor([list(b"def ")]), 40)[0].tolist())``.
        """
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.config.block_size:])
            logits = logits[:, -1, : self.config.vocab_size].float() / max(temperature, 1e-6)
            nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
