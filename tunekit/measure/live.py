"""Live bytes over a training step, storage by storage, and where the peak happens. Measurement
layer.

`LiveBytes` is a dispatch mode: every op's output whose storage is new (not one of the op's
inputs' storages, so views and in-place results are not counted again) adds its bytes; the
storage's weak reference takes them off when it is freed. It works the same on real and on fake
tensors (a plan steps the model under FakeTensorMode with it), so its peak can be checked against
a real CPU step.

Where: the phase the caller names (``forward``, ``backward``, ``optimizer step``), the innermost
module running (module forward hooks), and in backward the module whose forward made the autograd
node being run: as a module's forward returns, every node its forward made and no inner module
claimed (a relu called in the forward itself) is tagged with its name through ``Node.metadata``
(`_tag`; made in it: a sequence number from the forward's start on). A node no module's forward
made (the loss outside the model, a hand-written function's) is in no module: "" (never the
module of the node run before it).

``round_to``: each storage's bytes rounded up to a multiple of it, as CUDA's caching allocator
rounds every block to 512 bytes (1 counts bytes as they are).
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tunekit.measure import torch_private
from tunekit.measure.model_flops import tensors_in

_TAG = "tunekit_module"
CUDA_BLOCK = 512   # c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize, every size rounds up to it


def _storages(value):
    out = {}
    for t in tensors_in(value, levels=3):
        st = t.untyped_storage()
        if st.nbytes():
            out[st._cdata] = st
    return out


def _tag(nodes, name: str, start: int) -> None:
    """Tag with ``name`` every autograd node reachable from ``nodes`` that a forward begun at sequence
    number ``start`` made (its ``_sequence_nr()`` from ``start`` on) and no inner module tagged
    first (inner modules' forwards return, and tag, before their caller's). Nodes made before it (its
    inputs' history) bound the walk; the walk goes on through nodes already tagged, since a node of
    this forward may lie behind an inner module's (``fc(relu(x))``: the relu behind fc's nodes)."""
    seen, todo = set(), [n for n in nodes if n is not None]
    while todo:
        node = todo.pop()
        if id(node) in seen or torch_private.node_sequence_nr(node) < start:
            continue
        seen.add(id(node))
        if _TAG not in node.metadata:
            node.metadata[_TAG] = name
        todo.extend(n for n, _ in node.next_functions if n is not None)


class LiveBytes(TorchDispatchMode):
    """Context manager: bytes alive over a step, from ``base`` (what lives before it: weights,
    optimizer state, the batch). ``peak``, ``peak_at`` (phase, module, op), ``phase_peaks``
    (phase -> (bytes, module, op, what ``on_peak()`` returned there)), ``phase_casts`` (phase -> the
    bytes of copies cast from the model's parameters alive at that peak: autocast's cache keeps
    every weight it cast until its context exits, checkpointed or not) and ``samples`` (phase,
    live bytes) after each new storage, for a chart. ``op_name(func, args, kwargs)``: an op's name
    where it is not its own (a GPU plan's CPU-device step names the GPU's op); None: ``func`` less "aten.".
    ``scratch(func, args, kwargs, out)``: the bytes an op allocates for its own use and frees before it
    returns (a CPU elementwise op's copies of its inputs at another dtype), alive beside its output."""

    def __init__(self, model: torch.nn.Module | None = None, base: float = 0.0, round_to: int = 1,
                 on_peak=None, op_name=None, scratch=None):
        super().__init__()
        self.round_to = max(1, int(round_to))
        self.live = self.peak = float(base)
        self.phase, self.peak_at, self.samples, self.phase_peaks = "start", ("start", "", ""), [], {}
        self.casts, self.phase_casts, self._cast_keys = 0.0, {}, set()
        self._params = {p.untyped_storage()._cdata for p in model.parameters()} if model is not None else set()
        self.on_peak = on_peak
        self.op_name = op_name
        self.scratch = scratch
        self._refs = {}     # storage identity -> (weak ref, bytes)
        self._stack = []   # (module name, the autograd sequence number as its forward began)
        # a plan's wrapper of the user's model and loss (planning.module.Stepped) is named as that model:
        # its peak is 'in CNN' or 'in c1', never in the wrapper's own class nor its attribute 'model'
        inner = getattr(model, "planned_model", None)
        self._names = {id(m): n or type(m).__name__ for n, m in (inner or model).named_modules()} \
            if model is not None else {}
        if inner is not None:
            self._names[id(model)] = type(inner).__name__
        self._hooks = []

    def _rounded(self, n: int) -> int:
        r = self.round_to
        return -(-n // r) * r

    # --- the step's phases and modules --------------------------------------------------------

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self._stack.clear()   # a checkpointed block's recompute may stop early, its hooks unpopped

    def _pre(self, module, args):
        self._stack.append((self._names.get(id(module), type(module).__name__), torch_private.autograd_sequence_nr()))

    def _post(self, module, args, output):
        name, start = self._stack.pop() if self._stack else ("", 0)
        _tag([t.grad_fn for t in tensors_in(output, levels=2)], name, start)

    def where(self) -> str:
        """The innermost module running (forward), or the one whose forward made the backward node
        running ("": none made it); "" in any other phase."""
        if self.phase == "forward":
            return self._stack[-1][0] if self._stack else ""
        if self.phase == "backward":
            node = torch_private.current_autograd_node()
            return (node.metadata.get(_TAG) or "") if node is not None else ""
        return ""

    def __enter__(self):
        from torch.nn.modules import module as mod

        if self._names:
            self._hooks = [mod.register_module_forward_pre_hook(self._pre),
                           mod.register_module_forward_hook(self._post)]
        return super().__enter__()

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        return super().__exit__(*exc)

    # --- the bytes ----------------------------------------------------------------------------

    def _freed(self, key):
        entry = self._refs.pop(key, None)
        if entry is not None:
            self.live -= entry[1]
            if key in self._cast_keys:
                self._cast_keys.discard(key)
                self.casts -= entry[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # torch.tensor(...) makes its storage outside the dispatcher and hands it to lift_fresh
        inputs = {} if func.__name__.startswith("lift_fresh") else _storages((args, kwargs))
        grew = False
        cast = func.__name__.startswith("_to_copy") and not self._params.isdisjoint(inputs)   # a weight's copy
        for key, st in _storages(out).items():
            if key in inputs or key in self._refs:
                continue
            n = self._rounded(st.nbytes())
            self._refs[key] = (weakref.ref(st, lambda _, k=key: self._freed(k)), n)
            self.live += n
            if cast:
                self._cast_keys.add(key)
                self.casts += n
            grew = True
        scratch = self._rounded(int(self.scratch(func, args, kwargs, out))) if self.scratch is not None else 0
        if grew or scratch:
            now = self.live + scratch   # the op's scratch is alive beside its output until it returns
            self.samples.append((self.phase, now))
            best = self.phase_peaks.get(self.phase)
            if best is None or now > best[0]:
                op = self.op_name(func, args, kwargs) if self.op_name else str(func).removeprefix("aten.")
                extra = self.on_peak() if self.on_peak is not None else None
                self.phase_peaks[self.phase] = (now, self.where(), op, extra)
                self.phase_casts[self.phase] = self.casts
                if now > self.peak:
                    self.peak, self.peak_at = now, (self.phase, self.where(), op)
        return out
