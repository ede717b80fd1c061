"""Memory anatomy of training, estimated from sizes alone: weights, master copy, gradients,
optimizer states, activations and what lives outside torch's allocator. Pure: no torch, no
IPython; pandas and plotly are imported only by the methods that need them.

Sources: the ml-engineering "Anatomy of Model's Memory Usage" section
(18 bytes/param for mixed-precision AdamW, per-optimizer state sizes, the CUDA context,
~1-2 GB for torch.distributed) and the large-scale-training notes (the activation formula of
Korthikanti et al. 2022 and the 147M-parameter GPT worked example).

>>> est = estimate_memory(1_000_000, layout="mixed", optimizer="adamw", device="cpu")
>>> est.static_bytes / 1_000_000          # 2 half + 4 master + 4 grads + 8 AdamW
18.0
"""
from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass, field

from tunekit.core import validate
from tunekit.core.fmt import fmt_pct
from tunekit.core.memory.answer import COMPONENTS, MemoryAnswer
from tunekit.core.memory.gpt_count import config_dims, gpt_activation_bytes
from tunekit.core.memory.hf_count import GROUPS, hf_activation_bytes
from tunekit.core.memory.options import CUDA_CONTEXT, MemoryOptions, setting_options

# the static lines live in memory.static; their public names are estimate's too (notebooks, tests)
from tunekit.core.memory.static import (  # noqa: F401
    bytes_per_param,
    layout_bytes,
    optimizer_bytes_per_param,
    param_bytes,
    static_lines,
    trained_only,
)
from tunekit.core.notes import Note
from tunekit.core.refusals import user_facing
from tunekit.core.registry import MEMORY_LAYOUTS
from tunekit.core.shapes import model_shape
from tunekit.core.units import GB, GiB, is_missing

NaN = math.nan


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

@dataclass
class MemoryEstimate(MemoryAnswer):
    """Per-device bytes by component, with the formula behind each line.

    `components[name]` is NaN where the inputs do not determine it (e.g. activations from a bare
    parameter count), never 0 by default. The three answers to "how much memory does this step
    take" share ``components`` (the same names) and say how they were found in ``method``:
    ``estimate_memory`` "analytic" (formulas, instant, known families), ``tunekit.plan`` "fake step"
    (the step under fake tensors: any model, any device), ``measure_memory`` "measured" (a real
    step here); on one Setting they agree (tests/core/test_setting.py).
    """

    components: dict
    formulas: dict
    inputs: dict
    notes: list = field(default_factory=list)
    method: str = "analytic"

    @property
    def total_bytes(self) -> float:
        """Sum of the known components (NaN lines are left out; see `notes`)."""
        return sum(v for v in self.components.values() if not is_missing(v))

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

    def __repr__(self):  # a terminal: the total and each line's bytes and share (formulas: to_frame())
        from tunekit.core.memory.summary import estimate_text
        return estimate_text(self)

    def _repr_html_(self) -> str:
        from tunekit.core.memory.summary import estimate_html
        return estimate_html(self)


@user_facing   # a refusal: the user's line and the message (core.refusals)
def estimate_memory(model=None, *, n_params: float | None = None, precision: str | None = None,
                    optimizer: str = "adamw", micro_batch: int = 1, seq_len: int | None = None,
                    checkpointing: bool = False, tp: int = 1, pp: int = 1, zero_stage: int = 0,
                    dp: int = 1, n_layer: int | None = None, n_embd: int | None = None,
                    n_head: int | None = None, activations: str = "auto", device: str | None = None,
                    cuda_context_bytes: float | None = None, overhead_fraction: float = 0.0,
                    optimizer_bytes: float | None = None, grad_bytes: float | None = None,
                    sequence_parallel: bool = False, attention: str | None = None,
                    parallel: str | None = None, world_size: int = 1, nodes: int = 1,
                    weights: str | None = None, layout: str | None = None, setting=None) -> MemoryEstimate:
    """Estimate per-device training memory.

    `model` is a parameter count, a config (tunekit's GPTConfig, or a transformers decoder
    config: Llama, Mistral, Qwen2, GPT-2, GPT-NeoX, ...), or a model with such a `.config`.
    The keyword parameters are the fields of `MemoryOptions` (tests/core/test_anatomy.py keeps the
    two equal). `activations`: "korthikanti" (Korthikanti et al., arXiv 2205.05198), "gpt" (tensor-by-tensor
    count for tunekit's GPT), "hf" (transformers' Llama-style and GPT-2 layers), or "auto" (the
    one that fits the config). `attention` ("sdpa", "math"/"eager", "flash") defaults to the
    config's. `optimizer_bytes` / `grad_bytes` override the per-param figures (to replay a
    document). `parallel` ("ddp", "fsdp", "fsdp_grad_op", "hsdp") with `world_size` ranks on
    `nodes` nodes sets `zero_stage`/`dp` for that sharding (see `MemoryOptions.sharded`).
    `device` is the device planned for ("cuda" adds the CUDA context, and the distributed buffers
    of a sharded run, to the total); None, the default, means this machine's: torch's answer when
    torch is already imported, else "cuda" where an NVIDIA driver is visible, else "cpu"
    (`options.this_machine_device`; torch is never imported here). The estimate's
    ``inputs["device"]`` and a note say which device was assumed and why; pass ``device="cuda"``
    to plan a GPU run from a CPU machine.

    >>> e = estimate_memory(147e6, n_layer=12, n_embd=768, n_head=12, seq_len=512,
    ...                     micro_batch=64, device="cpu", grad_bytes=2)
    >>> round(e["activations"] / 64)   # 512*768*12*(10+24+5*12*512/768)
    349175808
    """
    kw = {k: v for k, v in locals().items() if k not in ("model", "setting")}   # the parameters above
    if setting is not None:
        kw.update(setting_options(setting, kw))
    options = MemoryOptions(**kw)
    if options.deprecation:
        warnings.warn(options.deprecation, DeprecationWarning, stacklevel=2)
    return estimate_with(model, options)



def estimate_with(model, o: MemoryOptions) -> MemoryEstimate:
    """`estimate_memory` with its options made: the static lines, the activations, then what
    lives beside them (temporaries, CUDA context, distributed buffers)."""
    zero_stage, dp, notes = o.sharded
    device, device_why = o.planned_device
    if o.device is None:
        notes.append(Note("device.assumed", f"device={device!r} assumed: this machine's ({device_why}); pass "
                          "device= to plan for another"
                          + (" (device='cuda' adds the CUDA context)" if device == "cpu" else "")))
    m = _model_sizes(model, o)
    key = o.layout_key
    prec = MEMORY_LAYOUTS[key]
    per, steps = param_bytes(o, m.n_params, m.shapes, notes)
    comps, forms = static_lines(m.n_params, per, o.tp * o.pp, dp, zero_stage, steps)
    if hasattr(model, "parameters"):   # a live module: its frozen parameters train nothing
        frozen = trained_only(comps, forms, float(sum(p.numel() for p in model.parameters() if p.requires_grad)),
                              m.n_params)
        notes.extend([frozen] if frozen else [])
    mode = _activation_mode(o.activations, m)
    notes.extend(m.shape.notes if m.shape is not None else ())
    if m.dims and mode == "gpt":
        comps["buffers"], forms["buffers"] = _rope_buffers(m, key)
    # autocast's half weight copies (an upper bound here: only Linear weights are cast)
    comps["weight_casts"] = m.n_params * prec.weight_casts / (o.tp * o.pp)
    forms["weight_casts"] = (f"at most {prec.weight_casts} B per param: half copies made in forward, "
                             "freed after backward" if prec.weight_casts else "")
    if None in (m.n_layer, m.n_embd, m.n_head, m.seq_len):
        comps["activations"] = comps["recompute"] = NaN
        notes.append(Note("activations.unknown", "activations need n_layer, n_embd, n_head and seq_len (or a config)"
                          + (f": {m.shape_error}" if m.shape_error else "")))
    elif mode in ("gpt", "hf"):
        _counted_activations(comps, forms, notes, m, o, mode)
    else:
        _formula_activations(comps, forms, notes, m, o)
    if o.pp > 1 and not is_missing(comps["activations"]):
        notes.append("1F1B pipeline: the first stage holds pp micro-batches of L/pp layers, "
                     "i.e. the same activation bytes as L layers (not divided by pp)")
    _beside_lines(comps, forms, o, device, world=o.tp * o.pp * dp)
    inputs = dict(n_params=m.n_params, layout=key, optimizer=o.optimizer, micro_batch=o.micro_batch,
                  seq_len=m.seq_len, attention=m.attention, checkpointing=o.checkpointing, tp=o.tp, pp=o.pp,
                  zero_stage=zero_stage, dp=dp, n_layer=m.n_layer, n_embd=m.n_embd, n_head=m.n_head,
                  activations=mode, device=device, device_source=device_why)
    return MemoryEstimate({k: comps[k] for k in COMPONENTS if k in comps}, forms, inputs, notes)


@dataclass
class _Sizes:
    """What the estimate knows of the model: its config and shape (None for a bare count, or a
    partial config: then `shape_error` says why), the demo GPT's fields (`dims`, else empty)
    and the sizes, each given or read from the config."""

    cfg: object
    shape: object
    shape_error: str | None
    dims: dict
    n_params: float
    n_layer: int | None
    n_embd: int | None
    n_head: int | None
    seq_len: int | None
    attention: str
    shapes: list | None = None   # every parameter tensor's shape (a live module's, else the config's)


def _model_sizes(model, o: MemoryOptions) -> _Sizes:
    if isinstance(model, numbers.Real):
        validate.real("model: a parameter count", model)
    cfg = getattr(model, "config", model) if not isinstance(model, (int, float)) else None
    shape, shape_error = None, None
    if cfg is not None:
        try:
            shape = model_shape(cfg)
        except ValueError as e:   # a partial config: sizes may still come as arguments
            shape_error = str(e)
    dims = config_dims(cfg) if shape is not None and shape.family == "tunekit" else {}
    n_params = o.n_params
    if n_params is None:
        if isinstance(model, (int, float)):
            n_params = float(model)
        elif hasattr(model, "parameters"):   # a live module: count without importing torch
            n_params = float(sum(p.numel() for p in model.parameters()))
        elif shape is not None:
            n_params = float(shape.param_count())
        else:
            raise ValueError(shape_error or "give a parameter count, a config or a model")
    attention = o.attention
    if attention is None:
        attention = dims.get("attention") or getattr(cfg, "_attn_implementation", None) or "sdpa"
    shapes = ([tuple(p.shape) for p in model.parameters()] if hasattr(model, "parameters")
              else shape.param_shapes() if shape is not None else None)
    return _Sizes(cfg, shape, shape_error, dims, n_params, shapes=shapes,
                  n_layer=o.n_layer or (shape.n_layer if shape else None),
                  n_embd=o.n_embd or (shape.hidden if shape else None),
                  n_head=o.n_head or (shape.n_head if shape else None),
                  seq_len=o.seq_len or (shape.max_positions if shape else None), attention=attention)


def _activation_mode(activations: str, m: _Sizes) -> str:
    """The activation count that fits the model: its own count where one exists, else Korthikanti."""
    fits_hf = m.shape is not None and m.shape.family in GROUPS
    if activations == "gpt" and not m.dims:
        raise ValueError("activations='gpt' needs a GPTConfig-like config (vocab_size, mlp, ...)")
    if activations == "hf" and not fits_hf:
        raise ValueError(f"activations='hf' covers {sorted(GROUPS)} configs")
    if activations != "auto":
        return activations
    return "gpt" if m.dims else "hf" if fits_hf else "korthikanti"


def _rope_buffers(m: _Sizes, key: str) -> tuple:
    """(bytes, formula) of the demo GPT's rotary cos/sin tables: (T, head_dim) each, in the
    model's dtype (half only when the model is cast)."""
    rope = m.dims["pos"] == "rope" and m.n_head and m.seq_len
    elem = MEMORY_LAYOUTS[key].weights   # the model's dtype: half where its weights are
    return (2.0 * m.dims["block_size"] * (m.n_embd // m.n_head) * elem if rope else 0.0,
            "rotary cos + sin tables: 2 x block_size x head_dim")


def _counted_activations(comps, forms, notes, m: _Sizes, o: MemoryOptions, mode: str) -> None:
    """Activations counted tensor by tensor: the demo GPT's (gpt) or transformers' layers (hf)."""
    key = o.layout_key
    prec = MEMORY_LAYOUTS[key]
    if mode == "gpt":
        act = gpt_activation_bytes(m.cfg, o.micro_batch, m.seq_len, prec.activations,
                                   checkpointing=o.checkpointing, autocast=key == "amp")
    else:
        act = hf_activation_bytes(m.shape, o.micro_batch, m.seq_len, autocast=prec.activations == 2,
                                  attention=m.attention, checkpointing=o.checkpointing)
        comps["buffers"] = 0.0
        if MEMORY_LAYOUTS[key].weights == 2:   # half weights: no autocast
            notes.append("transformers activations are counted under autocast; pure half "
                         "weights keep about the same (the norms stay fp32 either way)")
    # tensor parallelism splits a layer's tensors (an upper-bound split: Korthikanti's 10sbh
    # stay whole); 1F1B pipelining keeps the L-layer total on the first stage
    tp = o.tp
    comps["activations"] = act["saved"] / tp
    comps["recompute"] = act["recompute"] / tp
    comps["weight_casts"] = act["weight_casts"] / (tp * o.pp) if key == "amp" or mode == "gpt" else 0.0  # autocast's
    forms["weight_casts"] = "half copies of the Linear weights, kept from forward to backward"
    forms["activations"] = act["formula"] + (f" / t={tp}" if tp > 1 else "")
    forms["recompute"] = "one block's saved tensors, rebuilt during backward" if o.checkpointing else ""
    if tp > 1:
        notes.append(f"{mode} activation count is for one device; divided by tp (the layer norms' and "
                     "residuals' share is not split without sequence parallelism, so this is low)")


def _formula_activations(comps, forms, notes, m: _Sizes, o: MemoryOptions) -> None:
    """Activations by Korthikanti et al.'s formula (2-byte elements, scaled to the precision's)."""
    prec = MEMORY_LAYOUTS[o.layout_key]
    s, b, h, L, a, tp = m.seq_len, o.micro_batch, m.n_embd, m.n_layer, m.n_head, o.tp
    scale = prec.activations / 2   # the formula counts 2-byte elements
    full = korthikanti_activation_bytes(s, b, h, L, a, tp, o.sequence_parallel)
    if o.checkpointing:
        comps["activations"] = scale * full_recompute_activation_bytes(s, b, h, L, tp, o.sequence_parallel)
        comps["recompute"] = scale * full / L
        forms["activations"] = "2*s*b*h*L (each layer's input)"
        forms["recompute"] = "one layer of s*b*h*(10+24/t+5as/(ht)), rebuilt in backward"
    else:
        comps["activations"] = scale * full
        comps["recompute"] = 0.0
        forms["activations"] = "s*b*h*L*(10 + 24/t + 5*a*s/(h*t))"
    if scale != 1:
        forms["activations"] += f" x {scale:g} ({prec.activations}-byte elements)"
    if m.shape is not None and m.attention in ("sdpa", "flash"):
        notes.append("the Korthikanti formula keeps the 5*a*s^2 attention scores, which fused "
                     "attention (sdpa, flash) does not save: an overestimate for this model")


def _beside_lines(comps, forms, o: MemoryOptions, device: str, world: int) -> None:
    """Temporaries (a share of the known lines), the CUDA context and distributed buffers, on
    ``device`` (the one given, or this machine's)."""
    known = sum(v for v in comps.values() if not is_missing(v))
    comps["temporary"] = o.overhead_fraction * known
    forms["temporary"] = f"{fmt_pct(o.overhead_fraction, 0)} of the above (temporary buffers, fragmentation)"
    on_cuda, context = str(device).startswith("cuda"), o.cuda_context_bytes
    if context is None:   # a plan's figure (options.CUDA_CONTEXT, with its source)
        context = CUDA_CONTEXT[0] if on_cuda else 0.0
    if on_cuda or context:   # a line that does not exist on this device is left out, not 0 bytes
        comps["cuda_context"] = float(context)
        forms["cuda_context"] = "CUDA context + kernels, outside torch's allocator" + (
            f" ({CUDA_CONTEXT[0] / GiB:.2f} GiB: {CUDA_CONTEXT[1]})" if o.cuda_context_bytes is None else " (as given)")
    if on_cuda and world > 1:
        comps["distributed"] = 1.5 * GiB
        forms["distributed"] = "torch.distributed/NCCL buffers (~1-2 GB per GPU)"


def worked_example_147m(micro_batch: int = 64) -> dict:
    """The large-scale-training notes' GPT example (147M params, L=12, h=768, s=512, a=12), read
    three ways. As printed it charges 2 + (4 + 12) + 2 = 20 B/param: the "4" is the fp32 master
    copy and the "12" is AdamW's 8 plus *another* fp32 copy, so the copy is counted twice.
    """
    common = dict(n_layer=12, n_embd=768, n_head=12, seq_len=512, micro_batch=micro_batch,
                  layout="mixed", device="cpu", activations="korthikanti")
    return {
        "as printed (20 B/param)": estimate_memory(147e6, optimizer_bytes=12, grad_bytes=2, **common),
        "fp32 copy once (16 B/param)": estimate_memory(147e6, grad_bytes=2, **common),
        "fp32 grads (18 B/param)": estimate_memory(147e6, **common),
    }
