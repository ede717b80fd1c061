"""The demo GPT's shape and its named presets, without torch: ``tunekit --help`` lists the presets
and a plan reads a config without importing torch. The model itself is `tunekit.models.gpt`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tunekit.core.registry import ATTENTIONS, FP32
from tunekit.core.shapes import gelu_d_ff, padded_vocab, swiglu_d_ff
from tunekit.core.validate import choice, did_you_mean, flag, nearest, real, whole

ATTENTION_IMPLS = tuple(ATTENTIONS)
MLP_KINDS = ("gelu", "swiglu")
POS_KINDS = ("rope", "learned")
NORM_KINDS = ("rms", "layer")
# where the norms and the loss compute: "fp32" upcasts (tunekit's default); "compute" runs each norm in the
# step's compute dtype (autocast's, else its input's), as llm-foundry's LPLayerNorm does (mosaicml/llm-foundry
# llmfoundry/models/layers/norm.py @ b2a43a1477a45f40f4086a1c72f851b0ab42d0ac); "logits" takes the loss on the
# logits' own dtype in one fused kernel a pass, as flash-attn's CrossEntropyLoss (llm-foundry's default loss_fn
# 'fused_crossentropy', llmfoundry/models/mpt/modeling_mpt.py @ b2a43a1477a45f40f4086a1c72f851b0ab42d0ac)
NORM_PRECISIONS = (FP32, "compute")
LOSS_PRECISIONS = (FP32, "logits")


class UnknownPreset(ValueError, KeyError):
    """A preset name not in `PRESETS`: a wrong value (ValueError), still a KeyError for code that
    looks a preset up; its message reads as written (KeyError's would be quoted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass
class GPTConfig:
    """Shape of the demo GPT. Example: ``GPTConfig(n_layer=2, n_head=2, n_embd=64)``.

    ``d_ff=None`` means: ``4 * n_embd`` for ``gelu``; for ``swiglu`` ``8/3 * n_embd`` rounded *up*
    to a multiple of 64 (so the MLP keeps about the parameters of a GELU MLP while its matmuls keep
    tensor-core friendly shapes: n_embd=4096 gives 10944, not the slow 10922).

    ``norm``: ``"rms"`` (RMSNorm, a weight) or ``"layer"`` (LayerNorm, a weight and, with ``bias``, a
    bias). ``norm_precision``: ``"fp32"`` (upcast) or ``"compute"`` (the step's compute dtype, no fp32
    copy). ``loss_precision``: ``"fp32"`` (the logits upcast, then cross-entropy) or ``"logits"`` (the
    cross-entropy on the logits' dtype, one pass forward and one backward, as a fused kernel).
    """

    vocab_size: int = 256
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 128  # longest sequence the model accepts
    mlp: str = "gelu"
    d_ff: int | None = None
    pos: str = "rope"
    attention: str = "sdpa"
    pad_vocab_multiple: int = 1
    bias: bool = False
    dropout: float = 0.0
    norm: str = "rms"
    norm_precision: str = FP32
    loss_precision: str = FP32

    def __post_init__(self):
        for name in ("vocab_size", "n_layer", "n_head", "n_embd", "block_size", "pad_vocab_multiple"):
            whole(name, getattr(self, name))
        if self.d_ff is not None:
            whole("d_ff", self.d_ff)
        flag("bias", self.bias)
        real("dropout", self.dropout, 0.0, 1.0, low_open=False, high_open=True)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"mlp must be one of {MLP_KINDS}, got {self.mlp!r}")
        if self.pos not in POS_KINDS:
            raise ValueError(f"pos must be one of {POS_KINDS}, got {self.pos!r}")
        choice("norm", self.norm, NORM_KINDS)
        choice("norm_precision", self.norm_precision, NORM_PRECISIONS)
        choice("loss_precision", self.loss_precision, LOSS_PRECISIONS)
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention must be one of {ATTENTION_IMPLS}, got {self.attention!r}")
        if self.pos == "rope" and self.head_dim % 2:
            raise ValueError("rotary positions need an even head_dim")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        return padded_vocab(self.vocab_size, self.pad_vocab_multiple)

    @property
    def ffn_dim(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        return gelu_d_ff(self.n_embd) if self.mlp == "gelu" else swiglu_d_ff(self.n_embd)

    @classmethod
    def preset(cls, name: str, **overrides) -> "GPTConfig":
        """A named config, optionally changed: ``GPTConfig.preset("cpu-tiny", n_layer=4)``."""
        if name not in PRESETS:
            close = nearest(str(name), list(PRESETS))
            raise UnknownPreset(f"unknown preset {name!r}{did_you_mean(close)} (the presets: "
                                f"{', '.join(sorted(PRESETS))})")
        return dataclasses.replace(PRESETS[name], **overrides)


PRESETS: dict[str, GPTConfig] = {
    # ~0.4M parameters: a few hundred steps a minute on 2 CPU cores.
    "cpu-tiny": GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=128),
    "cpu-small": GPTConfig(n_layer=4, n_head=4, n_embd=256, block_size=256),
    # The shapes of GPT-2 small (learned positions, GELU, biases, 50257-token vocab padded to
    # 50304) so its matmuls and parameter count match the real model; byte data uses ids 0..255.
    "gpt2-124m": GPTConfig(vocab_size=50257, pad_vocab_multiple=64, n_layer=12, n_head=12,
                           n_embd=768, block_size=1024, pos="learned", bias=True),
    "gpt2-350m": GPTConfig(vocab_size=50257, pad_vocab_multiple=64, n_layer=24, n_head=16,
                           n_embd=1024, block_size=1024, pos="learned", bias=True),
    # Llama-3.2-1B-like body (16 x 2048, SwiGLU 8192, rotary) on the byte vocabulary: ~1.07B.
    "gpt-1b": GPTConfig(n_layer=16, n_head=16, n_embd=2048, block_size=2048, mlp="swiglu",
                        d_ff=8192),
}
