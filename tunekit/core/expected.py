"""What a well-written run of a planned step reaches: each op of the plan's fake step at the
speed its kind reaches on the device (`core.efficiency`), the optimizer's update, and the
collectives less what overlaps. Pure: op records and figures in, an `Expected` out.

An op record is ``(name, kind, phase, flops, bytes, dims, itemsize[, io[, dtypes]])`` as the plan's counter
keeps it (planning/ops.RooflineCounter): ``kind`` "matmul", "attention", "flops" (another op
with a FLOP formula) or "memory"; ``dims`` (m, k, n, batch) for a matmul, (seq_q, seq_k,
head_dim, batch x heads) for an attention; ``phase`` "forward" or
"backward"; ``io`` its inputs' and outputs' ((storage, bytes), ...), for a compiled step's fusion;
``dtypes`` which kernel it is by its tensors' dtypes (planning.ops.dtype_signature).

- matmul: FLOPs at the device's matmul rate at transformer training shapes where its GPU row has
  one (`core.gpu.GPU.gemm`), else its MAMF, less the waves a tiled kernel leaves idle and the
  tensor-core loss of a dimension that is not a multiple of 8, or its bytes at the streaming
  bandwidth when that takes longer; on a CPU, a linear layer's matmul at its shape class's measured
  rate (tokens x features, forward / input gradient / weight gradient: `shape_class`) inside the
  measured grid, else the measured cube sweep at the cube root of m k n;
- attention: FLOPs at the fused kernel's published share of the peak for the backend, by head dim
  and sequence length (`core.efficiency.attention_share`);
- every other op: its bytes (inputs read, outputs written) at the streaming bandwidth; on a CPU,
  by size, and slower where it reads a tensor a core's L2 no longer holds (the L3 sweep) or the
  last-level cache no longer holds (the cold sweep): its reuse distance over the step's op records
  against the cache sizes (`reuse_bytes`, `cache_level`); dropout's random fill (`RNG`) and GELU-class
  ops at their measured elements per second where that takes longer;
- a compiled step (``fuse``): each run of memory-bound ops between two matmuls is one kernel that
  reads what the run did not make and writes what is read after it (or by nobody: a gradient);
- each kernel at least the host's time to launch it (a GPU: the longer of the two, the host
  runs ahead; a CPU: the two add up, the host is the device);
- on a CPU, the host's time for what launches no kernel: each view or metadata op and each module
  call at its measured time, and torch's checkpoint per recomputed segment and saved tensor (the
  model's other Python is not modelled);
- the optimizer: its update reads and writes each parameter, gradient and state once;
- collectives: at the links' bandwidth, hidden behind the compute they overlap with (DDP's
  buckets behind backward, FSDP's prefetched gathers behind forward and backward) but the last
  bucket's or first unit's; the compute they overlap with runs slower by a measured average
  (`core.efficiency.OVERLAP_SLOWDOWN`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from tunekit.core.efficiency import (
    ALIGN,
    MISALIGNED,
    OVERLAP_SLOWDOWN,
    RNG,
    TRANSCENDENTAL,
    WAVE_SOURCE,
    Figures,
    attention_share,
    log_interpolated,
    wave_efficiency,
)
from tunekit.core.units import is_missing

NaN = math.nan


@dataclass
class Expected:
    """A planned step's expected time and rates: what a good run of this shape reaches here.

    Example: ``p = tunekit.plan(cfg, "H100 SXM"); p.expected.tokens_per_s, p.expected.by_op``."""

    step_s: float
    tokens_per_s: float                 # per GPU (rank)
    mfu: float
    rows: list = field(default_factory=list)   # (op, category, calls, seconds, bound, source)
    notes: list = field(default_factory=list)
    comm_exposed_s: float = 0.0
    # op -> the dtype signatures its kernels ran at (planning.ops.kernel_dtypes); {}: not known
    dtypes: dict = field(default_factory=dict)
    # (kind, dtype signature, op, phase, dims) of its matmul and attention kernels (planning.expect.kernel_keys)
    kernels: frozenset = frozenset()

    @property
    def by_op(self):
        """A DataFrame: op (or category), category (matmul, attention, compute, memory-bound,
        optimizer, communication; host: a CPU's time with no kernel running), calls, expected_s,
        share of the step, what bounds it (compute / memory / launch / communication) and the
        source of its constant."""
        import pandas as pd

        df = pd.DataFrame(self.rows, columns=["op", "category", "calls", "expected_s", "bound", "source"])
        df["share"] = df.expected_s / self.step_s if self.step_s > 0 else NaN
        return df.sort_values("expected_s", ascending=False, ignore_index=True)[
            ["op", "category", "calls", "expected_s", "share", "bound", "source"]]

    def __repr__(self) -> str:
        from tunekit.core.fmt import fmt_ms, fmt_pct, fmt_rate

        top = sorted(self.rows, key=lambda r: -r[3])[:4]
        rate = fmt_rate(self.tokens_per_s, "tokens/s")
        return (f"expected step {fmt_ms(self.step_s, us_below_ms=True)}, {rate} per GPU, "
                f"MFU {fmt_pct(self.mfu)}; most: " + ", ".join(f"{r[0]} {fmt_ms(r[3], us_below_ms=True)}" for r in top))


def shape_class(dims, phase: str | None) -> tuple | None:
    """(layout, tokens, features) of a linear layer's matmul (m, k, n, batch) in its step phase, as
    measure.step_compute's shape trials name them: the forward's (tokens x in) @ (in x out) is
    "forward" (tokens m); a backward matmul reducing over its longest dimension k is the weight's
    gradient, "weight" (tokens k), else the input's, "input" (tokens m); the features are the other
    two dimensions' geometric mean. None for a batched matmul (attention's) or an unknown phase."""
    m, k, n, batch = dims
    if batch != 1 or phase not in ("forward", "backward"):
        return None
    if phase == "backward" and k > max(m, n):
        return "weight", k, math.sqrt(m * n)
    return ("forward" if phase == "forward" else "input"), m, math.sqrt(k * n)


def matmul_tflops(fig: Figures, dims, itemsize: int, phase: str | None = None) -> tuple[float, str]:
    """(TFLOPS one matmul of these dims reaches, where the figure comes from): a linear layer's shape
    class where the device measured it (`Figures.shape_tflops`), else the cube sweep at the cube root
    of one call's work (`call_size`); a GPU's at its figure for training shapes (`Figures.gemm_tflops`)
    or its MAMF, less the idle waves."""
    m, k, n, batch = dims
    cls = shape_class(dims, phase) if fig.matmul_shapes else None
    rate = fig.shape_tflops(*cls) if cls else None
    if rate:
        return rate, fig.shape_source
    if fig.mamf_sweep:   # a calibrated device: its sweep at the call's cube-root size, read in log-log
        return log_interpolated(fig.mamf_sweep, call_size(dims)), fig.mamf_source
    base, src = (fig.gemm_tflops, fig.gemm_source) if fig.gemm_tflops else (fig.mamf_tflops, fig.mamf_source)
    tflops = base * wave_efficiency(m, n, batch, fig.sms)
    if fig.sms:
        src += "; " + WAVE_SOURCE
    if itemsize <= 2 and any(d % ALIGN for d in (m, k, n)):
        tflops *= MISALIGNED[0]
        src += "; " + MISALIGNED[1]
    return tflops, src


def call_size(dims) -> float:
    """The cube a matmul call's work is read at in a CPU's sweep: the cube root of ``batch`` x m x k x n.
    A batched matmul (eager attention's bmm) is one call: its matrices share the dtype kernel's fixed
    cost, which the sweep's small cubes pay per matrix (bf16's bmm read at one matrix's cube root was
    priced 1.6-2.1x fp32's time where it ran 0.5-1.0x: benchmarks/RESULTS.md, the afternoon session)."""
    m, k, n, batch = dims
    return (max(batch, 1) * m * k * n) ** (1 / 3)


def cold_reads(ops, cache_bytes: float | None) -> list:
    """Per op record: whether it reads a tensor last touched more than ``cache_bytes`` ago (the
    bytes the ops between moved: its reuse distance, `reuse_bytes`), so from memory rather than the
    last-level cache. All False without a cache size or without the records' ``io``."""
    if not cache_bytes:
        return [False] * len(ops)
    return [d > cache_bytes for d in reuse_bytes(ops)]


def reuse_bytes(ops) -> list:
    """Per op record: the longest reuse distance of its inputs, the bytes the ops between moved since
    each was last touched; a tensor first read in the step (a parameter, the batch) counts as touched
    a whole step ago; 0 for a record without ``io``."""
    step_bytes = sum(rec[4] for rec in ops)
    touched: dict = {}
    moved, out = 0.0, []
    for rec in ops:
        if len(rec) <= 7:
            out.append(0.0)
            moved += rec[4]
            continue
        ins, outs = rec[7]
        out.append(max((moved - touched.get(sid, moved - step_bytes) for sid, _ in ins), default=0.0))
        moved += rec[4]
        for sid, _ in ins + outs:
            touched[sid] = moved
    return out


def cache_level(fig: Figures, rec, distance: float) -> str:
    """Where an op reads its inputs from, by their reuse distance: "cold" (memory) past the last-level
    cache, where a cold sweep was measured; "warm" (the L3) past both a core's L2 and the op's own
    bytes (the hot sweep's chain reads what the op before it wrote), where a warm sweep was; else "hot"."""
    if fig.cold_sweep and fig.cache_bytes and distance > fig.cache_bytes:
        return "cold"
    if fig.warm_sweep and fig.l2_bytes and distance > max(fig.l2_bytes, rec[4]):
        return "warm"
    return "hot"


HALF_AS_FP32 = 4   # bytes a CPU's elementwise kernel computes a 2-byte element at (see `fp32_width`)


def fp32_width(fig: Figures, kind: str, moved: float, itemsize: int) -> float:
    """The bytes a memory-bound op is timed by: on a CPU (``fig.host_bound``) a 2-byte (bf16/fp16)
    op's at 4 bytes an element, its fp32 twin's. ATen's CPU kernels compute half elements in fp32
    vectors, converting each load and store (``binary_op_as_fp32`` in torch 2.13.0's
    include/ATen/cpu/vec/vec512/vec512_bfloat16.h), so halving the bytes does not halve the time:
    this CPU ran a bf16 mul/add/silu of 256 x 344 elements at 1.15-1.26x its fp32 time, a cast of a
    344 x 128 weight to bf16 in 7 us against 11 us for an fp32 mul of twice its elements (helper
    bf16cpu42's interleaved micro-benchmark, 2026-12-07, under load: ratios). The bandwidth sweeps
    were measured in fp32 multiplies: a half op read at their rate moved half the time it takes."""
    if fig.host_bound and kind not in ("matmul", "attention", "flops") and itemsize == 2:
        return moved * HALF_AS_FP32 / itemsize
    return moved


def op_seconds(fig: Figures, rec, backend: str | None, cold: bool | str = False) -> tuple[float, str, str]:
    """(seconds, bound, source) of one op record on the device, its launch aside. ``cold``: it reads
    from memory what the cache no longer holds (`cold_reads`), at the cold sweep where there is one;
    or where it reads from, by `cache_level` ("hot", "warm", "cold")."""
    name, kind, phase, flops, moved, dims, itemsize = rec[:7]
    level = cold if isinstance(cold, str) else ("cold" if cold else "hot")
    cold, warm = level == "cold" and bool(fig.cold_sweep), level == "warm" and bool(fig.warm_sweep)
    moved = fp32_width(fig, kind, moved, itemsize)
    mem_s = moved / (fig.tbs_at(moved, cold, warm) * 1e12)
    mem_src = fig.cold_source if cold else fig.warm_source if warm else fig.bandwidth_source
    if kind == "matmul" and dims:
        tflops, src = matmul_tflops(fig, dims, itemsize, phase)
    elif kind == "attention" and fig.attention and backend in fig.attention:
        rows, src = fig.attention[backend]
        head_dim, seq = (dims[2], dims[1]) if dims else (None, None)
        share = rows if isinstance(rows, (int, float)) else attention_share(rows, head_dim, seq)
        tflops = share * fig.peak_tflops
    elif kind in ("matmul", "flops", "attention") and fig.mamf_tflops:
        tflops, src = fig.mamf_tflops, fig.mamf_source + (" (no figure for this attention backend: a matmul's)"
                                                          if kind == "attention" else "")
    else:
        if fig.rng_rate and name in RNG and len(rec) > 7:
            compute_s = sum(b for _, b in rec[7][1]) / max(itemsize, 1) / fig.rng_rate
            if compute_s > mem_s:
                return compute_s, "compute", fig.rng_source
        if fig.transcendental_rate and name in TRANSCENDENTAL and len(rec) > 7:
            elements = sum(b for _, b in rec[7][1]) / max(itemsize, 1)
            compute_s = elements / fig.transcendental_rate
            if compute_s > mem_s:
                return compute_s, "compute", "this CPU's GELU rate, measured (transcendental ops)"
        return mem_s, "memory", mem_src
    flop_s = flops / (tflops * 1e12)
    return (flop_s, "compute", src) if flop_s >= mem_s else (mem_s, "memory", mem_src)


def optimizer_bytes(params: float, param_bytes: int, grad_bytes: int, state_bytes: float) -> float:
    """Bytes an elementwise optimizer update moves: parameters and state read and written, gradients read."""
    return params * (2 * param_bytes + grad_bytes) + 2 * state_bytes


def expect(ops, fig: Figures, *, tokens: int, model_flops: float, backend: str | None, params: float,
           param_bytes: int, grad_bytes: int, state_bytes: float, optimizer_kernels: int, comm: dict | None = None,
           parallel: str | None = None, units: int = 1, fuse: bool = False,
           host_calls: dict | None = None) -> Expected | None:
    """The expected step; None when the figures the ops need are missing (`Figures.missing`).
    ``fuse``: a compiled step, its memory-bound ops fused (`fused`). ``host_calls``: the step's
    counts of what the host spends time on without a kernel of its own (`host_rows`), on a
    device the host waits for."""
    if fig.missing():
        return None
    if fuse:
        ops = fused(ops)
    table: dict = {}
    phase_s = {"forward": 0.0, "backward": 0.0}
    for rec, distance in zip(ops, reuse_bytes(ops)):
        work, bound, src = op_seconds(fig, rec, backend, cache_level(fig, rec, distance))
        t = work + fig.launch_s if fig.host_bound else max(work, fig.launch_s)
        if not fig.host_bound and fig.launch_s > work:
            bound, src = "launch", fig.launch_source
        phase_s[rec[2]] = phase_s.get(rec[2], 0.0) + t
        key = (rec[0], _category(rec[1]))
        calls, secs, by_bound = table.get(key, (0, 0.0, {}))
        t_b, _ = by_bound.get(bound, (0.0, src))
        by_bound[bound] = (t_b + t, src)
        table[key] = (calls + 1, secs + t, by_bound)
    rows = []
    for (op, cat), (calls, secs, by_bound) in table.items():
        bound = max(by_bound, key=lambda b: by_bound[b][0])   # what bounds most of its time, and its source
        rows.append((op, cat, calls, secs, bound, by_bound[bound][1]))
    rows += host_rows(fig, host_calls or {})
    moved = optimizer_bytes(params, param_bytes, grad_bytes, state_bytes)
    opt_cold = bool(fig.cold_sweep and fig.cache_bytes and moved > fig.cache_bytes)   # its state: from memory
    opt_s = moved / (fig.tbs_at(moved, cold=opt_cold) * 1e12)
    launches = optimizer_kernels * fig.launch_s
    opt_s = opt_s + launches if fig.host_bound else max(opt_s, launches)
    rows.append((OPTIMIZER_ROW, "optimizer", optimizer_kernels, opt_s, "memory",
                 fig.cold_source if opt_cold else fig.bandwidth_source))
    exposed, interference, notes = _exposed(comm or {}, phase_s, parallel, units)
    if exposed:
        rows.append(("collectives (exposed)", "communication", sum(1 for _ in comm), exposed, "communication",
                     "the links' bandwidth (spec table), less what overlaps with compute"))
    if interference:
        rows.append(("compute slowed by overlapped collectives", "communication", sum(1 for _ in comm),
                     interference, "communication", OVERLAP_SLOWDOWN[1]))
    step = sum(r[3] for r in rows)
    tps = tokens / step if step > 0 else NaN
    mfu = model_flops / step / 1e12 / fig.peak_tflops if (step > 0 and fig.peak_tflops) else NaN
    return Expected(step_s=step, tokens_per_s=tps, mfu=mfu, rows=rows, notes=notes, comm_exposed_s=exposed)


FUSED = "fused elementwise/reductions"
OPTIMIZER_ROW = "optimizer step"
HOST = "views, metadata ops, module calls"   # the host's time with no kernel of its own (a CPU)
CHECKPOINT = "checkpoint: saving, recomputing, unpacking"


def host_rows(fig: Figures, calls: dict) -> list:
    """The rows of a host-bound device's time with no kernel running, from the step's counts
    (planning/ops.RooflineCounter): ``no_kernel`` views and metadata ops and ``modules`` module
    calls at their measured times; ``segments`` checkpointed segments recomputed in the backward
    and the ``saved`` tensors their recompute saves, at the measured cost of torch's checkpoint per
    segment and per saved tensor (its hooks packing and unpacking each, beside the ops themselves)."""
    if not fig.host_bound:
        return []
    rows = []
    views, modules = calls.get("no_kernel", 0), calls.get("modules", 0)
    if fig.view_s is not None and fig.module_s is not None and views + modules:
        rows.append((HOST, "host", views + modules, views * fig.view_s + modules * fig.module_s, "launch",
                     fig.host_source))
    segments, saved = calls.get("segments", 0), calls.get("saved", 0)
    if fig.checkpoint_s is not None and segments:
        per_segment, per_tensor = fig.checkpoint_s
        rows.append((CHECKPOINT, "host", segments + saved, segments * per_segment + saved * per_tensor,
                     "launch", fig.checkpoint_source))
    return rows


def fused(ops) -> list:
    """The op records of a compiled step: each run of memory-bound ops (same phase, no matmul or
    attention between) becomes one record that reads the bytes of the storages the run did not
    make and writes those of its outputs read after the run, or never read in the step (a
    gradient, the loss). Records without ``io`` are kept as they are."""
    last_read: dict = {}
    for i, rec in enumerate(ops):
        if len(rec) > 7:
            for sid, _ in rec[7][0]:
                last_read[sid] = i
    out, run = [], []

    def close():
        if not run:
            return
        if len(run) == 1:
            out.append(ops[run[0]])
        else:
            made, reads, writes, seen = set(), 0, 0, set()
            for i in run:
                ins, outs = ops[i][7]
                for sid, nbytes in ins:
                    if sid not in made and sid not in seen:
                        seen.add(sid)
                        reads += nbytes
                for sid, _ in outs:
                    made.add(sid)
            written = set()
            for i in run:
                in_place = ops[i][0].endswith("_")   # writes into a storage that outlives the run (a gradient)
                for sid, nbytes in ops[i][7][1]:
                    needed = in_place or sid not in last_read or last_read[sid] > run[-1]
                    if needed and sid not in written:
                        written.add(sid)
                        writes += nbytes
            first = ops[run[0]]
            out.append((FUSED, "memory", first[2], 0, reads + writes, None, first[6]))
        run.clear()

    for i, rec in enumerate(ops):
        if rec[1] == "memory" and len(rec) > 7 and (not run or ops[run[0]][2] == rec[2]):
            run.append(i)
            continue
        close()
        if rec[1] == "memory" and len(rec) > 7:
            run.append(i)
        else:
            out.append(rec)
    close()
    return out


def _category(kind: str) -> str:
    return {"matmul": "matmul", "attention": "attention", "flops": "compute"}.get(kind, "memory-bound")


def _exposed(comm: dict, phase_s: dict, parallel: str | None, units: int) -> tuple[float, float, list]:
    """(seconds of the collectives not hidden behind compute, seconds the compute they overlap with
    loses, notes): DDP all-reduces bucket by bucket during backward (the last bucket after it), FSDP's
    gathers prefetched during forward and backward and its reduce-scatters during backward (the first
    gather before any compute). While a collective runs, its kernels hold SMs and memory bandwidth:
    the compute beside it runs ``OVERLAP_SLOWDOWN`` slower, so the C seconds hidden cost
    C * s / (1 + s) (the compute done in them is C / (1 + s) of its own time)."""
    total = sum(v for v in comm.values() if not is_missing(v))
    if not total or parallel is None:
        return 0.0, 0.0, []
    if parallel == "ddp":
        hidden_by, first = phase_s.get("backward", 0.0), total / max(units, 1)
    else:
        hidden_by, first = phase_s.get("forward", 0.0) + phase_s.get("backward", 0.0), total / max(2 * units, 1)
    exposed = max(0.0, total - hidden_by) + min(first, total)
    slow = OVERLAP_SLOWDOWN[0]
    interference = max(0.0, total - exposed) * slow / (1 + slow)
    return exposed, interference, [f"compute overlapped with collectives expected {slow:.1%} slower "
                                   f"({OVERLAP_SLOWDOWN[1]})"]


def agreement(expected_s: float, measured_s: float, verdict: str, tolerance: float = 0.2) -> str:
    """How a measured step stands against its expectation: "within" ``tolerance`` of it, "off", or
    "uncertain" when the machine was not quiet while either was measured (load only slows a run)."""
    if verdict != "quiet" or not (expected_s > 0 and measured_s > 0):
        return "uncertain"
    return "within" if abs(expected_s / measured_s - 1) <= tolerance else "off"
