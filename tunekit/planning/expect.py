"""A plan's expectation: the device's figures (its GPU row's, read by `core.efficiency`, for a GPU,
this machine's measured MAMF sweep, step-like bandwidth and time per op for the CPU) put to the op
records of the plan's one counting pass (core.expected)."""
from __future__ import annotations

from tunekit.core import registry
from tunekit.core.efficiency import (
    ATTENTION_KERNELS,
    DDP_BUCKET_BYTES,
    FOREACH_TENSORS,
    OPTIMIZER_OPS,
    Figures,
    gpu_figures,
)
from tunekit.core.expected import OPTIMIZER_ROW, expect
from tunekit.core.notes import Note
from tunekit.planning.fsdp_work import FSDP1_AUTOCAST, FSDP2, FSDP_VERSIONS, fsdp_records


def cpu_figures(peak: float | None, compute: str, say=None) -> Figures:
    """This CPU's figures: its matmuls as a step runs them by size (measure.stream; the calibrated
    MAMF sweep above those sizes) and a linear layer's by shape class (tokens x features, in its
    three layouts), its step-like bandwidth by size (inputs in a core's cache, in the last-level
    cache, in memory: by the cache sizes sysfs lists) and its time per small op, each
    measured once and cached, and read from the cache as they are (``busy`` names those taken on a
    busy machine): a plan is a function of its setting and these records, whatever the load now.
    ``measure_stream(refresh=True)`` and ``calibrate(dtype, "cpu", force=True)`` measure them again.
    ``say``: told how far a first measurement of the step figures is, round by round (a plan's progress)."""
    from tunekit.measure.peaks import calibrate
    from tunekit.measure.rng import measure_rng
    from tunekit.measure.stream import cache_bytes, cache_levels, measure_stream

    # the dtypes a CPU is calibrated in
    dtype = compute if compute in (registry.FP32, registry.BF16) else registry.FP32
    cal = calibrate(dtype, "cpu")
    stream = measure_stream(say=None if say is None else lambda news: say(f"this CPU's step figures, {news}"))
    rng = measure_rng()
    # step-like matmuls (operands from memory, outputs kept) up to the stream's largest size; the
    # MAMF sweep's (hot, repeated) only above it, where compute outweighs the trips to memory
    best = dict(stream.matmuls.get(dtype, []))
    top = max(best, default=0)
    best.update({m: t for m, _, _, t in cal.sweep if m > top})
    return Figures(name="cpu", peak_tflops=peak, mamf_tflops=cal.tflops,
                   mamf_source=f"this CPU's {dtype} matmuls as a step runs them, measured ({stream.verdict}), "
                               f"and its calibrated MAMF sweep above {top} ({cal.verdict})", bandwidth_tbs=None,
                   bandwidth_source=f"this CPU's bandwidth by size: multiplies whose outputs autograd keeps, "
                                    f"measured ({stream.verdict})",
                   launch_s=stream.op_s, launch_source=f"this CPU's time per small op, measured ({stream.verdict})",
                   host_bound=True, mamf_sweep=tuple(sorted(best.items())), bandwidth_sweep=tuple(stream.sweep),
                   cold_sweep=tuple(stream.cold), cache_bytes=cache_bytes(),
                   cold_source=f"this CPU's bandwidth by size: multiplies reading tensors written before the cache "
                               f"was flushed, as a backward reads what the forward saved, measured ({stream.verdict})",
                   transcendental_rate=stream.gelu.get(dtype), rng_rate=rng["rates"].get(dtype),
                   rng_source=f"this CPU's {dtype} bernoulli_ (dropout's random fill) elements per second, "
                              f"measured ({rng['verdict']})", view_s=stream.view_s, module_s=stream.module_s,
                   host_source=f"this CPU's time per view op and per module call, measured ({stream.verdict})",
                   checkpoint_s=stream.checkpoint_s, matmul_shapes=tuple(stream.shapes.get(dtype, ())),
                   shape_source=f"this CPU's {dtype} linear-layer matmuls by shape class (tokens x features, "
                                f"forward, input and weight gradients), measured ({stream.verdict})",
                   warm_sweep=tuple(stream.warm), l2_bytes=cache_levels().get(2),
                   warm_source=f"this CPU's bandwidth by size: multiplies reading tensors a core's L2 no longer "
                               f"holds (its L3 does), measured ({stream.verdict})",
                   checkpoint_source=f"this CPU's time of torch's non-reentrant checkpoint per segment and per "
                                     f"tensor its recompute saves, measured ({stream.verdict})",
                   attention={"cpu": (stream.attention[dtype] / peak if peak else 0.0,
                                      f"this CPU's causal SDPA forward + backward, measured ({stream.verdict})")},
                   busy=tuple(what for what, c in (("tunekit.measure.stream.measure_stream(refresh=True)", stream),
                                                   (f"tunekit.calibrate({dtype!r}, 'cpu', force=True)", cal))
                              if taken_busy(c.conditions))
                   + (("tunekit.measure.rng.measure_rng(refresh=True)",) if rng["verdict"] == "busy" else ()))


def expected_of(step, setting, dev, tokens: int, model, comm: dict, layout: dict | None, units: int,
                kernel: str | None = None, say=None, fsdp: str = FSDP2):
    """(the Expected, or None, and the notes: what is missing or not modelled). ``kernel``: the fused
    attention kernel on a GPU (core.efficiency.ATTENTION_KERNELS; None: "flash" at half precision).
    ``fsdp``: the FSDP a sharded step runs, whose own copies, casts and divides each micro-step add
    memory-bound records (`sharded_work`).
    ``say``: told how far a first measurement of this CPU's figures is (`cpu_figures`)."""
    compute = setting.compute
    if dev.peak is None and dev.name != "cpu":   # no peak for the dtype: its device.no_peak note says so
        return None, []
    if dev.name == "cpu":
        fig = cpu_figures(dev.peak, compute, say)
    else:
        fig = gpu_figures(dev.name, compute, dev.peak, dev.bandwidth, bool(setting.compile))
    missing = fig.missing()
    if missing:
        todo = "" if fig.host_bound else (
            ". No measured card of its chip and memory kind to borrow from: measure them on the card "
            f"(tunekit.calibrate({compute!r}) for the MAMF, a large device-to-device copy's bytes read and written "
            "over its time for the bandwidth) and add them with their source to its row in tunekit/core/gpus.py "
            "(mamf, bandwidth_share)")
        notes = [Note("expected.missing", f"no expected step on {fig.name} ({compute}): tunekit has no figure "
                                          f"for {' nor '.join(missing)}; the bound stands alone{todo}")]
        other = None if fig.host_bound else precision_with_figures(dev.name, compute, dev.bandwidth,
                                                                   bool(setting.compile))
        if other is not None:
            notes.append(Note("expected.other_precision",
                              f"{fig.name} has an expected step in {other}: plan with "
                              f"precision={other!r} (tunekit.plan(..., {fig.name!r}, precision={other!r}), "
                              f"lab.plan({fig.name!r}, precision={other!r}))"))
        return None, notes
    borrowed = [Note("expected.borrowed", f"{fig.name} has no measurement of its own: {b}") for b in fig.borrowed]
    trained = [p for p in model.parameters() if p.requires_grad]
    params = sum(p.numel() for p in trained)
    param_bytes = trained[0].element_size() if trained else 4
    grad_bytes = registry.dtype(setting.grads).bytes
    opt = registry.optimizer(setting.optimizer)
    shard = layout["shard"] if layout else 1
    # the state the fake step's optimizer made (Adafactor's factored moments: far below a byte per
    # parameter), else the registry's count over the parameters' shapes
    made = (getattr(step, "components", None) or {}).get("optimizer_states")
    shapes = [tuple(p.shape) for p in trained]
    state = made if made is not None and made >= 0 else opt.state_bytes_of(shapes, param_bytes)
    per_tensor = OPTIMIZER_OPS.get(opt.name, OPTIMIZER_OPS["adamw"])
    # the CPU runs the single-tensor update; CUDA's foreach/fused launches take 36 tensors each
    kernels = per_tensor * (len(trained) if fig.host_bound else -(-len(trained) // FOREACH_TENSORS))
    ops = step.ops + sharded_work(step, setting, layout, fsdp)
    backend = None
    if any(r[1] == "attention" for r in ops):
        half = compute in (registry.BF16, registry.FP16)
        backend = "cpu" if fig.host_bound else kernel or ("flash" if half else "efficient")
    kind = layout["kind"] if layout else None
    buckets = int(params * grad_bytes // DDP_BUCKET_BYTES[0]) + 1
    out = expect(ops, fig, tokens=tokens, model_flops=step.model_flops, backend=backend, params=params / shard,
                 param_bytes=param_bytes, grad_bytes=grad_bytes, state_bytes=state / shard,
                 optimizer_kernels=kernels, comm=comm, parallel=kind, units=buckets if kind == "ddp" else units,
                 fuse=bool(setting.compile), host_calls=step.host)
    # which kernel each row is (lab.expect carries a measured factor only to the same): the update's
    # runs on the parameters, their gradients and states
    update = f"{str(trained[0].dtype).removeprefix('torch.') if trained else 'float32'} params, {setting.grads} grads"
    out.dtypes = kernel_dtypes(ops, update)
    out.kernels = kernel_keys(ops)
    notes = list(out.notes)
    if backend and not fig.host_bound and backend not in (fig.attention or {}):
        notes.append(f"no published {backend} attention figure for {fig.name}: attention expected at its MAMF")
    elif backend and not fig.host_bound:
        notes.append(f"attention expected at {ATTENTION_KERNELS.get(backend, backend)}'s published throughput "
                     f"by head dim and sequence ({fig.attention[backend][1]})")
    if setting.compile:
        notes.append("compile=True: each run of memory-bound ops between matmuls expected as one fused kernel "
                     "(what it reads from outside, what is read after it), at the compiled launch cost")
    if len(ops) > len(step.ops):
        notes.append(f"{fsdp}: FSDP's own copies, casts and divides each micro-step, as {FSDP_VERSIONS[fsdp]} "
                     "does them, at the streaming bandwidth (the rows named after it)")
    out.notes = notes
    return out, borrowed + ([busy_note(fig)] if fig.busy else [])


def sharded_work(step, setting, layout: dict | None, fsdp: str = FSDP2) -> list:
    """FSDP's own op records in one micro-step of ``step`` sharded as ``layout`` says (none for one device
    or DDP): planning.fsdp_work's, the gathered parameters in the compute dtype (the weights' for
    fsdp1_autocast), gradients reduced in the weights' dtype (tunekit's FSDP2) or the compute dtype (FSDP1's
    MixedPrecision as Composer sets it)."""
    if layout is None or layout["kind"] == "ddp":
        return []
    weights = setting.weights or registry.FP32
    param = weights if fsdp == FSDP1_AUTOCAST else setting.compute
    reduce = setting.grads if fsdp == FSDP2 else setting.compute
    return fsdp_records(fsdp, step.units, layout["shard"], 1 if layout["kind"] == "fsdp_grad_op" else 2, weights,
                        param, reduce, setting.grad_accum or 1)


def taken_busy(conditions) -> bool:
    """Whether a calibration's conditions were busy, whatever priority its trials ran at: trials ahead
    of the load at real-time priority still share the host: on the 2-vCPU VM beside other work, two fresh
    caches so taken had every interleaved round of one 5-29% slower (benchmarks/bench_calibration.py's
    per-round profile, 2026-12-07)."""
    return conditions is not None and conditions.verdict == "busy"


def busy_note(fig: Figures) -> Note:
    """The note of an expectation made from calibrations taken on a busy machine (``fig.busy``)."""
    return Note("expected.busy_figures", "expected from this CPU's figures as calibrated on a busy machine (their "
                                         "records' conditions say so, even where their trials ran ahead of the "
                                         "load), so possibly slow: at a quiet moment, run "
                                         f"{' and '.join(fig.busy)}, then plan again")


def kernel_dtypes(ops, update: str | None = None) -> dict:
    """{op name: its records' dtype signatures, sorted} of a step's op records (`dtype_signature`;
    records without one are left out); ``update``: the optimizer's update's (core.expected's ``OPTIMIZER_ROW``
    row, made of no record: the parameters', gradients' and states' dtypes)."""
    seen: dict = {}
    for rec in ops:
        if len(rec) > 8:
            seen.setdefault(rec[0], set()).add(rec[8])
    out = {name: tuple(sorted(sigs)) for name, sigs in seen.items()}
    if update:
        out[OPTIMIZER_ROW] = (update,)
    return out


def kernel_keys(ops) -> frozenset:
    """(kind, dtype signature, op, phase, dims) of each matmul and attention kernel a step's op records
    run: what a CPU's kernel library makes once per process and keeps (a oneDNN primitive per shape:
    measure.first_use); records without a signature or dims are left out."""
    return frozenset((rec[1], rec[8], rec[0], rec[2], rec[5]) for rec in ops
                     if len(rec) > 8 and rec[1] in ("matmul", "attention") and rec[5] is not None)


def precision_with_figures(name: str, compute: str, bandwidth: float | None, compiled: bool) -> str | None:
    """The first training precision (bf16, fp16, tf32) other than ``compute`` whose figures GPU
    row ``name`` has for an expected step (a peak, a MAMF and a bandwidth, its own or borrowed);
    None where it has none."""
    from tunekit.core import specs

    row = specs.gpu(name)
    for other in (registry.BF16, registry.FP16, registry.TF32):
        peak = row.tflops.get(other)
        if other != compute and peak and not gpu_figures(name, other, peak, bandwidth, compiled).missing():
            return other
    return None
