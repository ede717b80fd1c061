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

from ...core import registry, validate
from ...core.plan import Plan
from .analytic import FakeStepError, analytic_plan, fake_failure
from .device import device_figures
from .module import ModuleTarget
from .step import WEIGHTS, alternatives, fake_step, search_micro_batch
from .target import amount, build, config_of, masks_as_in_eager, max_len, model_name

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def plan(target, device: str = "H100 SXM", *, precision: str | None = None, weights: str | None = None,
         micro_batch: int | None = None, seq_len: int | None = None, checkpointing: bool | None = None,
         optimizer: str | None = None, search: bool = False, search_limit: int = 4096,
         batch_fn=None, loss_fn=None, blocks=None) -> Plan:
    """Plan one training step of ``target`` on ``device`` without running it.

    ``target``: a ``tunekit.GPTConfig``, a transformers config, an ``nn.Module`` (built on the
    meta device, or a real one: a fake twin is stepped, the module is only read), or a
    ``tunekit.Lab`` (its model, batches, loss and default toggles). A module tunekit has no batch
    for needs ``batch_fn(micro_batch, seq_len) -> (x, y)``, called inside the fake mode;
    ``loss_fn(model, x, y) -> loss`` (default: the model's own loss, else its output summed) and
    ``blocks`` (what checkpointing recomputes) as the Lab takes them. A step a fake tensor cannot
    take (a value read, a value-dependent shape: Adafactor, a token-dispatching router) is
    planned by ``estimate_memory`` instead, and the plan says so (``method="analytic"``).
    ``device``: a name of the spec table ("H100 SXM", "A100", "MI300X", ...) or "cpu" (this
    machine's RAM and calibrated peak).
    ``precision``: the Lab's words (bf16/fp16 run under autocast); ``weights``: the parameters'
    dtype (None: fp32, with master weights where autocast runs; "bf16": pure bf16 training).
    ``search=True`` also finds the largest micro-batch that fits (fake steps, doubling then
    bisection up to ``search_limit``).

    Example: ``tunekit.plan(LlamaConfig(...), "H100 SXM", weights="bf16", micro_batch=1, seq_len=8192)``."""
    cfg, kind, toggles = config_of(target, batch_fn, loss_fn, blocks)
    precision = validate.choice("precision", precision or toggles.get("precision", "fp32"), PRECISIONS)
    weights = weights if weights is not None else toggles.get("weights")
    if weights is not None:
        validate.choice("weights", weights, tuple(k for k in WEIGHTS if k))
    limit = max_len(cfg, kind)   # None: a module without a position limit
    seq_note = []
    if seq_len is None and not toggles.get("seq_len") and limit is None:
        seq_len, seq_note = 1, ["seq_len not given: batch_fn was called with seq_len=1, as a Lab on your own "
                                "batch_fn calls it"]
    micro_batch = validate.count("micro_batch", toggles.get("micro_batch", 1) if micro_batch is None else micro_batch)
    seq_len = validate.count("seq_len", (toggles.get("seq_len") or limit) if seq_len is None else seq_len)
    checkpointing = validate.flag("checkpointing", checkpointing if checkpointing is not None
                                  else toggles.get("checkpointing", False))
    optimizer = registry.optimizer(validate.text("optimizer", optimizer or toggles.get("optimizer", "adamw"))).name
    validate.flag("search", search)
    search_limit = validate.count("search_limit", search_limit)
    dev = device_figures(device, precision)
    if checkpointing and not getattr(cfg, "can_checkpoint", True):
        raise ValueError("checkpointing needs the blocks to recompute: tunekit.plan(..., blocks='layers'), an "
                         "attribute path of the model or a list of its modules")
    if limit is not None and seq_len > limit:
        raise ValueError(f"seq_len={seq_len} is longer than the model's {limit} positions")
    setting = dict(precision=precision, weights=weights, micro_batch=micro_batch, seq_len=seq_len,
                   checkpointing=checkpointing, optimizer=optimizer)
    # a module's batch_fn may hand back real tensors and a module real constants: taken as fakes
    with FakeTensorMode(allow_non_fake_inputs=isinstance(cfg, ModuleTarget)), warnings.catch_warnings(), \
            masks_as_in_eager(kind):
        warnings.simplefilter("ignore")   # transformers' init notices; nothing here runs for real
        model, tokens, unit = None, micro_batch, "samples"   # until the batch says
        try:
            tokens, unit = amount(cfg, kind, micro_batch, seq_len)
            model = build(cfg, kind, WEIGHTS[weights])
            step = fake_step(model, kind, cfg, setting, micro_batch)
        except Exception as e:   # what a fake tensor cannot take is planned analytically, and said
            reason = e.reason if isinstance(e, FakeStepError) else fake_failure(e)
            if reason is None:
                raise
            planned = analytic_plan(model, cfg, kind, setting, dev, reason, model_name(cfg, kind), tokens, unit)
            planned.notes[1:1] = seq_note if unit == "tokens" else []
            return planned
        found = search_micro_batch(model, kind, cfg, setting, dev, search_limit) if search else None
        fixed = sum(b for b, _ in dev["fixed"].values())
        over = sum(step["components"].values()) + fixed > dev["memory"]
        tries = alternatives(cfg, kind, setting, step, dev, fixed) if over else []
    notes = (seq_note if unit == "tokens" else []) + step["notes"] + dev["notes"]   # samples: seq_len unused
    if dev["name"] != "cpu":
        notes.append("a CPU-device fake step placed on the GPU's figures: CUDA autocast's op lists, the caching "
                     "allocator's rounding and cuBLAS workspaces are not modelled")
    notes.append("memory = the sum of the components (activations are freed as gradients grow: the real peak "
                 "is lower)")
    return Plan(model=model_name(cfg, kind), device=dev["name"], device_memory_bytes=dev["memory"], setting=setting,
                components=step["components"], fixed=dev["fixed"], tokens=tokens, unit=unit,
                executed_flops=step["executed"], model_flops=step["model"],
                bound_step_s=step["bound_s"](dev["peak"], dev["bandwidth"]), peak_tflops=dev["peak"],
                bandwidth_tbs=dev["bandwidth"], bound_by=step["top"](dev["peak"], dev["bandwidth"]),
                notes=notes, max_micro_batch=found, alternatives=tries)


