"""Where the time and the memory of a step went: the op-category rules and the records. Pure: no torch.

    >>> categorize(["aten::mm", "aten::matmul", "aten::linear"])
    'matmul/linear'
    >>> categorize(["aten::mul", "nn.Module: RMSNorm"])      # a pointwise op inside a norm module
    'normalization'
    >>> categorize(["aten::mul_", "Optimizer.step#AdamW.step"])
    'optimizer'

`categorize` takes an op's chain of names, innermost first: the op, its parent ops, the module
scopes around it and, for an op of the backward pass, the chain of the forward op it belongs to.
It decides in four passes over `RULES`, the one table of category rules:
1. ``scope`` rules, outermost name first: everything inside ``Optimizer.step`` is optimizer time,
   inside a DataLoader's ``__next__`` data loading, inside a c10d collective communication;
2. ``op`` rules, innermost first: a kernel that says what it is (``aten::mm``, SDPA, layer_norm,
   gelu, a host<->device memcpy) wins, also inside a module of another kind (the q/k/v
   projections of an attention module are matmuls);
3. ``module`` rules, innermost first: a generic op inside a module that says what it is (the
   ``pow``/``mean``/``rsqrt`` of a hand-written RMSNorm are normalization);
4. ``pointwise`` rules: what is left of the elementwise and reduction ops; then ``other``.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, dataclass, field

from tunekit.core.fmt import fmt_mib, fmt_pct
from tunekit.core.units import is_missing

NaN = math.nan

MATMUL, ATTENTION, NORM, ELEMENTWISE = "matmul/linear", "attention", "normalization", "activation/elementwise"
OPTIMIZER, COMM, MEMCPY, DATA, OTHER, IDLE = ("optimizer", "communication", "memory copy", "data loading",
                                              "other", "idle")
# the order of charts and tables; "idle" only on a GPU (wall time with no kernel running)
CATEGORIES = (MATMUL, ATTENTION, NORM, ELEMENTWISE, OPTIMIZER, COMM, MEMCPY, DATA, OTHER, IDLE)
TOP_OPS = 300   # ops a trace keeps (tables show the first 10): a step's every op and module scope, so
#                 that tunekit.diff tells an op or a module missing on one side from one cut off
UNTRACED = "between ops (Python)"  # CPU: the wall time no op ran in; with the categories it makes 100%

_POINTWISE = ("add|sub|rsub|mul|div|pow|sqrt|rsqrt|exp|exp2|log|log1p|neg|abs|sign|reciprocal|where|"
              "clamp|clamp_min|clamp_max|maximum|minimum|lerp|addcmul|addcdiv|fill|zero|copy|_to_copy|"
              "sum|mean|amax|amin|max|min|norm|var|std|cumsum|eq|ne|lt|le|gt|ge|logical_not|masked_fill|"
              "cat|stack|tril|triu|dropout|native_dropout|native_dropout_backward|bernoulli|threshold_backward|"
              "sigmoid_backward|tanh_backward|_foreach_[a-z_]+")

# a convolution's op or the kernel it runs as (CPU's oneDNN mkldnn_convolution, cuDNN, MIOpen, the
# slow fallbacks _slow_conv2d_forward / slow_conv3d, a depthwise or transposed one), forward or backward
CONVOLUTION = r"^(aten::)?\w*conv(olution|\dd|_depthwise\dd|_dilated\dd|_transpose\dd|_tbc)(_forward|_backward)?\w*$"

# (pass, category, regex on one name); the first rule of a pass that matches decides
RULES: tuple = (
    ("scope", OPTIMIZER, r"^Optimizer\.(step|zero_grad)"),
    ("scope", DATA, r"DataLoader|^tunekit: data"),
    ("scope", COMM, r"^(c10d|nccl|gloo)[:_]|^record_param_comms$"),
    ("op", COMM, r"(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast_|send|recv)"
                 r"(_coalesced|_base|_into_tensor|_tensor)?_?$|^nccl|^ncclDevKernel|^ncclKernel"),
    ("op", MEMCPY, r"Memcpy (HtoD|DtoH)|^cudaMemcpy|^aten::_pin_memory$|^aten::pin_memory$"),
    ("op", ATTENTION, r"scaled_dot_product|_efficient_attention|_flash_attention|_cudnn_attention|"
                      r"flash_attn|^fmha|ScaledDotProduct|FlashAttn|EfficientAttention"),
    ("op", MATMUL, r"^aten::(mm|bmm|addmm|baddbmm|addbmm|matmul|linear|addmv|mv|dot|einsum|_scaled_mm|"
                   r"_addmm_activation|_int_mm|conv\w*|convolution\w*|_convolution\w*)$|"
                   rf"{CONVOLUTION}|"
                   r"^(Mm|Bmm|Addmm|Baddbmm|Mv|Dot|Convolution|Conv\w*|ScaledMm)Backward\d*$|"
                   r"gemm|cutlass|cublas|sm\d+_xmma"),
    ("op", NORM, r"^aten::(native_)?(layer_norm|rms_norm|group_norm|batch_norm|instance_norm|_fused_rms_norm)"
                 r"(_backward)?$|^aten::native_batch_norm\w*$|^aten::_batch_norm\w*$|"
                 r"^(NativeLayerNorm|LayerNorm|RmsNorm|FusedRmsNorm|NativeGroupNorm|NativeBatchNorm|"
                 r"CudnnBatchNorm)Backward\d*$|layer_norm_kernel|rms_norm_kernel"),
    ("op", ELEMENTWISE, r"^aten::(gelu|silu|relu|relu_|leaky_relu|tanh|sigmoid|softplus|mish|elu|hardswish|"
                        r"_softmax|softmax|_log_softmax|log_softmax|glu)(_backward)?(_data)?$|"
                        r"^(Gelu|Silu|Relu|Tanh|Sigmoid|Softmax|LogSoftmax|Glu)Backward\d*$"),
    ("module", ATTENTION, r"^nn\.Module: \w*(Attention|Attn|SDPA)\w*"),
    ("module", NORM, r"^nn\.Module: \w*Norm\w*"),
    ("module", MATMUL, r"^nn\.Module: (Linear|Conv\dd|\w*Linear)$"),
    ("module", ELEMENTWISE, r"^nn\.Module: (GELU|ReLU|SiLU|Tanh|Sigmoid|Softmax|NewGELUActivation|"
                            r"\w*Activation)$"),
    ("pointwise", ELEMENTWISE, rf"^aten::({_POINTWISE})_?$|^aten::_foreach_\w+$|"
                               r"^(Add|Sub|Mul|Div|Pow|Sqrt|Rsqrt|Exp|Neg|Mean|Sum|Cat|Where|Clamp)Backward\d*$|"
                               r"elementwise_kernel|reduce_kernel"),
)
_COMPILED = tuple((p, c, re.compile(r)) for p, c, r in RULES)


def _first(names, kind):
    for name in names:
        for p, cat, rx in _COMPILED:
            if p == kind and rx.search(name):
                return cat
    return None


def categorize(chain) -> str:
    """The category of one op from its chain of names, innermost first (see the module doc)."""
    chain = list(chain)
    return (_first(reversed(chain), "scope") or _first(chain, "op") or _first(chain, "module")
            or _first(chain, "pointwise") or OTHER)


def by_category(op_seconds) -> list[tuple[str, float]]:
    """(category, seconds) from (aten op name, seconds) pairs (``"mm.default"``,
    ``"_scaled_dot_product_flash_attention_for_cpu_backward.default"``), the largest first: the
    names a plan for another device prints (its kernels are not the CPU ops of the fake step).

    >>> by_category([("mm.default", 2.0), ("bmm.default", 1.0),
    ...              ("_scaled_dot_product_flash_attention_for_cpu.default", 0.5)])
    [('matmul/linear', 3.0), ('attention', 0.5)]"""
    from tunekit.core.expected import FUSED

    out: dict = {}
    for name, t in op_seconds:
        cat = ELEMENTWISE if name == FUSED else categorize(["aten::" + name.split(".")[0]])
        out[cat] = out.get(cat, 0.0) + t
    return sorted(out.items(), key=lambda kv: -kv[1])


# --- the records ---------------------------------------------------------------------------------


@dataclass
class Breakdown:
    """The time of one traced run by category, and its top ops. Seconds; see `categorize`.

    CPU: each op's self CPU time on the thread that ran the block (no nested op counted twice);
    the wall time the profiler saw no op in (Python between ops) is ``untraced_s``. GPU: kernel
    time, and ``idle`` = wall minus the time some kernel ran. Either way the parts add up to the
    wall time, so `shares` add up to 100%. ``overhead`` = traced / untraced time - 1, measured:
    NaN when no untraced run to compare with, or when the traced run was the faster (noise; a
    profiler never makes a run faster)."""

    device: str                       # "cpu" | "cuda"
    wall_s: float                     # the traced run
    seconds: dict                     # category -> seconds (the categories of CATEGORIES only)
    top_ops: list = field(default_factory=list)   # dicts: op, category, self_s, calls
    untraced_s: float = NaN           # CPU: wall minus every op's self time
    overhead: float = NaN             # traced wall / untraced wall - 1
    untimed_wall_s: float = NaN       # the untraced run it was compared with
    path: str | None = None           # Chrome trace (Perfetto / TensorBoard)
    notes: list = field(default_factory=list)

    def total_s(self) -> float:
        return sum(self.seconds.values())

    def parts(self) -> dict:
        """What the wall time splits into, in seconds: the categories and, on CPU, `UNTRACED`."""
        out = dict(self.seconds)
        if not is_missing(self.untraced_s):
            out[UNTRACED] = max(0.0, self.untraced_s)
        return out

    def shares(self) -> dict:
        """part -> share of the wall time, largest first; they add up to 100% ({} without a wall time)."""
        if is_missing(self.wall_s) or not self.wall_s > 0:
            return {}
        return {c: s / self.wall_s for c, s in sorted(self.parts().items(), key=lambda kv: -kv[1])}

    def dominant(self) -> str:
        """The category with the most time (idle included)."""
        return max(self.seconds, key=self.seconds.get)

    def short(self, n: int = 3) -> str:
        """'matmul/linear 41% · optimizer 22% · activation/elementwise 18% · rest 19%': the ``n``
        largest parts and the rest, in whole percents that add up to exactly 100."""
        pct = whole_percents(self.shares())
        if not pct:
            return ""
        top = [(c, p) for c, p in list(pct.items())[:n] if p > 0]
        rest = 100 - sum(p for _, p in top)
        return " · ".join([f"{c} {p}%" for c, p in top] + ([f"rest {rest}%"] if rest > 0 else []))

    def frame(self):
        """pandas DataFrame: part, seconds, share of the wall (largest first; shares add up to 1)."""
        import pandas as pd

        parts = self.parts()
        rows = [(c, parts[c], s) for c, s in self.shares().items()]
        return pd.DataFrame(rows, columns=["category", "seconds", "share"])

    def overhead_text(self) -> str:
        """The profiler's overhead in words: '+12%', 'lost in noise (...)' or 'unknown'; never negative."""
        if not is_missing(self.overhead):
            return fmt_pct(self.overhead, 0, signed=True)
        if not is_missing(self.untimed_wall_s) and self.wall_s < self.untimed_wall_s:
            return "lost in noise (the traced run was the faster)"
        return "unknown"

    def compare_with(self, untimed_wall_s: float) -> None:
        """The profiler's overhead against an untraced run of ``untimed_wall_s`` seconds."""
        self.untimed_wall_s = untimed_wall_s
        self.overhead = profiler_overhead(self.wall_s, untimed_wall_s)
        if is_missing(self.overhead) and self.wall_s < untimed_wall_s:
            self.notes.append(f"the traced run was {fmt_pct(1 - self.wall_s / untimed_wall_s)} faster than the "
                              "untraced one: run-to-run noise hides the profiler's overhead")

    def table(self, n: int = 10):
        """pandas DataFrame of the top ``n`` ops by self time."""
        import pandas as pd

        return pd.DataFrame(self.top_ops[:n], columns=["op", "category", "self_s", "calls"])

    def to_dict(self) -> dict:
        return asdict(self)


def median_breakdown(steps: list) -> Breakdown:
    """One `Breakdown` of several traced steps of one setting: each category's seconds, the time no
    op ran in and each op's self time and calls, their median over the steps (an op a step did not
    run counts 0 there), the wall the sum of those parts (so the shares still add up to 100%). One
    traced step is one sample of a shared machine: an op a burst of other work slowed in one step
    moves no median of three. The first step's Chrome trace and notes, and a note saying so."""
    first = steps[0]
    if len(steps) == 1:
        return first
    seconds = {c: statistics.median(b.seconds.get(c, 0.0) for b in steps) for c in first.seconds}
    untraced = NaN if is_missing(first.untraced_s) else statistics.median(
        0.0 if is_missing(b.untraced_s) else b.untraced_s for b in steps)
    ops: dict = {}
    for i, b in enumerate(steps):
        for o in b.top_ops:
            ops.setdefault((o["op"], o["category"]), [(0.0, 0)] * len(steps))[i] = (o["self_s"], o["calls"])
    top = sorted(({"op": op, "category": cat, "self_s": statistics.median(s for s, _ in v),
                   "calls": int(statistics.median(c for _, c in v))} for (op, cat), v in ops.items()),
                 key=lambda r: -r["self_s"])
    wall = sum(seconds.values()) + (0.0 if is_missing(untraced) else max(0.0, untraced))
    return Breakdown(device=first.device, wall_s=wall, seconds=seconds, top_ops=top[:TOP_OPS], untraced_s=untraced,
                     path=first.path, notes=[*first.notes, f"the median of {len(steps)} traced steps, part by part "
                                                           f"and op by op (the Chrome trace: the first's)"])


def as_breakdown(t) -> "Breakdown | None":
    """A trace as a `Breakdown`: itself, or rebuilt from its dict (a run read back from a log)."""
    if t is None or isinstance(t, Breakdown):
        return t
    if isinstance(t, dict) and {"device", "wall_s", "seconds"} <= set(t):
        known = {k: t[k] for k in ("device", "wall_s", "seconds", "top_ops", "untraced_s", "overhead") if k in t}
        return Breakdown(**known)
    return None


def profiler_overhead(traced_s: float, untraced_s: float) -> float:
    """traced / untraced - 1; NaN when either is unknown or the traced run was the faster (a
    profiler only adds work: a faster traced run is noise, never a negative overhead)."""
    if is_missing(traced_s) or is_missing(untraced_s) or not untraced_s > 0 or traced_s < untraced_s:
        return NaN
    return traced_s / untraced_s - 1


def whole_percents(shares: dict) -> dict:
    """Fractions that add up to 1 as whole percents that add up to exactly 100 (largest
    remainder), in the same order: printed shares never add up to 99% or 101%."""
    total = sum(shares.values())
    if not total > 0:
        return dict.fromkeys(shares, 0)
    raw = {k: 100 * v / total for k, v in shares.items()}
    out = {k: int(v) for k, v in raw.items()}
    for k in sorted(raw, key=lambda k: out[k] - raw[k])[:100 - sum(out.values())]:
        out[k] += 1
    return out


# torch.profiler's memory categories -> ours (what the timeline shows)
PARAMS, GRADS, OPT_STATE, ACTS, TEMPS = "parameters", "gradients", "optimizer state", "activations", "temporaries/other"
MEMORY_CATEGORIES = (PARAMS, GRADS, OPT_STATE, ACTS, TEMPS)
TORCH_MEMORY_CATEGORY = {"PARAMETER": PARAMS, "GRADIENT": GRADS, "OPTIMIZER_STATE": OPT_STATE,
                         "ACTIVATION": ACTS, "TEMPORARY": TEMPS, "INPUT": TEMPS, "AUTOGRAD_DETAIL": TEMPS,
                         None: TEMPS}


@dataclass
class MemoryTimeline:
    """Bytes alive by category through one traced run (torch.profiler's memory profiler).

    ``times_s`` from the start of the run; ``bytes`` maps each of MEMORY_CATEGORIES to a list
    as long as ``times_s``. ``snapshot_path``: a torch.cuda.memory snapshot (memory_viz), CUDA only."""

    device: str
    times_s: list
    bytes: dict
    snapshot_path: str | None = None
    notes: list = field(default_factory=list)

    def totals(self) -> list:
        return [sum(v[i] for v in self.bytes.values()) for i in range(len(self.times_s))]

    def peak(self) -> tuple[float, float, dict]:
        """(time of the peak in s, bytes at the peak, bytes by category at the peak)."""
        tot = self.totals()
        if not tot:
            return NaN, NaN, {}
        i = max(range(len(tot)), key=tot.__getitem__)
        return self.times_s[i], float(tot[i]), {c: v[i] for c, v in self.bytes.items()}

    def short(self) -> str:
        t, total, by = self.peak()
        if not by:
            return "no allocations seen"
        top = max(by, key=by.get)
        end = self.times_s[-1] or 1.0
        return f"peak {fmt_mib(total)} at {fmt_pct(t / end, 0)} of the step ({top} {fmt_pct(by[top] / total, 0)})"

    def to_dict(self) -> dict:
        return asdict(self)


def short(value) -> str | None:
    """One line for a table cell: a Breakdown/MemoryTimeline, or the dict a run log kept of one."""
    if value is None:
        return None
    if isinstance(value, dict):
        cls = Breakdown if "seconds" in value else MemoryTimeline
        try:
            value = cls(**value)
        except TypeError:
            return str(value)
    return value.short()
