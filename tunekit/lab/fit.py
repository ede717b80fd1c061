"""Refuse a step that cannot fit, before allocating it.

    >>> est = estimate(lab, lab.resolve(micro_batch=10**7))
    >>> est.fits, est.need_bytes, est.limit.bytes, est.line.method
    >>> check(lab, t)       # raises WontFitError (a ToggleError) saying what to try

A real CPU out-of-memory does not raise: the kernel kills the process (in Jupyter, the kernel and
everything in it). So ``lab.run``, its FLOP probe, the max-batch search and distributed runs
compare the peak a step would take above what is in use now with the memory available
(tunekit.measure.memavail) first. The peak is linear in the micro-batch: inputs and activations
grow with it; weights, gradients and optimizer state do not (the state a first step creates is
counted as if it lived beside the activations: it comes after them, so this errs high). The
activations are estimated the cheapest way that holds, and the refusal says which:

- ``analytic``: ``tunekit.estimate_memory``'s count of saved activations, tensor by tensor, for
  tunekit's GPT and the transformers families it knows; no tensor is made. Far below the limit
  (under a quarter) it is the answer; nearer, the step is measured;
- ``size bound``, for other models of known layers and width: every layer keeps its
  (micro_batch, seq_len, hidden) input for backward, at least L*b*s*h*element bytes;
- ``measured``: any nn.Module. A forward+backward at two small micro-batches, peaks from the
  exact meters (tunekit.measure.step.step_peak), extrapolated linearly; cached per configuration.
  On CPU the peak is RSS, whose pages and allocator caches make it noisy: 0.8-1.35x of a real
  step's peak in our trials on the demo GPT (lab.find_max_batch_size measures the real limit).

Nothing here trains: the optimizer never steps and the random streams are put back.
"""
from __future__ import annotations

import gc
import math
import weakref
from dataclasses import dataclass

import torch

from tunekit.core import registry
from tunekit.core.fmt import fmt_bytes
from tunekit.core.search import largest_fitting
from tunekit.core.toggles import ToggleError, Toggles
from tunekit.core.units import is_missing
from tunekit.measure import memavail
from tunekit.measure.oom import free_memory, is_oom
from tunekit.measure.step import step_peak
from tunekit.train.precision import autocast, matmul_precision

_FIRST = 2          # smallest measured micro-batch: BatchNorm refuses a batch of one in training
_RESOLUTION = 16 * 2**20  # grow the measured batches until their peaks differ by this much
_LINES = weakref.WeakKeyDictionary()   # Lab -> {configuration: {micro_batch: (peak, floor)}}
SEARCH = "lab.find_max_batch_size() to measure the largest micro-batch that fits"   # a refusal's last advice


class WontFitError(ToggleError):
    """A step refused because its estimated peak memory exceeds the memory available; nothing
    was allocated for it. ``.estimate`` is the FitEstimate behind the message.

    Example: ``except tunekit.lab.fit.WontFitError as e: e.estimate.need_bytes``."""

    def __init__(self, estimate: "FitEstimate", what: str = "this run"):
        super().__init__([estimate.message(what)])
        self.estimate, self.what = estimate, what


@dataclass
class Line:
    """Bytes a step takes above what is in use now, ``fixed + per_sample * micro_batch``."""

    fixed: float
    per_sample: float
    method: str     # "size bound" | "analytic" | "measured"
    how: str        # how it was estimated, in words

    def at(self, micro_batch: int) -> float:
        return self.fixed + self.per_sample * micro_batch

    def largest(self, limit: float) -> int:
        """The largest micro-batch the line keeps within ``limit`` (0: not even one): the one
        search (core.search) from the arithmetic answer, so that ``at`` agrees with it to the
        last rounding of a float."""
        if self.per_sample <= 0:
            return 0 if self.fixed > limit else 2**62
        guess = (limit - self.fixed) / self.per_sample
        start = min(max(int(guess), 1), 2**62) if math.isfinite(guess) else 1
        return largest_fitting(lambda b: self.at(b) <= limit, start, 2**62).best or 0


@dataclass
class FitEstimate:
    toggles: Toggles
    line: Line
    limit: memavail.Available | None   # None: this device's free memory is unknown
    copies: int = 1                    # processes sharing the limit (ranks of a CPU run)
    advice: tuple = ()                 # what to try, filled in when refused

    @property
    def need_bytes(self) -> float:
        return self.copies * self.line.at(self.toggles.micro_batch)

    @property
    def fits(self) -> bool:
        return self.limit is None or self.need_bytes <= self.limit.bytes

    def message(self, what: str = "this run", search: str = SEARCH) -> str:
        """The refusal in words; ``search``: how the caller measures the largest micro-batch that
        fits (`SEARCH`, the Lab's; ``tunekit run``: the shell command that does it)."""
        t, line = self.toggles, self.line
        each = f" ({self.copies} processes, each)" if self.copies > 1 else ""
        need = fmt_bytes(self.need_bytes) if math.isfinite(self.need_bytes) else "more than all"
        parts = (f" ({fmt_bytes(line.per_sample)} per sample + {fmt_bytes(line.fixed)} fixed)"
                 if math.isfinite(line.at(1)) else "")
        return (f"{what} does not fit: micro_batch={t.micro_batch} at seq_len={t.seq_len} needs an "
                f"estimated {need} more memory{each}, but only {fmt_bytes(self.limit.bytes)} is "
                f"available ({self.limit.source}). Estimated ({line.method}): {line.how}{parts}. "
                f"Nothing was allocated for it. Try: " + "; ".join((*self.advice, search)) + ".")


# --- the estimate --------------------------------------------------------------------------------


def estimate(lab, t: Toggles, guard: bool = False) -> FitEstimate:
    """How much more memory a training step of ``lab`` under ``t`` (applied) takes, against the
    memory available on its device. ``guard``: count ``lab.run``'s host copy of the weights and
    optimizer state (on CPU it takes RAM)."""
    limit = memavail.available(lab.device, lab.cuda_index)
    fixed = _new_state_bytes(lab, t)
    copy = _params_bytes(lab) + _state_bytes(lab) if guard and lab.device.type == "cpu" else 0
    fixed += copy
    b = t.micro_batch
    line = _cheap_line(lab, t, fixed + _grads_bytes(lab))
    if limit is not None and b > 2 * _FIRST and (line is None or line.at(b) <= limit.bytes):
        # measure unless the analytic count is far below the limit: it is within 10% of the
        # saved activations, and a step's temporaries add less than 1x that (0.5-0.8x measured)
        if line is None or line.method != "analytic" or 4 * line.at(b) >= limit.bytes:
            line = _measured_line(lab, t, fixed, limit.bytes)   # its backward makes the gradients
    if line is None:   # a model of unknown shape at a micro-batch the measurement would match
        line = Line(fixed + _grads_bytes(lab), 0.0, "parameter count", "gradients and optimizer "
                    f"state only; no activations measured at micro_batch <= {2 * _FIRST}")
    if copy:
        line.how += ", and lab.run's guard copy of the weights and optimizer state"
    return FitEstimate(t, line, limit)


def check(lab, t: Toggles, guard: bool = False, what: str = "this run") -> FitEstimate:
    """``estimate``, raising WontFitError when the step does not fit."""
    est = estimate(lab, t, guard)
    if not est.fits:
        est.advice = tuple(_advice(lab, t, est.line, est.limit))
        raise WontFitError(est, what)
    return est


def refuse_cheaply(lab, t: Toggles, what: str) -> None:
    """Raise WontFitError where the cheap line (analytic or size bound: no tensor made, ``t`` need
    not be applied) already puts the step past the memory available: the refusal ``check`` makes
    there without measuring, for an entry that must refuse before any step, real or fake
    (``lab.expect``). A step the cheap line lets through is left to ``check`` at run time."""
    limit = memavail.available(lab.device, lab.cuda_index)
    line = _cheap_line(lab, t, _new_state_bytes(lab, t) + _grads_bytes(lab))
    if limit is None or line is None:
        return
    est = FitEstimate(t, line, limit)
    if not est.fits:
        est.advice = tuple(_advice(lab, t, line, limit))
        raise WontFitError(est, what)


def check_distributed(lab, t: Toggles, parallel: str, nproc: int, nodes: int) -> FitEstimate | None:
    """Refuse a distributed run whose ranks cannot fit, before launching them: per rank,
    ``tunekit.estimate_memory`` for this sharding (the model's shape must be known; None
    otherwise). On CPU every rank, of every emulated node, shares this machine's RAM."""
    if lab.adapter.shape is None:
        return None
    world = nproc * nodes
    found = _analytic(lab, t, parallel=parallel, world_size=world, nodes=nodes)
    if found is None:
        return None
    fixed, per_sample, how = found
    line = Line(fixed, per_sample, "analytic",
                f"tunekit.estimate_memory for {parallel} over {world} rank(s): static bytes "
                f"(weights, gradients, optimizer state) as sharded + {how}")
    limit = memavail.available(lab.device, lab.cuda_index)
    copies = world if lab.device.type == "cpu" else 1
    fit = FitEstimate(t, line, limit, copies)
    if not fit.fits:
        fit.advice = tuple(_advice(lab, t, line, limit, copies))
        raise WontFitError(fit, f"this {parallel} run")
    return fit


# --- the three lines ---------------------------------------------------------------------------


def _cheap_line(lab, t: Toggles, fixed: float) -> Line | None:
    """The analytic line (GPT, known transformers families), else the size bound; None when the
    model's shape is unknown. No tensor is made."""
    shape = lab.adapter.shape
    if shape is None:
        return None
    found = _analytic(lab, t)
    if found is not None:
        const, per_sample, how = found
        return Line(fixed + const, per_sample, "analytic", how)
    elem = max((p.element_size() for p in lab.model.parameters()), default=4)
    per_sample = shape.n_layer * t.seq_len * shape.hidden * elem
    return Line(fixed, per_sample, "size bound",
                f"each of the {shape.n_layer} layers keeps its (micro_batch, seq_len={t.seq_len}, "
                f"hidden={shape.hidden}) input for backward, {elem} B an element")


def _analytic(lab, t: Toggles, **dist):
    """(fixed, per_sample, how) from ``estimate_memory``'s activation count, or None when it has
    no exact count for this model. ``fixed``: what does not grow with the micro-batch (autocast's
    weight copies), plus, for a distributed run (``dist``), a fresh worker's static bytes."""
    from tunekit.core.memory.estimate import estimate_memory

    def at(b):
        return estimate_memory(lab.model, layout=registry.PRECISIONS[t.precision].memory_layout,
                               optimizer=t.optimizer, micro_batch=b, seq_len=t.seq_len,
                               checkpointing=t.checkpointing, attention=lab.adapter.attention,
                               device=lab.device.type, cuda_context_bytes=0.0, **dist)

    try:
        one, two = at(1), at(2)
    except ValueError:   # a config estimate_memory cannot read
        return None
    if one.inputs["activations"] not in ("gpt", "hf"):
        return None   # the Korthikanti formula keeps attention scores fused kernels never save

    def moving(e):
        return e["activations"] + e["recompute"] + e["weight_casts"]

    per_sample = moving(two) - moving(one)
    fixed = moving(one) - per_sample + (one.static_bytes if dist else 0.0)
    if is_missing(per_sample) or is_missing(fixed):
        return None
    how = (f"tunekit.estimate_memory's count of saved activations ({one.inputs['activations']}, "
           "tensor by tensor), plus gradients and the optimizer state a first step creates")
    return fixed, per_sample, how


def _measured_line(lab, t: Toggles, fixed: float, limit: float) -> Line:
    """Measure forward+backward at micro-batches b and 2b, from b = 2 up to where the two peaks
    differ by ``_RESOLUTION`` (a pass staying within t.micro_batch / 2 and a quarter of
    ``limit``), and draw the line through them. ``fixed``: bytes to add that the passes do not
    allocate (the gradients they do)."""
    key = (str(lab.device), t.seq_len, t.precision, lab.adapter.state())
    cache = _LINES.setdefault(lab, {})
    points = cache.get(key)
    if points is None:
        if len(cache) >= 64:   # bounded: one entry per configuration measured
            cache.pop(next(iter(cache)))
        # a warm-up at a third size takes the process' one-time allocations (threads, arenas)
        # out of the line; the measured sizes keep what a step at a new shape costs the first
        # time (oneDNN's kernels and buffers per shape), as the run's first step will pay it
        _, *first = _measure(lab, t, [_FIRST + 1, _FIRST, 2 * _FIRST])
        points = cache[key] = dict(zip((_FIRST, 2 * _FIRST), first))
    b = _FIRST
    while True:
        if b not in points or 2 * b not in points:
            points[b], points[2 * b] = _measure(lab, t, [b, 2 * b])
        (p1, f1), (p2, f2) = points[b], points[2 * b]
        if math.inf in (p1, p2):
            cache.pop(key)   # not kept: memory may be free again at the next run
            return Line(math.inf, math.inf, "measured", f"a forward+backward at micro_batch={b} or "
                        f"{2 * b} ran out of memory while it was measured")
        # NaN (no exact meter here) compares False: stop there, on the floor alone
        if not p2 - p1 < _RESOLUTION:
            break
        # jump towards the batch whose growth the bytes per sample seen so far put at twice the
        # resolution; at most 64x, as tiny batches hide most of a sample's bytes below a page
        seen = max(p2 - p1, f2 - f1, 1) / b
        nxt = min(max(2 * b, min(64 * b, 2 ** math.floor(math.log2(2 * _RESOLUTION / seen)))),
                  t.micro_batch // 4, math.floor(limit / (8 * seen)))
        if nxt <= b:
            break
        b = nxt
    # the floor (batch + saved tensors) is exact: page-size noise never makes the line lower
    per_sample = max((f2 - f1) / b, 0.0)
    if not is_missing(p2 - p1):
        per_sample = max(per_sample, (p2 - p1) / b)
    base = max((f1 if is_missing(p1) else p1) - per_sample * b, 0.0)
    return Line(fixed + base, per_sample, "measured",
                f"a forward+backward at micro_batch={b} and {2 * b} (peaks from the exact meters), "
                "extrapolated linearly in the micro-batch, plus the optimizer state a first step "
                "creates")


def _measure(lab, t: Toggles, batches: list) -> list:
    """(peak, floor) of a forward+backward at each micro-batch in ``batches``. The random
    streams (torch's, the Lab's batcher) are put back: the estimate changes no run."""
    dev = lab.device
    batcher = getattr(lab, "batcher", None)
    saved = batcher.generator.get_state() if batcher is not None else None
    devices = [lab.cuda_index] if lab.cuda_index is not None else []
    # a garbage collection inside a pass would free unrelated memory and hide some of its peak
    collecting = gc.isenabled()
    gc.disable()
    out = []
    try:
        with torch.random.fork_rng(devices=devices), matmul_precision(t, dev):
            for b in batches:
                out.append(step_peak(lab.model, lambda x, y: lab.loss_fn(lab.model, x, y),
                                     lambda b=b: lab.batch(b, t.seq_len), lambda: autocast(t, dev),
                                     dev, lab.cuda_index))
    except Exception as e:
        if not is_oom(e):
            raise
        out += [(math.inf, 0)] * (len(batches) - len(out))
    finally:
        if collecting:
            gc.enable()
        if saved is not None:
            batcher.generator.set_state(saved)
    if math.inf in (p for p, _ in out):
        free_memory(dev)   # outside the handler: its traceback pinned the failed pass' tensors
    return out


# --- what is not allocated yet -------------------------------------------------------------------


def _params_bytes(lab) -> int:
    return sum(p.numel() * p.element_size() for p in lab.model.parameters())


def _grads_bytes(lab) -> int:
    """Gradients the backward will allocate (those already there are in use now)."""
    return sum(p.numel() * p.element_size() for p in lab.model.parameters()
               if p.requires_grad and p.grad is None)


def _state_bytes(lab) -> int:
    from tunekit.models.optimizers import state_bytes

    return state_bytes(lab.optimizer) if lab.optimizer is not None else 0


def _new_state_bytes(lab, t: Toggles) -> int:
    """Optimizer state the first step creates (torch makes it lazily, at step 1). Counted as if
    it lived beside the activations, though it comes after them: an estimate that errs high."""
    spec = registry.optimizer(t.optimizer)
    opt = lab.optimizer   # t is applied: this is the run's optimizer
    return sum(spec.state_bytes_of([tuple(p.shape)], p.element_size()) for p in lab.model.parameters()
               if p.requires_grad and not (opt is not None and opt.state.get(p)))   # Adafactor's by shape


def _advice(lab, t: Toggles, line: Line, limit, copies: int = 1) -> list:
    out = []
    n = min(line.largest(limit.bytes / copies), t.micro_batch - 1)
    if n >= 1:
        accum = math.ceil(t.micro_batch * t.grad_accum / n)
        out.append(f"micro_batch={n} or less (estimated to fit) with grad_accum={accum} for the same "
                   "global batch")
    else:
        out.append("a smaller model or seq_len: the estimate says not even micro_batch=1 fits")
    if lab.adapter.can_checkpoint and not t.checkpointing:
        out.append("checkpointing=True (keeps each block's input only)")
    if t.autocast is None and lab.env().bf16_supported:
        out.append("precision='bf16' (half-size activations)")
    return out
