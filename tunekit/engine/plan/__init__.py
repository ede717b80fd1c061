"""`tunekit.plan`: one training step of a model stepped under fake tensors (no memory, no compute),
measured with the same code that measures a real step (`measure.memory.measure_memory`: the
same tally of saved activations, gradients and optimizer state), placed against a device's
memory and roofline. Engine layer.

The model is built from its config inside ``FakeTensorMode`` on the CPU device: torch's CPU
build cannot run autograd on fake CUDA tensors, so a GPU plan is a CPU-device fake step placed on
the GPU's figures (its memory, dense peak and bandwidth from `core.specs`, a CUDA context as a
fixed cost). What CUDA does differently (autocast's op lists, the caching allocator's rounding,
cuBLAS workspaces) is not modelled and the plan says so.
"""
from __future__ import annotations

import warnings

from torch._subclasses.fake_tensor import FakeTensorMode

from ...core import validate
from ...core.plan import Plan
from .device import device_figures
from .step import WEIGHTS, alternatives, fake_step, search_micro_batch
from .target import build, config_of, masks_as_in_eager, max_len, model_name

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def plan(target, device: str = "H100 SXM", *, precision: str | None = None, weights: str | None = None,
         micro_batch: int | None = None, seq_len: int | None = None, checkpointing: bool | None = None,
         optimizer: str | None = None, search: bool = False, search_limit: int = 4096) -> Plan:
    """Plan one training step of ``target`` on ``device`` without running it.

    ``target``: a ``tunekit.GPTConfig``, a transformers config, or a ``tunekit.Lab`` (its model's
    config and current toggles are the defaults). ``device``: a name of the spec table
    ("H100 SXM", "A100", "MI300X", ...) or "cpu" (this machine's RAM and calibrated peak).
    ``precision``: the Lab's words (bf16/fp16 run under autocast); ``weights``: the parameters'
    dtype (None: fp32, with master weights where autocast runs; "bf16": pure bf16 training).
    ``search=True`` also finds the largest micro-batch that fits (fake steps, doubling then
    bisection up to ``search_limit``).

    Example: ``tunekit.plan(LlamaConfig(...), "H100 SXM", weights="bf16", micro_batch=1, seq_len=8192)``."""
    cfg, kind, toggles = config_of(target)
    precision = validate.choice("precision", precision or toggles.get("precision", "fp32"), PRECISIONS)
    if weights is not None:
        validate.choice("weights", weights, tuple(k for k in WEIGHTS if k))
    micro_batch = validate.count("micro_batch", toggles.get("micro_batch", 1) if micro_batch is None else micro_batch)
    seq_len = validate.count("seq_len", (toggles.get("seq_len") or max_len(cfg, kind)) if seq_len is None else seq_len)
    checkpointing = validate.flag("checkpointing", checkpointing if checkpointing is not None
                                  else toggles.get("checkpointing", False))
    optimizer = optimizer or toggles.get("optimizer", "adamw")
    validate.flag("search", search)
    search_limit = validate.count("search_limit", search_limit)
    dev = device_figures(device, precision)
    if seq_len > max_len(cfg, kind):
        raise ValueError(f"seq_len={seq_len} is longer than the model's {max_len(cfg, kind)} positions")
    setting = dict(precision=precision, weights=weights, micro_batch=micro_batch, seq_len=seq_len,
                   checkpointing=checkpointing, optimizer=optimizer)
    with FakeTensorMode(), warnings.catch_warnings(), masks_as_in_eager(kind):
        warnings.simplefilter("ignore")   # transformers' init notices; nothing here runs for real
        model = build(cfg, kind, WEIGHTS[weights])
        step = fake_step(model, kind, cfg, setting, micro_batch)
        found = search_micro_batch(model, kind, cfg, setting, dev, search_limit) if search else None
        fixed = sum(b for b, _ in dev["fixed"].values())
        over = sum(step["components"].values()) + fixed > dev["memory"]
        tries = alternatives(cfg, kind, setting, step, dev, fixed) if over else []
    notes = step["notes"] + dev["notes"]
    if dev["name"] != "cpu":
        notes.append("a CPU-device fake step placed on the GPU's figures: CUDA autocast's op lists, the caching "
                     "allocator's rounding and cuBLAS workspaces are not modelled")
    notes.append("memory = the sum of the components (activations are freed as gradients grow: the real peak "
                 "is lower)")
    return Plan(model=model_name(cfg, kind), device=dev["name"], device_memory_bytes=dev["memory"], setting=setting,
                components=step["components"], fixed=dev["fixed"], tokens=micro_batch * seq_len,
                executed_flops=step["executed"], model_flops=step["model"],
                bound_step_s=step["bound_s"](dev["peak"], dev["bandwidth"]), peak_tflops=dev["peak"],
                bandwidth_tbs=dev["bandwidth"], bound_by=step["top"](dev["peak"], dev["bandwidth"]),
                notes=notes, max_micro_batch=found, alternatives=tries)


