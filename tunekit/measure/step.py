"""The training step, written once, and what watches it. Measurement for the engine; never prints.

``run_step``: forward (under autocast), backward (``accum`` micro-batches, the gradient sync on
the last) and the optimizer (through fp16's GradScaler). The Lab's timed steps, every rank's,
the untimed probe, the fit check's peak, ``measure_memory`` and ``tunekit.plan``'s fake steps all
take it; what each measures is an `Observer` plugged into it (a FLOP counter, the saved-tensor
tally, live bytes, a device meter), entered and left under one interrupt shield.

``probe_step``: one forward+backward under the FLOP counter and the saved-activation tally (the
same tally as ``measure_memory``); run once per configuration and never timed: the counter slows
the step. ``step_peak``: the peak memory of one forward+backward at a small micro-batch, from the
exact meters, for the estimate that refuses a step too big to fit (tunekit.lab.fit).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

from tunekit.core.notes import without
from tunekit.measure.device_meter import DeviceMeter
from tunekit.measure.flops import (
    FlopCount,
    TunekitFlopCounter,
    sdpa_backward_flops,
    sdpa_forward_flops,
    uncounted_notes,
)
from tunekit.measure.interrupts import deferred_interrupt
from tunekit.measure.oom import free_memory, memory_now_bytes
from tunekit.measure.tally import SavedTensorTally, unique_bytes
from tunekit.measure.torch_private import fake_scalar_reads_for

PHASES = ("forward", "backward", "optimizer step")


class Observer:
    """What watches a step: entered when the first phase of its ``span`` starts, left when the
    last one ends (the whole step by default), told each ``phase`` in between, and handed each
    micro-batch's ``batch`` once its forward is done (before the backward frees what it saved).
    Over ``accum`` micro-batches a span runs from its first phase in the first micro-step to its
    last phase in the last one."""

    span = ("forward", "optimizer step")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def phase(self, name: str) -> None:
        pass

    def forward_done(self, batch) -> None:
        pass


class Watch(Observer):
    """A context manager (a dispatch mode, the tally, a meter) as an observer over ``span``;
    ``on_phase(name)`` is told each phase (LiveBytes.set_phase)."""

    def __init__(self, cm, span=("forward", "backward"), on_phase=None):
        self.cm, self.span, self.on_phase = cm, span, on_phase

    def __enter__(self):
        self.cm.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        return bool(self.cm.__exit__(*exc))

    def phase(self, name: str) -> None:
        if self.on_phase is not None:
            self.on_phase(name)


def run_step(loss_of, batch_of, *, accum: int = 1, autocast=contextlib.nullcontext, optimizer=None,
             scaler=None, sync=None, zero_grad: bool = False, observers=(), keep_loss: bool = True):
    """One training step; returns its loss summed over the micro-batches (detached), or None with
    ``keep_loss=False`` (a measured step: the loss is freed after its backward, as in a loop that
    does not keep it).

    ``loss_of(*batch)`` is the forward's loss; ``batch_of(i)`` the i-th micro-batch (called when
    its forward starts, so an observer of the forward sees it made); ``autocast()`` a fresh
    context for the forward; ``optimizer`` None: no update (gradients are left for the caller);
    ``sync(last)`` a context holding the gradient sync back until the last micro-step;
    ``zero_grad``: the optimizer drops the gradients after its update.

    Without observers nothing is added to the step (the timed path). With them, entering and
    leaving every observer runs with Ctrl-C held (tunekit.measure.interrupts), and only the
    model's forward, backward and update run interruptible: a Ctrl-C at any instant leaves no
    observer installed."""
    if not observers:
        return _steps(loss_of, batch_of, accum, autocast, optimizer, scaler, sync, zero_grad, keep_loss,
                      _Watching((), None))
    with deferred_interrupt() as shield:
        watch = _Watching(observers, shield)
        try:
            return _steps(loss_of, batch_of, accum, autocast, optimizer, scaler, sync, zero_grad, keep_loss, watch)
        finally:
            watch.leave_all()


def _steps(loss_of, batch_of, accum, autocast, optimizer, scaler, sync, zero_grad, keep_loss, watch):
    gate = watch.shield.gate if watch.shield is not None else contextlib.nullcontext
    total = None
    for i in range(accum):
        last = i == accum - 1
        watch.at("forward")
        with sync(last) if sync is not None else contextlib.nullcontext():
            with gate():
                batch = batch_of(i)
                with autocast():
                    loss = loss_of(*batch)
            watch.forward_done(batch, last)
            del batch   # autograd keeps what it saved; the inputs themselves need not outlive the forward
            if accum > 1:
                loss = loss / accum
            watch.at("backward")
            with gate():
                (scaler.scale(loss) if scaler is not None else loss).backward()
            watch.done("backward", last)
        if keep_loss:
            total = loss.detach() if total is None else total + loss.detach()
        del loss
    if optimizer is not None:
        watch.at("optimizer step")
        with gate():
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                # a fake step's optimizer may read a value (Adafactor's .item()): 1, see fake_scalar_reads
                with fake_scalar_reads_for(optimizer):
                    optimizer.step()
            if zero_grad:
                optimizer.zero_grad(set_to_none=True)
        watch.done("optimizer step", True)
    return total


class _Watching:
    """The observers of one step: entered at the first phase of their span, left after its last
    (or when the step ends), all with the shield's gate shut."""

    def __init__(self, observers, shield):
        self.waiting, self.entered, self.shield = list(observers), [], shield

    def at(self, phase: str) -> None:
        for o in [o for o in self.waiting if o.span[0] == phase]:
            self.waiting.remove(o)
            o.__enter__()
            self.entered.append(o)
        for o in self.entered:
            o.phase(phase)

    def forward_done(self, batch, last: bool) -> None:
        for o in self.entered:
            o.forward_done(batch)
        self.done("forward", last)

    def done(self, phase: str, last: bool) -> None:
        if last:   # the last entered first: dispatch modes and saved-tensor hooks are stacks
            for o in [o for o in reversed(self.entered) if o.span[1] == phase]:
                self.entered.remove(o)
                o.__exit__(None, None, None)

    def leave_all(self) -> None:
        error = None
        for o in reversed(self.entered):
            try:
                o.__exit__(None, None, None)
            except Exception as e:   # every observer is left; the first failure is raised after
                error = error or e
        self.entered = []
        if error is not None:
            raise error


@dataclass
class ProbeResult:
    flops: FlopCount                  # per micro-batch
    saved_bytes: int                  # activations saved for backward, one micro-batch
    attention_ran: str | None
    notes: list = field(default_factory=list)
    cast_bytes: int = 0               # autocast's half copies of weights kept for backward
    per_sample: int = 1               # tokens per sample of the probed batch (its seq_len, or 1)
    unit: str = "tokens"              # what per_sample counts: "tokens", or "samples" (no sequence dimension)


def per_sample(x, seq_len) -> tuple[int, str]:
    """What one sample of a batch whose first input is ``x`` counts: ``(seq_len, "tokens")`` when
    ``x`` has a sequence dimension of that length (B, S, ...), else ``(1, "samples")`` (images,
    features): the Lab's tokens/s, samples/s for a model without a sequence, and the plan's.

    >>> per_sample(torch.zeros(4, 128, dtype=torch.long), 128), per_sample(torch.zeros(4, 3, 32, 32), 128)
    ((128, 'tokens'), (1, 'samples'))"""
    shape = tuple(getattr(x, "shape", ()))
    return (seq_len, "tokens") if len(shape) >= 2 and shape[1] == seq_len else (1, "samples")


def probe_step(model: torch.nn.Module, loss_of, x, y, autocast) -> ProbeResult:
    """Count FLOPs and saved-activation bytes of one forward+backward; gradients are cleared.

    ``loss_of(x, y)`` returns the scalar loss; ``autocast()`` returns a fresh context manager.
    Example: ``probe_step(lab.model, lambda x, y: lab.model(x, y)[1], x, y, nullcontext)``.
    """
    tally = SavedTensorTally(list(model.parameters()), list(model.buffers()))
    counter = TunekitFlopCounter()
    saved = _Saved(tally)
    try:
        run_step(loss_of, lambda i: (x, y), autocast=autocast, keep_loss=False,
                 observers=[Watch(counter), Watch(tally, span=("forward", "forward")), saved])
    finally:
        model.zero_grad(set_to_none=True)
    fc = counter.result()
    return ProbeResult(fc, saved.acts, getattr(model, "attention_ran", None), list(fc.notes), saved.casts)


class _Saved(Observer):
    """The tally's bytes when the forward is done (the backward frees them), and the floor of a
    step's peak: the larger of those and the batch."""

    span = ("forward", "forward")

    def __init__(self, tally):
        self.tally, self.acts, self.casts, self.floor = tally, 0, 0, 0

    def forward_done(self, batch) -> None:
        self.acts, self.casts = self.tally.activation_bytes, self.tally.cast_bytes
        self.floor = max(self.acts + self.casts, unique_bytes(list(batch)))


def step_peak(model, loss_of, batch_of, autocast, device, cuda_index=None) -> tuple[float, int]:
    """(peak, floor): bytes one forward+backward takes above what was in use before it, the batch
    ``batch_of()`` makes included; gradients are cleared after.

    ``peak`` is read by the device's exact meter (CPU: VmHWM, once glibc has handed its free pages
    back, else reused pages would not show; CUDA: the allocator's peak); NaN where not measured.
    ``floor`` is what the step provably holds at the end of its forward: the larger of the batch
    and the tensors autograd saved for backward (tallied storage by storage), a lower bound that
    page-size noise in the meter cannot shrink.
    """
    free_memory(device, collect=False)
    before = memory_now_bytes(device)
    tally = SavedTensorTally(list(model.parameters()), list(model.buffers()))
    meter = _Meter(DeviceMeter(device, cuda_index))
    saved = _Saved(tally)
    try:
        run_step(loss_of, lambda i: batch_of(), autocast=autocast, keep_loss=False,
                 observers=[meter, Watch(tally, span=("forward", "forward")), saved])
    finally:
        model.zero_grad(set_to_none=True)
    return (math.nan if meter.peak is None else meter.peak - before), saved.floor


class _Meter(Observer):
    """A device meter's peak over the forward and backward."""

    span = ("forward", "backward")

    def __init__(self, meter):
        self.meter, self.peak = meter, None

    def __enter__(self):
        self.meter.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.peak = self.meter.stop()
        return False


def add_flash_flops(res: ProbeResult, shape, batch: int, seq_len: int, checkpointing: bool) -> None:
    """flash-attn's kernels are invisible to torch's FLOP counter: add their causal FLOPs.

    ``shape``: a ModelShape (or GPTConfig). Same accounting as tunekit.measure.flops for SDPA:
    forward 4*B*nh*T^2*hs, backward 10*B*nh*T^2*hs of which 2 units rebuild the scores, halved
    for the causal mask; checkpointing runs the forward once more.
    """
    qkv = (batch, shape.n_head, seq_len, shape.head_dim)  # (B, nh, T, hs)
    fwd = sdpa_forward_flops(qkv, qkv, qkv) // 2 * shape.n_layer
    bwd = sdpa_backward_flops(qkv, qkv, qkv) // 2 * shape.n_layer
    redo = fwd if checkpointing else 0
    res.flops.executed += fwd + bwd + redo
    res.flops.recompute += redo
    res.flops.attention_recompute += bwd // 5   # d / (3d + 2d)
    # the counter listed flash-attn's custom ops as uncounted: they are accounted for now, and
    # the uncounted note names the others alone
    res.flops.uncounted_ops = [op for op in res.flops.uncounted_ops if not op.startswith("flash_attn")]
    left = uncounted_notes(res.flops.uncounted_ops)
    res.flops.notes = without(res.flops.notes, "flops.uncounted") + left
    res.notes = without(res.notes, "flops.uncounted") + left
    res.notes.append("added flash-attn FLOPs (torch's counter cannot see them): causal, analytic")
