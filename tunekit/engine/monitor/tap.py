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
from ...models.adapters import adapt

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
MAX_COUNTS = 16  # signatures counted per monitor; past it (shapes change every step) none is


class StepTap:
    """``tap = StepTap(model, adapter); tap.begin(counts); ...step...; info = tap.end()``."""

    def __init__(self, model: torch.nn.Module, adapter):
        self.model = model
        # the model and its direct children with weights: a wrapper whose forward is not what runs
        # (a LightningModule calling self.model) is seen through the child it calls
        watched = [(model, adapter)] + [(c, adapt(c)) for c in model.children()
                                        if next(c.parameters(), None) is not None]
        self.handles = []
        for m, a in watched:
            self.handles.append(m.register_forward_pre_hook(self._hook(a), with_kwargs=True))
            self.handles.append(m.register_forward_hook(self._leave, always_call=True))
        self.counts: dict = {}       # signature -> FlopCount
        self.dtype = None            # tunekit dtype name of the latest call
        self.counter = None
        self.active = False
        self.depth = 0               # watched forwards running: only the outermost call counts

    def _hook(self, adapter):
        def pre(module, args, kwargs):
            self.depth += 1
            if self.active and self.depth == 1:
                self._pre(adapter, module, args, kwargs)
        return pre

    def _leave(self, module, args, out):
        self.depth = max(self.depth - 1, 0)

    def begin(self, count: bool) -> None:
        """A step starts; ``count``: a new signature may start the FLOP counter."""
        self.may_count, self.active = count, True
        self.tokens = self.samples = 0
        self.unknown = None          # why a call's tokens or samples are unknown
        self.signature = None
        self.depth = 0
        self.calls = []              # (adapter, tokens, seq_len, trained) per call of a known shape

    def _pre(self, adapter, module, args, kwargs):
        try:  # never an error in the user's forward: what cannot be read is said in the row
            self._call(adapter, module, args, kwargs)
        except Exception as e:
            self.unknown = self.unknown or f"{type(e).__name__}: {e}"

    def _call(self, adapter, module, args, kwargs):
        grad = torch.is_grad_enabled()
        trained = grad and module.training
        try:
            b, s = adapter.forward_tokens(args, kwargs)
            self.tokens += b * s
            self.samples += b
            self.calls.append((adapter, b * s, s, trained))
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
            self.signature = (type(module).__name__, _shapes(args, kwargs), module.training, grad, auto, self.dtype)
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
        for h in self.handles:
            h.remove()


def _param_dtype(model):
    p = next(model.parameters(), None)
    return None if p is None else p.dtype


def _shapes(args, kwargs) -> tuple:
    """The shapes and dtypes of the call's tensor inputs (top level): what decides its work."""
    def one(v):
        return (tuple(v.shape), str(v.dtype)) if isinstance(v, torch.Tensor) else type(v).__name__
    return tuple(one(a) for a in args) + tuple((k, one(v)) for k, v in sorted(kwargs.items()))
