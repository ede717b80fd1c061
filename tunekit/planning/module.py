"""`tunekit.plan` on an nn.Module: a fake twin of the module, stepped on the user's batches and
loss (the Lab's contract: ``batch_fn(micro_batch, seq_len) -> (x, y)``, ``loss_fn(model, x, y)``,
``blocks`` to checkpoint).

The twin is ``copy.deepcopy(module, memo)`` with the memo filled first: every parameter, buffer
and tensor attribute of the module maps to a fake CPU tensor of its shape, stride, dtype and
requires_grad, made in the plan's FakeTensorMode. deepcopy then copies the structure (submodules,
config, flags) and takes the fakes for the tensors, so no weight is copied and the live module
is only read: a module built on the meta device and one with real weights plan the same way.
"""
from __future__ import annotations

import copy

import torch

from tunekit.core.setting import HALF
from tunekit.measure.device import weights_dtype
from tunekit.measure.step import per_sample
from tunekit.models.adapters import adapt, loss_of, step_loss

KINDS = {"tunekit-gpt": "gpt", "transformers": "hf"}   # adapter kind -> the plan's kind


class ModuleTarget:
    """A live module to plan, with the Lab's ``batch_fn``, ``loss_fn`` and ``blocks``.

    ``kind``: "gpt" or "hf" for tunekit's GPT or a transformers model trained as the Lab trains
    it (its own loss, its own blocks): the step is a config's step on the twin (token batches
    unless ``batch_fn`` is given, analytic MFU). "module" otherwise: the twin is wrapped in
    `Stepped` with the user's loss, and its ``blocks`` are checkpointed when asked.

    Example: ``ModuleTarget(net, batch_fn=lambda b, s: (torch.randn(b, 64), torch.randn(b, 1)))``."""

    def __init__(self, module, batch_fn=None, loss_fn=None, blocks=None):
        adapter = adapt(module, blocks)   # resolves ``blocks`` on the live module (read only)
        self.module = adapter.model       # a compiled or DDP-wrapped model: the model inside
        self.inner_kind = KINDS.get(adapter.kind, "module")
        self.config = module.config if self.inner_kind != "module" else None
        own = self.inner_kind != "module" and loss_fn is None and blocks is None
        self.kind = self.inner_kind if own else "module"
        if batch_fn is None and self.inner_kind == "module":
            raise TypeError(f"tunekit.plan needs batch_fn=lambda micro_batch, seq_len: (x, y) to plan "
                            f"{type(self.module).__name__}: tunekit knows no batch for it (its loss: "
                            "loss_fn=lambda model, x, y: ..., default the output summed)")
        if not any(p.requires_grad for p in self.module.parameters()):
            raise ValueError(f"{type(self.module).__name__} has no parameter to train (every one has "
                             "requires_grad=False): unfreeze what the step trains before planning it")
        self.batch_fn, self.loss_fn = batch_fn, loss_fn
        self.blocks = adapter.blocks() if blocks is not None else None
        self.live_checkpointing = adapter.checkpointing
        self.can_checkpoint = adapter.can_checkpoint   # blocks named, or a model that knows its own

    @property
    def name(self) -> str:
        n = sum(p.numel() for p in self.module.parameters())
        return f"{type(self.module).__name__} ({n:,} parameters)"

    def toggles(self) -> dict:
        """What the live module says of the step: checkpointing as it is set, and its weights'
        dtype when they are all half (they are planned as they are)."""
        weights = weights_dtype(self.module.parameters())
        weights = weights if weights in HALF else None
        return dict(checkpointing=self.live_checkpointing, **({"weights": weights} if weights else {}))

    def build(self, dtype=None) -> torch.nn.Module:
        """The fake twin (call it inside the plan's FakeTensorMode); ``dtype``: its floating
        parameters and buffers cast, as ``module.to(dtype)`` would (None, or the dtype all its
        floating parameters have already: as they are, an fp32 buffer of a bf16 model stays fp32)."""
        dtypes = {p.dtype for p in self.module.parameters() if p.is_floating_point()}
        memo = fake_memo(self.module, None if dtypes == {dtype} else dtype)
        twin = copy.deepcopy(self.module, memo)
        _drop_live_wrappers(self.module, twin)
        if self.kind != "module":
            return twin
        blocks = [memo[id(b)] for b in self.blocks] if self.blocks is not None else None
        return Stepped(twin, self.loss_fn, adapt(twin, blocks))

    def batch(self, micro_batch: int, seq_len: int) -> tuple:
        """``batch_fn(micro_batch, seq_len)`` made fake (call it inside the FakeTensorMode: its
        torch.randint and the like make fakes): a real or non-CPU tensor it returns becomes a fake
        CPU tensor of the same shape, dtype and requires_grad (its values are not needed)."""
        out = self.batch_fn(micro_batch, seq_len)
        return tuple(_fake_inputs(v) for v in (out if isinstance(out, (tuple, list)) else (out,)))

    def amount(self, micro_batch: int, seq_len: int) -> tuple[int, str]:
        """(tokens or samples of one micro-batch, "tokens" or "samples"): B x S when the batch's
        first input has a sequence of ``seq_len``, else B samples (the Lab's rule, per_sample)."""
        if self.batch_fn is None:
            return micro_batch * seq_len, "tokens"
        first = next(iter(self.batch(micro_batch, seq_len)), None)
        per, unit = per_sample(first, seq_len)
        return micro_batch * per, unit


class Stepped(torch.nn.Module):
    """The twin and the loss it trains on: ``stepped(*batch)`` is the scalar loss of one step,
    ``loss_fn(model, *batch)`` (default: models.adapters.step_loss for the adapter's kind), a loss
    that is not one number summed in fp32 as ``measure_memory`` does. ``adapter`` checkpoints its
    blocks."""

    def __init__(self, model, loss_fn, adapter):
        super().__init__()
        self.model, self.loss_fn, self.adapter = model, loss_fn, adapter
        self.checked = False

    @property
    def planned_model(self) -> torch.nn.Module:
        """The user's model (its twin) this wraps: what a plan's peak is said to be in (measure.live)."""
        return self.model

    def forward(self, *batch):
        out = self.loss_fn(self.model, *batch) if self.loss_fn is not None else \
            step_loss(self.model, batch, self.adapter.kind, reduce=False)
        try:
            loss = loss_of(out)
        except TypeError as e:
            raise TypeError(f"{e}: give loss_fn=lambda model, x, y: ... returning one") from None
        if not self.checked:   # a loss_fn that calls the live model would plan nothing of the twin
            trained = {id(p) for p in self.model.parameters() if p.requires_grad}
            if trained and not _reaches(loss.grad_fn, trained):
                raise ValueError("loss_fn's loss does not reach the model it is given: loss_fn(model, x, y) must "
                                 "call that model, not one it refers to")
            self.checked = True
        return loss


def _reaches(grad_fn, ids: set) -> bool:
    """Whether autograd's graph from ``grad_fn`` accumulates into a parameter whose id is in ``ids``."""
    seen, todo = set(), [grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if id(getattr(fn, "variable", None)) in ids:
            return True
        todo.extend(f for f, _ in fn.next_functions)
    return False


def fake_memo(module, dtype=None) -> dict:
    """deepcopy's memo for a fake twin: id of every parameter, buffer and tensor attribute of
    ``module`` -> a fake CPU tensor like it (tied tensors stay tied: one id, one fake)."""
    memo = {}
    attributes = [v for m in module.modules() for v in vars(m).values() if isinstance(v, torch.Tensor)]
    for t in [*module.parameters(), *module.buffers(), *attributes]:
        if id(t) in memo:
            continue
        cast = dtype if dtype is not None and t.is_floating_point() else t.dtype
        fake = torch.empty_strided(t.shape, t.stride(), dtype=cast, device="cpu")
        memo[id(t)] = torch.nn.Parameter(fake, requires_grad=t.requires_grad) \
            if isinstance(t, torch.nn.Parameter) else fake
    return memo


def _drop_live_wrappers(module, twin) -> None:
    """A block the Lab checkpoints has its forward replaced by a wrapper of the live block's
    bound forward; deepcopy keeps that function as it is, so the twin would call the live block.
    The twin gets its class's forward back (the plan sets checkpointing itself)."""
    for live, copied in zip(module.modules(), twin.modules()):
        wrapped = getattr(copied.__dict__.get("forward"), "__wrapped__", None)
        if getattr(wrapped, "__self__", None) is live:
            del copied.forward


def _fake_inputs(v):
    """``v`` with every tensor in it (in tuples, lists and dicts too) a fake CPU tensor."""
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(v, (tuple, list)):
        return type(v)(_fake_inputs(x) for x in v)
    if isinstance(v, dict):
        return {k: _fake_inputs(x) for k, x in v.items()}
    if not isinstance(v, torch.Tensor) or (isinstance(v, FakeTensor) and v.device.type == "cpu"):
        return v
    fake = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cpu")
    return fake.requires_grad_() if v.requires_grad else fake
