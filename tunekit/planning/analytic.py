"""When the fake step cannot run: why (`fake_failure`), and the plan `estimate_memory` makes
instead (`analytic_plan`), said to be one.

A fake tensor has a shape but no values, so a step that reads a value (``.item()``, ``bool()``
of a tensor: Adafactor's step, a router that branches on its counts) or whose output shape
depends on values (``nonzero``, ``torch.where(mask)``, boolean indexing: a mixture of experts
that dispatches tokens) cannot be faked. The plan then comes from the analytic estimate: the
static lines from the parameter count, the activations from tunekit's tables where the model has
a config they cover, else unknown (NaN, and the plan says so): never a silent guess.
"""
from __future__ import annotations

import inspect
import math

import torch

from tunekit.core.memory.estimate import estimate_memory
from tunekit.core.memory.static import trained_only
from tunekit.core.notes import without
from tunekit.core.setting import HALF
from tunekit.core.units import is_missing
from tunekit.measure.device import weights_dtype
from tunekit.measure.tally import storage_key, unique_bytes
from tunekit.models.adapters import adapt
from tunekit.planning.record import COMPONENTS, Plan

NaN = math.nan


class FakeStepError(ValueError):
    """The fake step could not run; ``reason`` says why, in words."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def fake_failure(e: BaseException) -> str | None:
    """Why ``e`` (or an exception it was raised from) is a fake tensor's limit rather than a bug
    in the step, in words; None when it is not one (it is then raised as it is). Told by the
    exception's type, never by its message: torch's fake-tensor exceptions (an op without a fake
    kernel, a tensor it cannot fake), any other exception class of torch's fake-tensor and
    symbolic-shape modules (a guard on a data-dependent size), and
    a meta kernel that refuses a dtype the real kernel takes (`_stricter_meta_kernel`)."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        MissingOpProfile,
        UnsupportedFakeTensorException,
        UnsupportedOperatorException,
    )

    limits = (UnsupportedOperatorException, UnsupportedFakeTensorException, MissingOpProfile)

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, DataDependentOutputException):
            return (f"the step reads a tensor's value ({e}: .item(), bool() or .tolist() of a tensor), "
                    "which a fake tensor does not have")
        if isinstance(e, DynamicOutputShapeException):
            return (f"an op's output shape depends on tensor values ({e}: nonzero, torch.where(mask), "
                    "boolean indexing, unique), which a fake tensor does not have")
        if isinstance(e, limits) or type(e).__module__.startswith(_FAKE_MODULES) or _stricter_meta_kernel(e):
            return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
        e = e.__cause__ or e.__context__
    return None


# where torch defines the exceptions of a fake tensor's limits, those named above and those a later
# torch adds: GuardOnDataDependentSymNode (torch.fx.experimental.symbolic_shapes), ...
_FAKE_MODULES = ("torch._subclasses", "torch.fx.experimental")
_TRIED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)   # the dtypes a step's matmuls run in


def _stricter_meta_kernel(e: BaseException) -> bool:
    """A meta kernel (what a fake tensor runs for an op) that refuses a dtype the real kernel
    takes: torch 2.13's ``_grouped_mm`` meta wants bf16 where the CPU kernel runs fp32 (a
    transformers mixture of experts over fp32 weights). Told by running the refusing kernel
    again on meta tensors of the same shapes and strides in each of `_TRIED_DTYPES`: one that
    passes makes the refusal the dtype's. A shape error raised there fails in every dtype: the
    step's own bug, and not taken for one."""
    frame = _meta_kernel_frame(e) if isinstance(e, RuntimeError) else None
    if frame is None:
        return False
    kernel = frame.f_globals.get(frame.f_code.co_name)
    if kernel is None or getattr(inspect.unwrap(kernel), "__code__", None) is not frame.f_code:
        return False   # a nested function: its arguments are not the op's
    args = {n: frame.f_locals[n] for n in inspect.signature(inspect.unwrap(kernel)).parameters
            if n in frame.f_locals}
    for dtype in _TRIED_DTYPES:
        twins = {n: torch.empty_strided(v.shape, v.stride(), dtype=dtype, device="meta")
                 if isinstance(v, torch.Tensor) and v.is_floating_point() else v for n, v in args.items()}
        try:
            inspect.unwrap(kernel)(**twins)
        except Exception:   # noqa: BLE001 - any refusal in this dtype: the next one is tried
            continue
        return True
    return False


def _meta_kernel_frame(e: BaseException):
    """The innermost frame of ``e``'s traceback in torch's meta kernels, or None."""
    tb, found = e.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith("_meta_registrations.py"):
            found = tb.tb_frame
        tb = tb.tb_next
    return found


# A step whose formula figure (estimate_memory's, the line lab.run's fit check uses) is over this many
# times the card is answered from it, without the fake step and its advice search (a minute for a 1B
# GPT). estimate_memory is within 0.1% of the measured saved tensors for tunekit's GPT and within 10%
# (its target) for the transformers decoders it counts (benchmarks/RESULTS.md, `bench_memory_estimate.py`):
# twice the card is over by ten times that error, so no setting the fake step would let fit is cut off.
FAR_PAST = 2.0


def far_past_the_card(cfg, kind, s, dev, layout: dict | None, name: str) -> Plan | None:
    """The formula's plan of a step whose every activation it counts and whose total is over
    `FAR_PAST` times the device's memory, said to be the formula's, with the largest micro-batch the
    formula fits; None otherwise (the fake step then plans it). A step of one sample is never cut short:
    sharding and half weights are its answers, and only the fake step's advice searches them."""
    if kind not in ("gpt", "hf") or s.micro_batch <= 1 or getattr(cfg, "is_encoder_decoder", False):
        return None   # (the formula has no encoder-decoder: the fake step plans it)
    p = analytic_plan(None, cfg, kind, s, dev, layout, "", name, s.micro_batch * s.seq_len, "tokens", speed=False)
    if p.unknown or not p.total_bytes > FAR_PAST * dev.memory:
        return None
    one = analytic_plan(None, cfg, kind, s.replace(micro_batch=1), dev, layout, "", name, s.seq_len, "tokens",
                        speed=False)
    per_sample = (p.total_bytes - one.total_bytes) / (s.micro_batch - 1) if s.micro_batch > 1 else math.inf
    fits = max(0, 1 + math.floor((dev.memory - one.total_bytes) / per_sample)) if per_sample > 0 else 0
    p.notes[0] = (f"formula's figure (estimate_memory, no fake step): over {FAR_PAST:g}x the card's memory, so the "
                  "fake step and its advice search were skipped; " + (
                      f"micro_batch={fits} at most fits by the same formula (plan that for the fake step's figures "
                      "and advice)" if fits else "not even micro_batch=1 fits by the same formula (plan "
                      "micro_batch=1 for the fake step's figures and advice: sharding, half weights)"))
    return p


def analytic_plan(model, cfg, kind, setting: dict, dev: dict, layout: dict | None, reason: str, name: str,
                  tokens: int, unit: str, speed: bool = True) -> Plan:
    """The plan from ``estimate_memory``: ``model`` is the fake model built for the step (its
    parameter and buffer counts, its config) or None when building it failed (then a module
    target's live module is counted, its metadata only, or a config's own counts). Activations:
    tunekit's tables for a config they cover, else NaN; the speed bound: the MFU convention's
    FLOPs at the dense peak where the shape is known, else none. ``layout``: rank 0's share of a
    sharded run, as estimate_memory shards it (the collectives are not timed)."""
    inner = getattr(model, "model", model) if type(model).__name__ == "Stepped" else model
    if inner is None and hasattr(cfg, "module"):   # a module whose twin was not made: the live one's counts
        inner = cfg.module
    config = getattr(inner, "config", None) if inner is not None else (cfg if kind in ("gpt", "hf") else None)
    params = list(inner.parameters()) if inner is not None else []
    n_params = float(sum(p.numel() for p in params)) or None
    bytes_layout = _layout(setting, params)
    notes = [f"analytic estimate: the fake step failed because {reason}"]
    est = estimate_memory(config if config is not None else n_params, n_params=n_params, layout=bytes_layout,
                          optimizer=setting.optimizer, micro_batch=setting.micro_batch,
                          seq_len=setting.seq_len if config is not None else None,
                          checkpointing=setting.checkpointing, device="cpu" if dev.name == "cpu" else "cuda",
                          cuda_context_bytes=0.0, attention=setting.attention if config is not None else None,
                          **(dict(parallel=layout["kind"], world_size=layout["world_size"], nodes=layout["nodes"])
                             if layout else {}))
    components = {k: float(est.components[k]) for k in COMPONENTS}
    if inner is not None and is_missing(components["buffers"]):
        components["buffers"] = float(unique_bytes(inner.buffers(), {storage_key(p) for p in params}))
    frozen = trained_only(components, None, sum(p.numel() for p in params if p.requires_grad), n_params or 0)
    notes.extend([frozen] if frozen else [])
    if is_missing(components["activations"]):
        notes.append(f"activations unknown (NaN): tunekit has no activation count for {name}; the memory shown "
                     "leaves them out")
    if not is_missing(est.components["recompute"]) and est.components["recompute"] > 0:
        notes.append(f"checkpointing rebuilds one block's activations in backward: about "
                     f"{est.components['recompute'] / 2**30:,.3f} GiB more at that moment (not in the sum)")
    notes += without(est.notes, "device.assumed", "activations.unknown")
    if layout:
        notes.append(f"{layout['kind']}: rank 0's share as estimate_memory shards it; the collectives are not timed")
    model_flops, bound_s = _speed(inner, setting, tokens, unit, dev, notes) if speed else (NaN, NaN)
    return Plan(model=name, device=dev.name, device_memory_bytes=dev.memory, setting=setting,
                components=components, fixed=dev.fixed, tokens=tokens, executed_flops=NaN,
                model_flops=model_flops, bound_step_s=bound_s, peak_tflops=dev.peak,
                bandwidth_tbs=dev.bandwidth, notes=notes + dev.notes, method="analytic", unit=unit,
                parallel=layout, compute_bound_s=bound_s)


def _layout(setting, params) -> str:
    """The estimate's precision for the step: pure half weights, autocast over fp32 ("amp"), or fp32/tf32."""
    live = weights_dtype(params)
    return setting.replace(weights=setting.weights or (live if live in HALF else None)).memory_layout


def _speed(inner, setting, tokens, unit, dev, notes) -> tuple[float, float]:
    """(model FLOPs, the step's lower bound in s): 6N + attention per token at the dense peak
    where tunekit knows the shape (no memory traffic, no recompute: looser than a counted
    roofline), else NaN and a note."""
    shape = None
    if inner is not None and unit == "tokens":
        try:
            adapter = adapt(inner)
            shape = adapter.shape
        except ValueError:
            shape = None
    if shape is None:
        notes.append("no speed bound: no op was counted and tunekit has no FLOP formula for this model")
        return NaN, NaN
    model_flops, _, why = adapter.model_flops(setting.seq_len, tokens, None)
    if model_flops is None:   # frozen weights: only a count gives the step's FLOPs, and none was made
        notes.append("no speed bound: " + why[0])
        return NaN, NaN
    if not dev.peak:
        return model_flops, NaN
    notes.append("bound: the MFU convention's FLOPs (6 x matmul weights x tokens + causal attention) at the dense "
                 "peak, with no memory traffic and no recompute: a looser lower bound than a fake step's roofline")
    return model_flops, model_flops / (dev.peak * 1e12)
