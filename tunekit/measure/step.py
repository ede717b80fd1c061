"""What the Lab measures outside its timed steps. Measurement for the engine; never prints.

``probe_step``: one forward+backward under the FLOP counter that also tallies the bytes autograd
saves for backward (what activation checkpointing shrinks), with the same tally as
``measure_memory``. Run once per configuration and never timed: the counter slows the step.
``step_peak``: the peak memory of one forward+backward at a small micro-batch, from the exact
meters, for the estimate that refuses a step too big to fit (tunekit.engine.fit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..core.notes import without
from .flops import FlopCount, TunekitFlopCounter, sdpa_backward_flops, sdpa_forward_flops, uncounted_notes
from .interrupts import deferred_interrupt
from .meters import DeviceMeter
from .oom import free_memory, memory_now_bytes
from .tally import SavedTensorTally, unique_bytes


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
    # The counter and the tally's hooks go on and off whole; only the model's forward and
    # backward run in the gate (a Ctrl-C there is raised at once, and waits in the clean-up).
    with deferred_interrupt() as shield:
        counter.__enter__()
        try:
            with tally, autocast():
                with shield.gate():
                    loss = loss_of(x, y)
            # read before backward, which frees what the forward saved
            acts, casts = tally.activation_bytes, tally.cast_bytes
            with shield.gate():
                loss.backward()
        finally:
            counter.__exit__(None, None, None)
            model.zero_grad(set_to_none=True)
    fc = counter.result()
    return ProbeResult(fc, acts, getattr(model, "attention_ran", None), list(fc.notes), casts)


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
    meter = DeviceMeter(device, cuda_index).start()
    floor = 0
    try:
        x, y = batch_of()
        with tally, autocast():
            loss = loss_of(x, y)
        floor = max(tally.activation_bytes + tally.cast_bytes, unique_bytes([x, y]))
        del x, y
        loss.backward()
        del loss
    finally:
        peak = meter.stop()
        model.zero_grad(set_to_none=True)
    return (math.nan if peak is None else peak - before), floor


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
