"""What a monitored model is called with during a step: tokens and samples, the inputs' shapes,
the dtype it computes in, and, when asked, a FLOP count of the step from its first forward on.

Forward hooks on the model and on its direct children with weights (a wrapper whose own forward
is not what runs, a LightningModule calling ``self.model``, is seen through the child it calls);
only outermost calls count. Tokens and samples come from the calls of the step's *entry* module
(the first watched module called; its later calls too, for gradient accumulation): B x S for the
models tunekit knows the shape of (`models.adapters`), else samples from the first input (a
tensor's first dimension, a list's length). Calls made without grad (an evaluation inside the
step) add to them only in a step where nothing trained.

A step's *signature* is every outermost call's inputs (shapes and dtypes, inside dicts and lists),
train mode, grad and autocast: FLOPs are counted once per signature. The counter starts at the
step's first forward when that first call's inputs were never part of a counted step (or a
recount is due) and stops at the first optimizer step after it (torch's global optimizer hook),
else at the step's end; a step whose full signature turns out to have no count (a later
micro-batch of new shapes) gets no FLOPs and the next step is counted.
"""
from __future__ import annotations

from time import perf_counter

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from tunekit.core.registry import FP32
from tunekit.measure.device import dtype_name
from tunekit.measure.flops import TunekitFlopCounter
from tunekit.models.adapters import adapt

MAX_COUNTS = 16  # signatures counted per monitor; past it (shapes change every step) none is


class StepTap:
    """``tap = StepTap(model, adapter); tap.begin(count); ...step...; info = tap.end()``."""

    def __init__(self, model: torch.nn.Module, adapter):
        self.model = model
        watched = [(model, adapter)] + [(c, adapt(c)) for c in model.children()
                                        if next(c.parameters(), None) is not None]
        self.handles = []
        for m, a in watched:
            self.handles.append(m.register_forward_pre_hook(self._hook(a), with_kwargs=True))
            self.handles.append(m.register_forward_hook(self._leave, always_call=True))
        self.counts: dict = {}       # full signature -> FlopCount
        self.first_seen: set = set()  # first-call signatures of counted steps
        self.recount = False          # the last step's inputs had no count: count the next one
        self.param_dtype = dominant_dtype(model)
        self.dtype = None             # tunekit dtype name of the latest call
        self.counter = None
        self.active = False
        self.depth = 0                # watched forwards running: only the outermost call counts

    @property
    def full(self) -> bool:
        return len(self.counts) >= MAX_COUNTS

    def _hook(self, adapter):
        def pre(module, args, kwargs):
            self.depth += 1
            if self.active and self.depth == 1:
                self._pre(adapter, module, args, kwargs)
        return pre

    def _leave(self, module, args, out):
        self.depth = max(self.depth - 1, 0)

    def begin(self, count: bool) -> None:
        """A step starts; ``count``: new inputs may start the FLOP counter."""
        self.may_count, self.active, self.depth = count, True, 0
        self.own_s = 0.0
        self.entry = None            # the first watched module called in the step
        self.amounts = {True: [0, 0], False: [0, 0]}   # trained? -> [tokens, samples]
        self.no_tokens = False       # the entry module has no sequence tunekit knows
        self.unknown = None          # why a call's tokens or samples are unknown
        self.token_ids = None        # (B, S) of an entry call counted in samples whose input looks like token ids
        self.signature = []
        self.calls = []              # (adapter, tokens, seq_len, trained) per call of a known shape

    def _pre(self, adapter, module, args, kwargs):
        t0 = perf_counter()
        try:  # never an error in the user's forward: what cannot be read is said in the row
            self._call(adapter, module, args, kwargs)
        except Exception as e:
            self.unknown = self.unknown or f"{type(e).__name__}: {e}"
        self.own_s += perf_counter() - t0   # the monitor's own time inside the step

    def _call(self, adapter, module, args, kwargs):
        grad = torch.is_grad_enabled()
        trained = grad and module.training
        device = _device_of(args, kwargs)
        auto = torch.is_autocast_enabled(device)
        self.dtype = dtype_name(torch.get_autocast_dtype(device) if auto else self.param_dtype) or FP32
        first = not self.signature
        self.signature.append((type(module).__name__, _shapes((args, kwargs)), module.training, grad, auto, self.dtype))
        if first and self.may_count and not self.full and (self.recount or self.signature[0] not in self.first_seen):
            self._start_count()
        if self.entry is None:
            self.entry = module
        if module is not self.entry:   # another part of the model (net.head(net.backbone(x)))
            return
        amount = self.amounts[trained]
        try:
            b, s = adapter.forward_tokens(args, kwargs)
            amount[0] += b * s
            amount[1] += b
            self.calls.append((adapter, b * s, s, trained))
        except ValueError as e:
            n = _samples(args, kwargs)
            if n is None:
                self.unknown = f"{type(module).__name__}'s forward got no batched input ({e})"
            else:
                amount[1] += n
                self.no_tokens = True  # a model without a sequence tunekit knows: samples only
                self.token_ids = self.token_ids or _token_ids(args, kwargs)

    def _start_count(self) -> None:
        """The counter on from this forward to the step's optimizer step (or the step's end): a
        loop left half-way with its iterator held does not leave it counting every op after."""
        counter = TunekitFlopCounter()
        counter.__enter__()
        self.counter, self.counted = counter, None
        self.opt_hook = register_optimizer_step_post_hook(self._optimizer_stepped)

    def _optimizer_stepped(self, optimizer, args, kwargs) -> None:
        self._stop_count()

    def _stop_count(self) -> None:
        counter, self.counter = self.counter, None
        hook, self.opt_hook = getattr(self, "opt_hook", None), None
        if hook is not None:
            hook.remove()
        if counter is not None:
            counter.__exit__(None, None, None)
            self.counted = counter.result()

    def end(self) -> dict:
        """The step's tokens, samples, signature and calls, and its FLOP count if it was counted."""
        self.active = False
        self._stop_count()
        counted, self.counted = getattr(self, "counted", None), None
        key = tuple(self.signature)
        if counted is not None:
            self.counts[key] = counted
            self.first_seen.add(key[0])
            self.recount = False
        known = self.counts.get(key)
        if known is None and key and not self.full and self.may_count:
            self.recount = True        # new inputs met after the step's first call: count the next
        tokens, samples = self.amounts[True] if self.amounts[True][1] else self.amounts[False]
        return {"tokens": None if self.no_tokens or not tokens else tokens, "samples": samples or None,
                "signature": key, "unknown": self.unknown, "count": counted, "known": known,
                "calls": [c for c in self.calls if c[3]] or list(self.calls), "own_s": self.own_s,
                "token_ids": self.token_ids}

    def abort(self) -> None:
        """Leave torch's dispatch stack as found whatever happened (a failed step)."""
        self.active = False
        self._stop_count()
        self.counted = None

    def remove(self) -> None:
        self.abort()
        for h in self.handles:
            h.remove()
        self.handles = []


def dominant_dtype(model):
    """The dtype holding most of the model's parameters (what its matmuls mostly run in)."""
    sizes: dict = {}
    for p in model.parameters():
        sizes[p.dtype] = sizes.get(p.dtype, 0) + p.numel()
    return max(sizes, key=sizes.get) if sizes else None


def _device_of(args, kwargs) -> str:
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            return v.device.type
    return "cpu"


def _samples(args, kwargs):
    """Samples of a call of a module tunekit knows no shape of: its first input's first
    dimension, or the length of a list/tuple of tensors (one sample each, images say), or the
    first tensor of a dict's. None when the inputs do not tell."""
    first = args[0] if args else next(iter(kwargs.values()), None)
    if isinstance(first, dict):
        first = next((v for v in first.values() if isinstance(v, torch.Tensor)), None)
    if isinstance(first, torch.Tensor):
        return first.shape[0] if first.dim() else None
    if isinstance(first, (list, tuple)) and first and all(isinstance(v, torch.Tensor) for v in first):
        return len(first)
    return None


def _token_ids(args, kwargs):
    """(B, S) when a call's first input is a 2-D tensor of integers (what token ids look like), else None."""
    first = args[0] if args else next(iter(kwargs.values()), None)
    if isinstance(first, torch.Tensor) and first.dim() == 2 and first.dtype in (torch.int64, torch.int32):
        return tuple(first.shape)
    return None


def _shapes(value, depth: int = 0):
    """Shapes and dtypes of tensors, looked for inside tuples, lists and dicts (3 levels, 64
    items): what decides a call's work. Plain numbers and strings count by value."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), str(value.dtype))
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    if depth >= 3:
        return type(value).__name__
    if isinstance(value, dict):
        return tuple((k, _shapes(v, depth + 1)) for k, v in list(sorted(value.items(), key=lambda kv: str(kv[0])))[:64])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, len(value)) + tuple(_shapes(v, depth + 1) for v in value[:64])
    return type(value).__name__
