"""Bytes that autograd saves for backward, tallied storage by storage. Measurement layer.

The one saved-activation tally: `measure_memory` and the Lab's probe step both use it, so
``RunResult.saved_bytes`` and ``measure_memory(lab)["activations"]`` are the same measurement.
"""
from __future__ import annotations

import torch

from tunekit.measure.torch_private import storage_id, storage_weakref

_VIEWISH = {"TBackward0", "ViewBackward0", "TransposeBackward0", "PermuteBackward0",
            "ExpandBackward0", "UnsafeViewBackward0", "AliasBackward0", "ReshapeAliasBackward0"}
_CASTS = {"ToCopyBackward0", "_ToCopyBackward0"}


def storage_key(t: torch.Tensor):
    """(device type, index, storage identity); the identity holds for fake tensors too (a plan
    steps the model under FakeTensorMode with this same tally), and an empty storage is 0."""
    return (t.device.type, t.device.index, storage_id(t) if t.untyped_storage().nbytes() else 0)


def unique_bytes(tensors, exclude=()) -> int:
    """Bytes of the distinct storages behind `tensors` (views and tied tensors count once)."""
    seen, total = set(exclude), 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        key = storage_key(t)
        if key[2] == 0 or key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def _is_weight_cast(t: torch.Tensor, params: set) -> bool:
    """True when t's autograd history is (views of) a dtype cast of a parameter."""
    node, cast = t.grad_fn, False
    for _ in range(6):
        if node is None:
            return False
        name = node.name()
        if name == "torch::autograd::AccumulateGrad":
            return cast and id(node.variable) in params
        if name in _CASTS:
            cast = True
        elif name not in _VIEWISH:
            return False
        nxt = [f for f, _ in node.next_functions if f is not None]
        if len(nxt) != 1:
            return False
        node = nxt[0]
    return False


class SavedTensorTally:
    """Context manager: tally the storages autograd saves for backward during a forward.

    Only storages still alive when read count: a tensor saved by a branch that was dropped
    during the forward is freed with its graph, and its address may be reused by a later one.
    """

    def __init__(self, params, buffers=()):
        self.exclude = {storage_key(p) for p in params} | {storage_key(b) for b in buffers}
        self.param_ids = {id(p) for p in params}
        self._seen = {}   # storage key -> (weak ref, bytes, is a weight cast)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, t):
        key = storage_key(t)
        if key[2] and key not in self.exclude:
            old = self._seen.get(key)
            if old is None or old[0].expired():
                st = t.untyped_storage()
                self._seen[key] = (storage_weakref(st), st.nbytes(),
                                   _is_weight_cast(t, self.param_ids))
        # detached: returning `t` itself would make a saved output hold its own grad_fn (a
        # reference cycle that keeps a dropped branch's tensors alive until gc runs)
        return t.detach()

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)

    def _alive(self, casts: bool) -> int:
        return sum(n for ref, n, c in self._seen.values() if c == casts and not ref.expired())

    @property
    def activation_bytes(self) -> int:
        return self._alive(False)

    @property
    def cast_bytes(self) -> int:
        return self._alive(True)


def _unpack(t):
    return t
