"""Model-shape arithmetic shared by the demo GPT, the memory estimate and the advisor. Pure.

    >>> padded_vocab(50257)          # GPT-2 pads 50257 to 786 x 64
    50304
    >>> swiglu_d_ff(4096)            # ceil(8/3 * 4096 / 64) * 64: tensor-core friendly
    10944
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# A100 tensor cores are fully used when GEMM dims are multiples of 128 bytes: 64 fp16/bf16
# elements (V100: 16 bytes = 8 elements). stas00/ml-engineering training/performance/README.md
# (Vector and matrix size divisibility) recommends 64.
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


# --- the shape of a decoder, read from a config ---------------------------------------------------

# How the decoder families differ beyond their config numbers: a gated (SwiGLU) MLP, the norm
# (RMSNorm keeps a weight; LayerNorm a weight and a bias), which projections carry biases (True,
# False, or the config field that says), and learned position tables; where they differ from the
# usual, the norms a block keeps (one: a parallel block), lm_head's bias, a norm after the embedding
# and a position table's extra rows (OPT's 2), as transformers' modeling code builds them.
_FAMILIES = {
    "llama": dict(gated=True, norm="rms", qkv_bias="attention_bias", o_bias="attention_bias",
                  mlp_bias="mlp_bias", learned_pos=False),
    "mistral": dict(gated=True, norm="rms", qkv_bias=False, o_bias=False, mlp_bias=False, learned_pos=False),
    "qwen2": dict(gated=True, norm="rms", qkv_bias=True, o_bias=False, mlp_bias=False, learned_pos=False),
    "gpt2": dict(gated=False, norm="layer", qkv_bias=True, o_bias=True, mlp_bias=True, learned_pos=True),
    "gpt_neox": dict(gated=False, norm="layer", qkv_bias="attention_bias", o_bias="attention_bias",
                     mlp_bias=True, learned_pos=False),
    "phi": dict(gated=False, norm="layer", qkv_bias=True, o_bias=True, mlp_bias=True, learned_pos=False,
                layer_norms=1, head_bias=True),
    "gptj": dict(gated=False, norm="layer", qkv_bias=False, o_bias=False, mlp_bias=True, learned_pos=False,
                 layer_norms=1, head_bias=True),
    "opt": dict(gated=False, norm="layer", qkv_bias="enable_bias", o_bias="enable_bias", mlp_bias="enable_bias",
                learned_pos=True, pos_offset=2),
    "bloom": dict(gated=False, norm="layer", qkv_bias=True, o_bias=True, mlp_bias=True, learned_pos=False,
                  embed_norm=True),
    "falcon": dict(gated=False, norm="layer", qkv_bias="bias", o_bias="bias", mlp_bias="bias", learned_pos=False),
}
# mixtures of experts laid out as their dense kin (each expert's width: moe_intermediate_size, else d_ff)
_FAMILIES["mixtral"] = _FAMILIES["mistral"]
_FAMILIES["qwen2_moe"] = _FAMILIES["qwen2"]
# gated-MLP decoders laid out like Llama as far as the 6N count goes (their norms may differ)
for _name in ("gemma", "gemma2", "gemma3_text", "qwen3", "phi3", "olmo", "olmo2", "granite", "stablelm"):
    _FAMILIES.setdefault(_name, dict(_FAMILIES["llama"], qkv_bias=False, o_bias=False, mlp_bias=False))


@dataclass(frozen=True)
class ModelShape:
    """What FLOP and memory formulas need of a decoder-only transformer. Build it with
    `model_shape(config)` from tunekit's GPTConfig or a transformers config (Llama, Mistral,
    Qwen2, GPT-2, GPT-NeoX, Phi, GPT-J, OPT, BLOOM, Falcon, and the Mixtral and Qwen2-MoE mixtures
    of experts; other families are read Llama-style and say so in `notes`)."""

    family: str
    n_layer: int
    hidden: int
    n_head: int
    n_kv_head: int
    head_dim: int
    d_ff: int
    gated: bool
    vocab: int                  # rows of the embedding and of lm_head (padding included)
    max_positions: int | None
    learned_pos: bool
    tied: bool
    norm: str                   # "rms" | "layer"
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    notes: tuple = ()
    # a mixture of experts (n_experts 0: a dense MLP of d_ff): n_experts gated MLPs of d_ff each, top_k
    # of them per token, a router (n_experts x hidden) and, Qwen2-MoE's, a shared expert of
    # shared_d_ff with its 1-wide gate
    n_experts: int = 0
    top_k: int = 0
    shared_d_ff: int = 0
    layer_norms: int = 2        # norms a block keeps (a parallel block: 1)
    head_bias: bool = False     # lm_head's bias (Phi, GPT-J)
    embed_norm: bool = False    # a norm after the embedding (BLOOM)
    pos_offset: int = 0         # a learned position table's rows beyond max_positions (OPT: 2)

    @property
    def q_width(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.n_kv_head * self.head_dim

    def layer_matmul_params(self) -> int:
        """Weights of one block's matmuls: q, k, v, o and the 2 (or 3, gated) MLP matrices; of a
        mixture of experts, the top_k experts a token runs, the router and the shared expert."""
        h = self.hidden
        attn = h * self.q_width + 2 * h * self.kv_width + self.q_width * h
        return attn + self._mlp_weights(self.top_k)

    def _mlp_weights(self, experts: int) -> int:
        """The MLP's matmul weights with ``experts`` of a mixture's experts (a dense MLP: all of it)."""
        h, mats = self.hidden, 3 if self.gated else 2
        if not self.n_experts:
            return mats * h * self.d_ff
        shared = 3 * h * self.shared_d_ff + h if self.shared_d_ff else 0
        return experts * mats * h * self.d_ff + self.n_experts * h + shared

    def matmul_params(self) -> int:
        """N of the 6N rule: every matmul weight, lm_head included (a matmul even when tied)."""
        return self.n_layer * self.layer_matmul_params() + self.vocab * self.hidden

    def train_flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per trained token, tunekit's one MFU convention (PaLM/Megatron): 6 x the
        matmul weights + the attention matmuls with the causal mask halving them, no
        recomputation, whatever kernel runs."""
        from tunekit.core.formulas import train_flops_per_token

        return train_flops_per_token(self.matmul_params(), self.n_layer, self.q_width, seq_len,
                                     causal=True)

    def param_count(self) -> int:
        """Parameters the model holds (a tied lm_head counted once)."""
        h, f = self.hidden, self.d_ff
        norm = h if self.norm == "rms" else 2 * h
        biases = ((self.q_width + 2 * self.kv_width) * self.qkv_bias + h * self.o_bias
                  + ((2 if self.gated else 1) * f + h) * self.mlp_bias)
        layer = self.layer_matmul_params() - self._mlp_weights(self.top_k) + self._mlp_weights(self.n_experts)
        layer += biases + self.layer_norms * norm
        outside = (self.vocab * h + norm * (1 + self.embed_norm) + self.vocab * self.head_bias
                   + ((self.max_positions + self.pos_offset) * h if self.learned_pos else 0))
        return self.n_layer * layer + outside + (0 if self.tied else self.vocab * h)

    def param_shapes(self) -> list:
        """The shape of every parameter tensor, (out, in) for a matmul weight, laid out as the family
        builds it (tunekit's GPT, GPT-2 and GPT-NeoX fuse q, k and v into one matrix); their sizes
        add up to `param_count`. What a shape-dependent state (Adafactor's) is counted over."""
        h, f, qkv = self.hidden, self.d_ff, (self.q_width, self.kv_width, self.kv_width)
        fused = self.family in ("tunekit", "gpt2", "gpt_neox", "bloom", "falcon")
        norm = [(h,)] if self.norm == "rms" else [(h,), (h,)]
        attn = [(sum(qkv), h)] if fused else [(w, h) for w in qkv]
        attn += ([(sum(qkv),)] if fused else [(w,) for w in qkv]) if self.qkv_bias else []
        attn += [(h, self.q_width)] + ([(h,)] if self.o_bias else [])
        mlp = [(f, h)] * (2 if self.gated else 1) + [(h, f)]
        mlp += [(f,)] * (2 if self.gated else 1) + [(h,)] if self.mlp_bias else []
        if self.n_experts:   # transformers' stacked experts: gate and up fused, then down; the router
            e, g = self.n_experts, self.shared_d_ff
            mlp = [(e, 2 * f, h), (e, h, f), (e, h)] + ([(g, h), (g, h), (h, g), (1, h)] if g else [])
        outside = ([(self.vocab, h)] + ([(self.max_positions + self.pos_offset, h)] if self.learned_pos else [])
                   + norm * (1 + self.embed_norm) + ([(self.vocab,)] if self.head_bias else []))
        return (self.n_layer * (attn + mlp + self.layer_norms * norm) + outside
                + ([] if self.tied else [(self.vocab, h)]))


# The names a size goes by in tunekit's GPTConfig and in transformers' configs, first found wins.
_NAMES = {
    "n_layer": ("num_hidden_layers", "n_layer"),
    "hidden": ("hidden_size", "n_embd"),
    "n_head": ("num_attention_heads", "n_head"),
    "n_kv_head": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "d_ff": ("ffn_dim", "d_ff", "intermediate_size", "n_inner", "ffn_hidden_size"),
    "vocab_size": ("vocab_size",),
    "max_positions": ("max_position_embeddings", "n_positions", "block_size"),
    "n_experts": ("num_local_experts", "num_experts"),
    "top_k": ("num_experts_per_tok",),
    "expert_d_ff": ("moe_intermediate_size",),
    "shared_d_ff": ("shared_expert_intermediate_size",),
}


def read_config(cfg) -> dict:
    """The sizes a config states, each under any of its names (None where it states none), plus
    ``vocab`` (the embedding's rows: padded_vocab_size, or vocab_size padded to
    pad_vocab_multiple), ``mlp`` and ``family`` ("tunekit" for GPTConfig-like fields, else the
    model_type). The one place configs are read: `model_shape` builds on it, and a partial
    config (the advisor's dict of a few fields) is read here as far as it goes.

    >>> read_config({"n_embd": 64, "n_head": 4})["hidden"]
    64
    """
    def get(*names):
        return next((v for v in (cfg_get(cfg, n) for n in names) if v is not None), None)

    sizes = {k: get(*names) for k, names in _NAMES.items()}
    vocab = sizes["vocab_size"]
    sizes["vocab"] = cfg_get(cfg, "padded_vocab_size") or (
        vocab and padded_vocab(vocab, cfg_get(cfg, "pad_vocab_multiple") or 1))
    sizes["mlp"] = cfg_get(cfg, "mlp")
    # tunekit's GPTConfig, or a dict of its fields (no model_type; n_embd or mlp)
    tunekit = cfg_get(cfg, "model_type") is None and bool(sizes["mlp"] or cfg_get(cfg, "n_embd"))
    sizes["family"] = "tunekit" if tunekit else str(cfg_get(cfg, "model_type", "") or "unknown")
    return sizes


def model_shape(cfg) -> ModelShape:
    """The shape of tunekit's GPTConfig or of a transformers decoder config (or a dict of
    either's fields). Raises ValueError naming what is missing."""
    if cfg_get(cfg, "is_encoder_decoder", False):   # two stacks and cross-attention: not one decoder's sums
        raise ValueError(f"{type(cfg).__name__.removesuffix('Config')} is an encoder-decoder: tunekit's shape "
                         "formulas are a decoder's (one stack, causal self-attention); plan it with tunekit.plan("
                         "config), which steps the whole model, or give estimate_memory the built model or n_params=")
    r = read_config(cfg)
    family, h, notes = r["family"], r["hidden"], []
    experts = {}   # a mixture of experts' fields of ModelShape
    if family == "tunekit":
        gated = r["mlp"] == "swiglu"
        bias = bool(cfg_get(cfg, "bias", False))
        # GPTConfig.norm "layer" keeps a bias only with ``bias``: without one it keeps one vector, as RMSNorm
        norm = "layer" if cfg_get(cfg, "norm", "rms") == "layer" and bias else "rms"
        fam = dict(gated=gated, norm=norm, qkv_bias=bias, o_bias=bias, mlp_bias=bias,
                   learned_pos=cfg_get(cfg, "pos", "rope") == "learned")
        tied = True
        d_ff = r["d_ff"] or (h and (swiglu_d_ff(h) if gated else gelu_d_ff(h)))
    else:
        fam = _FAMILIES.get(family)
        if fam is None:   # most recent decoders are Llama-like: a gated MLP, RMSNorm
            fam = dict(gated=True, norm="rms", qkv_bias="attention_bias", o_bias="attention_bias",
                       mlp_bias="mlp_bias", learned_pos=False)
            notes.append(f"model_type {family!r} is not one tunekit knows: read as Llama-style "
                         "(gated MLP, RMSNorm, biases from attention_bias); counts may be off")
        elif family not in ("llama", "mistral", "qwen2", "gpt2", "gpt_neox", "mixtral", "qwen2_moe", "phi", "gptj",
                            "opt", "bloom", "falcon"):
            notes.append(f"{family}: read as Llama-style for counting (its norms may differ)")
        fam = {k: (bool(cfg_get(cfg, v, False)) if isinstance(v, str) and k != "norm" else v)
               for k, v in fam.items()}
        if family == "falcon":   # one k/v head (multi-query) unless the new architecture says how many;
            new = bool(cfg_get(cfg, "new_decoder_architecture", False))   # its parallel block: one norm
            r["n_kv_head"] = cfg_get(cfg, "num_kv_heads") if new else 1 if cfg_get(cfg, "multi_query", True) else None
            fam["layer_norms"] = 2 if new and cfg_get(cfg, "num_ln_in_parallel_attn", 2) != 1 or not cfg_get(
                cfg, "parallel_attn", True) else 1
        tie = cfg_get(cfg, "tie_word_embeddings")
        tied = True if tie is None else bool(tie)
        d_ff = r["d_ff"] or (4 * h if h else None)
        if r["n_experts"] and r["top_k"]:   # each expert's width: moe_intermediate_size where stated
            d_ff = r["expert_d_ff"] or d_ff
            experts = dict(n_experts=int(r["n_experts"]), top_k=int(r["top_k"]), shared_d_ff=int(r["shared_d_ff"] or 0))
            if cfg_get(cfg, "mlp_only_layers") or (cfg_get(cfg, "decoder_sparse_step") or 1) > 1:
                notes.append(f"{family}: mlp_only_layers/decoder_sparse_step make some layers dense; every layer "
                             "is counted as a mixture of experts here (build the model for its exact counts)")
    n_head = r["n_head"]
    sizes = dict(n_layer=r["n_layer"], hidden=h, n_head=n_head, vocab=r["vocab"])
    missing = [k for k, v in sizes.items() if not v]
    if missing:
        raise ValueError(f"cannot read {missing} from {type(cfg).__name__}: give a decoder config")
    return ModelShape(family=family, n_kv_head=n_head if r["n_kv_head"] is None else r["n_kv_head"],
                      head_dim=r["head_dim"] or h // n_head, d_ff=int(d_ff), tied=tied,
                      max_positions=r["max_positions"], notes=tuple(notes), **sizes, **fam, **experts)
