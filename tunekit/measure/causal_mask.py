"""Finding the masked half of unfused causal attention in a FLOP count. Measurement layer.

Eager ("math") attention computes the whole score matrix, then masks its upper triangle:
``S = Q @ K^T -> (scale) -> S + mask | S.masked_fill(mask, -inf) | where(keep, S, -inf) ->
softmax -> P @ V``. Those FLOPs ran (HFU), but half of them are not the model's work in tunekit's
MFU convention (PaLM/Megatron: causal attention at half), the share the counter already removes
from SDPA with ``is_causal``. `CausalTracker` follows each forward ``bmm``'s output through the
ops that keep its (Sq, Sk) shape; when a mask whose upper triangle is all masked (Sq == Sk > 1)
meets it, half of that bmm, half of the ``bmm`` that consumes the probabilities, and half of the
two bmms of each one's backward (found by hooks on their autograd nodes) are the masked work.
A mask it cannot read (fake or meta tensors) leaves the count as it is.
"""
from __future__ import annotations

import threading
import weakref

import torch

from tunekit.measure.torch_private import op_argument_names

aten = torch.ops.aten
_MATMULS = {aten.bmm, aten.baddbmm}
_NEG = -1e4          # a score at or below this is masked (-inf, or the dtype's lowest finite)


class _Chain:
    """The scores of one forward bmm and what followed from them."""

    __slots__ = ("flops", "node", "causal", "counted")

    def __init__(self, flops: int, counted: bool):
        self.flops, self.node, self.causal, self.counted = flops, None, False, counted


class CausalTracker:
    """The counter's helper: ``see()`` each op; ``masked`` sums the masked FLOPs found,
    ``unread`` the masks it could not read.

    ``counted``: the op is the model's work (not a recomputation), so its masked share counts."""

    def __init__(self):
        self.masked = 0
        self.unread = 0               # masks met whose values could not be read (fake tensors)
        self._tracked: dict = {}      # id(tensor) -> (weakref to it, _Chain)
        self._pending: list = []      # (weakref to a bmm output, chain or None) awaiting grad_fn
        self._inside = threading.local()   # depth of masked backward nodes running on this thread
        self._masks: dict = {}        # id(mask) -> (weakref, version, causal)
        self._mask_pos: dict = {}     # SDPA packet -> position of its mask argument (or None)
        self._run = object()          # hooks of an earlier count's graph do nothing here

    def reset(self) -> None:
        self.masked = self.unread = 0
        self.release()

    def release(self) -> None:
        """Forget the tensors and autograd nodes of the run (a chain holds its node, and so the
        graph's saved tensors); its totals stay, and its hooks do nothing from now on."""
        self._tracked, self._pending, self._masks = {}, [], {}
        self._inside = threading.local()
        self._run = object()

    def see(self, packet, out, args, kwargs, n: int, counted: bool, forward: bool) -> None:
        """One op that ran, with its ``n`` FLOPs; ``forward``: not a gradient's op (a checkpoint's
        recomputation is forward)."""
        self.masked += self._see(packet, out, args, kwargs, n, counted, forward)

    def _see(self, packet, out, args, kwargs, n, counted, forward) -> int:
        if self._pending:
            self._attach()
        masked = 0
        if n and packet in _MATMULS and getattr(self._inside, "depth", 0) > 0:
            return n - n // 2 if counted else 0   # a bmm of a masked bmm's backward
        if not forward:
            return 0
        t_out = out if isinstance(out, torch.Tensor) else next(
            (o for o in out if isinstance(o, torch.Tensor)), None) if isinstance(out, (tuple, list)) else None
        if t_out is None or t_out.dim() < 2:
            return 0
        chains = [(a, c) for a, c in (self._lookup(a) for a in _tensors(args)) if c is not None]
        if packet in _MATMULS:
            probs = [c for _, c in chains if c.causal]
            if probs:   # P @ V: the probabilities of a causal chain
                masked = n - n // 2 if counted else 0
                self._pending.append((weakref.ref(t_out), None))
            elif n:
                chain = _Chain(n, counted)
                self._track(t_out, chain)
                self._pending.append((weakref.ref(t_out), chain))
            return masked
        for a, chain in chains:
            if tuple(t_out.shape[-2:]) != tuple(a.shape[-2:]):
                continue
            self._track(t_out, chain)
            if not chain.causal and self._masks_causally(packet, args, kwargs, a):
                chain.causal = True
                if chain.counted:
                    masked += chain.flops - chain.flops // 2
                self._hook(chain.node)
        return masked

    # --- the scores' masks ------------------------------------------------------------------

    def sdpa_masks_causally(self, packet, args, kwargs) -> bool:
        """An SDPA op (not ``is_causal``) given a mask that hides the upper triangle: its
        kernel computes the masked half (no kernel skips blocks of an explicit mask)."""
        if packet not in self._mask_pos:
            names = op_argument_names(packet)
            self._mask_pos[packet] = next((names.index(k) for k in ("attn_mask", "attn_bias") if k in names), None)
        pos = self._mask_pos[packet]
        if pos is None:
            return False
        names = op_argument_names(packet)
        mask = kwargs.get(names[pos], args[pos] if pos < len(args) else None)
        q = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if not isinstance(mask, torch.Tensor) or q is None or q.dim() < 2:
            return False
        sq = q.shape[-2]   # (B, H, S, D): the query's length, and keys as many (self-attention)
        if sq < 2 or mask.dim() < 2 or tuple(mask.shape[-2:]) != (sq, sq):
            return False
        return self._causal(mask, True if mask.dtype == torch.bool else None)

    def _masks_causally(self, packet, args, kwargs, scores) -> bool:
        sq, sk = scores.shape[-2:]
        if sq != sk or sq < 2:
            return False
        mask = None
        if packet is aten.masked_fill and len(args) > 2 and args[0] is scores and _very_negative(args[2]):
            mask, keep = args[1], False
        elif packet is aten.where and len(args) > 2 and args[1] is scores and _very_negative(args[2]):
            mask, keep = args[0], True
        elif packet is aten.add and len(args) > 1 and kwargs.get("alpha", 1) == 1:
            other = args[1] if args[0] is scores else args[0]
            if isinstance(other, torch.Tensor) and other.is_floating_point():
                mask, keep = other, None
        if not isinstance(mask, torch.Tensor) or mask.dim() < 2 or tuple(mask.shape[-2:]) != (sq, sk):
            return False
        return self._causal(mask, keep)

    def _causal(self, mask, keep) -> bool:
        hit = self._masks.get(id(mask))
        if hit is not None and hit[0]() is mask and hit[1] == mask._version:
            return hit[2]
        try:
            if mask.device.type == "meta" or _is_fake(mask):
                raise ValueError("no values to read")
            masked = mask <= _NEG if keep is None else (~mask if keep else mask)
            upper = torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).triu(1)
            causal = bool((masked | ~upper).all())
        except Exception:   # a mask we cannot read: the count stays as it ran, and says so
            causal = False
            self.unread += 1
        self._masks[id(mask)] = (weakref.ref(mask), mask._version, causal)
        return causal

    # --- tensors and autograd nodes ---------------------------------------------------------

    def _lookup(self, t):
        hit = self._tracked.get(id(t))
        return (t, hit[1]) if hit is not None and hit[0]() is t else (t, None)

    def _track(self, t, chain) -> None:
        if len(self._tracked) > 4096:  # drop the dead
            self._tracked = {k: v for k, v in self._tracked.items() if v[0]() is not None}
        self._tracked[id(t)] = (weakref.ref(t), chain)

    def _attach(self) -> None:
        """A bmm's autograd node exists once the op has returned: at the next op."""
        pending, self._pending = self._pending, []
        for ref, chain in pending:
            t = ref()
            node = getattr(t, "grad_fn", None) if t is not None else None
            if chain is None:
                self._hook(node)
            else:
                chain.node = node
                if chain.causal:
                    self._hook(node)

    def _hook(self, node) -> None:
        if node is None:
            return
        me, run = weakref.ref(self), self._run

        def enter(grad_outputs):
            s = me()
            if s is not None and s._run is run:
                s._inside.depth = getattr(s._inside, "depth", 0) + 1

        def leave(grad_inputs, grad_outputs):
            s = me()
            if s is not None and s._run is run:
                s._inside.depth = max(0, getattr(s._inside, "depth", 0) - 1)

        node.register_prehook(enter)
        node.register_hook(leave)


def _tensors(args):
    return [a for a in args if isinstance(a, torch.Tensor)]


def _very_negative(value) -> bool:
    try:
        return float(value) <= _NEG
    except Exception:  # a tensor without values (fake, meta)
        return False


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)
