"""Sizing advice: the documents' shape rules checked on a model config, with concrete numbers.
Pure: no torch, no IPython (pandas only inside `Advice.to_frame`).

    >>> adv = advise(GPTConfig.preset("gpt2-124m"), micro_batch=8)
    >>> print(adv)            # one line per rule: ok / FIX / n/a, the numbers, and why

Rules (ml-engineering "Vector and matrix size divisibility" and "Final recommendations for
model sizing", after Anthony et al. 2024, "The Case for Co-Designing Model Architectures with
Hardware"): vocab divisible by 64; b*s, h/a and h/t divisible by a high power of two; (b*a)/t an
integer; t small; SwiGLU d_ff near 8/3*h on a well-shaped value. `tunekit.bench` can back a rule
by measurement (`swiglu_dff_search`, `matmul_shape_sweep`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tunekit.core.refusals import user_facing
from tunekit.core.shapes import TENSOR_CORE_MULTIPLE, model_shape, padded_vocab, read_config, round_to_multiple
from tunekit.core.shapes import cfg_get as _get
from tunekit.core.validate import whole

_SRC = "ml-engineering: vector and matrix size divisibility"


def pow2_factor(n: int) -> int:
    """Largest power of two dividing n: pow2_factor(96) == 32; 0 for 0."""
    n = int(n)
    return n & -n if n else 0


def swiglu_dff_candidates(h: int) -> dict:
    """d_ff near 8/3*h on multiples of 64, 128 and 256 (h=4096: 10944, 10880, 11008 for
    8/3*h = 10922.67; the H100 search of stas00/ml-engineering training/performance/README.md
    found 10944 fastest, Llama-2-7B uses 11008)."""
    target = 8 * h / 3
    out = {"8/3*h": target}
    for m in (64, 128, 256):
        out[f"x{m}"] = round_to_multiple(target, m)
    return out


# --- the advisor ---------------------------------------------------------------------------------


@dataclass
class Rule:
    """One checked rule: ok is True, False, or None when the inputs do not allow checking."""

    rule: str
    ok: bool | None
    value: str
    recommendation: str
    reason: str
    source: str = _SRC

    @property
    def status(self) -> str:
        return {True: "ok", False: "FIX", None: "n/a"}[self.ok]


@dataclass
class Advice:
    rules: list = field(default_factory=list)

    @property
    def problems(self) -> list:
        return [r for r in self.rules if r.ok is False]

    def __getitem__(self, name: str) -> Rule:
        for r in self.rules:
            if r.rule == name:
                return r
        raise KeyError(name)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([{"rule": r.rule, "status": r.status, "value": r.value,
                              "recommendation": r.recommendation, "reason": r.reason}
                             for r in self.rules]).set_index("rule")

    def __str__(self):
        return "\n".join(f"[{r.status:>3}] {r.rule}: {r.value} -> {r.recommendation}  ({r.reason})"
                         for r in self.rules)


def _power_rule(name, n, what, multiple, fix):
    p = pow2_factor(n)
    ok = p >= multiple
    return Rule(name, ok, f"{what} = {n} (power-of-two factor {p})",
                "fine" if ok else fix,
                "GEMM dims that are multiples of 64 fill tensor-core tiles and waves; "
                "more powers of 2 help (tile/wave quantization)")


@user_facing   # a refusal: the user's line and the message (core.refusals)
def advise(model, *, micro_batch: int | None = None, seq_len: int | None = None, tp: int = 1,
           multiple: int = TENSOR_CORE_MULTIPLE) -> Advice:
    """Check a config (tunekit's GPTConfig, a transformers decoder config, a dict of either's
    fields, or a model with `.config`) against the rules.

    Example: ``tunekit.advise(tunekit.GPTConfig.preset("gpt2-124m"), micro_batch=8)``."""
    micro_batch = None if micro_batch is None else whole("micro_batch", micro_batch)
    seq_len = None if seq_len is None else whole("seq_len", seq_len)
    tp, multiple = whole("tp", tp), whole("multiple", multiple)
    d = _read(getattr(model, "config", model))
    h, a, vocab, padded = d["h"], d["a"], d["vocab"], d["padded"]
    seq_len = seq_len or d["seq_len"]
    rules = []

    if vocab is not None:
        good = padded_vocab(vocab, multiple)
        rules.append(Rule("vocab divisible by 64", padded % multiple == 0,
                          f"vocab {vocab}" + (f", padded to {padded}" if padded != vocab else " (not padded)"),
                          "fine" if padded % multiple == 0 else
                          f"pad the vocabulary to {good} (pad_vocab_multiple={multiple})",
                          "the embedding and lm_head GEMMs have the vocab as a dimension"))
    if h is not None:
        rules.append(_power_rule("hidden size h divisible by 64", h, "h", multiple,
                                 f"use h = {round_to_multiple(h, multiple)}"))
    if h and a:
        better = sorted((a2 for a2 in range(1, h + 1) if h % a2 == 0
                         and pow2_factor(h // a2) >= multiple), key=lambda a2: (abs(a2 - a), a2))
        fix = (f"use {better[0]} heads (head_dim {h // better[0]})" if better
               else f"no head count gives a head_dim multiple of {multiple} for h={h}")
        if h % a:
            rules.append(Rule("h/a divisible by a high power of 2", False, f"h={h}, a={a}: not divisible",
                              fix, "heads must split h evenly; more powers of 2 in h/a help"))
        else:
            rules.append(_power_rule("h/a divisible by a high power of 2", h // a, "head_dim h/a",
                                     multiple, fix))
    if micro_batch and seq_len:
        bs = micro_batch * seq_len
        b_fix = next((b for b in range(micro_batch, micro_batch + multiple)
                      if pow2_factor(b * seq_len) >= multiple), None)
        rules.append(_power_rule("b*s divisible by a high power of 2", bs, "tokens b*s", multiple,
                                 (f"micro-batch {b_fix} (b*s = {b_fix * seq_len}) or " if b_fix else "")
                                 + f"s = {round_to_multiple(seq_len, multiple)}"))
    else:
        rules.append(Rule("b*s divisible by a high power of 2", None, "micro_batch not given",
                          "pass micro_batch= to check", "b*s is the row count of every GEMM"))
    if h:
        ok = h % tp == 0 and pow2_factor(h // tp) >= multiple
        rules.append(Rule("h/t divisible by a high power of 2", ok, f"h/t = {h}/{tp}",
                          "fine" if ok else f"choose t so that h/t is a multiple of {multiple}",
                          "each tensor-parallel rank multiplies an h/t-wide slice"))
    if a and micro_batch:
        ok = (micro_batch * a) % tp == 0
        rules.append(Rule("(b*a)/t an integer", ok, f"b*a/t = {micro_batch}*{a}/{tp}",
                          "fine" if ok else "choose t dividing b*a",
                          "attention heads x batch are split across tensor-parallel ranks"))
    rules.append(Rule("t as small as possible", tp == 1 or None, f"t = {tp}",
                      "fine" if tp == 1 else "use the smallest t that fits the model",
                      "tensor parallelism adds communication inside every layer"))
    rules.append(_ffn_rule(d, multiple))
    rules.append(Rule("micro-batch as large as possible", None, f"micro_batch = {micro_batch}",
                      "find it with lab.find_max_batch_size(); 7 that fits beats 4",
                      "larger GEMMs run closer to peak; b itself needs no alignment",
                      "ml-engineering: batch sizes"))
    return Advice(rules)


def _read(cfg) -> dict:
    """The sizes the rules need: from the model's shape when the config is a whole one, else
    from what a partial config states (`read_config`)."""
    if cfg is None or isinstance(cfg, (str, bytes, int, float, list, tuple)):
        raise ValueError("advise needs a model config (tunekit's GPTConfig, a transformers config or a "
                         f"dict of their fields) or a model with .config, got {cfg!r}")
    try:
        s = model_shape(cfg)
    except ValueError:
        s = None
    if s is not None:
        return dict(h=s.hidden, a=s.n_head, vocab=_get(cfg, "vocab_size"), padded=s.vocab,
                    seq_len=s.max_positions, d_ff=s.d_ff, gated=s.gated)
    r = read_config(cfg)
    h, d_ff, gated = r["hidden"], r["d_ff"], r["mlp"] == "swiglu"
    return dict(h=h, a=r["n_head"], vocab=r["vocab_size"], padded=r["vocab"], seq_len=r["max_positions"],
                d_ff=d_ff or (4 * h if not gated and h else None), gated=gated, assumed=not d_ff)


def _ffn_rule(d, multiple) -> Rule:
    h, d_ff = d["h"], d["d_ff"]
    if not h or not d_ff:
        return Rule("MLP width well-shaped", None, "d_ff unknown", "-", "needs n_embd and d_ff")
    if not d["gated"]:
        ok = d_ff % multiple == 0
        assumed = " (assumed: no d_ff given)" if d.get("assumed") else ""
        return Rule("MLP width well-shaped", ok, f"GELU d_ff = {d_ff} ({d_ff / h:.3g}*h){assumed}",
                    "fine" if ok else f"use d_ff = {round_to_multiple(d_ff, multiple)}",
                    "d_ff is a GEMM dimension of both MLP matmuls")
    c = swiglu_dff_candidates(h)
    # near: within one multiple or 5% of 8/3*h (Llama-2-7B's 11008 at h=4096 is 0.8% above)
    ok = d_ff % multiple == 0 and abs(d_ff - c["8/3*h"]) <= max(multiple, 0.05 * c["8/3*h"])
    off = f"; not a multiple of {multiple} ({d_ff} % {multiple} = {d_ff % multiple})" if d_ff % multiple else ""
    return Rule("SwiGLU d_ff near 8/3*h, well-shaped", ok,
                f"d_ff = {d_ff} ({d_ff / h:.4g}*h; 8/3*h = {c['8/3*h']:.1f}){off}",
                "fine" if ok else f"use d_ff = {c['x64']} (x64), {c['x128']} (x128) or "
                f"{c['x256']} (x256); measure with tunekit.bench.swiglu_dff_search({h})",
                "8/3 keeps the MLP's parameters but breaks alignment: at h=4096 d_ff=10922 ran "
                "at 273 TFLOPS on H100, 10944 at 398 (+46%)")
