"""Measured memory anatomy of one training step, side by side with the estimate.

    >>> rep = tunekit.measure_memory(model, (x, y))          # or measure_memory(lab)
    >>> rep.to_frame()                                        # estimated | measured | error

Parameter, gradient and optimizer-state bytes come from the tensors themselves (unique
storages, so tied or viewed tensors count once). Saved activations come from
`torch.autograd.graph.saved_tensors_hooks`: every tensor autograd keeps for backward passes the
pack hook, exact on any device. Under autocast the half copies of weights that autocast makes
and keeps for backward are told apart (their autograd history is a cast of a parameter) and
reported as `weight_casts`. On CUDA the allocator peak, reserved bytes and NVML's device total
are added, with `other` = what the named components do not explain.
"""
from __future__ import annotations

import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from math import nan as NaN

import torch

from tunekit.core import registry
from tunekit.core.memory.answer import COMPONENTS, MemoryAnswer
from tunekit.core.memory.estimate import MemoryEstimate, estimate_memory
from tunekit.core.notes import Note
from tunekit.core.refusals import user_facing
from tunekit.core.setting import HALF, Setting, from_keywords, from_words
from tunekit.core.units import GiB, is_missing
from tunekit.core.validate import flag
from tunekit.measure import nvml
from tunekit.measure.device import torch_dtype, weights_dtype
from tunekit.measure.step import Observer, Watch, run_step
from tunekit.measure.tally import SavedTensorTally, storage_key, unique_bytes
from tunekit.models.adapters import adapt, step_loss


@dataclass
class MemoryReport(MemoryAnswer):
    """Measured bytes by component, the matching estimate, and device-level readings."""

    measured: dict
    estimate: MemoryEstimate | None
    device: str
    layout: str      # the memory layout measured (registry.MEMORY_LAYOUTS): "fp32", "amp", "bf16", "fp16"
    cuda: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    method: str = "measured"   # a real step here (core.memory.answer: the three answers)

    @property
    def precision(self) -> str:
        """Deprecated: the memory layout, `layout` (a training precision is Setting.precision)."""
        warnings.warn("MemoryReport.precision is the memory layout: read MemoryReport.layout", DeprecationWarning, 2)
        return self.layout

    @property
    def components(self) -> dict:
        """The measured bytes by component, under the name every memory answer uses."""
        return self.measured

    @property
    def total_bytes(self) -> float:
        """The step's peak: the allocator's on CUDA, the measured components' sum elsewhere."""
        return self.cuda.get("allocator_peak", self.known_bytes)

    def __repr__(self):  # a terminal: measured against estimated per component (every reading: to_frame())
        from tunekit.core.memory.summary import report_text
        return report_text(self)

    def _repr_html_(self) -> str:
        from tunekit.core.memory.summary import report_html
        return report_html(self)

    def error(self, name: str) -> float:
        """(estimated - measured) / measured for one component; NaN when either is unknown."""
        est = self.estimate.components.get(name, NaN) if self.estimate else NaN
        meas = self.measured.get(name, NaN)
        if is_missing(est) or is_missing(meas) or meas == 0:
            return 0.0 if (est == 0 and meas == 0) else NaN
        return (est - meas) / meas

    def to_frame(self):
        """One row per component: estimated_bytes, measured_bytes, error (relative)."""
        import pandas as pd

        names = [k for k in COMPONENTS if k in self.measured] + \
                [k for k in self.measured if k not in COMPONENTS]
        rows = []
        for k in names:
            est = self.estimate.components.get(k, NaN) if self.estimate else NaN
            rows.append({"component": k, "estimated_bytes": est, "measured_bytes": self.measured[k],
                         "error": self.error(k)})
        for k, v in self.cuda.items():
            rows.append({"component": k, "estimated_bytes": NaN, "measured_bytes": v, "error": NaN})
        return pd.DataFrame(rows).set_index("component")

    def figure(self):
        """plotly: estimated and measured side by side, stacked by component (GiB = 2^30)."""
        import plotly.graph_objects as go

        fig = go.Figure()
        for k in COMPONENTS:
            est = self.estimate.components.get(k, NaN) if self.estimate else NaN
            meas = self.measured.get(k, NaN)
            ys = [None if is_missing(est) else est / GiB, None if is_missing(meas) else meas / GiB]
            if any(ys):   # an unknown side has no bar (None), never a 0 one
                fig.add_bar(name=k, x=["estimated", "measured"], y=ys)
        if "other" in self.cuda and not is_missing(self.cuda["other"]):
            fig.add_bar(name="other (unexplained)", x=["measured"], y=[self.cuda["other"] / GiB])
        fig.update_layout(barmode="stack", yaxis_title="GiB (2^30 bytes)",
                          title=f"memory anatomy, {self.layout} on {self.device}")
        return fig


def optimizer_name(opt) -> str | None:
    """The registry's name for a torch optimizer instance, or None when it has no formula."""
    momentum = any(g.get("momentum", 0) for g in getattr(opt, "param_groups", ()))
    entry = registry.optimizer_for_class(type(opt).__name__, momentum)
    return entry.name if entry else None


def autocast_torch(precision):
    """The torch dtype a training precision autocasts to (`Setting.autocast`, which checks it), or None."""
    if precision is None or isinstance(precision, torch.dtype):
        return precision
    ac = Setting(precision=precision).autocast
    return torch_dtype(ac) if ac else None


@dataclass
class StepTarget:
    """What ``measure_memory`` steps: a model, its adapter, one batch, ``loss_of(model, batch)``
    and the toggles to measure under (optimizer: an instance or a registry name; precision in the
    Lab's words; None: left as they are). A Lab makes one (``lab.memory_target()``)."""

    model: torch.nn.Module
    adapter: object
    batch: tuple
    loss_of: object            # loss_of(model, batch) -> scalar loss
    optimizer: object = None
    precision: str | None = None
    checkpointing: bool | None = None
    attention: str | None = None


def _unpack_target(target, batch, micro_batch, seq_len) -> StepTarget:
    """What to measure: a Lab's (its ``memory_target``) or a module's, on the one loss helper
    (models.adapters.step_loss: a transformers causal LM on its labels, or on its inputs as
    labels when given only them; any other model on its output, summed when not one number)."""
    if hasattr(target, "memory_target"):   # a tunekit Lab
        return target.memory_target(micro_batch, seq_len, batch)
    model, adapter = target, adapt(target)
    if batch is None:
        if not adapter.vocab_size:
            raise ValueError("give a batch: measure_memory(model, (x, y))")
        dev = next(model.parameters()).device
        b, s = micro_batch or 4, seq_len or adapter.default_seq_len(dev.type) or 64
        gen = torch.Generator(device="cpu").manual_seed(0)
        tokens = torch.randint(0, adapter.vocab_size, (b, s + 1), generator=gen).to(dev)
        batch = (tokens[:, :-1].clone(), tokens[:, 1:].clone())  # y: x shifted by one
    return StepTarget(model, adapter, batch, lambda m, b: step_loss(m, b, adapter.kind))


@user_facing   # a refusal: the user's line and the message (core.refusals)
def measure_memory(target, batch=None, *, optimizer=None, precision=None, checkpointing=None,
                   micro_batch: int | None = None, seq_len: int | None = None,
                   estimate: bool = True, setting=None) -> MemoryReport:
    """Run one training step (forward, backward, optimizer step) and measure each component.

    `target`: a tunekit Lab (its model, default toggles and batches) or an nn.Module with
    `batch` = (inputs...) for ``model(*batch)``; a model returning ``(logits, loss)`` (tunekit's
    GPT) trains on its loss, any other output on ``output.float().sum()``.
    Nothing of the caller's changes: the step is taken by a fresh optimizer with lr=0 (AdamW
    when none is given, else a copy of the given one's class and settings), so the weights and
    the given optimizer's state stay as they were; gradients the parameters held before are put
    back; checkpointing/attention and the RNG state are restored. `precision` uses the Lab's
    words: "bf16"/"fp16" run the forward under torch.autocast (reported as "amp") unless the
    weights already are that dtype (then pure "bf16"/"fp16"), "fp32"/"tf32" do not.

    ``setting``: a ``tunekit.Setting`` instead of optimizer, precision, checkpointing, micro_batch
    and seq_len (its weights' dtype must be the model's: a real step measures the weights it has).

    Example: ``tunekit.measure_memory(lab, precision="bf16").to_frame()``.

    long: its docstring says what every keyword means; the body is 65 lines."""
    words = dict(optimizer=optimizer, precision=precision, checkpointing=checkpointing, micro_batch=micro_batch,
                 seq_len=seq_len)
    s = from_keywords(setting, "measure_memory", **words)
    # else the words given, checked once by the Setting (None, a torch dtype, an optimizer object: as they are)
    given = {k: v for k, v in words.items() if isinstance(v, str) or v is not None and k not in ("precision",
                                                                                                  "optimizer")}
    checked = s if s is not None else from_words(**given)
    optimizer, precision, checkpointing, micro_batch, seq_len = (
        getattr(checked, k) if s is not None or k in given else v for k, v in words.items())
    flag("estimate", estimate)
    tg = _unpack_target(target, batch, micro_batch, seq_len)
    if s is not None and s.attention is not None:
        tg.attention = s.attention
    model, batch, adapter = tg.model, tg.batch, tg.adapter
    optimizer = optimizer if optimizer is not None else tg.optimizer  # given: over the Lab's toggles
    precision = precision if precision is not None else tg.precision
    checkpointing = checkpointing if checkpointing is not None else tg.checkpointing
    params = [p for p in model.parameters()]
    dev = params[0].device if params else torch.device("cpu")
    notes = _setting_notes(s, params, dev) if s is not None else []
    given = optimizer
    optimizer = _shadow_optimizer(optimizer, params, notes)
    ac_dtype = autocast_torch(precision)
    half = weights_dtype(params)
    if half in HALF:
        layout = half   # pure half weights: autocast to the same dtype casts nothing
        if ac_dtype is not None and ac_dtype != autocast_torch(half):
            notes.append(f"weights are {half}; autocast to {ac_dtype} was not applied")
        ac_dtype = None
    else:
        layout = "amp" if ac_dtype is not None else registry.FP32
    ac = torch.autocast(dev.type, dtype=ac_dtype) if ac_dtype is not None else nullcontext()
    set_ck = checkpointing is not None and adapter.can_checkpoint
    set_attn = tg.attention is not None and bool(adapter.attentions)
    if checkpointing and not adapter.can_checkpoint:
        notes.append(Note("ckpt.not_applied",
                          "checkpointing requested, but tunekit does not know this model's blocks: not applied"))
    prev_ck, prev_attn = adapter.checkpointing, adapter.attention
    prev_grads = [p.grad for p in params]
    cuda = dev.type == "cuda"
    try:
        if set_ck and checkpointing != prev_ck:
            adapter.set_checkpointing(checkpointing)
        if set_attn and tg.attention != prev_attn:
            adapter.set_attention(tg.attention)
        for p in params:
            p.grad = None
        with torch.random.fork_rng(devices=[dev] if cuda else [], device_type=dev.type):
            measured, cuda_info = _one_step(model, batch, tg.loss_of, optimizer, given, ac, params,
                                            dev, notes)
        ck_used, attn_used = adapter.checkpointing, adapter.attention
    finally:
        for p, g in zip(params, prev_grads):
            p.grad = g
        if set_ck and adapter.checkpointing != prev_ck:
            adapter.set_checkpointing(prev_ck)
        if set_attn and adapter.attention != prev_attn:
            adapter.set_attention(prev_attn)
    if not cuda:
        notes.append(Note("memory.cpu", "no CUDA device: allocator peak, NVML total and 'other' are not measured here"))
    est = None
    if estimate:
        est = _estimate_for(model, batch, optimizer or given, layout, dev, ck_used, attn_used,
                            adapter.shape, notes)
    return MemoryReport(measured, est, str(dev), layout, cuda_info, notes)


def _setting_notes(s, params, dev) -> list:
    """What a real step here cannot be of a Setting is refused (other weights, a layout over
    ranks, another device or model); what it measures the same way is said (a compiled step is
    measured eager; one micro-step of several: gradients accumulate in place)."""
    why = []
    if s.weights is not None and s.weights != weights_dtype(params):
        why.append(f"weights={s.weights!r}: the model's weights are {weights_dtype(params)} and a real step measures "
                   "them as they are")
    if s.parallel is not None:
        why.append(f"parallel={s.parallel!r}: this measures one process's step")
    if s.device is not None and s.device not in (dev.type, str(dev)):
        why.append(f"device={s.device!r}: the model is on {dev}")
    if s.model is not None:
        why.append(f"model={s.model!r}: this measures the model it is given")
    if why:
        raise ValueError("measure_memory(setting=...): " + "; ".join(why) + ". Plan it instead: "
                         "tunekit.plan(model, setting=s)")
    notes = []
    if s.compile:
        notes.append("compile=True is not measured: the components are an eager step's")
    if s.grad_accum > 1:
        notes.append(f"grad_accum={s.grad_accum}: one micro-step measured (the gradients of the others accumulate "
                     "in place: the same components)")
    return notes


def _shadow_optimizer(opt, params, notes):
    """A fresh optimizer with lr=0 standing in for `opt`: same state sizes, and neither the
    weights nor `opt`'s own state change (stepping even an lr=0 optimizer would advance its
    moments and step count). `opt` may be a Lab optimizer name. None when it cannot be rebuilt."""
    if opt is None:
        notes.append(Note("memory.shadow_optimizer",
                          "no optimizer given: a fresh AdamW(lr=0) was stepped; the weights do not change"))
        return torch.optim.AdamW(params, lr=0.0, weight_decay=0.0)
    if isinstance(opt, str):
        from tunekit.models.optimizers import build_optimizer

        return build_optimizer(opt, params, lr=0.0)
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": g["params"], "lr": 0.0}
              for g in opt.param_groups]
    try:
        shadow = type(opt)(groups, lr=0.0)
    except Exception as e:   # a constructor that takes other arguments
        notes.append(f"could not copy {type(opt).__name__} ({type(e).__name__}); optimizer "
                     "states are read from it without stepping")
        return None
    notes.append(Note("memory.shadow_optimizer", f"a fresh {type(opt).__name__}(lr=0) with the given settings "
                      "was stepped; the given optimizer is untouched"))
    return shadow


def _one_step(model, batch, loss_of, optimizer, given, ac, params, dev, notes):
    """One forward/backward/step with `optimizer` (None: no step; states read from `given`),
    observed (measure.step.run_step): the saved tensors tallied over the forward, the allocator's
    growth read where it ends, the gradients read when the update starts."""
    cuda = dev.type == "cuda"
    forward = (lambda b: loss_of(model, b)), (lambda i: (batch,))   # the batch as given: a tuple or a tensor
    if cuda and optimizer is not None:   # warm-up: states exist, the peak is a steady one
        run_step(*forward, autocast=lambda: ac, optimizer=optimizer, zero_grad=True, keep_loss=False)
        notes.append("CUDA: one warm-up step ran first so optimizer states exist at the peak")
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    tally = SavedTensorTally(params, list(model.buffers()))
    seen = _Readings(tally, params, dev if cuda else None)
    run_step(*forward, autocast=lambda: ac, optimizer=optimizer, keep_loss=False,
             observers=[Watch(tally, span=("forward", "forward")), seen])
    if cuda:
        torch.cuda.synchronize(dev)
    exclude = {storage_key(p) for p in params}
    source = optimizer if optimizer is not None else given
    state = [v for st in source.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    opt_bytes = float(unique_bytes(state, exclude)) if source.state else NaN
    measured = {"weights": float(unique_bytes(params)), "master_weights": 0.0,
                "gradients": float(seen.grads), "optimizer_states": opt_bytes,
                "weight_casts": seen.casts, "activations": seen.acts,
                "buffers": float(unique_bytes(model.buffers(), exclude))}
    for p in params:
        p.grad = None
    return measured, (_cuda_readings(dev, measured, seen.forward_growth) if cuda else {})


class _Readings(Observer):
    """What measure_memory reads off its step: the tally at the end of the forward (the backward
    frees what it saved), the allocator's growth there, the gradients before any update."""

    def __init__(self, tally, params, cuda_dev):
        self.tally, self.params, self.cuda_dev = tally, params, cuda_dev
        self.acts = self.casts = self.forward_growth = NaN
        self.grads = None

    def __enter__(self):
        self.before = torch.cuda.memory_allocated(self.cuda_dev) if self.cuda_dev is not None else NaN
        return self

    def forward_done(self, batch) -> None:
        self.acts, self.casts = float(self.tally.activation_bytes), float(self.tally.cast_bytes)
        if self.cuda_dev is not None:
            self.forward_growth = torch.cuda.memory_allocated(self.cuda_dev) - self.before

    def phase(self, name: str) -> None:
        if name == "optimizer step":
            self._read_grads()

    def __exit__(self, *exc) -> bool:
        self._read_grads()   # no update: the gradients as the backward left them
        return False

    def _read_grads(self) -> None:
        if self.grads is None:
            self.grads = unique_bytes([p.grad for p in self.params])


def _cuda_readings(dev, measured, forward_growth) -> dict:
    """Allocator and NVML readings. `other`: what the allocator gained during the forward beyond
    the saved activations and weight casts (outputs, loss, temporaries still held), read at the
    end of the forward, where the named lines all coexist (gradients do not exist yet)."""
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    peak = float(torch.cuda.max_memory_allocated(index))
    reserved = float(torch.cuda.memory_reserved(index))
    used, why = nvml.used_bytes(index)
    out = {"allocator_peak": peak, "allocator_reserved": reserved,
           "forward_growth": float(forward_growth),
           "other": float(forward_growth) - measured["activations"] - measured["weight_casts"],
           "nvml_used": used if used is not None else NaN,
           # CUDA context, kernels, NCCL, other libraries (and other processes on this GPU)
           "outside_allocator": (used - reserved) if used is not None else NaN}
    if why:
        out["nvml_note"] = why
    return out


def _estimate_for(model, batch, optimizer, layout, dev, checkpointing, attention, shape, notes):
    name = optimizer_name(optimizer)
    kw = dict(layout=layout, optimizer=name or "adamw", device=str(dev), cuda_context_bytes=0.0)
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    if shape is not None and x.dim() == 2:
        est = estimate_memory(model.config, n_params=float(sum(p.numel() for p in model.parameters())),
                              micro_batch=x.shape[0], seq_len=x.shape[1],
                              checkpointing=checkpointing, attention=attention, **kw)
    else:
        est = estimate_memory(float(sum(p.numel() for p in model.parameters())), **kw)
    if name is None:
        est.components["optimizer_states"] = NaN
        notes.append(f"no state formula for {type(optimizer).__name__}: its estimate is NaN")
    notes.extend(est.notes)
    return est
