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

import contextlib
import math
import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..core import validate
from ..core.plan import COMPONENTS, Plan
from ..core.specs import SPECS, find_spec
from ..measure.flops import TunekitFlopCounter
from ..measure.memory import autocast_dtype, measure_memory
from ..measure.model_flops import tensors_in
from ..models.adapters import adapt

CUDA_CONTEXT = (0.47 * 2**30, "CUDA context, lazy loading (torch 2.1 on an A100, ml-engineering)")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
WEIGHTS = {None: None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


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
    cfg, kind, toggles = _config_of(target)
    precision = validate.choice("precision", precision or toggles.get("precision", "fp32"), PRECISIONS)
    if weights is not None:
        validate.choice("weights", weights, tuple(k for k in WEIGHTS if k))
    micro_batch = validate.count("micro_batch", toggles.get("micro_batch", 1) if micro_batch is None else micro_batch)
    seq_len = validate.count("seq_len", (toggles.get("seq_len") or _max_len(cfg, kind)) if seq_len is None else seq_len)
    checkpointing = validate.flag("checkpointing", checkpointing if checkpointing is not None
                                  else toggles.get("checkpointing", False))
    optimizer = optimizer or toggles.get("optimizer", "adamw")
    validate.flag("search", search)
    search_limit = validate.count("search_limit", search_limit)
    dev = _device(device, precision)
    if seq_len > _max_len(cfg, kind):
        raise ValueError(f"seq_len={seq_len} is longer than the model's {_max_len(cfg, kind)} positions")
    setting = dict(precision=precision, weights=weights, micro_batch=micro_batch, seq_len=seq_len,
                   checkpointing=checkpointing, optimizer=optimizer)
    with FakeTensorMode(), warnings.catch_warnings(), _masks_as_in_eager(kind):
        warnings.simplefilter("ignore")   # transformers' init notices; nothing here runs for real
        model = _build(cfg, kind, WEIGHTS[weights])
        step = _fake_step(model, kind, cfg, setting, micro_batch)
        found = _search(model, kind, cfg, setting, dev, search_limit) if search else None
        fixed = sum(b for b, _ in dev["fixed"].values())
        over = sum(step["components"].values()) + fixed > dev["memory"]
        tries = _alternatives(cfg, kind, setting, step, dev, fixed) if over else []
    notes = step["notes"] + dev["notes"]
    if dev["name"] != "cpu":
        notes.append("a CPU-device fake step placed on the GPU's figures: CUDA autocast's op lists, the caching "
                     "allocator's rounding and cuBLAS workspaces are not modelled")
    notes.append("memory = the sum of the components (activations are freed as gradients grow: the real peak "
                 "is lower)")
    return Plan(model=_name(cfg, kind), device=dev["name"], device_memory_bytes=dev["memory"], setting=setting,
                components=step["components"], fixed=dev["fixed"], tokens=micro_batch * seq_len,
                executed_flops=step["executed"], model_flops=step["model"],
                bound_step_s=step["bound_s"](dev["peak"], dev["bandwidth"]), peak_tflops=dev["peak"],
                bandwidth_tbs=dev["bandwidth"], bound_by=step["top"](dev["peak"], dev["bandwidth"]),
                notes=notes, max_micro_batch=found, alternatives=tries)


def _alternatives(cfg, kind, setting, step, dev, fixed) -> list:
    """What to change when the step does not fit, each tried as a fake step: (change, its total
    bytes, fits, executed FLOPs against the plan's), most memory saved first."""
    changes = []
    if not setting["checkpointing"]:
        changes.append(("checkpointing=True", dict(checkpointing=True)))
    if setting["weights"] in (None, "fp32") and setting["precision"] in ("bf16", "fp16"):
        changes.append((f"weights={setting['precision']!r}", dict(weights=setting["precision"])))
    if setting["optimizer"] in ("adamw", "adamw_fused"):
        changes.append(("optimizer='sgd'", dict(optimizer="sgd")))
    if setting["micro_batch"] > 1:
        changes.append((f"micro_batch={setting['micro_batch'] // 2}", dict(micro_batch=setting["micro_batch"] // 2)))
    out = []
    for label, change in changes:
        s = dict(setting, **change)
        try:
            alt = _fake_step(_build(cfg, kind, WEIGHTS[s["weights"]]), kind, cfg, s, s["micro_batch"])
        except ValueError:   # a change that cannot be faked is not offered
            continue
        total = sum(alt["components"].values()) + fixed
        per_token = alt["executed"] / s["micro_batch"] / (step["executed"] / setting["micro_batch"])
        out.append((label, total, total <= dev["memory"], per_token))
    return sorted(out, key=lambda a: a[1])


@contextlib.contextmanager
def _masks_as_in_eager(kind):
    """transformers cannot read a fake tensor's values, so it cannot see that the planned batch
    packs one sequence per row, builds an explicit causal mask and repeats the KV heads where an
    eager run passes ``is_causal`` and GQA to SDPA (other saved tensors). While the plan steps,
    its packed-sequence finder answers what it answers for such a batch: none packed.
    tests/test_plan.py's byte-exact transformers test is the canary."""
    utils = None
    if kind == "hf":
        import importlib

        try:
            utils = importlib.import_module("transformers.masking_utils")
        except ImportError:
            utils = None
    if utils is None or not hasattr(utils, "find_packed_sequence_indices"):
        yield
        return
    before = utils.find_packed_sequence_indices
    utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        utils.find_packed_sequence_indices = before


# --- the target ---------------------------------------------------------------------------------

def _config_of(target):
    from ..models.gpt import GPTConfig

    if isinstance(target, GPTConfig):
        return target, "gpt", {}
    if type(target).__name__ == "Lab":
        t = target.toggles
        toggles = dict(precision=t.precision, micro_batch=t.micro_batch, seq_len=t.seq_len,
                       checkpointing=t.checkpointing, optimizer=t.optimizer)
        cfg = getattr(target.model, "config", None)
        kind = "gpt" if isinstance(cfg, GPTConfig) else "hf"
        if kind == "hf" and not hasattr(cfg, "model_type"):
            raise ValueError("tunekit.plan needs a Lab on tunekit's GPT or a transformers model (a config to build)")
        return cfg, kind, toggles
    if hasattr(target, "model_type") and hasattr(target, "to_dict"):
        return target, "hf", {}
    raise TypeError(f"tunekit.plan takes a GPTConfig, a transformers config or a Lab, got {type(target).__name__}: "
                    "build your model from a config (no weights are needed)")


def _max_len(cfg, kind) -> int:
    return cfg.block_size if kind == "gpt" else int(getattr(cfg, "max_position_embeddings", 2048) or 2048)


def _name(cfg, kind) -> str:
    if kind == "gpt":
        return f"GPT (n_layer={cfg.n_layer}, n_embd={cfg.n_embd})"
    return f"{type(cfg).__name__.removesuffix('Config')} (hidden={cfg.hidden_size}, layers={cfg.num_hidden_layers})"


def _build(cfg, kind, dtype):
    """The model, its parameters made in ``dtype`` (None: fp32) as they are created."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.float32)
    try:
        if kind == "gpt":
            from ..models.gpt import GPT

            return GPT(cfg)
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_config(cfg, dtype=dtype or torch.float32)
    finally:
        torch.set_default_dtype(previous)


# --- the device ---------------------------------------------------------------------------------

def _device(name, precision) -> dict:
    validate.text("device", name)
    dtype = "fp32" if precision == "fp32" else precision
    if name.strip().lower() == "cpu":
        import psutil

        from ..measure.peaks import resolve_peak

        peak = resolve_peak("cpu", dtype if dtype in ("fp32", "bf16") else "fp32")
        return dict(name="cpu", memory=float(psutil.virtual_memory().total), peak=peak.tflops, bandwidth=None,
                    fixed={}, notes=[f"peak {peak.source}; no memory bandwidth known for this CPU: the bound "
                                     "counts FLOPs only"])
    spec = find_spec(name)
    if spec is None:
        raise ValueError(f"unknown device {name!r}: one of {', '.join(s.name for s in SPECS)}, or 'cpu'")
    if spec.memory_gb is None:
        raise ValueError(f"the spec table has no memory size for {spec.name}: plan for another device")
    notes = [] if spec.bandwidth_tbs else [f"no memory bandwidth listed for {spec.name}: the bound counts FLOPs only"]
    peak = spec.tflops.get(dtype)
    if peak is None:
        notes.append(f"{spec.name} lists no {dtype} peak: no speed bound")
    # vendors' "80 GB" is what torch sees as ~79 GiB: 80 x 2^30 x 0.99 (an H100 80GB reports 85.0e9 bytes)
    return dict(name=spec.name, memory=spec.memory_gb * 2**30 * 0.99, peak=peak, bandwidth=spec.bandwidth_tbs,
                fixed={"cuda_context": CUDA_CONTEXT}, notes=notes + [f"peak and memory: {spec.source}"])


# --- the fake step ------------------------------------------------------------------------------

class RooflineCounter(TunekitFlopCounter):
    """TunekitFlopCounter that also keeps, for each op that does FLOPs (matmuls, attention), its
    FLOPs (causal attention halved) and the bytes it must move (inputs read, outputs written).
    Elementwise ops, norms and casts are left out of the bound: a compiler can fuse them into
    their neighbours, so counting their traffic would make the "bound" a guess about fusion."""

    def __enter__(self):
        self.ops = []   # (op name, flops, bytes)
        return super().__enter__()

    def _count_flops(self, func_packet, out, args, kwargs):
        before = self.get_total_flops()
        result = super()._count_flops(func_packet, out, args, kwargs)
        flops = self.get_total_flops() - before
        if flops:
            moved = sum(t.nbytes for t in tensors_in((args, kwargs, out), levels=3))
            self.ops.append((str(func_packet).removeprefix("aten."), flops, moved))
        return result


def _batch(cfg, kind, micro_batch, seq_len):
    vocab = cfg.vocab_size
    x = torch.randint(0, vocab, (micro_batch, seq_len))
    return x, (torch.randint(0, vocab, (micro_batch, seq_len)) if kind == "gpt" else x)


def _fake_step(model, kind, cfg, setting, micro_batch) -> dict:
    try:
        return _fake_step_of(model, kind, cfg, setting, micro_batch)
    except Exception as e:
        from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

        if isinstance(e, (DataDependentOutputException, DynamicOutputShapeException)):
            raise ValueError(f"this step reads a tensor's value ({e}), which a fake step cannot (no data): "
                             f"plan with another optimizer than {setting['optimizer']!r}, or use "
                             "tunekit.estimate_memory (analytic) for this model") from None
        raise


def _fake_step_of(model, kind, cfg, setting, micro_batch) -> dict:
    batch = _batch(cfg, kind, micro_batch, setting["seq_len"])
    report = measure_memory(model, batch, optimizer=setting["optimizer"], precision=setting["precision"],
                            checkpointing=setting["checkpointing"], estimate=False)
    components = {k: float(report.measured.get(k, 0.0)) for k in COMPONENTS}
    if any(math.isnan(v) for v in components.values()):
        raise ValueError(f"the fake step left a component unmeasured: {components}")
    adapter = adapt(model)
    ac = autocast_dtype(setting["precision"])
    before = adapter.checkpointing
    counter = RooflineCounter()
    try:
        if adapter.can_checkpoint:
            adapter.set_checkpointing(setting["checkpointing"])
        with counter:
            with torch.autocast("cpu", dtype=ac) if ac is not None else contextlib.nullcontext():
                loss = _loss(model, kind, batch)
            loss.backward()
    finally:
        if adapter.can_checkpoint:
            adapter.set_checkpointing(before)
        for p in model.parameters():
            p.grad = None
    count = counter.result()
    ops = counter.ops
    tokens = micro_batch * setting["seq_len"]
    # the Lab's MFU convention where the shape is known (causal attention halved, no recompute)
    model_flops = adapter.model_flops(setting["seq_len"], tokens, float(count.model))[0]

    def per_op(peak, bw):
        out = {}
        for name, flops, moved in ops:
            t = max(flops / (peak * 1e12) if peak else 0.0, moved / (bw * 1e12) if bw else 0.0)
            out[name] = out.get(name, 0.0) + t
        return out

    def bound_s(peak, bw):
        return sum(per_op(peak, bw).values()) if (peak or bw) else math.nan

    def top(peak, bw):
        return sorted([kv for kv in per_op(peak, bw).items() if kv[1] > 0], key=lambda kv: -kv[1])[:6] \
            if (peak or bw) else []

    notes = [n for n in report.notes if "no CUDA device" not in n and "fresh AdamW" not in n]
    notes += count.notes
    return dict(components=components, executed=float(count.executed), model=float(model_flops),
                bound_s=bound_s, top=top, notes=notes)


def _loss(model, kind, batch):
    x, y = batch
    if kind == "gpt":
        return model(x, y)[1]
    return model(input_ids=x, labels=y, use_cache=False).loss


def _search(model, kind, cfg, setting, dev, limit) -> int | None:
    """The largest micro-batch whose fake step fits the device: doubling, then bisection."""
    def fits(mb):
        step = _fake_step(model, kind, cfg, dict(setting, micro_batch=mb), mb)
        return sum(step["components"].values()) + sum(b for b, _ in dev["fixed"].values()) <= dev["memory"]

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo

