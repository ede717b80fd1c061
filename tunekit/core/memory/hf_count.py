"""Saved-activation bytes of transformers' decoders (Llama/Mistral/Qwen2 and GPT-2), layer by
layer. Pure: no torch.

The coefficients are bytes per element of what transformers' modeling code (5.x) keeps for
backward, read off tensor by tensor with tunekit's SavedTensorTally on CPU and written here per
element kind; tests/models/test_hf_models.py and benchmarks/bench_memory_estimate.py check the totals
against measure_memory. T = b*s tokens, h hidden, f MLP width, kv the k/v projection width.

Llama-style layer, fp32 (sdpa): two RMSNorms keep input, fp32 rsqrt and output (3 x 4 B x Th
each, plus 4 B x T), q/k/v projections and rotary (q, k before and after rotation: 4 x 4 B x Th
for q, 2 x 4 B x T*kv for k/v), the attention output and its projection input (2 x 4 B x Th),
the residual adds; the gated MLP keeps gate, silu(gate), up and their product (4 x 4 B x Tf);
SDPA adds a 4-byte logsumexp per (b, head, token). Eager attention keeps the softmaxed scores
(b*nh*s^2 fp32) and k/v repeated to every query head (so no k/v-width term).
Under torch.autocast(bf16) the matmul-side copies are 2-byte, the norm math stays fp32.
GPT-2 (transformers passes an explicit causal mask, so SDPA takes its math path on CPU) keeps
the scores, its probabilities and dropout masks: s^2 terms with either implementation.
"""
from __future__ import annotations

from tunekit.core.registry import BF16, FP32

# (group, dtype, attention) -> bytes per: Th, Tf, T*kv, b*nh*s^2, b*nh*s (logsumexp), T
_LAYER = {
    ("llama", FP32, "sdpa"): (32, 16, 8, 0, 4, 8),
    ("llama", FP32, "math"): (40, 16, 0, 4, 0, 8),
    ("llama", BF16, "sdpa"): (30, 8, 4, 0, 4, 8),
    ("llama", BF16, "math"): (34, 8, 0, 6, 0, 8),
    ("gpt2", FP32, "sdpa"): (40, 20, 0, 12, 0, 16),
    ("gpt2", FP32, "math"): (40, 20, 0, 12, 0, 16),
    ("gpt2", BF16, "sdpa"): (30, 10, 0, 12, 0, 16),
    ("gpt2", BF16, "math"): (24, 10, 0, 8, 0, 16),
}
# outside the layers: final norm (Th), fp32 logits for the loss (4 B x T*V), ids and targets
_OUTSIDE = {FP32: (12, 4, 24), BF16: (10, 4, 24)}   # bytes per Th, T*V, T
GROUPS = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gpt2": "gpt2"}


def hf_activation_bytes(shape, b: int, s: int, autocast: bool, attention: str = "sdpa",
                        checkpointing: bool = False) -> dict | None:
    """Saved activations of one micro-batch for a ModelShape of a known transformers family,
    or None for other families. Returns saved, recompute, weight_casts and the formula."""
    group = GROUPS.get(shape.family)
    if group is None:
        return None
    dt = BF16 if autocast else FP32
    attn = "math" if attention in ("math", "eager") else "sdpa"   # flash keeps what sdpa keeps
    T, h = b * s, shape.hidden
    c_h, c_f, c_kv, c_s2, c_lse, c_t = _LAYER[(group, dt, attn)]
    layer = (c_h * T * h + c_f * T * shape.d_ff + c_kv * T * shape.kv_width
             + c_s2 * b * shape.n_head * s * s + c_lse * b * shape.n_head * s + c_t * T)
    o_h, o_v, o_t = _OUTSIDE[dt]
    outside = o_h * T * h + o_v * T * shape.vocab + o_t * T
    lm_head = shape.vocab * h
    cast = 2 if autocast else 0
    if checkpointing:  # each layer keeps its fp32 input; one layer is rebuilt in backward
        return {"saved": shape.n_layer * 4 * T * h + outside, "recompute": layer,
                "weight_casts": cast * lm_head,
                "formula": f"L x 4*T*h layer inputs + head/loss ({shape.family}, transformers)"}
    return {"saved": shape.n_layer * layer + outside, "recompute": 0,
            "weight_casts": cast * shape.matmul_params(),
            "formula": f"L x layer({attn}, {dt}) + head/loss ({shape.family}, transformers)"}
