"""How tunekit drives a model: one small protocol, three implementations. Models layer.

    >>> a = adapt(model)              # tunekit's GPT, a transformers causal LM, or any nn.Module
    >>> a.shape                       # ModelShape (layers, widths, heads, ...) or None
    >>> a.set_checkpointing(True); a.set_attention("sdpa")
    >>> loss = a.loss(model, x, y)

- `GPTAdapter`: tunekit's demo GPT (its own set_attention / set_checkpointing).
- `HFAdapter`: transformers causal-LM models (Llama, Mistral, Qwen2, GPT-2, GPT-NeoX, ... any
  ``*ForCausalLM`` with a decoder config): attention through ``set_attn_implementation``
  (math = "eager", sdpa, flash = "flash_attention_2"), checkpointing through
  ``activation_checkpointing_enable`` (``gradient_checkpointing_enable`` in older releases;
  non-reentrant), loss from ``labels``.
- `ModuleAdapter`, for any other ``nn.Module``: checkpointing of the blocks you name
  (``adapt(model, blocks="layers")``), no attention switch, no analytic shape: MFU then comes
  from the counted FLOPs and the record says so.
- `step_loss(fwd, batch, kind)`: the loss of one training step, for every caller (the Lab,
  measure_memory, plan): how a batch is fed, and `loss_of` the forward's output.
"""
from __future__ import annotations

import functools
import inspect

import torch
from torch.utils.checkpoint import checkpoint

from tunekit.core.formulas import MFU_ANALYTIC, MFU_COUNTED, forward_flops_per_token, train_flops_per_token
from tunekit.core.registry import ATTENTIONS, attention
from tunekit.core.shapes import ModelShape, model_shape, read_config


class ModuleAdapter:
    """Any nn.Module: the fallback. ``blocks``: an attribute path ("layers", "model.h") or a
    list of modules whose forward is checkpointed when checkpointing is on."""

    kind = "module"
    attentions: tuple = ()          # the Lab's attention names this model can switch to

    def __init__(self, model: torch.nn.Module, blocks=None):
        self.model = model
        self._blocks = _resolve_blocks(model, blocks)
        self._ckpt = False

    # --- shape ----------------------------------------------------------------------------------
    @property
    def shape(self) -> ModelShape | None:
        return None

    @property
    def max_seq_len(self) -> int | None:
        return None

    @property
    def vocab_size(self) -> int | None:
        return getattr(getattr(self.model, "config", None), "vocab_size", None)

    def default_seq_len(self, device_type: str) -> int | None:
        return None

    # --- switches -------------------------------------------------------------------------------
    @property
    def attention(self) -> str | None:
        return None

    def set_attention(self, name: str) -> None:
        raise ValueError(f"{type(self.model).__name__} has no attention switch tunekit knows")

    @property
    def attention_ran(self) -> str | None:
        return getattr(self.model, "attention_ran", None)

    @property
    def can_checkpoint(self) -> bool:
        return bool(self._blocks)

    @property
    def checkpointing(self) -> bool:
        return self._ckpt

    def set_checkpointing(self, on: bool) -> None:
        if on and not self._blocks:
            raise ValueError("name the blocks to checkpoint: Lab(model, blocks='layers')")
        for block in self._blocks:
            if on and "forward" not in block.__dict__:
                inner = block.forward
                block.forward = functools.wraps(inner)(
                    lambda *a, _f=inner, **k: checkpoint(_f, *a, use_reentrant=False, **k)
                    if torch.is_grad_enabled() else _f(*a, **k))
            elif not on and "forward" in block.__dict__:
                del block.forward   # back to the class's forward
        self._ckpt = bool(on)

    def blocks(self) -> list:
        return list(self._blocks)

    def matmul_weights(self) -> int:
        """N of the 6N rule, counted on the live model: the weights of every Linear (and GPT-2's
        Conv1D) module, each module once, so a tied lm_head counts as the matmul it is; and a
        mixture of experts' stacked expert weights (3-D, experts first: transformers' grouped
        experts) at the share a token uses, ``num_experts_per_tok`` of them, and its router's
        (experts x hidden) weight, which every token multiplies (transformers' ``*TopKRouter``
        holds it as a bare parameter, not a Linear)."""
        linear = sum(m.weight.numel() for m in _matmuls(self.model))
        top_k = getattr(getattr(self.model, "config", None), "num_experts_per_tok", None)
        if not isinstance(top_k, int) or top_k < 1:
            return linear
        own = [(type(m).__name__.lower(), p) for m in self.model.modules() if not isinstance(m, torch.nn.Linear)
               for p in m.parameters(recurse=False)]
        stacked = [p for name, p in own if "expert" in name and p.dim() == 3]
        routers = [p for name, p in own if "router" in name and p.dim() == 2]
        return (linear + sum(p.numel() * min(top_k, p.shape[0]) // p.shape[0] for p in stacked)
                + sum(p.numel() for p in routers))

    def frozen_matmul_weights(self) -> int:
        """The Linear (and Conv1D) weights that do not train (requires_grad False), each module once."""
        return sum(m.weight.numel() for m in _matmuls(self.model) if not m.weight.requires_grad)

    # --- a step ---------------------------------------------------------------------------------
    def check_default_loss(self) -> None:
        """Refuse, before any work, a model whose forward cannot take the default (x, y)."""
        try:
            inspect.signature(self.model.forward).bind(None, None)
        except TypeError:
            sig = inspect.signature(self.model.forward)
            raise ValueError(f"{type(self.model).__name__}.forward{sig} cannot take (x, y): give "
                             "loss_fn=lambda model, x, y: ... (and batch_fn)") from None
        except ValueError:   # no signature to read (a builtin): let the first step tell
            pass

    def loss(self, fwd, x, y=None):
        """The loss of ``fwd`` (the model, or its compiled wrapper) on one batch (`step_loss`);
        a loss that is not one number is left for the Lab to refuse."""
        return step_loss(fwd, (x,) if y is None else (x, y), self.kind, reduce=False)

    def model_flops(self, seq_len: int, tokens: int, counted: float | None, backward: bool = True) -> tuple:
        """(model FLOPs of ``tokens`` tokens, convention, notes) in tunekit's one MFU convention:
        analytic when the shape is known (N counted on the live model, layers and widths from
        its config), else the count's model FLOPs (``counted``: FlopCount.model). ``backward=False``:
        tokens that only went forward (2N per token and the forward's attention, not 6N)."""
        shape = self.shape
        if shape is None:
            return counted, MFU_COUNTED, ["MFU from the counted FLOPs (no analytic shape for this "
                                          "model): executed minus recomputation and the masked half "
                                          "of causal attention the count found"]
        frozen = self.frozen_matmul_weights()
        if frozen and backward:   # 6N: every weight takes a gradient; a frozen one none (below all trained: nor dX)
            return counted, MFU_COUNTED, [f"MFU from the counted FLOPs: {frozen:,} of the {self.matmul_weights():,} "
                                          "matmul weights are frozen (requires_grad=False) and take no weight "
                                          "gradient, which the 6N rule assumes"]
        n = self.matmul_weights()
        per_token = (train_flops_per_token if backward else forward_flops_per_token)(
            n, shape.n_layer, shape.q_width, seq_len)
        notes = [] if n == shape.matmul_params() else [
            f"MFU uses the {n:,} matmul weights counted on the model; its config reads as "
            f"{shape.matmul_params():,} ({shape.family})"]
        return per_token * tokens, MFU_ANALYTIC, notes

    def forward_tokens(self, args: tuple, kwargs: dict) -> tuple[int, int]:
        """(batch, sequence length) of one call of the model's forward, from its inputs; raises
        ValueError saying why when they do not tell (the analytic count then cannot be used)."""
        raise ValueError(f"{type(self.model).__name__} has no shape tunekit knows")

    def state(self) -> tuple:
        """What changes the work of a step besides the batch: attention, checkpointing, the
        parameter dtypes and train/eval mode (keys of FLOP-count caches include it)."""
        dtypes = tuple(sorted({str(p.dtype) for p in self.model.parameters()}))
        return (self.kind, self.attention, self.checkpointing, dtypes, self.model.training)


class GPTAdapter(ModuleAdapter):
    """tunekit's demo GPT."""

    kind = "tunekit-gpt"
    attentions = tuple(ATTENTIONS)

    def __init__(self, model, blocks=None):
        super().__init__(model, blocks if blocks is not None else list(model.blocks))

    @property
    def shape(self) -> ModelShape:
        return model_shape(self.model.config)

    @property
    def max_seq_len(self) -> int:
        return self.model.config.block_size

    def default_seq_len(self, device_type: str) -> int:
        return self.model.config.block_size

    @property
    def attention(self) -> str:
        return self.model.config.attention

    def set_attention(self, name: str) -> None:
        self.model.set_attention(attention(name).name)

    @property
    def checkpointing(self) -> bool:
        return bool(self.model.checkpointing)

    def set_checkpointing(self, on: bool) -> None:
        self.model.set_checkpointing(on)

    def forward_tokens(self, args, kwargs):
        return _batch_and_length(args[0] if args else kwargs.get("idx"), "idx")


class HFAdapter(ModuleAdapter):
    """A transformers causal-LM model (``model(input_ids=..., labels=...).loss``)."""

    kind = "transformers"

    _signature = None   # of the model's forward, bound once a call passes positional arguments

    def __init__(self, model, blocks=None):
        names = set(getattr(model, "_no_split_modules", None) or ())
        found = [m for m in model.modules() if type(m).__name__ in names]
        super().__init__(model, blocks if blocks is not None else found)

    @property
    def attentions(self) -> tuple:
        return tuple(a.name for a in ATTENTIONS.values() if a.hf_name) \
            if hasattr(self.model, "set_attn_implementation") else ()

    @property
    def shape(self) -> ModelShape | None:
        """The decoder's shape; None for an encoder-decoder (T5, BART), whose model FLOPs the count
        gives (`model_shape` refuses it: its sums are one causal stack's)."""
        if getattr(self.model.config, "is_encoder_decoder", False):
            return None
        return model_shape(self.model.config)

    @property
    def max_seq_len(self) -> int | None:
        return read_config(self.model.config)["max_positions"]

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    def default_seq_len(self, device_type: str) -> int:
        # long enough for the attention term to show, short enough for a CPU step in seconds
        return min(self.max_seq_len or 2048, 1024 if device_type == "cuda" else 128)

    @property
    def attention(self) -> str | None:
        hf = getattr(self.model.config, "_attn_implementation", None)
        return next((a.name for a in ATTENTIONS.values() if a.hf_name == hf), hf)

    def set_attention(self, name: str) -> None:
        self.model.set_attn_implementation(attention(name).hf_name)

    @property
    def attention_ran(self) -> str | None:
        return self.attention  # transformers runs the implementation it is set to, or raises

    @property
    def can_checkpoint(self) -> bool:
        return bool(getattr(self.model, "supports_gradient_checkpointing", False))

    # transformers >= 5.2x names it "activation checkpointing" and deprecates "gradient_..."
    @property
    def _new_names(self) -> bool:
        return hasattr(self.model, "activation_checkpointing_enable")

    @property
    def checkpointing(self) -> bool:
        name = "is_activation_checkpointing" if self._new_names else "is_gradient_checkpointing"
        return bool(getattr(self.model, name, False))

    def set_checkpointing(self, on: bool) -> None:
        kwargs = {"use_reentrant": False}  # recompute only what backward needs, like tunekit's GPT
        if self._new_names:
            if on:
                self.model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                self.model.activation_checkpointing_disable()
        elif on:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        else:
            self.model.gradient_checkpointing_disable()

    def forward_tokens(self, args, kwargs):
        if not args:   # the usual call, model(**batch): no binding needed (it costs ~0.1 ms a call)
            call = kwargs
        else:
            if self._signature is None:
                import inspect

                self._signature = inspect.signature(self.model.forward)
            try:
                call = self._signature.bind_partial(*args, **kwargs).arguments
            except (TypeError, ValueError):
                raise ValueError("the call's arguments do not match the model's forward") from None
            call = {**call, **call.get("kwargs", {})}
        x = call.get("input_ids")
        b, s = _batch_and_length(x if x is not None else call.get("inputs_embeds"), "input_ids or inputs_embeds")
        past = call.get("past_key_values")
        # decoding: each new token also attends to the cached positions, which s does not say
        if past is not None and (past.get_seq_length() if hasattr(past, "get_seq_length") else len(past)):
            raise ValueError("the model was called with a filled KV cache (decoding)")
        keep = call.get("logits_to_keep", 0)
        if not (isinstance(keep, int) and (keep == 0 or keep >= s)):  # lm_head skips positions
            raise ValueError("the model was called with logits_to_keep: lm_head ran on part of the tokens")
        return b, s


def _matmuls(model):
    return (m for m in model.modules() if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D")


def _batch_and_length(x, what: str) -> tuple[int, int]:
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError(f"no (batch, sequence) {what} tensor in the call")
    return int(x.shape[0]), int(x.shape[1])


def step_loss(fwd, batch, kind: str = "module", reduce: bool = True):
    """The loss of one training step of ``fwd`` (a model, or its compiled or DDP wrapper) on
    ``batch``, for a model of adapter ``kind``. A transformers causal LM (``"transformers"``)
    takes ``(x, y)`` as input_ids and labels already shifted by one, and ``(x,)`` (or ``x``) as
    its own labels, shifted by transformers, as its Trainer's labels=input_ids; any other model
    is fed ``fwd(*batch)`` for a tuple or list, ``fwd(batch)`` otherwise (tunekit's GPT:
    ``(x, y)`` -> ``(logits, loss)``). The loss is `loss_of` the output."""
    items = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    if kind == "transformers" and len(items) == 1:
        out = fwd(input_ids=items[0], labels=items[0], use_cache=False)
    elif kind == "transformers" and len(items) == 2:
        # The Lab's y is x shifted by one already: `shift_labels` hands it to the loss as is
        # (with `labels` alone transformers would shift again and skip a token), so every one
        # of the b*s tokens is predicted, as the throughput counts them.
        out = fwd(input_ids=items[0], labels=items[1], shift_labels=items[1], use_cache=False)
    else:
        out = fwd(*items)
    return loss_of(out, reduce)


def loss_of(out, reduce: bool = True):
    """The loss in what a model's forward returned: the second item of a ``(logits, loss)``
    pair (the first when the second is None), an output's ``.loss`` (transformers), a dict's
    ``"loss"``, or the output itself. ``reduce``: a tensor of more than one number is summed in
    fp32, and what is not a tensor is a TypeError saying what it is; ``reduce=False`` returns
    what it found as it is (the Lab refuses a loss that is not one number in words of its own)."""
    if isinstance(out, (tuple, list)):
        out = out[1] if len(out) > 1 and out[1] is not None else out[0]
    out = getattr(out, "loss", out)
    if isinstance(out, dict) and torch.is_tensor(out.get("loss")):   # {"loss": ...}
        out = out["loss"]
    if not reduce:
        return out
    if not torch.is_tensor(out):
        what = f"a dict of {sorted(map(str, out))}" if isinstance(out, dict) else type(out).__name__
        raise TypeError(f"the model's output is {what}, not a tensor to sum into a loss")
    return out if out.dim() == 0 else out.float().sum()


def is_transformers_model(model) -> bool:
    return hasattr(model, "config") and hasattr(model.config, "model_type") and (
        hasattr(model, "gradient_checkpointing_enable") or hasattr(model, "activation_checkpointing_enable"))


def adapt(model: torch.nn.Module, blocks=None) -> ModuleAdapter:
    """The adapter for ``model`` (a compiled model through its original, a DDP/DataParallel
    wrapper through the model it wraps)."""
    from tunekit.models.gpt import GPT

    inner = getattr(model, "_orig_mod", model)
    if type(inner).__name__ in ("DistributedDataParallel", "DataParallel"):  # the model it wraps
        inner = getattr(inner.module, "_orig_mod", inner.module)
    if isinstance(inner, GPT):
        return GPTAdapter(inner, blocks)
    if is_transformers_model(inner):
        return HFAdapter(inner, blocks)
    return ModuleAdapter(inner, blocks)


def _resolve_blocks(model, blocks) -> list:
    if blocks is None:
        return []
    if isinstance(blocks, str):
        try:
            found = functools.reduce(getattr, blocks.split("."), model)
        except AttributeError:
            children = [n for n, _ in model.named_children()]
            raise ValueError(f"blocks={blocks!r} is not an attribute path of "
                             f"{type(model).__name__} (its children: {children})") from None
        return list(found) if isinstance(found, (torch.nn.ModuleList, torch.nn.Sequential, list)) else [found]
    blocks = list(blocks)
    if not all(isinstance(b, torch.nn.Module) for b in blocks):
        raise TypeError("blocks must be an attribute path or a list of nn.Modules")
    return blocks


__all__ = ["ModuleAdapter", "GPTAdapter", "HFAdapter", "adapt", "is_transformers_model", "loss_of", "step_loss"]

