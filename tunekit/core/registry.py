"""One declaration per optimizer, dtype, training precision and attention implementation.
Pure: no torch, no IPython.

Everything that names one of these (the Lab's toggles and dashboard, the optimizer factory, the
memory estimate, the peak tables, the magics' options) reads it from here: adding an optimizer or
a precision is one edit in this file plus its test.

    >>> optimizer("adamw-8bit").name                  # aliases resolve to one entry
    'adamw_8bit'
    >>> optimizer("adamw").state_bytes_per_param(4)    # two fp32 moments
    8
    >>> PRECISIONS["bf16"].autocast_dtype
    'bf16'
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# --- dtypes: names as users write them -> what torch calls them ---------------------------------


@dataclass(frozen=True)
class DType:
    name: str
    torch_name: str     # attribute of the torch module
    bytes: int          # bytes per element as stored
    doc: str


# the dtype names, declared here once: code names them by these constants, never by a literal
# (tests/project/test_code_shape.py); users and data files write the strings
FP32, TF32, BF16, FP16, FP8 = "fp32", "tf32", "bf16", "fp16", "fp8"

DTYPES: dict[str, DType] = {d.name: d for d in (
    DType(FP32, "float32", 4, "IEEE single precision"),
    DType(TF32, "float32", 4, "fp32 storage; CUDA tensor cores round matmul inputs to 10 mantissa bits"),
    DType(BF16, "bfloat16", 2, "8-bit exponent (fp32's range), 7-bit mantissa"),
    DType(FP16, "float16", 2, "5-bit exponent: needs loss scaling for training"),
    DType(FP8, "float8_e4m3fn", 1, "Hopper and newer; scaled matmuls only"),
)}
_DTYPE_ALIASES = {"float32": FP32, "float": FP32, "bfloat16": BF16, "float16": FP16,
                  "half": FP16, "float8_e4m3fn": FP8}


def dtype(name: str) -> DType:
    """The dtype entry for a name or alias: ``dtype("bfloat16").name == "bf16"``."""
    key = _DTYPE_ALIASES.get(str(name).lower(), str(name).lower())
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; one of {sorted(DTYPES)} (or {sorted(_DTYPE_ALIASES)})")
    return DTYPES[key]


# --- training precisions (the Lab's `precision` toggle) -----------------------------------------


@dataclass(frozen=True)
class Precision:
    name: str
    compute: str                # dtype the matmuls run in on CUDA (tf32 is fp32 elsewhere)
    autocast_dtype: str | None  # the forward runs under torch.autocast to this dtype
    grad_scaler: bool           # fp16: a GradScaler keeps small gradients from underflowing
    cuda_only: bool
    memory_layout: str          # key of MEMORY_LAYOUTS: what the parameters, grads and states cost
    doc: str


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision(FP32, FP32, None, False, False, FP32, "everything in fp32"),
    Precision(TF32, TF32, None, False, False, TF32, "fp32 tensors, tf32 matmuls on CUDA"),
    Precision(BF16, BF16, BF16, False, False, "amp", "fp32 weights, bf16 autocast forward"),
    Precision(FP16, FP16, FP16, True, True, "amp", "fp32 weights, fp16 autocast + GradScaler"),
)}


# --- memory layouts: bytes per parameter of a training precision --------------------------------


@dataclass(frozen=True)
class MemoryLayout:
    """Bytes per parameter (or per activation element) that a training precision keeps."""

    weights: int        # the copy the forward reads
    master: int         # fp32 master copy kept beside half weights (0 when the weights are it)
    grads: int
    state: int          # bytes of one optimizer-state element (torch keeps them in the param dtype)
    activations: int    # bytes of one saved activation element (matmul side)
    weight_casts: int   # per matmul param: half copies autocast makes and keeps until backward
    doc: str


MEMORY_LAYOUTS: dict[str, MemoryLayout] = {
    FP32: MemoryLayout(4, 0, 4, 4, 4, 0, "fp32 everything"),
    TF32: MemoryLayout(4, 0, 4, 4, 4, 0, "fp32 storage, tf32 matmuls: memory as fp32"),
    BF16: MemoryLayout(2, 0, 2, 2, 2, 0, "pure bf16: weights, grads and optimizer states in bf16"),
    FP16: MemoryLayout(2, 0, 2, 2, 2, 0, "pure fp16: weights, grads and optimizer states in fp16"),
    # Megatron/DeepSpeed-style mixed precision: persistent half weights + fp32 master + fp32 grads
    # (stas00/ml-engineering training/performance/README.md: "6 bytes ... maintains a model in fp32 and
    # one in fp16/bf16", 4-byte grads).
    "mixed": MemoryLayout(2, 4, 4, 4, 2, 0, "half weights + fp32 master copy + fp32 grads"),
    # torch.autocast: the fp32 params are the master; half copies of the matmul weights are made
    # in the forward and saved for backward, so they live per step, not persistently.
    "amp": MemoryLayout(4, 0, 4, 4, 2, 2, "torch.autocast: fp32 params/grads, half weight casts per step"),
}
_LAYOUT_ALIASES = {"bf16-mixed": "mixed", "fp16-mixed": "mixed", "amp-bf16": "amp",
                   "amp-fp16": "amp", "autocast": "amp", "float32": FP32, "bfloat16": BF16,
                   "float16": FP16}


def memory_layout_name(name: str) -> str:
    """Canonical layout name: ``memory_layout_name("bf16-mixed") == "mixed"``."""
    key = _LAYOUT_ALIASES.get(str(name).lower(), str(name).lower())
    if key not in MEMORY_LAYOUTS:
        raise ValueError(f"unknown memory layout {name!r}; one of "
                         f"{sorted(MEMORY_LAYOUTS) + sorted(_LAYOUT_ALIASES)}")
    return key


# --- optimizers --------------------------------------------------------------------------------


# torch's AdamW (fused or not) and Adafactor keep per parameter tensor a 0-dim `step` tensor of
# torch's scalar dtype, fp32 (torch/optim/adam.py and _adafactor.py, `_init_group`; on the CPU
# unless fused or capturable); SGD, Lion and bitsandbytes' AdamW8bit keep none (an int at most)
STEP_BYTES = 4


@dataclass(frozen=True)
class Optimizer:
    name: str
    factory: str | None         # "module:Class" the Lab builds; None: a name for estimates only
    kwargs: tuple = ()          # ((key, value), ...) passed besides lr
    states: int = 0             # parameter-sized state tensors per parameter
    state_bytes: int | None = None  # bytes per state element; None: the parameter dtype's
    package: str | None = None  # pip name when it is not part of torch
    cuda_only: bool = False
    aliases: tuple = ()
    doc: str = ""
    factored: bool = False      # torch's Adafactor: a matrix's second moment as a row and a column
    step_bytes: int = 0         # its 0-dim `step` tensor per parameter tensor (`STEP_BYTES`), or 0

    def state_bytes_per_param(self, param_bytes: int = 4) -> int:
        """Bytes per parameter: `states` parameter-sized tensors (for a factored optimizer, its
        bound: what a vector's full-size moment takes; `state_bytes_of` counts by shape)."""
        return self.states * (self.state_bytes or param_bytes)

    def state_bytes_of(self, shapes, param_bytes: int = 4) -> int:
        """Bytes of the state kept for parameters of ``shapes`` (tuples). A factored optimizer's as
        torch.optim.Adafactor allocates it (torch/optim/_adafactor.py, ``_init_group``): per
        parameter a 0-dim fp32 step, and for one of 2+ dims (..., r, c) a row variance (..., r, 1)
        and a column variance (..., 1, c), for a vector a variance of its size, in its dtype.
        ``optimizer("adafactor").state_bytes_of([(32, 64), (32,)]) == (4 + 4 * 96) + (4 + 4 * 32)``;
        AdamW's: two moments and a step per tensor, ``(4 + 8 * 2048) + (4 + 8 * 32)``."""
        if not self.factored:
            return sum(self.step_bytes + self.state_bytes_per_param(param_bytes) * math.prod(s) for s in shapes)
        elem = self.state_bytes or param_bytes
        return sum(self.step_bytes + elem * (math.prod(s[:-1]) + math.prod(s[:-2]) * s[-1] if len(s) > 1
                                                  else math.prod(s)) for s in shapes)


_WD = (("weight_decay", 0.1),)  # GPT-2/3 practice for the AdamW family
OPTIMIZERS: dict[str, Optimizer] = {o.name: o for o in (
    Optimizer("adamw", "torch.optim:AdamW", _WD, 2, aliases=("adam",), step_bytes=STEP_BYTES,
              doc="exp_avg + exp_avg_sq: 8 B/param in fp32"),
    # one kernel per parameter group instead of a loop of small ops (CPU and CUDA in torch>=2.4)
    Optimizer("adamw_fused", "torch.optim:AdamW", _WD + (("fused", True),), 2, step_bytes=STEP_BYTES,
              doc="AdamW as one fused kernel"),
    Optimizer("sgd", "torch.optim:SGD", (("momentum", 0.9),), 1,
              aliases=("sgd-momentum", "sgd_momentum"), doc="one momentum buffer: 4 B/param"),
    Optimizer("adafactor", "torch.optim:Adafactor", (), 1, factored=True, step_bytes=STEP_BYTES,
              doc="ml-engineering's ~4 B/param bound; torch's factored moments are far smaller (by shape)"),
    Optimizer("lion", "lion_pytorch:Lion", _WD, 1, package="lion-pytorch",
              doc="one momentum: 4 B/param"),
    Optimizer("adamw_8bit", "bitsandbytes.optim:AdamW8bit", _WD, 2, state_bytes=1,
              package="bitsandbytes", cuda_only=True, aliases=("adamw-8bit", "adam8bit"),
              doc="bitsandbytes: 1 byte per moment -> 2 B/param"),
    # names for estimates only (no Lab factory)
    Optimizer("sgd_nomomentum", None, (), 0, aliases=("sgd-nomomentum",), doc="plain SGD keeps nothing"),
    Optimizer("adamw_bf16", None, (), 2, state_bytes=2, aliases=("adamw-bf16", "anyprecision"),
              doc="AnyPrecisionAdamW with bf16 states -> 4 B/param"),
)}
_OPT_ALIASES = {a: o.name for o in OPTIMIZERS.values() for a in o.aliases}
LAB_OPTIMIZERS = tuple(n for n, o in OPTIMIZERS.items() if o.factory)


def optimizer(name: str) -> Optimizer:
    """The optimizer entry for a name or alias (case-insensitive)."""
    key = str(name).lower()
    key = _OPT_ALIASES.get(key, key)
    if key not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; one of {sorted(OPTIMIZERS)}"
                         + _meant(name, [*OPTIMIZERS, *_OPT_ALIASES], _OPT_ALIASES))
    return OPTIMIZERS[key]


def precision_meant(value) -> str | None:
    """The training precision ``value`` probably meant: a dtype's other name ('bfloat16',
    torch.float16, 'half'), else the spelling closest to one (`core.validate.nearest`).

    >>> precision_meant("bfloat16"), precision_meant("torch.float32"), precision_meant("BF-16"), precision_meant(8)
    ('bf16', 'fp32', 'bf16', None)
    """
    from tunekit.core.validate import nearest

    key = str(value).lower().removeprefix("torch.")
    named = _DTYPE_ALIASES.get(key, key)
    return named if named in PRECISIONS else nearest(value, PRECISIONS)


def _meant(name, names: list, canonical: dict | None = None) -> str:
    """": did you mean 'x'?" for a name spelled close to one of ``names`` (`core.validate.nearest`;
    an alias said as ``canonical`` names it: 'adamq' -> 'adamw', not its alias 'adam'), else ""."""
    from tunekit.core.validate import did_you_mean, nearest

    near = nearest(str(name), names)
    return did_you_mean((canonical or {}).get(near, near) if near is not None else None)


def optimizer_for_class(class_name: str, momentum: float = 0.0) -> Optimizer | None:
    """The entry a torch optimizer instance corresponds to (by class name), or None."""
    cls = class_name.lower()
    if cls == "sgd":
        return OPTIMIZERS["sgd" if momentum else "sgd_nomomentum"]
    for o in OPTIMIZERS.values():
        if o.factory and o.factory.split(":")[1].lower() == cls:
            return o
    return OPTIMIZERS.get(_OPT_ALIASES.get(cls, cls))


# --- attention implementations ------------------------------------------------------------------


@dataclass(frozen=True)
class Attention:
    name: str
    cuda_only: bool
    half_only: bool             # takes fp16/bf16 tensors only
    package: str | None
    keeps_scores: bool          # saves the (s x s) score matrix for backward
    hf_name: str | None         # transformers' attn_implementation for it
    doc: str
    aliases: tuple = ()


ATTENTIONS: dict[str, Attention] = {a.name: a for a in (
    Attention("math", False, False, None, True, "eager", "QK^T, softmax and AV as separate ops",
              aliases=("eager",)),
    Attention("sdpa", False, False, None, False, "sdpa", "torch's scaled_dot_product_attention (fused kernels)"),
    Attention("flash", True, True, "flash-attn", False, "flash_attention_2", "the flash-attn package's kernels",
              aliases=("flash_attention_2",)),
)}
ATTENTION_ALIASES = {a: x.name for x in ATTENTIONS.values() for a in x.aliases}


def attention(name: str) -> Attention:
    """The attention entry for a name or alias (``"eager"`` is transformers' name for math)."""
    key = ATTENTION_ALIASES.get(name, name)
    if key not in ATTENTIONS:
        raise ValueError(f"unknown attention {name!r}; one of {tuple(ATTENTIONS)} (or {tuple(ATTENTION_ALIASES)})"
                         + _meant(name, [*ATTENTIONS, *ATTENTION_ALIASES]))
    return ATTENTIONS[key]


def module_available(module: str) -> bool:
    """Whether a module can be imported, without importing it (a heavy CUDA import must not be
    paid, or crash, just to list the options)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
