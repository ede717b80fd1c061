"""Static memory per parameter: weights, master copy, gradients and optimizer states under a
memory layout, and their lines of an estimate (split by model parallelism and ZeRO). Pure.

An optimizer's state is its parameter-sized tensors plus, for torch's AdamW and Adafactor, a
0-dim fp32 ``step`` per parameter tensor (`registry.Optimizer.step_bytes`): with the model's
tensor shapes known the estimate counts those too, as ``optimizer.state`` holds them.
"""
from __future__ import annotations

import math

from tunekit.core import registry
from tunekit.core.fmt import fmt_count
from tunekit.core.memory.answer import STATIC
from tunekit.core.memory.options import MemoryOptions
from tunekit.core.notes import Note
from tunekit.core.registry import FP32, MEMORY_LAYOUTS, MemoryLayout, memory_layout_name

NaN = math.nan


def layout_bytes(layout: str) -> MemoryLayout:
    """Bytes per parameter of a memory layout (a key or alias of tunekit.core.registry.MEMORY_LAYOUTS:
    "fp32", "amp", "mixed", "bf16", ...; a training precision's is `Setting.memory_layout`)."""
    return MEMORY_LAYOUTS[memory_layout_name(layout)]


def optimizer_bytes_per_param(optimizer: str, layout: str = FP32) -> float:
    """Optimizer-state bytes per parameter under a memory ``layout``: AdamW 8 (fp32), SGD-momentum/Lion 4,
    Adafactor 4 (a bound: by shape far less), 8-bit AdamW 2, bf16 AdamW 4; states take a pure half dtype."""
    return registry.optimizer(optimizer).state_bytes_per_param(layout_bytes(layout).state)


def bytes_per_param(layout: str = "mixed", optimizer: str = "adamw") -> dict:
    """Static bytes per parameter by component under a memory ``layout``. mixed + AdamW: 2 + 4 + 4 + 8 = 18."""
    p = layout_bytes(layout)
    return {"weights": p.weights, "master_weights": p.master, "gradients": p.grads,
            "optimizer_states": optimizer_bytes_per_param(optimizer, layout)}


def param_bytes(o: MemoryOptions, n_params: float, shapes: list | None, notes: list) -> tuple[dict, int]:
    """(`bytes_per_param` of the estimate's options, bytes of the optimizer's per-tensor ``step``
    counts), by the tensors' ``shapes`` where they are known (every parameter tensor's, summing to
    ``n_params``): a factored optimizer's state by shape (its steps in it), AdamW's steps apart."""
    per, opt = bytes_per_param(o.layout_key, o.optimizer), registry.optimizer(o.optimizer)
    steps = 0
    if o.optimizer_bytes is not None:
        per["optimizer_states"] = o.optimizer_bytes
    elif shapes is not None and sum(map(math.prod, shapes)) == n_params and opt.factored:
        # torch's Adafactor by the tensors' shapes (registry.Optimizer.state_bytes_of), per parameter
        per["optimizer_states"] = opt.state_bytes_of(shapes, layout_bytes(o.layout_key).state) / n_params
    elif shapes is not None and sum(map(math.prod, shapes)) == n_params:
        steps = opt.step_bytes * len(shapes)   # AdamW's 0-dim fp32 step per tensor; SGD keeps none
    elif opt.factored:
        notes.append(Note("optimizer.bound", f"{opt.name}: its factored state follows the tensors' shapes, "
                          f"unknown here: charged {per['optimizer_states']:g} B/param, its bound (a model or "
                          "config gives them)"))
    if o.grad_bytes is not None:
        per["gradients"] = o.grad_bytes
    return per, steps


def static_lines(n_params: float, per: dict, shard: int, dp: int, zero_stage: int, steps: int = 0) -> tuple:
    """(components, formulas) of weights, master copy, gradients and optimizer states: model
    parallelism (``shard`` = tp*pp) splits each, ZeRO stage s splits those it covers over dp;
    the optimizer's ``steps`` bytes (one small tensor per parameter tensor) stay whole."""
    zero_div = {"weights": 3, "master_weights": 1, "gradients": 2, "optimizer_states": 1}
    comps, forms = {}, {}
    for k in STATIC:
        div = shard * (dp if zero_stage >= zero_div[k] else 1)
        comps[k] = n_params * per[k] / div
        forms[k] = f"{fmt_count(n_params)} params x {per[k]:g} B" + (f" / {div}" if div > 1 else "")
    if steps:
        comps["optimizer_states"] += steps
        forms["optimizer_states"] += f" + {steps:g} B of step counts (4 B per tensor)"
    comps["buffers"] = NaN
    return comps, forms


TRAINED_ONLY = ("master_weights", "gradients", "optimizer_states")


def trained_only(comps: dict, forms: dict | None, trainable: float, n_params: float) -> str | None:
    """Frozen parameters (``requires_grad=False``) keep no gradient, master copy or optimizer state:
    those lines scaled to the ``trainable`` share of ``n_params``; the note saying so, or None
    when every parameter trains."""
    if not n_params or trainable >= n_params:
        return None
    for k in TRAINED_ONLY:
        comps[k] *= trainable / n_params
        if forms is not None and forms.get(k):
            forms[k] += f" x {fmt_count(trainable)}/{fmt_count(n_params)} trained"
    return (f"{int(trainable):,} of {int(n_params):,} parameters are trained: gradients, master weights and "
            "optimizer states counted for those")
