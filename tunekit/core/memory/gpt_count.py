"""Parameter and saved-activation counts for tunekit's demo GPT, tensor by tensor. Pure.

The config is duck-typed on GPTConfig's attribute names (or a dict with them), so nothing here
imports tunekit.models.gpt or torch. Counts follow what torch autograd actually saves for the model in
tunekit/models/gpt.py (checked tensor by tensor with saved_tensors_hooks in tests/measure/test_memory.py):

* RMSNorm computes in fp32: it keeps an fp32 view of its input, the fp32 rsqrt (one per token),
  the normalized tensor before the weight (fp32 when the residual stream is fp32, else the cast
  back), and its output in the matmul dtype (the next Linear keeps that).
* SDPA (CPU flash, CUDA flash/efficient) keeps q, k after rotary, the fused qkv output (v is a
  view of it), the output and an fp32 logsumexp per (batch, head, token): no s^2 term.
* Math attention keeps q, k, a contiguous copy of v, the causal mask (bool s*s), the fp32
  softmax and its cast back, and the re-laid-out output: 5*a*s^2-like terms appear here.
* MLP: GELU keeps its input and output; SwiGLU keeps gate, silu(gate), up and their product.
* Loss: fp32 log-softmax over the padded vocabulary, int64 targets and indices.
* The options (GPTConfig.norm, norm_precision, loss_precision): a LayerNorm keeps its input, mean and
  rstd a token and the next Linear its output; a norm in the compute dtype keeps those in it (a
  cast of an fp32 residual under autocast); the "logits" loss keeps the logits and the targets only.
"""
from __future__ import annotations

from tunekit.core.registry import FP32
from tunekit.core.shapes import cfg_get as _get
from tunekit.core.shapes import model_shape


def config_dims(cfg) -> dict:
    """The sizes the formulas need from a GPTConfig-like object: its `model_shape`, and the demo
    GPT's architecture fields (mlp, attention, positions, bias, dropout)."""
    s = model_shape(cfg)
    return {
        "n_layer": s.n_layer, "n_head": s.n_head, "n_embd": s.hidden, "block_size": s.max_positions,
        "vocab": s.vocab, "d_ff": s.d_ff, "mlp": _get(cfg, "mlp", "gelu"),
        "attention": _get(cfg, "attention", "sdpa"), "pos": _get(cfg, "pos", "rope"),
        "bias": bool(_get(cfg, "bias", False)), "dropout": float(_get(cfg, "dropout", 0.0) or 0.0),
        "norm": _get(cfg, "norm", "rms"), "norm_precision": _get(cfg, "norm_precision", FP32),
        "loss_precision": _get(cfg, "loss_precision", FP32),
    }


def gpt_param_count(cfg) -> int:
    """Parameters of the demo GPT (token table tied to lm_head, so counted once): see
    tunekit.core.shapes.ModelShape.param_count."""
    return model_shape(cfg).param_count()


def matmul_weight_count(cfg) -> dict:
    """Weights that go through a Linear (autocast casts and saves these): per layer and lm_head."""
    d = config_dims(cfg)
    h, f = d["n_embd"], d["d_ff"]
    n_mats = 3 if d["mlp"] == "swiglu" else 2
    return {"per_layer": 4 * h * h + n_mats * h * f, "lm_head": d["vocab"] * h}


def _norm_bytes(T, h, resid, elem, kind="rms", precision=FP32):
    if precision != FP32:   # in the compute dtype c: the cast input (the residual itself when c is its dtype)
        c = elem
        if kind == "layer":  # input, output (the next Linear's), mean and rstd a token (torch's CPU kernel: in c)
            return 2 * c * T * h + 2 * c * T
        return 3 * c * T * h + c * T   # input, pre-weight product, output; rsqrt a token
    if kind == "layer":      # fp32 input, mean and rstd a token, output in the matmul dtype
        return T * h * (4 + elem) + 8 * T
    # fp32 view of the input, rsqrt per token, pre-weight product, output in matmul dtype
    pre_weight = 4 if resid == 4 else 2
    return T * h * (4 + pre_weight + elem) + 4 * T


def gpt_layer_activation_bytes(b: int, s: int, h: int, a: int, d_ff: int, mlp: str = "gelu",
                               attention: str = "sdpa", elem: int = 4, resid: int = 4,
                               dropout: float = 0.0, autocast: bool = False, norm: tuple = ("rms", FP32)) -> int:
    """Bytes one block saves for backward. elem: bytes of matmul-side activations (4 fp32, 2
    bf16/fp16 or autocast); resid: bytes of the residual stream (2 only in pure half precision).

    >>> gpt_layer_activation_bytes(2, 64, 128, 4, 512)   # fp32 sdpa gelu, see tests
    1313792
    """
    T = b * s
    norms = 2 * _norm_bytes(T, h, resid, elem, *norm)
    if attention == "math":
        scores = b * a * s * s
        attn = 4 * T * h * elem + s * s + 4 * scores + (elem * scores if elem != 4 else 0)
    else:  # sdpa / flash: qkv output, q and k after rotary, output, logsumexp
        attn = 6 * T * h * elem + 4 * b * a * s
    mlp_bytes = (4 if mlp == "swiglu" else 2) * T * d_ff * elem
    if autocast and mlp == "swiglu" and norm[1] == FP32:
        # autocast caches casts of weights only: gate and up each cast the fp32 norm output (a norm in the
        # compute dtype hands them one half tensor)
        mlp_bytes += T * h * elem
    masks = 0
    if dropout > 0:   # bool masks: two residual dropouts (+ attention probabilities for math)
        masks = 2 * T * h + (b * a * s * s if attention == "math" else 0)
    return norms + attn + mlp_bytes + masks


def gpt_activation_bytes(cfg, b: int, s: int, elem: int, checkpointing: bool = False,
                         autocast: bool = False) -> dict:
    """Saved activation bytes of the whole demo GPT for one micro-batch.

    Returns saved (held from forward to backward), recompute (one block rebuilt during backward
    under checkpointing), weight_casts (autocast's half copies of Linear weights kept for
    backward) and a one-line formula.
    """
    d = config_dims(cfg)
    h, a, L, V, f = d["n_embd"], d["n_head"], d["n_layer"], d["vocab"], d["d_ff"]
    T = b * s
    resid = 4 if (elem == 4 or autocast) else 2
    layer = gpt_layer_activation_bytes(b, s, h, a, f, d["mlp"], d["attention"], elem, resid,
                                       d["dropout"], autocast, (d["norm"], d["norm_precision"]))
    # idx (+ position ids) for the embeddings; final norm; fp32 log-softmax, targets, weight
    outside = 8 * T + (8 * s if d["pos"] == "learned" else 0) + _norm_bytes(T, h, resid, elem, d["norm"],
                                                                            d["norm_precision"])
    loss = 4 * T * V + 8 * T + 4 if d["loss_precision"] == FP32 else elem * T * V + 8 * T
    outside += loss + (T * h if d["dropout"] > 0 else 0)
    mats = matmul_weight_count(cfg)
    cast = 2 if autocast else 0
    if checkpointing:
        saved = L * resid * T * h + outside   # each block's input only
        recompute = layer + cast * mats["per_layer"]
        casts = cast * mats["lm_head"]
        formula = f"L*{resid}*T*h block inputs + head/loss; one block rebuilt in backward"
    else:
        saved, recompute = L * layer + outside, 0
        casts = cast * (L * mats["per_layer"] + mats["lm_head"])
        formula = f"L x block({d['attention']}, {d['mlp']}, {elem}-byte) + head/loss, tunekit GPT"
    return {"saved": saved, "recompute": recompute, "weight_casts": casts, "formula": formula}
