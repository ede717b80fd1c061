"""What a monitored model is called with during a step: tokens and samples, the inputs' shapes,
the dtype it computes in, and, when asked, a FLOP count of the step from its first forward on.
Engine layer.

One forward pre-hook on the model. Each call adds its tokens (B x S from the inputs, for the
models tunekit knows the shape of: `models.adapters`) or its samples (the first input tensor's
first dimension, for any other module), so grad accumulation and Trainer-driven loops need no
batch from the user. The first call of a step names the step's *signature* (input shapes, train
mode, grad, autocast); a signature with no FLOP count yet starts the counter right there, so the
step that first shows new shapes is the one counted (no step reuses a count of other shapes).
"""
from __future__ import annotations

import torch

from ...measure.flops import TunekitFlopCounter

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
MAX_COUNTS = 16  # signatures counted per monitor; past it (shapes change every step) none is


class StepTap:
    """``tap = StepTap(model, adapter); tap.begin(counts); ...step...; info = tap.end()``."""

    def __init__(self, model: torch.nn.Module, adapter):
        self.model, self.adapter = model, adapter
        self.handle = model.register_forward_pre_hook(self._pre, with_kwargs=True)
        self.counts: dict = {}       # signature -> FlopCount
        self.dtype = None            # tunekit dtype name of the latest call
        self.counter = None
        self.active = False

    def begin(self, count: bool) -> None:
        """A step starts; ``count``: a new signature may start the FLOP counter."""
        self.may_count, self.active = count, True
        self.tokens = self.samples = 0
        self.unknown = None          # why a call's tokens or samples are unknown
        self.signature = None
        self.seq = set()             # sequence lengths seen (model FLOPs from the shape)
        self.calls = []              # (tokens, seq_len, trained) per call of a known shape

    def _pre(self, module, args, kwargs):
        if not self.active:
            return
        try:  # never an error in the user's forward: what cannot be read is said in the row
            self._call(args, kwargs)
        except Exception as e:
            self.unknown = self.unknown or f"{type(e).__name__}: {e}"

    def _call(self, args, kwargs):
        grad = torch.is_grad_enabled()
        trained = grad and self.model.training
        try:
            b, s = self.adapter.forward_tokens(args, kwargs)
            self.tokens += b * s
            self.samples += b
            self.calls.append((b * s, s, trained))
        except ValueError as e:
            first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
            if first is None or first.dim() == 0:
                self.unknown = f"{type(self.model).__name__}'s forward got no batched tensor ({e})"
            else:
                self.samples += first.shape[0]
                self.tokens = None  # a model without a sequence tunekit knows: samples only
        device = next((a.device.type for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), "cpu")
        auto = torch.is_autocast_enabled(device)
        self.dtype = _DTYPES.get(torch.get_autocast_dtype(device) if auto else _param_dtype(self.model), "fp32")
        if self.signature is None:
            self.signature = (_shapes(args, kwargs), self.model.training, grad, auto, self.dtype)
            if self.may_count and self.signature not in self.counts and len(self.counts) < MAX_COUNTS:
                counter = TunekitFlopCounter()
                counter.__enter__()
                self.counter = counter

    def end(self) -> dict:
        """The step's calls: tokens, samples, signature, and its FLOP count if it was counted."""
        self.active = False
        counted, counter, self.counter = None, self.counter, None
        if counter is not None:
            counter.__exit__(None, None, None)
            counted = counter.result()
        return {"tokens": self.tokens, "samples": self.samples, "signature": self.signature,
                "unknown": self.unknown, "count": counted, "calls": list(self.calls)}

    def abort(self) -> None:
        """Leave torch's dispatch stack as found whatever happened (a failed step)."""
        counter, self.counter = self.counter, None
        self.active = False
        if counter is not None:
            counter.__exit__(None, None, None)

    def remove(self) -> None:
        self.abort()
        self.handle.remove()


def _param_dtype(model):
    p = next(model.parameters(), None)
    return None if p is None else p.dtype


def _shapes(args, kwargs) -> tuple:
    """The shapes and dtypes of the call's tensor inputs (top level): what decides its work."""
    def one(v):
        return (tuple(v.shape), str(v.dtype)) if isinstance(v, torch.Tensor) else type(v).__name__
    return tuple(one(a) for a in args) + tuple((k, one(v)) for k, v in sorted(kwargs.items()))
