"""One training step under fake tensors, measured by `measure_memory` and counted op by op for
the roofline (`count_into`: the counting pass alone, for a step measured without it); the
micro-batch search. What to change when a step does not fit: planning/advice.py."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, replace

import torch

from tunekit.core.expected import fused
from tunekit.core.formulas import MFU_ANALYTIC
from tunekit.core.notes import without
from tunekit.core.search import largest_fitting
from tunekit.core.units import is_missing
from tunekit.measure.live import LiveBytes
from tunekit.measure.memory import autocast_torch, measure_memory
from tunekit.measure.model_flops import tensors_in
from tunekit.measure.step import Observer, Watch, run_step
from tunekit.measure.tally import storage_key
from tunekit.measure.torch_private import fake_scalar_reads_for
from tunekit.models.adapters import adapt, step_loss
from tunekit.models.units import fsdp_units
from tunekit.planning.analytic import FakeStepError, fake_failure
from tunekit.planning.cuda_like import GpuKernels
from tunekit.planning.module import ModuleTarget
from tunekit.planning.ops import RooflineCounter, promoted_bytes
from tunekit.planning.optimizer import STAND_INS, plan_optimizer
from tunekit.planning.record import COMPONENTS


def batch_of(cfg, kind, micro_batch, seq_len):
    if isinstance(cfg, ModuleTarget):   # a module: its batch_fn's batches, else the tokens its config takes
        if cfg.batch_fn is not None:
            return cfg.batch(micro_batch, seq_len)
        cfg, kind = cfg.config, cfg.inner_kind
    vocab = cfg.vocab_size
    x = torch.randint(0, vocab, (micro_batch, seq_len))
    return x, (torch.randint(0, vocab, (micro_batch, seq_len)) if kind == "gpt" else x)


# the count's fields of a FakeStep (`_counted`: a pass without the optimizer, the same under any)
COUNTED = ("executed", "model_flops", "count_notes", "ops", "host")
HELD_ONLY = "not stepped: only its held bytes (planning.step._held)"   # a held-only step's peak_at


@dataclass
class FakeStep:
    """One planned step's figures. The live-bytes pass always fills the first group; the
    components (measure_memory's pass) and the count (FLOPs op by op) are None until a pass made
    them (`fake_step` with them, or `complete`)."""

    peak: float                       # the most bytes alive at once over a steady step
    peak_at: str                      # where: phase, module, op
    grads_at_peak: float              # the gradients' bytes alive there
    state_scalars: float              # the optimizer's 0-dim states (AdamW's steps: never sharded)
    phase_detail: dict                # phase -> (its peak bytes, where, the gradients alive there)
    phase_peaks: dict                 # phase -> its peak bytes
    timeline: list                    # (phase, live bytes) over the step
    units: list                       # the FSDP units (lists of parameter names)
    components: dict | None = None    # component -> bytes (planning.record.COMPONENTS)
    notes: list = field(default_factory=list)
    executed: float | None = None     # FLOPs executed (recompute included)
    model_flops: float | None = None  # the MFU convention's
    count_notes: list = field(default_factory=list)
    ops: list | None = None           # the counted ops (planning.ops.RooflineCounter.ops)
    host: object = None               # the host calls the count saw
    casts_at: dict = field(default_factory=dict)   # phase -> autocast's weight copies alive at its peak
    held: float = 0.0                 # parameters, buffers and optimizer state: alive the whole step
    all_grads: float = 0.0            # every gradient at once (the optimizer step's)

    def has(self, part: str) -> bool:
        """Whether the pass ``part`` ("components" or "ops") was made."""
        return getattr(self, part) is not None

    def per_op(self, peak, bw) -> dict:
        """Each op's roofline seconds at ``peak`` TFLOPS and ``bw`` TB/s, over its fused traffic
        (a bound holds for any implementation: a compiler's fused traffic, not eager's)."""
        out = {}
        for name, _kind, _phase, flops, moved, *_ in fused(self.ops):
            t = max(flops / (peak * 1e12) if peak else 0.0, moved / (bw * 1e12) if bw else 0.0)
            out[name] = out.get(name, 0.0) + t
        return out

    def bound_s(self, peak, bw) -> float:
        """The roofline's lower bound on the step (NaN with neither figure)."""
        return sum(self.per_op(peak, bw).values()) if (peak or bw) else math.nan

    def top(self, peak, bw, n: int | None = 6) -> list:
        """The ``n`` ops that take longest on the roofline, (op, seconds); n=None: every op."""
        if not (peak or bw):
            return []
        return sorted([kv for kv in self.per_op(peak, bw).items() if kv[1] > 0], key=lambda kv: -kv[1])[:n]


def fake_step(model, kind, cfg, setting, micro_batch, round_to: int = 1, count: bool = True,
              components: bool = True, say=None, held_only: bool = False) -> FakeStep:
    """One planned step: with ``components``, its components (measure_memory's code); its steady
    peak and where (a second step, tracked by LiveBytes) and, with ``count``, its FLOPs op by op
    for the roofline (a third: torch's FLOP counter keeps tensors alive, so it never runs beside
    the live-bytes tracking; on an 8B Llama it would add 20 GB to the peak). A step left without
    its components or its count gets them later (`complete`), only where they are read: the
    advice's single-GPU totals read the peak alone. ``say(text)``: told each pass and phase (the
    plan's progress). `FakeStepError` (a ValueError) saying why when a fake tensor cannot take it
    (a value read, a value-dependent shape). ``held_only``: no live-bytes pass, only what `in_param_dtype`
    reads of a step it replaces (`_held`)."""
    say = say or _quiet
    return FakeStep(**_guarded(model, kind, setting, lambda: _fake_step_of(
        model, kind, cfg, setting, micro_batch, round_to, count, components, say, held_only)))


def complete(model, kind, cfg, setting, micro_batch, step: FakeStep, parts=("components", "ops"),
             say=None) -> FakeStep:
    """``step`` (a `fake_step` run without its components or its count) with those of ``parts`` it
    lacks added: "components" (measure_memory's pass), "ops" (the count, FLOPs op by op)."""
    say = say or _quiet

    def missing():
        batch, out = batch_of(cfg, kind, micro_batch, setting.seq_len), {}
        if "components" in parts and not step.has("components"):
            out.update(_components(model, batch, setting, say))
        if "ops" in parts and not step.has("ops"):
            adapter = model.adapter if kind == "module" else adapt(model)
            out.update(_counted(model, adapter, kind, batch, setting, micro_batch, say))
        return out

    for name, value in _guarded(model, kind, setting, missing).items():
        setattr(step, name, step.notes + value if name == "notes" else value)
    return step


def _guarded(model, kind, setting, passes) -> dict:
    """``passes()`` with a module's blocks checkpointed as ``setting`` says (and put back), what a
    fake tensor cannot take raised as `FakeStepError`."""
    ck = model.adapter if kind == "module" else None   # a module's blocks (plan.module.Stepped): checkpointed here
    if ck is not None and setting.checkpointing and not ck.can_checkpoint:
        raise ValueError(f"checkpointing needs the blocks to recompute: tunekit.plan(..., blocks='layers') "
                         f"(an attribute path of {type(model.model).__name__} or a list of its modules)")
    try:
        if ck is not None:
            ck.set_checkpointing(setting.checkpointing)
        step = passes()
    except Exception as e:
        reason = fake_failure(e)
        if reason is None:
            raise
        raise FakeStepError(reason) from e
    finally:
        if ck is not None and ck.checkpointing:
            ck.set_checkpointing(False)
    if ck is not None and "notes" in step:   # measure_memory's adapter does not know the blocks checkpointed here
        step["notes"] = without(step["notes"], "ckpt.not_applied")
    return step


def _quiet(_text) -> None:
    pass


class _Phases(Observer):
    """Tells ``say`` each phase of a pass: the plan's progress within a fake step."""

    def __init__(self, say, what):
        self.say, self.what = say, what

    def phase(self, name: str) -> None:
        self.say(f"{self.what}, {name}")


def _fake_step_of(model, kind, cfg, setting, micro_batch, round_to, count, components, say, held_only) -> dict:
    batch = batch_of(cfg, kind, micro_batch, setting.seq_len)
    out = _components(model, batch, setting, say) if components else {}
    adapter = model.adapter if kind == "module" else adapt(model)   # a module's: its twin's blocks
    lived = _held(model, setting, round_to) if held_only else _timeline(model, adapter, kind, batch, setting,
                                                                         round_to, say)
    out.update(lived, units=fsdp_units(model, adapter, "fsdp"))
    return dict(out, **_counted(model, adapter, kind, batch, setting, micro_batch, say)) if count else out


def _components(model, batch, setting, say) -> dict:
    """The step's components and notes, by measure_memory (its tally of saved activations)."""
    say("components (saved activations, gradients, optimizer state)")
    # the Lab's optimizer by name, a stand-in (an instance measure_memory steps a copy of) where it cannot run here
    opt = plan_optimizer(setting.optimizer, model.parameters()) if setting.optimizer in STAND_INS else setting.optimizer
    report = measure_memory(model, batch, optimizer=opt, precision=setting.precision,
                            checkpointing=setting.checkpointing, estimate=False)
    components = {k: float(report.measured.get(k, 0.0)) for k in COMPONENTS}
    if any(is_missing(v) for v in components.values()):
        raise ValueError(f"the fake step left a component unmeasured: {components}")
    return dict(components=components, notes=without(report.notes, "memory.cpu", "memory.shadow_optimizer"))


def _counted(model, adapter, kind, batch, setting, micro_batch, say=_quiet) -> dict:
    """The step's FLOPs, counted op by op: executed, the MFU convention's, and the roofline."""
    before = adapter.checkpointing
    counter = RooflineCounter(GpuKernels.current())   # a GPU plan's: the GPU's kernels
    try:
        if adapter.can_checkpoint:
            adapter.set_checkpointing(setting.checkpointing)
        run_step(lambda b: _loss(model, kind, b), lambda i: (batch,), autocast=_autocast(setting), keep_loss=False,
                 observers=[Watch(counter), _Phases(say, "FLOPs op by op")])
    finally:
        if adapter.can_checkpoint:
            adapter.set_checkpointing(before)
        for p in model.parameters():
            p.grad = None
    count = counter.result()
    ops = counter.ops
    tokens = micro_batch * setting.seq_len
    # the Lab's MFU convention where the shape is known (causal attention halved, no recompute);
    # else the count's, which says so, and what of it the fake tensors hid (an eager mask's values)
    model_flops, convention, why = adapter.model_flops(setting.seq_len, tokens, float(count.model))
    counted = convention != MFU_ANALYTIC
    count_notes = list(count.notes) + why if counted else without(count.notes, "flops.mask_unread")

    return dict(executed=float(count.executed), model_flops=float(model_flops), count_notes=count_notes, ops=ops,
                host=counter.host_calls())


def _in(phase: str, where: str) -> str:
    """Where in the model a phase's peak is: ', in fc'; a forward's or backward's op no module's forward
    made (the loss, code between modules) ', outside every module' (measure.live.LiveBytes.where)."""
    if where:
        return f", in {where}"
    return ", outside every module" if phase in ("forward", "backward") else ""


def _timeline(model, adapter, kind, batch, setting, round_to, say=_quiet) -> dict:
    """A steady step, its live bytes tracked (`measure.live.LiveBytes`): its peak, where it
    happens, and the gradients alive there. The optimizer's state is made first (one update
    from zero gradients: it allocates what a first step would), so it lives from the start as it
    does in every step after the first."""
    params = list(model.parameters())
    before = adapter.checkpointing
    rounded = _rounded_bytes(round_to)
    try:
        opt, state, all_grads = _state_made(model, setting, rounded)
        base = (rounded(params) + rounded(list(model.buffers()), params) + rounded(tensors_in(batch))
                + rounded(state, params))

        def grads_now():
            return None if live.phase == "forward" else rounded([p.grad for p in params])

        gpu = GpuKernels.current()   # a GPU plan's: where the peak is, named by the GPU's op
        # a CPU's: an elementwise op's copies of its inputs at another dtype (a GPU's kernels cast as they load)
        live = LiveBytes(model, base, round_to, on_peak=grads_now, op_name=gpu.op_name if gpu else None,
                         scratch=None if gpu else promoted_bytes)
        if adapter.can_checkpoint:
            adapter.set_checkpointing(setting.checkpointing)
        run_step(lambda b: _loss(model, kind, b), lambda i: (batch,), autocast=_autocast(setting), optimizer=opt,
                 keep_loss=False, observers=[Watch(live, span=("forward", "optimizer step"), on_phase=live.set_phase),
                                             _Phases(say, "live bytes")])
        scalars = _rounded_bytes(1)([v for v in state if v.dim() == 0], params)   # AdamW's steps: never sharded
    finally:
        if adapter.can_checkpoint:
            adapter.set_checkpointing(before)
        for p in params:
            p.grad = None
    # phase -> (its peak bytes, where, the gradients alive there)
    detail = {ph: (float(b), f"{ph}{_in(ph, where)} ({op})", float(grads or 0.0))
              for ph, (b, where, op, grads) in live.phase_peaks.items()}
    accum = setting.grad_accum or 1
    if accum > 1 and "forward" in detail:
        # micro-steps 2..accum run their forward beside the gradients the first ones left (they
        # accumulate in place until the optimizer step): one more copy of every gradient there
        b, where, _ = detail["forward"]
        detail["forward"] = (b + float(all_grads), f"{where}, beside the gradients kept over grad_accum={accum}",
                             float(all_grads))
    peak, at, grads = max(detail.values(), key=lambda v: v[0])
    # phase -> the casts of weights alive at its peak (autocast's cache: every weight by the forward's end)
    casts = {ph: float(c) for ph, c in live.phase_casts.items()}
    held = rounded(params) + rounded(list(model.buffers()), params) + rounded(state, params)
    return dict(peak=peak, peak_at=at, grads_at_peak=grads, state_scalars=float(scalars), phase_detail=detail,
                casts_at=casts, held=held, all_grads=float(all_grads),
                phase_peaks={ph: v[0] for ph, v in detail.items()}, timeline=list(live.samples))


def _state_made(model, setting, rounded) -> tuple:
    """(the optimizer, its state tensors, every gradient's bytes): the state made by one update from zero
    gradients (what a first step allocates), the gradients set to None again."""
    params = list(model.parameters())
    opt = plan_optimizer(setting.optimizer, params)
    try:
        for p in params:
            p.grad = torch.zeros_like(p) if p.requires_grad else None
        all_grads = rounded([p.grad for p in params if p.grad is not None])
        with fake_scalar_reads_for(opt):   # Adafactor's .item()
            opt.step()
    finally:
        for p in params:
            p.grad = None
    return opt, [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)], all_grads


def _held(model, setting, round_to) -> dict:
    """A step not run, only what `in_param_dtype` reads of one it replaces (sharded over fp32 weights, its
    live bytes the half model's): the bytes held the whole step and every gradient's; its peak the held."""
    params, rounded = list(model.parameters()), _rounded_bytes(round_to)
    _, state, all_grads = _state_made(model, setting, rounded)
    held = rounded(params) + rounded(list(model.buffers()), params) + rounded(state, params)
    return dict(peak=held, peak_at=HELD_ONLY, grads_at_peak=0.0, phase_detail={}, phase_peaks={}, timeline=[],
                state_scalars=_rounded_bytes(1)([v for v in state if v.dim() == 0], params), held=held,
                all_grads=float(all_grads))


def _rounded_bytes(round_to):
    """Bytes of the distinct storages behind some tensors, each rounded up to ``round_to``."""
    def total(tensors, exclude=()):
        skip = {storage_key(t) for t in exclude}
        seen, out = set(), 0
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            key = storage_key(t)
            if key[2] == 0 or key in seen or key in skip:
                continue
            seen.add(key)
            out += -(-t.untyped_storage().nbytes() // round_to) * round_to
        return float(out)
    return total


def _autocast(setting):
    """The fake step's autocast: on the CPU device (a GPU plan is a CPU-device fake step)."""
    ac = autocast_torch(setting.precision)   # the precision's autocast, as plans have always taken it
    return (lambda: torch.autocast("cpu", dtype=ac)) if ac is not None else contextlib.nullcontext


def _loss(model, kind, batch):
    # the one loss helper; the batch of a transformers model is (x, x): x its own labels, shifted
    # by transformers (a module's: plan.module.Stepped, which takes its loss the same way)
    return step_loss(model, batch[:1], "transformers") if kind == "hf" else step_loss(model, batch)


def search_micro_batch(setting, run, total_of, memory, limit) -> int:
    """The largest micro-batch whose fake step (``run(setting)``) fits ``memory``: the one search
    (core.search) from 1 up to ``limit``; 0 when not even one fits."""
    def fits(mb):
        s = setting.replace(micro_batch=mb)
        return total_of(run(s), s) <= memory

    return largest_fitting(fits, 1, limit).best or 0


# FSDP's mixed precision computes on its param dtype: "unlike autocast, this applies mixed precision at the
# module level, not op level, which means low-precision activations are saved for backward" (pytorch/pytorch
# torch/distributed/fsdp/_fully_shard/_fsdp_api.py, MixedPrecisionPolicy, torch 2.13); tunekit's sharded ranks run so
# (parallel/worker.py: MixedPrecisionPolicy(param_dtype=the autocast dtype), no autocast)
PARAM_DTYPE_NOTE = ("sharded over fp32 weights: the step computes on FSDP's half param dtype (MixedPrecisionPolicy, "
                    "no autocast), so its activations are the half model's; weights, gradients and optimizer "
                    "state stay the fp32 model's")


def in_param_dtype(full: FakeStep, half: FakeStep) -> FakeStep:
    """``full`` (a step over fp32 weights under autocast) with its live bytes taken from ``half`` (the
    same step on the half model): each phase's peak is the half step's with the half model's
    parameters, buffers and optimizer state swapped for the fp32 model's (``held``) and its gradients
    scaled to fp32; no autocast weight copies (FSDP's gathered parameters replace them, `planning.shard`).
    Its components stay ``full``'s (the static lines are the fp32 model's); its count is ``half``'s where
    that has one (the ops FSDP's param dtype runs: no autocast weight casts, half gradients; FSDP's own
    copies and casts are planning.fsdp_work's records), else ``full``'s.
    Half step: peak 100 in backward, held 30, gradients 10 of 20 alive; full: held 60, gradients 40
    -> 100 + (60 - 30) + 10 x (40/20 - 1) = 140, gradients 20."""
    ratio = full.all_grads / half.all_grads if half.all_grads else 1.0
    shift = full.held - half.held
    detail = {ph: (b + shift + g * (ratio - 1), where, g * ratio) for ph, (b, where, g) in half.phase_detail.items()}
    peak, at, grads = max(detail.values(), key=lambda v: v[0])
    counted = {name: getattr(half, name) for name in COUNTED} if half.has("ops") else {}
    return replace(full, **counted, peak=peak, peak_at=at, grads_at_peak=grads, phase_detail=detail,
                   phase_peaks={ph: v[0] for ph, v in detail.items()}, casts_at=dict.fromkeys(detail, 0.0),
                   timeline=[(ph, b + shift) for ph, b in half.timeline], notes=full.notes + [PARAM_DTYPE_NOTE])
