"""A plan: what one training step needs on a device and how fast it could possibly go, computed
without running the model (`tunekit.plan`). Pure: numbers in, numbers and text out.

Memory: the step's components as measured on a fake step (parameters, master weights, gradients,
optimizer state, weight casts, activations saved for backward, buffers) and its peak, the most
bytes alive at once over a steady step (optimizer state already made) with where it happens,
plus the device's fixed costs (CUDA context, cuBLAS workspace, NCCL buffers), against the
device's memory. The peak is not the sum of the components: activations are freed as gradients
are made, and temporaries (the loss's gradient over the vocabulary, say) belong to no component.
On a GPU every block is rounded up to 512 bytes as torch's caching allocator does; what the
allocator reserves beyond that (fragmentation, segments) is not modelled.
Under sharding the figures are rank 0's (`planning.shard`).

Speed of light: every op of the step on the device's roofline, the longer of its FLOPs at the
dense peak and its bytes (inputs read, outputs written) at the memory bandwidth, summed.
Memory-bound ops count as a compiler would fuse them (each run between two matmuls reads what it
did not make and writes what is read after it: `core.expected.fused`), since a fused run (llm.c's
kernels, torch.compile) moves no more than that. No step on one device can take less, so the
step time is a lower bound and tokens/s and MFU are upper bounds, often loose ones: kernels
reach ~80% of the dense peak at best (MAMF). Across ranks the collectives take their bytes at
the links' bandwidth; with perfect overlap a step takes at least the longer of the two.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from tunekit.core.expected import Expected
from tunekit.core.fmt import fmt_gib, fmt_ms, fmt_pct, fmt_rate
from tunekit.core.memory.answer import MemoryAnswer
from tunekit.core.setting import Setting
from tunekit.core.units import GiB, is_missing

NaN = math.nan

# the components a plan counts over its step (core.memory.answer names them all); the device's
# fixed costs (CUDA context, distributed buffers) are `Plan.fixed`
COMPONENTS = ("weights", "master_weights", "gradients", "optimizer_states", "weight_casts",
              "activations", "buffers")


@dataclass
class PlanDevice:
    """What a plan needs of a device (`planning.device.device_figures`, as the planner reads it):
    its name, memory (bytes torch can use), dense peak for the step's compute dtype (TFLOPS, None: not listed), memory
    bandwidth (TB/s), link (GB/s each way), the allocator's rounding, the fixed costs beside the
    model (name -> (bytes, source)) and notes."""

    name: str
    memory: float
    peak: float | None
    bandwidth: float | None
    link: float | None
    round_to: int
    fixed: dict
    notes: list


@dataclass
class Placed:
    """A fake step placed on a device: rank 0's components, its peak and where, the total with
    the device's fixed costs, and the collectives' time (0 on one device)."""

    components: dict | None   # None: a step faked without them (the advice's totals read the peak alone)
    peak: float
    peak_at: str
    total: float
    comm_s: float
    comm: dict
    notes: list


@dataclass
class Plan(MemoryAnswer):
    """What one training step needs on ``device`` and its speed-of-light bound.

    Example: ``p = tunekit.plan(cfg, "H100 SXM"); p.fits, p.total_bytes / 2**30, p.bound_tokens_per_s``."""

    model: str
    device: str
    device_memory_bytes: float          # what the device has (spec sheet, or this machine's RAM)
    setting: Setting                    # the step planned (core.setting)
    components: dict                    # component -> bytes (COMPONENTS)
    fixed: dict                         # fixed cost -> (bytes, source)
    tokens: int                         # of one micro-batch (samples where `unit` says so)
    executed_flops: float               # of one step, causal attention halved as tunekit counts
    model_flops: float                  # the MFU convention's (no recompute)
    bound_step_s: float                 # the roofline's lower bound on one step
    peak_tflops: float | None
    bandwidth_tbs: float | None
    bound_by: list = field(default_factory=list)   # (op, seconds) of the ops that take the most
    notes: list = field(default_factory=list)
    max_micro_batch: int | None = None   # the largest that fits (plan(..., search=True))
    # when it does not fit: (change, total bytes, fits, executed FLOPs per token vs the plan's)
    alternatives: list = field(default_factory=list)
    peak_bytes: float = NaN             # the most alive at once over a steady step (one rank), fixed costs aside
    peak_at: str = ""                   # where: phase, module, op
    phase_peaks: dict = field(default_factory=dict)   # phase -> its peak bytes (one device, unsharded)
    timeline: list = field(default_factory=list)      # (phase, live bytes) over the step, one device
    parallel: dict | None = None        # kind, world_size, nodes, shard (None: one device)
    compute_bound_s: float = NaN        # the roofline of the FLOP-doing ops
    comm_s: float = 0.0                 # the collectives at the links' bandwidth, one step
    comm: dict = field(default_factory=dict)          # "kind/scope" -> seconds
    method: str = "fake step"           # how it was computed: "fake step", or "analytic" (estimate_memory)
    unit: str = "tokens"                # what `tokens` counts: "tokens", or "samples" (a batch without a sequence)
    expected: Expected | None = None    # what a good run reaches (None: a figure missing)
    # when it does not fit: the combinations of changes that fit (planning.advice.Option), best expected tokens/s first
    advice: list = field(default_factory=list)
    # and the combinations not tried, each with why (planning.advice.Skipped)
    not_tried: list = field(default_factory=list)

    def sbatch(self, target, folder, **kw):
        """Write the batch script that runs this setting (or ``option=``, an index into ``advice``)
        on ``target`` (a ``tunekit.Slurm``) into ``folder``, the expected step as a comment; returns
        its path (``sbatch PATH`` submits it). Keywords: ``model`` (what to train, default what was
        planned), ``script`` (your own command instead of tunekit's worker), ``steps``, ``warmup``
        (tunekit.parallel.slurm.plan_script)."""
        return target.plan_script(self, folder, **kw)

    @property
    def fixed_bytes(self) -> float:
        return sum(b for b, _ in self.fixed.values())

    @property
    def total_bytes(self) -> float:
        """What the device must hold at the step's peak: the peak (the sum of the known components
        where no peak was measured: an analytic plan; `unknown` lists what is left out) plus the
        fixed costs."""
        held = self.peak_bytes if not is_missing(self.peak_bytes) else \
            sum(v for v in self.components.values() if not is_missing(v))
        return held + self.fixed_bytes

    @property
    def other_bytes(self) -> float:
        """What the peak holds beyond its components (each their largest over the step), not broken
        down: temporaries no component owns (the loss's gradient over the vocabulary, an op's output
        in flight), less component bytes not alive at the peak; negative where those are more.
        The components and this sum to ``peak_bytes`` (NaN where no peak was measured)."""
        return self.peak_bytes - sum(v for v in self.components.values() if not is_missing(v))

    @property
    def fits(self) -> bool:
        """The known total within the device's memory (with `unknown` components: the known part)."""
        return self.total_bytes <= self.device_memory_bytes

    @property
    def headroom_bytes(self) -> float:
        return self.device_memory_bytes - self.total_bytes

    @property
    def bound_tokens_per_s(self) -> float:
        """Per device (rank): its micro-batch's tokens over the bound step time (samples when
        `unit` is "samples")."""
        return self.tokens / self.bound_step_s if self.bound_step_s > 0 else NaN

    @property
    def world_size(self) -> int:
        return self.parallel["world_size"] if self.parallel else 1

    @property
    def bound_mfu(self) -> float:
        """The MFU the step would have at its speed of light: model FLOPs over the bound's time.
        NaN for an analytic plan: its bound is those FLOPs at the peak, 100% by construction."""
        if not self.peak_tflops or not self.bound_step_s > 0 or self.method != "fake step":
            return NaN
        return self.model_flops / self.bound_step_s / 1e12 / self.peak_tflops

    def to_frame(self):
        """The memory as a DataFrame: component, GiB, share of the device."""
        import pandas as pd

        rows = [(k, v) for k, v in self.components.items()] + [(k, b) for k, (b, _) in self.fixed.items()]
        if not is_missing(self.other_bytes):   # the rows then sum to the total
            rows.insert(len(self.components), ("other at the peak" if self.other_bytes >= 0 else
                                               "less, not alive at the peak", self.other_bytes))
        df = pd.DataFrame(rows, columns=["component", "bytes"])
        return df.assign(GiB=df.bytes / GiB, share_of_device=df.bytes / self.device_memory_bytes)

    def __repr__(self) -> str:
        return to_text(self)

    def _repr_html_(self) -> str:
        import html

        return f"<pre style='font-size:12px'>{html.escape(to_text(self))}</pre>"


def memory_rows(p: Plan) -> list[str]:
    """The plan's peak and its rows, which sum to it: the components, what else the peak holds (or
    what of the components it does not), the fixed costs."""
    rows = []
    if not is_missing(p.peak_bytes):
        # the components are not the peak's parts (gradients T4's gpt2-124m plan listed whole were
        # partly made at its backward peak): said, and what else the peak holds is a row, so that
        # the rows sum to the peak
        rows.append(f"  peak       {fmt_gib(p.peak_bytes, 3)} at {p.peak_at} + fixed costs; the components "
                    "(each its largest over the step, not all alive at the peak) and the rest of the peak:")
    w = max(17, *map(len, [*p.components, *p.fixed]))   # one name column: 'hipblaslt_workspace' is 19 wide
    for k, v in p.components.items():
        if is_missing(v):
            rows.append(f"    {k:<{w}}{'unknown':>14}")
        elif v:
            rows.append(f"    {k:<{w}}{fmt_gib(v, 3):>14}")
    if not is_missing(p.other_bytes) and p.other_bytes >= 0:
        rows.append(f"    {'other at the peak':<{w}}{fmt_gib(p.other_bytes, 3):>14}  (the peak less the rows above, "
                    "not broken down: temporaries no component owns, e.g. the loss's gradient over the vocabulary, "
                    "less component bytes not alive at the peak)")
    elif not is_missing(p.other_bytes):   # a figure is never printed negative: the row says it is taken off
        rows.append(f"    {'less, not alive':<{w}}{fmt_gib(-p.other_bytes, 3):>14}  (the rows above less the peak: "
                    "component bytes, each counted at its own largest, that the peak does not hold)")
    for k, (b, src) in p.fixed.items():
        rows.append(f"    {k:<{w}}{fmt_gib(b, 3):>14}  ({src})")
    return rows


def to_text(p: Plan) -> str:
    s = p.setting
    head = (f"plan · {p.model} on {p.device} · {s.precision}"
            + (f" (weights {s.weights})" if s.weights else "")
            + (f" · micro-batch {s.micro_batch} x {s.seq_len}" if p.unit == "tokens"
               else f" · micro-batch {s.micro_batch} samples")
            + (" · checkpointing" if s.checkpointing else "") + f" · {s.optimizer}")
    verdict = "fits" if p.fits else "does NOT fit"
    if p.parallel:
        par = p.parallel
        gpus = f"{par['world_size']} GPU{'s' if par['world_size'] > 1 else ''}"
        head += (f" · {par['kind']} over {gpus}" + (f" on {par['nodes']} nodes" if par["nodes"] > 1 else "")
                 + " (per rank)")
    head += f" · {p.method}"
    known = f"at least {fmt_gib(p.total_bytes)} ({', '.join(p.unknown)} unknown)" if p.unknown else \
        fmt_gib(p.total_bytes)
    lines = [head, f"  memory     {known} of {fmt_gib(p.device_memory_bytes)}: {verdict}"
             f" ({fmt_gib(abs(p.headroom_bytes))} {'free' if p.fits else 'over'})"]
    notes = p.notes
    if p.method != "fake step" and notes:   # how it was computed, first
        lines.insert(1, f"  method     {notes[0]}")
        notes = notes[1:]
    lines += memory_rows(p)
    for change, total, fits, flops in p.alternatives:
        lines.append(f"  try        {change}: {fmt_gib(total)}, {'fits' if fits else 'still over'}"
                     + (f", {fmt_pct(flops - 1, 0, signed=True)} FLOPs per token" if abs(flops - 1) > 0.005 else ""))
    if p.advice:
        best = ", the best 3" if len(p.advice) > 3 else ""
        order = "by expected tokens/s per GPU" if any(not is_missing(o.tokens_per_s) for o in p.advice) else \
            (f"no expected speed on {p.device} (a note says which figure is missing): fits with room first, "
             "then fewer GPUs")
        lines.append(f"  advice     {len(p.advice)} combination(s) that fit{best}, {order} (plan.advice):")
    for i, o in enumerate(p.advice[:3], 1):
        rate = "no expectation" if is_missing(o.tokens_per_s) else \
            "expected " + fmt_rate(o.tokens_per_s, f"{p.unit}/s") + (" per GPU" if o.gpus > 1 else "")
        lines.append(f"    {i}. {o.label}: {fmt_gib(o.total_bytes)} ({fmt_gib(p.device_memory_bytes - o.total_bytes)}"
                     f" free), {rate}")
        lines += [f"         caveat: {n}" for n in o.notes]
    if p.max_micro_batch is not None:
        lines.append(f"  largest micro-batch that fits: {p.max_micro_batch}" if p.max_micro_batch else
                     "  largest micro-batch that fits: none (not even 1)")
    if not is_missing(p.bound_step_s):
        per_gpu = " per GPU" if p.parallel else ""
        lines.append(f"  bound      step >= {fmt_ms(p.bound_step_s, us_below_ms=True)}: "
                     f"<= {fmt_rate(p.bound_tokens_per_s, f'{p.unit}/s')}{per_gpu}"
                     + (f", MFU <= {fmt_pct(p.bound_mfu)}" if not is_missing(p.bound_mfu) else "")
                     + " (upper bounds, not predictions)")
    elif p.peak_tflops is None:
        lines.append(f"  bound      none: {p.device} lists no {s.compute} peak (the notes say what it runs instead)")
    e = p.expected
    if e is not None:
        rate = fmt_rate(e.tokens_per_s, f"{p.unit}/s")
        lines.append(f"  expected   step {fmt_ms(e.step_s, us_below_ms=True)}: {rate}"
                     + (" per GPU" if p.parallel else "") + (f", MFU {fmt_pct(e.mfu)}" if not is_missing(e.mfu) else "")
                     + " (what a well-written run reaches: plan.expected.by_op)")
    if p.comm:
        lines.append(f"  comm       {fmt_ms(p.comm_s, us_below_ms=True)} per step at the links' bandwidth ("
                     + ", ".join(f"{k} {fmt_ms(t, us_below_ms=True)}" for k, t in p.comm.items()) + f"); compute "
                     f"{fmt_ms(p.compute_bound_s, us_below_ms=True)}: the bound takes the longer (perfect overlap)")
    if p.bound_by:
        lines.append("  bound by   " + ", ".join(f"{op} {fmt_ms(t, us_below_ms=True)}" for op, t in p.bound_by[:4]))
    lines += [f"  note       {n}" for n in notes]
    return "\n".join(lines)


def thin_timeline(samples, most: int = 600) -> list:
    """At most ``most`` (phase, bytes) points of a plan's timeline, keeping each stretch's highest."""
    if len(samples) <= most:
        return list(samples)
    size = -(-len(samples) // most)
    return [max(samples[i:i + size], key=lambda s: s[1]) for i in range(0, len(samples), size)]
