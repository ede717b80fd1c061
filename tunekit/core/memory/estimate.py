"""Memory anatomy of training, estimated from sizes alone: weights, master copy, gradients,
optimizer states, activations and what lives outside torch's allocator. Pure: no torch, no
IPython; pandas and plotly are imported only by the methods that need them.

Sources: the ml-engineering "Anatomy of Model's Memory Usage" section
(18 bytes/param for mixed-precision AdamW, per-optimizer state sizes, 0.5-2 GB of CUDA context,
~1-2 GB for torch.distributed) and the large-scale-training notes (the activation formula of
Korthikanti et al. 2022 and the 147M-parameter GPT worked example).

>>> est = estimate_memory(1_000_000, precision="mixed", optimizer="adamw", device="cpu")
>>> est.static_bytes / 1_000_000          # 2 half + 4 master + 4 grads + 8 AdamW
18.0
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from .. import registry, validate
from ..registry import MEMORY_LAYOUTS, MemoryLayout, memory_layout_name
from ..shapes import model_shape
from ..units import GB, GiB, is_missing
from ..validate import flag, fraction, real, whole
from .gpt_count import config_dims, gpt_activation_bytes
from .hf_count import GROUPS, hf_activation_bytes

NaN = math.nan


def precision_layout(precision: str) -> MemoryLayout:
    """Bytes per parameter of a training precision (see tunekit.core.registry.MEMORY_LAYOUTS)."""
    return MEMORY_LAYOUTS[memory_layout_name(precision)]


canonical_precision = memory_layout_name


def optimizer_bytes_per_param(optimizer: str, precision: str = "fp32") -> float:
    """Optimizer-state bytes per parameter: AdamW 8 (fp32), SGD-momentum/Lion/Adafactor 4,
    8-bit AdamW 2, bf16 AdamW 4; states follow the param dtype in pure half precision."""
    return registry.optimizer(optimizer).state_bytes_per_param(precision_layout(precision).state)


def bytes_per_param(precision: str = "mixed", optimizer: str = "adamw") -> dict:
    """Static bytes per parameter by component. mixed + AdamW: 2 + 4 + 4 + 8 = 18."""
    p = precision_layout(precision)
    return {"weights": p.weights, "master_weights": p.master, "gradients": p.grads,
            "optimizer_states": optimizer_bytes_per_param(optimizer, precision)}


# --- activation formulas ------------------------------------------------------------------------


def korthikanti_activation_bytes(s: int, b: int, h: int, n_layer: int, a: int, t: int = 1,
                                 sequence_parallel: bool = False) -> float:
    """Saved activations without recompute, fp16 elements and 1-byte dropout masks:
    s*b*h*L*(10 + 24/t + 5*a*s/(h*t)) bytes (Korthikanti et al. 2022, table 2).

    Per layer: attention 11sbh + 5as^2b, MLP 19sbh, two layernorms 4sbh: 34sbh + 5as^2b; tensor
    parallelism splits all but the 10sbh that sit before/after the parallel regions, which
    sequence parallelism splits too.
    """
    base = 34 / t if sequence_parallel else 10 + 24 / t
    return s * b * h * n_layer * (base + 5 * a * s / (h * t))


def full_recompute_activation_bytes(s: int, b: int, h: int, n_layer: int, t: int = 1,
                                    sequence_parallel: bool = False) -> float:
    """With full activation recomputation only each layer's fp16 input stays: 2*s*b*h*L
    (divided by t under sequence parallelism)."""
    return 2 * s * b * h * n_layer / (t if sequence_parallel else 1)


# --- the estimate -------------------------------------------------------------------------------

COMPONENTS = ("weights", "master_weights", "gradients", "optimizer_states", "buffers", "weight_casts",
              "activations", "recompute", "temporary", "cuda_context", "distributed")
STATIC = ("weights", "master_weights", "gradients", "optimizer_states")


@dataclass
class MemoryEstimate:
    """Per-device bytes by component, with the formula behind each line.

    `components[name]` is NaN where the inputs do not determine it (e.g. activations from a bare
    parameter count), never 0 by default.
    """

    components: dict
    formulas: dict
    inputs: dict
    notes: list = field(default_factory=list)

    @property
    def static_bytes(self) -> float:
        """Weights + master copy + gradients + optimizer states."""
        return sum(self.components.get(k, 0.0) for k in STATIC)

    @property
    def total_bytes(self) -> float:
        """Sum of the known components (NaN lines are left out; see `notes`)."""
        return sum(v for v in self.components.values() if not is_missing(v))

    def __getitem__(self, name):
        return self.components[name]

    def to_frame(self):
        """pandas view: one row per component, bytes, GiB (2^30), GB (1e9), share, formula."""
        import pandas as pd

        total = self.total_bytes
        rows = [{"component": k, "bytes": v, "GiB": v / GiB, "GB": v / GB,
                 "share": (v / total if total and not is_missing(v) else NaN),
                 "formula": self.formulas.get(k, "")} for k, v in self.components.items()]
        rows.append({"component": "total", "bytes": total, "GiB": total / GiB, "GB": total / GB,
                     "share": 1.0, "formula": "sum of the known lines"})
        return pd.DataFrame(rows).set_index("component")

    def figure(self, title: str | None = None):
        """plotly stacked bar, one segment per component (GiB = 2^30 bytes)."""
        import plotly.graph_objects as go

        fig = go.Figure()
        for k, v in self.components.items():
            if not is_missing(v) and v > 0:
                fig.add_bar(name=k, x=["estimate"], y=[v / GiB], hovertext=self.formulas.get(k))
        fig.update_layout(barmode="stack", yaxis_title="GiB (2^30 bytes)",
                          title=title or f"estimated memory: {self.total_bytes / GiB:.2f} GiB")
        return fig

    def __str__(self):
        lines = [f"{k:>17}: {v / GiB:9.3f} GiB  {self.formulas.get(k, '')}"
                 for k, v in self.components.items() if is_missing(v) or v]
        unknown = [k for k, v in self.components.items() if is_missing(v)]
        lines.append(f"{'total':>17}: {self.total_bytes / GiB:9.3f} GiB "
                     f"({self.total_bytes / GB:.2f} GB)"
                     + (f", a lower bound: {', '.join(unknown)} unknown" if unknown else ""))
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


def estimate_memory(model=None, *, n_params: float | None = None, precision: str = "mixed",
                    optimizer: str = "adamw", micro_batch: int = 1, seq_len: int | None = None,
                    checkpointing: bool = False, tp: int = 1, pp: int = 1, zero_stage: int = 0,
                    dp: int = 1, n_layer: int | None = None, n_embd: int | None = None,
                    n_head: int | None = None, activations: str = "auto", device: str = "cuda",
                    cuda_context_bytes: float | None = None, overhead_fraction: float = 0.0,
                    optimizer_bytes: float | None = None, grad_bytes: float | None = None,
                    sequence_parallel: bool = False, attention: str | None = None,
                    parallel: str | None = None, world_size: int = 1, nodes: int = 1) -> MemoryEstimate:
    """Estimate per-device training memory.

    `model` is a parameter count, a config (tunekit's GPTConfig, or a transformers decoder
    config: Llama, Mistral, Qwen2, GPT-2, GPT-NeoX, ...), or a model with such a `.config`.
    `activations`: "korthikanti" (the documents' formula), "gpt" (tensor-by-tensor count for
    tunekit's GPT), "hf" (transformers' Llama-style and GPT-2 layers), or "auto" (the one that
    fits the config). `attention` ("sdpa", "math"/"eager", "flash") defaults to the config's.
    `optimizer_bytes` / `grad_bytes` override the per-param figures (to replay a document).
    `parallel` ("ddp", "fsdp", "fsdp_grad_op", "hsdp") with `world_size` ranks on `nodes` nodes
    sets `zero_stage`/`dp` for that sharding (tunekit.engine.dist): DDP replicates (stage 0 over the
    world), FSDP shards parameters, gradients and optimizer state over the world (stage 3), HSDP
    over the ranks of one node.

    >>> e = estimate_memory(147e6, n_layer=12, n_embd=768, n_head=12, seq_len=512,
    ...                     micro_batch=64, device="cpu", grad_bytes=2)
    >>> round(e["activations"] / 64)   # 512*768*12*(10+24+5*12*512/768)
    349175808
    """
    dist_notes = []
    for name, v in (("world_size", world_size), ("nodes", nodes)):
        whole(name, v)
    if parallel is None and (world_size, nodes) != (1, 1):
        raise ValueError(f"world_size={world_size!r} and nodes={nodes!r} describe a sharded run: give "
                         "parallel='ddp', 'fsdp', 'fsdp_grad_op' or 'hsdp' with them (or zero_stage= and dp=)")
    if parallel is not None:
        zero_stage, dp, dist_notes = _sharding(parallel, world_size, nodes, zero_stage, dp)
    for name, v in (("tp", tp), ("pp", pp), ("dp", dp)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if isinstance(zero_stage, bool) or zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    flag("checkpointing", checkpointing)
    flag("sequence_parallel", sequence_parallel)
    validate.device("device", device)   # the device planned for: it need not be on this machine
    overhead_fraction = fraction("overhead_fraction", overhead_fraction)
    for name, v in (("cuda_context_bytes", cuda_context_bytes), ("optimizer_bytes", optimizer_bytes),
                    ("grad_bytes", grad_bytes)):
        if v is not None:
            real(name, v, low_open=False)
    _check_sizes(model, n_params=n_params, micro_batch=micro_batch, seq_len=seq_len,
                 n_layer=n_layer, n_embd=n_embd, n_head=n_head)
    cfg = getattr(model, "config", model) if not isinstance(model, (int, float)) else None
    shape, shape_error = None, None
    if cfg is not None:
        try:
            shape = model_shape(cfg)
        except ValueError as e:   # a partial config: sizes may still come as arguments
            shape_error = str(e)
    dims = config_dims(cfg) if shape is not None and shape.family == "tunekit" else {}
    n_layer = n_layer or (shape.n_layer if shape else None)
    n_embd = n_embd or (shape.hidden if shape else None)
    n_head = n_head or (shape.n_head if shape else None)
    seq_len = seq_len or (shape.max_positions if shape else None)
    if attention is None:
        attention = dims.get("attention") or getattr(cfg, "_attn_implementation", None) or "sdpa"
    if n_params is None:
        if isinstance(model, (int, float)):
            n_params = float(model)
        elif hasattr(model, "parameters"):   # a live module: count without importing torch
            n_params = float(sum(p.numel() for p in model.parameters()))
        elif shape is not None:
            n_params = float(shape.param_count())
        else:
            raise ValueError("give a parameter count, a config or a model")
    prec = precision_layout(precision)
    key = canonical_precision(precision)
    per = bytes_per_param(precision, optimizer)
    if optimizer_bytes is not None:
        per["optimizer_states"] = optimizer_bytes
    if grad_bytes is not None:
        per["gradients"] = grad_bytes

    comps, forms, notes = {}, {}, list(dist_notes)
    shard = tp * pp   # model parallelism splits every parameter-sized line
    zero_div = {"weights": 3, "master_weights": 1, "gradients": 2, "optimizer_states": 1}
    for k in STATIC:
        div = shard * (dp if zero_stage >= zero_div[k] else 1)
        comps[k] = n_params * per[k] / div
        forms[k] = f"{_num(n_params)} params x {per[k]:g} B" + (f" / {div}" if div > 1 else "")
    comps["buffers"] = NaN
    if activations not in ("auto", "gpt", "hf", "korthikanti"):
        raise ValueError(f"activations must be auto, gpt, hf or korthikanti, got {activations!r}")
    if activations == "gpt" and not dims:
        raise ValueError("activations='gpt' needs a GPTConfig-like config (vocab_size, mlp, ...)")
    if dims and activations in ("auto", "gpt"):
        # rotary cos/sin tables (T, head_dim) each, in the model's dtype (half only when cast)
        rope = dims["pos"] == "rope" and n_head and seq_len
        elem = 2 if key in ("bf16", "fp16", "mixed") else 4
        comps["buffers"] = 2.0 * dims["block_size"] * (n_embd // n_head) * elem if rope else 0.0
        forms["buffers"] = "rotary cos + sin tables: 2 x block_size x head_dim"
    # autocast's half weight copies (an upper bound here: only Linear weights are cast)
    comps["weight_casts"] = n_params * prec.weight_casts / shard
    forms["weight_casts"] = (f"at most {prec.weight_casts} B per param: half copies made in forward, "
                             "freed after backward" if prec.weight_casts else "")

    b, s = micro_batch, seq_len
    mode = activations if activations != "auto" else (
        "gpt" if dims else "hf" if shape is not None and shape.family in GROUPS else "korthikanti")
    if mode == "hf" and (shape is None or shape.family not in GROUPS):
        raise ValueError(f"activations='hf' covers {sorted(GROUPS)} configs")
    if shape is not None and shape.notes:
        notes.extend(shape.notes)
    if None in (n_layer, n_embd, n_head, s):
        comps["activations"] = comps["recompute"] = NaN
        notes.append("activations need n_layer, n_embd, n_head and seq_len (or a config)"
                     + (f": {shape_error}" if shape_error else ""))
    elif mode in ("gpt", "hf"):
        if mode == "gpt":
            act = gpt_activation_bytes(cfg, b, s, prec.activations, checkpointing=checkpointing,
                                       autocast=key == "amp")
        else:
            act = hf_activation_bytes(shape, b, s, autocast=prec.activations == 2,
                                      attention=attention, checkpointing=checkpointing)
            comps["buffers"] = 0.0
            if key in ("bf16", "fp16", "mixed"):
                notes.append("transformers activations are counted under autocast; pure half "
                             "weights keep about the same (the norms stay fp32 either way)")
        # tensor parallelism splits a layer's tensors (an upper-bound split: Korthikanti's 10sbh
        # stay whole); 1F1B pipelining keeps the L-layer total on the first stage (see below)
        comps["activations"] = act["saved"] / tp
        comps["recompute"] = act["recompute"] / tp
        comps["weight_casts"] = act["weight_casts"] / shard
        forms["weight_casts"] = "half copies of the Linear weights, kept from forward to backward"
        forms["activations"] = act["formula"] + (f" / t={tp}" if tp > 1 else "")
        forms["recompute"] = "one block's saved tensors, rebuilt during backward" if checkpointing else ""
        if tp > 1:
            notes.append(f"{mode} activation count is for one device; divided by tp (the layer norms' and "
                         "residuals' share is not split without sequence parallelism, so this is low)")
    else:
        scale = prec.activations / 2   # the formula counts 2-byte elements
        full = korthikanti_activation_bytes(s, b, n_embd, n_layer, n_head, tp, sequence_parallel)
        if checkpointing:
            comps["activations"] = scale * full_recompute_activation_bytes(s, b, n_embd, n_layer, tp,
                                                                            sequence_parallel)
            comps["recompute"] = scale * full / n_layer
            forms["activations"] = "2*s*b*h*L (each layer's input)"
            forms["recompute"] = "one layer of s*b*h*(10+24/t+5as/(ht)), rebuilt in backward"
        else:
            comps["activations"] = scale * full
            comps["recompute"] = 0.0
            forms["activations"] = "s*b*h*L*(10 + 24/t + 5*a*s/(h*t))"
        if scale != 1:
            forms["activations"] += f" x {scale:g} ({prec.activations}-byte elements)"
        if shape is not None and attention in ("sdpa", "flash"):
            notes.append("the Korthikanti formula keeps the 5*a*s^2 attention scores, which fused "
                         "attention (sdpa, flash) does not save: an overestimate for this model")
    if pp > 1 and not is_missing(comps["activations"]):
        notes.append("1F1B pipeline: the first stage holds pp micro-batches of L/pp layers, "
                     "i.e. the same activation bytes as L layers (not divided by pp)")
    known = sum(v for v in comps.values() if not is_missing(v))
    comps["temporary"] = overhead_fraction * known
    forms["temporary"] = f"{overhead_fraction:.0%} of the above (temporary buffers, fragmentation)"
    on_cuda = str(device).startswith("cuda")
    if cuda_context_bytes is None:
        # seeds: torch 2.1 used 0.47 GB lazily / 0.92 GB eagerly for its kernels on an A100
        cuda_context_bytes = 0.5 * GiB if on_cuda else 0.0
    comps["cuda_context"] = float(cuda_context_bytes)
    forms["cuda_context"] = "CUDA context + kernels, outside torch's allocator (0.5-2 GB)"
    world = tp * pp * dp
    comps["distributed"] = 1.5 * GiB if (on_cuda and world > 1) else 0.0
    forms["distributed"] = "torch.distributed/NCCL buffers (~1-2 GB per GPU)"
    inputs = dict(n_params=n_params, precision=key, optimizer=optimizer, micro_batch=b, seq_len=s,
                  attention=attention,
                  checkpointing=checkpointing, tp=tp, pp=pp, zero_stage=zero_stage, dp=dp,
                  n_layer=n_layer, n_embd=n_embd, n_head=n_head, activations=mode, device=device)
    return MemoryEstimate({k: comps[k] for k in COMPONENTS}, forms, inputs, notes)


def _sharding(parallel, world_size, nodes, zero_stage, dp) -> tuple:
    """(zero_stage, dp, notes) of a tunekit.engine.dist sharding; refuses a clash with explicit ones."""
    from ..comm import layout_problems

    errors = layout_problems(parallel, 1, nodes)
    if not errors and (isinstance(world_size, bool) or int(world_size) != world_size or world_size < 1
                       or world_size % nodes):
        errors.append(f"world_size must be a whole multiple of nodes={nodes}, got {world_size!r}")
    if not errors and (zero_stage, dp) != (0, 1):
        errors.append("give either parallel= (with world_size, nodes) or zero_stage/dp, not both")
    if errors:
        raise ValueError("; ".join(errors))
    if parallel == "ddp":
        return 0, int(world_size), []
    shard = int(world_size) // nodes if parallel == "hsdp" else int(world_size)
    notes = [f"{parallel}: parameters, gradients and optimizer state sharded over {shard} rank(s)"
             + (f" (one node; each of the {nodes} nodes holds a replica)" if parallel == "hsdp" else "")]
    if parallel == "fsdp_grad_op":
        notes.append("SHARD_GRAD_OP keeps every unit's gathered parameters from its forward to its "
                     "backward: the peak adds up to the full weights, beyond the static lines")
    return 3, shard, notes


def _check_sizes(model, **sizes) -> None:
    """Refuse impossible sizes before computing anything: counts are whole numbers >= 1."""
    if isinstance(model, numbers.Real) and (isinstance(model, bool) or not 0 < model < math.inf):
        raise ValueError(f"model: a parameter count must be a finite number > 0, got {model!r}")
    for name, v in sizes.items():
        if v is None and name != "micro_batch":
            continue
        real = isinstance(v, numbers.Real) and not isinstance(v, bool) and 1 <= v < math.inf
        if not real or (name != "n_params" and not float(v).is_integer()):
            allowed = "a finite number >= 1" if name == "n_params" else "a whole number >= 1"
            raise ValueError(f"{name} must be {allowed}, got {v!r}")


def worked_example_147m(micro_batch: int = 64) -> dict:
    """The large-scale-training notes' GPT example (147M params, L=12, h=768, s=512, a=12), read
    three ways. As printed it charges 2 + (4 + 12) + 2 = 20 B/param: the "4" is the fp32 master
    copy and the "12" is AdamW's 8 plus *another* fp32 copy, so the copy is counted twice.
    """
    common = dict(n_layer=12, n_embd=768, n_head=12, seq_len=512, micro_batch=micro_batch,
                  precision="mixed", device="cpu", activations="korthikanti")
    return {
        "as printed (20 B/param)": estimate_memory(147e6, optimizer_bytes=12, grad_bytes=2, **common),
        "fp32 copy once (16 B/param)": estimate_memory(147e6, grad_bytes=2, **common),
        "fp32 grads (18 B/param)": estimate_memory(147e6, **common),
    }


def _num(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.4g}{unit}"
    return f"{n:g}"
