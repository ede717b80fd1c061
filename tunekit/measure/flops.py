"""Counting executed FLOPs with torch's FlopCounterMode, plus what it misses. Measurement layer.

torch's counter (2.13) has two gaps that matter for transformers:
- CPU SDPA (`_scaled_dot_product_flash_attention_for_cpu` and its backward) is not in its
  registry, so attention counts 0 FLOPs on CPU. We register formulas for it.
- SDPA with `is_causal=True` is counted as full attention. Kernels that skip the masked half
  do half the work, so we halve it (FlashAttention's own benchmark does the same).
We also split out FLOPs executed to *recompute* activations during backward (activation
checkpointing): executed - recompute = model FLOPs (MFU), executed = hardware FLOPs (HFU).
Unfused (eager) attention with a causal mask computes the masked half, and it is executed work
(HFU), but not model work: `causal_mask.CausalTracker` finds it, and model FLOPs leave it out, so
that they are tunekit's one MFU convention (causal attention at half) whatever kernel ran.
A recomputation is an op run inside an autograd backward pass with grad mode on: the engine runs
backward formulas with grad mode off, while checkpointing re-enables it to rebuild the graph.
(A `create_graph=True` backward, as in gradient penalties, also runs with grad mode on and is
counted as recompute too.) Ops outside aten that have no formula (flash-attn's custom ops, say)
count 0 FLOPs in torch's counter; we name them so that nobody mistakes the total for complete.
"""
from __future__ import annotations

import contextlib
import math
import threading
import warnings
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from tunekit.core.fmt import fmt_flops
from tunekit.core.notes import Note
from tunekit.core.refusals import user_facing
from tunekit.core.validate import function
from tunekit.measure.causal_mask import CausalTracker
from tunekit.measure.interrupts import deferred_interrupt
from tunekit.measure.torch_private import (
    dispatch_mode_stack,
    hold_ctrl_c_in_dispatch,
    in_autograd_backward,
    is_flop_counter,
    op_argument_names,
)

aten = torch.ops.aten


# --- formulas for what torch does not count (shapes in, FLOPs out) ---------------------------


def sdpa_forward_flops(q_shape, k_shape, v_shape) -> int:
    """QK^T and PV for (B, H, Sq, D) x (B, H, Sk, D) x (B, H, Sk, Dv): 2*B*H*Sq*Sk*(D + Dv)."""
    b, h, sq, d = q_shape
    sk, dv = k_shape[-2], v_shape[-1]
    return 2 * b * h * sq * sk * d + 2 * b * h * sq * sk * dv


def sdpa_backward_flops(q_shape, k_shape, v_shape) -> int:
    """Backward: recompute QK^T, then dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q.

    Five matmuls, 2*B*H*Sq*Sk*(3*D + 2*Dv) FLOPs: 10*B*H*Sq*Sk*D when D == Dv.
    """
    b, h, sq, d = q_shape
    sk, dv = k_shape[-2], v_shape[-1]
    return 2 * b * h * sq * sk * (3 * d + 2 * dv)


def _cpu_sdpa_fwd(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_forward_flops(query, key, value)


def _cpu_sdpa_bwd(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flops(query, key, value)


_CPU_SDPA = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_fwd,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_bwd,
}


def _grouped_mm(a, b, *args, out_shape=None, **kwargs) -> int:
    """torch._grouped_mm (transformers' mixture-of-experts layers): each output element is one
    dot product of length K = a[-1], so 2 x out x K; with two 2D inputs the groups split K
    (out is (G, M, N) over a (M, K) x (K, N) product), so the G groups share it."""
    n = 2 * math.prod(out_shape) * a[-1]
    return n // out_shape[0] if len(a) == 2 and len(b) == 2 else n


def _no_flops(*args, out_shape=None, **kwargs) -> int:
    return 0


# torch's counter decomposes every op it has no formula for into its CompositeImplicitAutograd
# kernel where one exists (its registry is keyed by packets, the dispatched op is an overload: the
# test never matches): for the few ops that have one BESIDES a CPU/CUDA kernel, the count then
# names the decomposition's small ops (silu_backward as sigmoid, fill_, sub_, mul, mul) where the
# device runs one kernel. Keyed by their overload, they are not decomposed: counted at 0 FLOPs
# (elementwise, as every activation) under their own name. tests/measure/test_flops_one_kernel.py
# checks this list against every aten op of the installed torch.
ONE_KERNEL = {aten.silu_backward.default: _no_flops, aten.mish_backward.default: _no_flops}

_ADDED = {**_CPU_SDPA, **({aten._grouped_mm: _grouped_mm} if hasattr(aten, "_grouped_mm") else {}), **ONE_KERNEL}


def missing_formulas() -> dict:
    """The formulas tunekit adds because torch's registry lacks them (empty once torch has them)."""
    return {op: f for op, f in _ADDED.items() if op not in flop_registry}


# --- the counter -------------------------------------------------------------------------------


@dataclass
class FlopCount:
    """Executed FLOPs of one run, split so that MFU and HFU can both be computed."""

    executed: int = 0          # everything that ran (HFU)
    recompute: int = 0         # part of `executed` spent rebuilding checkpointed activations
    causal_halved: int = 0     # FLOPs removed by the causal correction
    attention_recompute: int = 0  # fused attention's backward recomputing QK^T (not model work)
    masked_attention: int = 0  # the masked half of causal attention that ran in full (eager, masks)
    by_op: dict = field(default_factory=dict)
    uncounted_ops: list = field(default_factory=list)  # ran, but no FLOP formula exists for them
    notes: list = field(default_factory=list)

    @property
    def model(self) -> int:
        """Model FLOPs in tunekit's MFU convention, from the count: executed minus checkpoint
        recompute, fused attention's recompute of the scores and the masked half of causal
        attention that ran in full (eager attention, an explicit causal mask)."""
        return self.executed - self.recompute - self.attention_recompute - self.masked_attention


def _causal_index(packet) -> int | None:
    names = op_argument_names(packet)
    return names.index("is_causal") if "is_causal" in names else None


class TunekitFlopCounter(FlopCounterMode):
    """FlopCounterMode with CPU SDPA registered, causal halving and recompute accounting.

    >>> with TunekitFlopCounter() as fc:
    ...     model(x).sum().backward()
    >>> fc.result().executed
    """

    def __init__(self):
        self._added = missing_formulas()
        super().__init__(display=False, custom_mapping=self._added)
        self._recompute = 0
        self._causal_halved = 0
        self._attention_recompute = 0
        self._causal = CausalTracker()
        self._by_op = defaultdict(int)
        self._causal_pos = {}
        self._saw_sdpa_cpu = False
        self._uncounted: set = set()

    def __enter__(self):
        self._recompute = self._causal_halved = self._attention_recompute = 0
        self._causal.reset()
        self._by_op.clear()
        self._uncounted.clear()
        # Compiled code runs eagerly while counted: Dynamo cannot trace under a dispatch mode, and
        # a frame it skipped once stays skipped (every later run would time eager code). The
        # count is then that of the eager original, which is what the compiled code computes.
        self._stance = _eager_stance()
        self._stance.__enter__()
        # Our module hooks make torch warn when a compiled module runs under the counter: that
        # warning is about us, not the user's code. Only this one filter, removed on exit.
        warnings.filterwarnings("ignore", message=_COMPILE_HOOK_WARNING, category=UserWarning)
        self._filter = warnings.filters[0]
        try:
            entered = super().__enter__()
            try:
                hold_ctrl_c_in_dispatch(self)
            except BaseException:
                super().__exit__(None, None, None)
                raise
            return entered
        except BaseException:
            self._leave()
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._leave()

    def _leave(self):
        self._causal.release()
        self._stance.__exit__(None, None, None)
        if self._filter in warnings.filters:
            warnings.filters.remove(self._filter)
            getattr(warnings, "_filters_mutated", lambda: None)()  # refresh "once" registries

    # torch's private per-op hook (see torch_private.COUNT_HOOK; the canary test checks it)
    def _count_flops(self, func_packet, out, args, kwargs):
        backward = in_autograd_backward()
        recompute = backward and torch.is_grad_enabled()
        if func_packet not in self.flop_registry:
            ns = getattr(func_packet, "_qualified_op_name", str(func_packet)).split("::")[0]
            if ns not in ("aten", "prim", "prims", "profiler"):
                self._uncounted.add(str(func_packet))  # a custom op: its work is invisible here
            self._causal.see(func_packet, out, args, kwargs, 0, not recompute, recompute or not backward)
            return out
        n = self.flop_registry[func_packet](*args, **kwargs, out_val=out)
        self._causal.see(func_packet, out, args, kwargs, n, not recompute, recompute or not backward)
        if n and _is_sdpa(func_packet):
            if func_packet not in self._causal_pos:
                self._causal_pos[func_packet] = _causal_index(func_packet)
            pos = self._causal_pos[func_packet]
            causal = kwargs.get("is_causal", args[pos] if pos is not None and pos < len(args) else False)
            useful = n
            if causal:
                self._causal_halved += n - n // 2
                n = useful = n // 2
            elif self._causal.sdpa_masks_causally(func_packet, args, kwargs):
                useful = n // 2   # ran in full, half of it masked
                if not recompute:
                    self._causal.masked += n - useful
            if func_packet in self._added:
                self._saw_sdpa_cpu = True
            if "backward" in str(func_packet):
                # of the 2*(3d + 2dv) units per score, 2d rebuild QK^T (the model's work is the
                # forward's 2*(d + dv) times two): the recompute share is d / (3d + 2dv)
                d, dv = args[1].shape[-1], args[3].shape[-1]
                self._attention_recompute += useful * d // (3 * d + 2 * dv)
        if n and recompute:
            self._recompute += n
        self._by_op[str(func_packet)] += n
        for parent in set(self.mod_tracker.parents):
            self.flop_counts[parent][func_packet] += n
        return out

    def result(self) -> FlopCount:
        notes = []
        if self._saw_sdpa_cpu:
            notes.append("added CPU SDPA FLOPs (torch counts 0 for them)")
        if self._causal_halved:
            notes.append(f"causal SDPA counted at half ({fmt_flops(self._causal_halved)} of masked work removed)")
        if self._recompute:
            notes.append(f"{fmt_flops(self._recompute)} recomputed in backward (checkpointing): in HFU, not MFU")
        masked = self._causal.masked
        if masked:
            notes.append(f"causal attention ran in full (eager or a mask): {fmt_flops(masked)} of masked work "
                         "in HFU, not in model FLOPs (MFU)")
        if self._causal.unread:
            notes.append(Note("flops.mask_unread", f"{self._causal.unread} attention mask(s) without values "
                              "(fake tensors): a causal mask's masked half, if any, is in the count's model FLOPs"))
        uncounted = sorted(self._uncounted)
        notes += uncounted_notes(uncounted)
        return FlopCount(executed=int(self.get_total_flops()), recompute=int(self._recompute),
                         causal_halved=int(self._causal_halved), by_op=dict(self._by_op), notes=notes,
                         uncounted_ops=uncounted, attention_recompute=int(self._attention_recompute),
                         masked_attention=int(masked))


def uncounted_notes(ops) -> list:
    """The note naming the ops the count left out (none when there are none)."""
    return [Note("flops.uncounted", "not counted (no FLOP formula): " + ", ".join(ops))] if ops else []


_COMPILE_HOOK_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"


def _eager_stance():
    """torch.compiler's "force_eager" stance while a count runs, on the main thread only: the stance
    is one for the whole process, so a count on another thread (the dashboard's expectation plans a
    fake step there) would make the user's compiled code run eagerly meanwhile, and two threads
    entering and leaving it out of order would leave it set. Off the main thread nothing compiled
    is counted (a plan's fake twin is never compiled)."""
    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)  # torch >= 2.6
    if set_stance is None or threading.current_thread() is not threading.main_thread():
        return contextlib.nullcontext()
    return set_stance("force_eager")


def _is_sdpa(packet) -> bool:
    name = str(packet)
    return "scaled_dot_product" in name or "flash_attention" in name or "efficient_attention" in name


def counting_active() -> bool:
    """True while a torch FLOP counter is on the dispatch stack (a clock read now is slowed by it)."""
    return any(is_flop_counter(m) for m in dispatch_mode_stack())


@user_facing   # a refusal: the user's line and the message (core.refusals)
def count_flops(fn, *args, **kwargs) -> FlopCount:
    """Run `fn(*args, **kwargs)` once under the counter and return its FlopCount.

    The run is slowed by the counter: never time it. Ctrl-C cannot leave the counter installed.
    Example::

        fc = count_flops(lambda: model(x).sum().backward())
        fc.executed, fc.model
    """
    function("fn", fn, "to run once under the counter, e.g. lambda: model(x).sum().backward()")
    counter = TunekitFlopCounter()
    with deferred_interrupt() as shield:  # the counter goes on and off whole; only fn runs in the gate
        counter.__enter__()
        try:
            with shield.gate():
                fn(*args, **kwargs)
        finally:
            counter.__exit__(None, None, None)
    return counter.result()
