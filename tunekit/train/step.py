"""The training step the Lab and every distributed rank take.

    >>> step = TrainStep(model, adapt(model), device, batcher.get, adapter.loss)
    >>> step.apply(t)                  # attention, checkpointing, optimizer, lr, compile
    >>> probe, source = step.probe(t)  # FLOPs and saved bytes of one untimed step
    >>> loss = step.step(t)            # grad_accum micro-batches, then the optimizer

One ``TrainStep`` owns a model, its adapter, what the step calls forward (the model, its
torch.compile'd form, or a DDP wrapper), the optimizer, fp16's GradScaler, the batch source and
the loss. A distributed rank sets ``forward`` to its wrapper and ``sync`` to what holds the
gradient sync back until the last micro-step; the sharded kinds cast through FSDP's
MixedPrecisionPolicy, so their step does not autocast (``cast=False``).
"""
from __future__ import annotations

import contextlib

import torch

from tunekit.core.notes import Note
from tunekit.core.registry import FP16
from tunekit.core.toggles import Toggles
from tunekit.measure.step import Observer, ProbeResult, add_flash_flops, per_sample, probe_step, run_step
from tunekit.models.data import Batcher
from tunekit.models.optimizers import build_optimizer
from tunekit.train.precision import autocast, matmul_precision


def token_batcher(adapter, data, device, seed: int) -> Batcher:
    """The batches of a token model: ``data`` ("corpus", "synthetic", bytes or a tensor), but
    synthetic tokens where the vocabulary is smaller than a byte (vocab < 256): byte tokens of the
    corpus would fall outside it. A model with no known vocabulary draws bytes (256)."""
    vocab = adapter.vocab_size or 256
    if vocab < 256 and isinstance(data, str) and data == "corpus":
        data = "synthetic"
    return Batcher(data, device=device, seed=seed, vocab_size=vocab)


def local_bytes(tensors) -> int:
    """Bytes of ``tensors`` held by this process (a DTensor's local shard; None skipped)."""
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors if t is not None]
    return sum(t.numel() * t.element_size() for t in local)


class TrainStep:
    """One model's training step: ``apply(t)`` puts toggles on it, ``step(t)`` takes one optimizer
    step, ``probe(t)`` counts one untimed step, ``recover()`` cleans up after a failed one.

    ``batch_fn(micro_batch, seq_len) -> (x, y)``; ``loss_fn(forward, x, y) -> loss``.
    """

    def __init__(self, model, adapter, device: torch.device, batch_fn, loss_fn, *, cast: bool = True):
        self.model, self.adapter, self.device = model, adapter, device
        self.batch_fn, self.loss_fn = batch_fn, loss_fn
        self.forward = model       # what the step calls: the model, or its DDP wrapper
        self.sync = None           # sync(last) -> context of a micro-step (None: every one syncs)
        self.cast = cast           # autocast here (False: FSDP's policy casts)
        self.optimizer = None
        self.optimizer_name = None
        self.scaler = None         # fp16's GradScaler: kept across runs, like the optimizer state
        self.compiled = None       # torch.compile(forward), made at the first compiled run
        self.grads_bytes = None    # this process's gradients at the first step's update
        # the model's attention and checkpointing as apply() last left them, and its own (`own`):
        # both as given at first
        self._applied: dict = {"attention": adapter.attention, "checkpointing": adapter.checkpointing}
        self._own = dict(self._applied)
        self._by_hand: set = set()   # which of them the user has set by hand since
        self._probes: dict[tuple, ProbeResult] = {}

    # --- toggles ----------------------------------------------------------------------------

    def apply(self, t: Toggles, notes: list | None = None) -> list:
        """Put ``t`` on the model and optimizer (attention, checkpointing, optimizer, lr,
        compile); returns ``notes`` with what changed beyond the toggles themselves."""
        notes = self.apply_model(t, notes)
        self.apply_optimizer(t, notes)
        if t.compile and self.compiled is None:
            self.compiled = torch.compile(self.forward)
        return notes

    def own(self, t: Toggles) -> Toggles:
        """``t`` with the attention and checkpointing it leaves None filled with the model's own: as
        the model was given, or as changed by hand since (a state ``apply`` did not leave, followed
        from then on); a run's own toggles are for that run."""
        a = self.adapter
        self._see_hand_changes()
        if t.attention is None and a.attentions:
            t = t.replace(attention=self._own["attention"])
        if t.checkpointing is None:
            t = t.replace(checkpointing=bool(a.can_checkpoint and self._own["checkpointing"]))
        return t

    def _see_hand_changes(self) -> None:
        """A state of the model ``apply`` did not leave was set by hand: the model's own from now on."""
        a = self.adapter
        for what, now in (("attention", a.attention), ("checkpointing", a.checkpointing)):
            if now != self._applied[what]:
                self._own[what] = now
                self._by_hand.add(what)

    def apply_model(self, t: Toggles, notes: list | None = None) -> list:
        """Attention kind and checkpointing: what a rank sets before it shards the model."""
        notes = [] if notes is None else notes
        a = self.adapter
        self._see_hand_changes()
        for what, wanted in (("attention", t.attention), ("checkpointing", t.checkpointing)):
            own = self._own[what]
            if what in self._by_hand and wanted is not None and wanted != own:
                # a toggle left out is the model's own (`own`): this one was given, over a hand change
                notes.append(Note("toggle.over_hand_change",
                                  f"{what} was set to {own!r} on the model by hand; this run's {what}={wanted!r}, "
                                  f"given explicitly, replaced it for this run (leave {what} out to run the "
                                  "model as it was set)"))
        if t.attention is not None and a.attentions and t.attention != a.attention:
            a.set_attention(t.attention)
        if a.can_checkpoint and t.checkpointing != a.checkpointing:
            a.set_checkpointing(t.checkpointing)
        self._applied = {"attention": a.attention, "checkpointing": a.checkpointing}
        return notes

    def apply_optimizer(self, t: Toggles, notes: list | None = None) -> list:
        """The optimizer of ``t`` (a new one, its state empty, when the kind changes or none is
        built yet; a rank builds it after sharding) and its learning rate."""
        notes = [] if notes is None else notes
        if self.optimizer is None or self.optimizer_name != t.optimizer:
            if self.optimizer is not None:
                notes.append(f"new optimizer {t.optimizer} (was {self.optimizer_name}): its state starts empty")
            self.optimizer = self.scaler = None  # drop the old state before allocating anew
            self.optimizer = build_optimizer(t.optimizer, self.model.parameters(), t.lr)
            self.optimizer_name = t.optimizer
        for group in self.optimizer.param_groups:
            group["lr"] = t.lr
        return notes

    def reset_optimizer(self) -> None:
        """Drop the optimizer, its state and the GradScaler: the next ``apply`` builds them anew."""
        self.optimizer = self.optimizer_name = self.scaler = None

    def grad_scaler(self, t: Toggles):
        """The GradScaler for an fp16 run (None otherwise). It lives as long as the optimizer:
        a fresh one would restart at scale 2**16 and skip the first steps of every run."""
        if not t.grad_scaler:
            return None
        if self.scaler is None:
            self.scaler = torch.amp.GradScaler(self.device.type)
        return self.scaler

    def scaler_state(self) -> dict | None:
        """The GradScaler's state (its scale and growth tracker), None without one."""
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_scaler_state(self, state: dict | None) -> None:
        """Put a GradScaler back with ``state`` (from ``scaler_state``); None: nothing to do."""
        if state is not None:
            self.grad_scaler(Toggles(precision=FP16)).load_state_dict(state)

    # --- one step ---------------------------------------------------------------------------

    def step(self, t: Toggles):
        """One optimizer step under ``t`` (applied): ``grad_accum`` micro-batches of forward and
        backward (the gradients synced on the last), then the optimizer (measure.step.run_step).
        Returns the summed loss (a tensor)."""
        fwd = self.compiled if t.compile else self.forward
        observers = [] if self.grads_bytes is not None else [_GradsBytes(self)]   # read at the first update
        with matmul_precision(t, self.device):
            return run_step(lambda x, y: self.loss_fn(fwd, x, y), lambda i: self.batch_fn(t.micro_batch, t.seq_len),
                            accum=t.grad_accum, autocast=self._autocast(t), optimizer=self.optimizer,
                            scaler=self.grad_scaler(t), sync=self.sync, zero_grad=True, observers=observers)

    def _autocast(self, t: Toggles):
        """A fresh autocast context per forward (none where FSDP's policy casts)."""
        return (lambda: autocast(t, self.device)) if self.cast else contextlib.nullcontext

    def recover(self) -> None:
        """After a failed or interrupted step: drop half-made gradients (they must not reach the
        next run) and a GradScaler that may have stopped between unscale_() and update()."""
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad(set_to_none=True)
        self.scaler = None

    # --- the untimed probe ------------------------------------------------------------------

    def probe(self, t: Toggles, batch=None) -> tuple[ProbeResult, str]:
        """FLOPs and saved-activation bytes of one untimed forward+backward of the model under
        ``t`` (``batch``, else one from ``batch_fn``), and "counted" or "cached": one count per
        configuration, the model's own state (attention, checkpointing, dtypes, mode) included."""
        key = (t.micro_batch, t.seq_len, t.precision, self.adapter.state())
        if key in self._probes:
            return self._probes[key], "cached"
        x, y = batch if batch is not None else self.batch_fn(t.micro_batch, t.seq_len)
        with matmul_precision(t, self.device):
            res = probe_step(self.model, lambda a, b: self.loss_fn(self.model, a, b), x, y,
                             lambda: autocast(t, self.device))   # before sharding: autocast on every rank
        res.attention_ran = self.adapter.attention_ran
        # tokens per sample: the batch's sequence length when it has one, else 1 (samples/s)
        res.per_sample, res.unit = per_sample(x, t.seq_len)
        if res.attention_ran == "flash" and self.adapter.shape is not None:
            add_flash_flops(res, self.adapter.shape, t.micro_batch, t.seq_len, self.adapter.checkpointing)
        if len(self._probes) >= 64:  # bounded: one entry per configuration tried
            self._probes.pop(next(iter(self._probes)))
        self._probes[key] = res
        return res, "counted"


class _GradsBytes(Observer):
    """This process's gradient bytes when the optimizer starts its first update."""

    span = ("optimizer step", "optimizer step")

    def __init__(self, owner: TrainStep):
        self.owner = owner

    def phase(self, name: str) -> None:
        self.owner.grads_bytes = local_bytes(p.grad for p in self.owner.model.parameters())
