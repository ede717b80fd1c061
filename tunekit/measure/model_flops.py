"""Model FLOPs of a profiled block from the shape of the model it ran, as the Lab computes them.
Measurement layer.

The FLOP counter counts what ran, and its model FLOPs leave out the recomputation and the masked
half of the causal attention it recognises (`measure.causal_mask`); the shape gives the Lab's
figure whatever the counter could not see (an op without a formula, a mask without values), so
it wins when known. During
a counted run, `ModelTap` watches the forward of each module the block reads: the tokens of every
call (B x S, from its inputs) and whether a backward pass reached the call's output. When exactly
one model ran and tunekit knows its shape, the block's model FLOPs are those of the Lab
(`ModuleAdapter.model_flops`): 6N per token plus causal attention for tokens trained on, 2N plus
the forward's attention for tokens only run forward. Otherwise the count's convention stays and a
note says why. The hooks are only on counted runs, which report no TFLOPS: timed runs carry none.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import torch

from tunekit.models.adapters import adapt


class ModelTap:
    """``tap = ModelTap(seen).start(); ...block...; tap.stop(); flops, notes = tap.result()``.

    `seen`: (name, module) pairs, e.g. from `fingerprint.modules_seen`. Only the outermost
    modules are watched (a submodule's calls are part of its parent's)."""

    def __init__(self, seen):
        mods = {}
        for label, m in seen:
            inner = getattr(m, "_orig_mod", m)  # a torch.compile wrapper runs its original
            mods.setdefault(id(inner), (label, inner))
        inside = set()
        if len(mods) > 1:
            for _, m in mods.values():
                inside.update(id(s) for s in m.modules() if s is not m)
        self.watched = [(label, m) for k, (label, m) in mods.items() if k not in inside]
        self.adapters = {id(m): adapt(m) for _, m in self.watched}
        self.calls = defaultdict(list)  # id(module) -> one dict per finished forward call
        self._handles, self._pending = [], []

    def start(self) -> ModelTap:
        for _, m in self.watched:
            self._handles.append(m.register_forward_pre_hook(self._pre, with_kwargs=True))
            self._handles.append(m.register_forward_hook(self._post, with_kwargs=True))
        return self

    def stop(self) -> None:
        """Remove every hook (a backward after the block no longer marks its calls)."""
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()

    # The hooks run inside the user's forward: whatever goes wrong in them becomes the call's
    # reason for falling back, never an error in the block.
    def _pre(self, module, args, kwargs):
        try:
            tokens = self.adapters[id(module)].forward_tokens(args, kwargs)
        except Exception as e:
            tokens = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
        self._pending.append(tokens)

    def _post(self, module, args, kwargs, out):
        call = {"tokens": self._pending.pop() if self._pending else "no pre-hook ran", "backward": False}
        self.calls[id(module)].append(call)

        def reached(grad, call=call):
            call["backward"] = True  # returns None: the gradient is left as it is

        try:
            for t in tensors_in(out):
                if t.requires_grad:
                    self._handles.append(t.register_hook(reached))
        except Exception as e:  # backward or not is then unknown
            call["tokens"] = f"its output could not be watched ({type(e).__name__}: {e})"

    def result(self) -> tuple[float | None, list[str]]:
        """(model FLOPs of the watched calls, notes); None when the shape cannot give them."""
        try:
            return self._result()
        except Exception as e:  # after the clock: the count's convention, and why
            return None, [f"MFU from the count: the model's shape gave no FLOPs ({type(e).__name__}: {e})"]

    def _result(self):
        ran = [(label, m, self.adapters[id(m)]) for label, m in self.watched if self.calls[id(m)]]
        known = [r for r in ran if _shape(r[2]) is not None]
        # modules with weights whose work the known shape does not include
        others = [r for r in ran if _shape(r[2]) is None and next(r[1].parameters(), None) is not None]
        if not known:
            if others:
                return None, [f"MFU from the count: {_names(others)} has no shape tunekit knows"]
            shaped = [(label, m) for label, m in self.watched if _shape(self.adapters[id(m)]) is not None]
            if shaped:
                return None, [f"MFU from the count: {_names(shaped)} ran no forward here"]
            return None, []
        if len(known) + len(others) > 1:
            return None, [f"MFU from the count: several models ran ({_names(known + others)}), "
                          "so no one model's shape gives the block's model FLOPs"]
        label, m, adapter = known[0]
        groups = defaultdict(int)  # (seq_len, backward) -> tokens
        for call in self.calls[id(m)]:
            if not isinstance(call["tokens"], tuple):
                return None, [f"MFU from the count: the tokens of a call of `{label}` are unknown "
                              f"({call['tokens']})"]
            b, s = call["tokens"]
            groups[s, call["backward"]] += b * s
        total, notes, parts = 0.0, [], []
        for (s, backward), tokens in sorted(groups.items()):
            flops, _, why = adapter.model_flops(s, tokens, None, backward=backward)
            if flops is None:   # the shape does not give them (frozen weights): the count's convention
                return None, ["MFU from the count: " + why[0].removeprefix("MFU from the counted FLOPs: ")]
            total += flops
            notes.extend(n for n in why if n not in notes)
            parts.append(f"{tokens} tokens at S={s} {'forward+backward' if backward else 'forward only'}")
        n_calls = len(self.calls[id(m)])
        return total, [f"MFU from the shape of `{label}` ({type(m).__name__}), as the Lab: "
                       f"{n_calls} forward call(s), " + ", ".join(parts)] + notes


def _shape(adapter):
    try:
        return adapter.shape
    except ValueError:  # a config tunekit cannot read the sizes of
        return None


def _names(rows) -> str:
    return ", ".join(f"`{r[0]}` ({type(r[1]).__name__})" for r in rows)


def tensors_in(value, depth: int = 0, levels: int = 2):
    """The tensors in ``value``: a tensor, or inside tuples, lists and mappings (a ModelOutput) down
    to ``levels`` levels: a forward's output (logits, loss), an op's arguments."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < levels and isinstance(value, (tuple, list)):
        for v in value:
            yield from tensors_in(v, depth + 1, levels)
    elif depth < levels and isinstance(value, Mapping):
        for v in value.values():
            yield from tensors_in(v, depth + 1, levels)
