"""`tunekit.plan`: one training step of a model stepped under fake tensors (no memory, no compute),
measured with the same code that measures a real step (`measure.memory.measure_memory`: the
same tally of saved activations, gradients and optimizer state), placed against a device's
memory and roofline.

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

from torch._subclasses.fake_tensor import FakeTensorMode

from tunekit.core import registry, validate
from tunekit.core.breakdown import by_category
from tunekit.core.comm import layout_problems
from tunekit.core.efficiency import ATTENTION_KERNELS
from tunekit.core.gpus import DEFAULT_DEVICE  # a Setting whose device is None is planned for it
from tunekit.core.setting import HALF, SETTING_CHOICES, Setting, from_keywords
from tunekit.core.units import is_missing
from tunekit.measure.device import torch_dtype
from tunekit.planning.advice import dimensions, pruned_note, search_changes
from tunekit.planning.analytic import FakeStepError, analytic_plan, fake_failure
from tunekit.planning.cuda_like import GpuKernels, quiet_fake_logs
from tunekit.planning.device import device_figures
from tunekit.planning.expect import expected_of
from tunekit.planning.module import ModuleTarget, Stepped
from tunekit.planning.record import Plan
from tunekit.planning.shard import comm_seconds, inter_node_gbs, node_net, rank_peak, shard_count
from tunekit.planning.step import complete, fake_step, search_micro_batch
from tunekit.planning.target import amount, build, config_of, masks_as_in_eager, max_len, model_name
from tunekit.view.progress import wait_progress

COMPILE_NOT_MODELLED = ("compile=True: the memory is an eager step's (a compiled step often saves fewer activations); "
                        "plan.expected fuses the memory-bound ops")


@validate.keywords_checked(SETTING_CHOICES)
def plan(target, device: str = DEFAULT_DEVICE, *, precision: str | None = None, weights: str | None = None,
         micro_batch: int | None = None, seq_len: int | None = None, checkpointing: bool | None = None,
         optimizer: str | None = None, attention: str | None = None, parallel: str | None = None,
         world_size: int = 1, nodes: int = 1, search: bool = False, search_limit: int = 4096,
         batch_fn=None, loss_fn=None, blocks=None, setting: Setting | None = None,
         attention_kernel: str | None = None, verbose: bool = True) -> Plan:
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
    ``attention``: the Lab's names ("sdpa", "math"/"eager", "flash"; None: the model's own).
    ``parallel`` ("ddp", "fsdp", "fsdp_grad_op", "hsdp") over ``world_size`` GPUs on ``nodes``
    nodes gives rank 0's memory and the collectives' time on the device's links; ``micro_batch``
    is then per rank. ``search=True`` also finds the largest micro-batch that fits (fake steps,
    doubling then bisection up to ``search_limit``).

    ``setting``: a ``tunekit.Setting`` instead of the step keywords (its ``device``, when set,
    instead of ``device``; ``grad_accum``, ``lr`` and ``compile`` are not planned).

    ``attention_kernel``: which fused kernel the expectation takes attention at ("flash":
    FlashAttention-2, torch's SDPA flash, the default; "fa3"; "triton": the 2023 FlashAttention-1-era
    Triton kernel of llm-foundry's attn_impl="triton"); the memory plan is the same.

    ``plan.expected`` (core.expected.Expected): what a well-written run of this step reaches on the
    device, op by op over the same fake step (``.step_s``, ``.tokens_per_s`` per GPU, ``.mfu``,
    ``.by_op``); None, with a note saying which figure is missing, for a device tunekit lacks one for.

    ``verbose`` (default): a plan that takes over 2 s says what it is doing (the fake step, its pass
    and phase, the advice's combination k of n) on one line that updates (tunekit.view.progress:
    stderr in a terminal, a display in a notebook), then how long it took; ``verbose=False`` nothing.
    Ctrl-C stops it: the KeyboardInterrupt reaches you, with nothing of yours changed.

    Example: ``tunekit.plan(LlamaConfig(...), "H100 SXM", weights="bf16", micro_batch=1, seq_len=8192)``."""
    given = dict(precision=precision, weights=weights, micro_batch=micro_batch, seq_len=seq_len,
                 checkpointing=checkpointing, optimizer=optimizer, attention=attention, parallel=parallel,
                 world_size=None if world_size == 1 else world_size, nodes=None if nodes == 1 else nodes)
    asked = from_keywords(setting, "plan", **given)
    if asked is not None:
        if asked.device is not None and device not in (DEFAULT_DEVICE, asked.device):
            raise ValueError(f"plan: the device is {device!r} and the Setting's {asked.device!r}: give one "
                             "(setting.replace(device=...) changes it)")
        precision, weights, micro_batch, seq_len = asked.precision, asked.weights, asked.micro_batch, asked.seq_len
        checkpointing, optimizer, attention = asked.checkpointing, asked.optimizer, asked.attention
        parallel, world_size, nodes, device = asked.parallel, asked.world_size, asked.nodes, asked.device or device
    cfg, kind, toggles = config_of(target, batch_fn, loss_fn, blocks)
    precision = validate.choice("precision", precision or toggles.get("precision", "fp32"), tuple(registry.PRECISIONS))
    weights = weights if weights is not None else toggles.get("weights")
    if weights is not None:
        validate.choice("weights", weights, ("fp32",) + HALF)
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
    attention = attention if attention is not None else toggles.get("attention")
    layout = _layout(parallel, world_size, nodes)
    if attention_kernel is not None:
        validate.choice("attention_kernel", attention_kernel, tuple(ATTENTION_KERNELS))
    validate.flag("search", search)
    validate.flag("verbose", verbose)
    search_limit = validate.count("search_limit", search_limit)
    # the matmuls run in the weights' dtype when those are half (autocast or not): the peak is that dtype's
    compute = Setting(precision=precision, weights=weights).compute
    dev = device_figures(device, compute, layout["world_size"] if layout else 1)
    if compute != precision:
        dev["notes"].insert(0, f"weights are {weights}: the matmuls run in {weights}, so the bound is against "
                               f"the {weights} peak (precision={precision!r} names the autocast, here none)"
                            if registry.PRECISIONS[precision].autocast_dtype is None else
                            f"weights are {weights}: the matmuls run in {weights} (autocast to {precision} is not "
                            f"applied to half weights), so the bound is against the {weights} peak")
    if checkpointing and not getattr(cfg, "can_checkpoint", True):
        raise ValueError("checkpointing needs the blocks to recompute: tunekit.plan(..., blocks='layers'), an "
                         "attribute path of the model or a list of its modules")
    if limit is not None and seq_len > limit:
        raise ValueError(f"seq_len={seq_len} is longer than the model's {limit} positions")
    # the step planned: what was asked (compile, grad_accum, lr kept as said), resolved
    setting = (asked or Setting()).replace(precision=precision, weights=weights, micro_batch=micro_batch,
                                           seq_len=seq_len, checkpointing=checkpointing, optimizer=optimizer,
                                           attention=attention, parallel=parallel, world_size=world_size,
                                           nodes=nodes, device=dev["name"])
    with wait_progress("tunekit.plan", verbose) as shown:
        shown.at("starting torch's fake-tensor mode (its first use in a process imports torch._dynamo)")
        notes = []
        gpu = GpuKernels(dev["name"]) if dev["name"] != "cpu" else contextlib.nullcontext()
        # a module's batch_fn may hand back real tensors and a module real constants: taken as fakes
        with FakeTensorMode(allow_non_fake_inputs=isinstance(cfg, ModuleTarget)), warnings.catch_warnings(), \
                masks_as_in_eager(kind), quiet_fake_logs(), gpu:
            warnings.simplefilter("ignore")   # transformers' init notices; nothing here runs for real
            models = {}

            steps = {}   # one fake step per shape: the search, the plan and its advice share it

            def run(s, count=True, components=True):
                if s.weights not in models:
                    shown.say(f"building the model ({s.weights or 'fp32'} weights, fake)")
                    models[s.weights] = build(cfg, kind, torch_dtype(s.weights) if s.weights else None)
                    _set_attention(models[s.weights], attention, notes)
                key = (s.precision, s.weights, s.micro_batch, s.seq_len, s.checkpointing, s.optimizer, s.attention)
                step = steps.get(key)
                if step is None:
                    step = fake_step(models[s.weights], kind, cfg, s, s.micro_batch, dev["round_to"], count,
                                     components, shown.say)
                else:   # what this use reads that the first did not
                    need = tuple(p for p in ("components",) * components + ("ops",) * count if p not in step)
                    if need:
                        completed(step, s, need)
                steps[key] = step
                return step

            def completed(st, s, parts):   # what a step faked without it lacks, read only where needed
                return complete(models[s.weights], kind, cfg, s, s.micro_batch, st, parts, shown.say)

            def total_of(step, s):
                return _placed(step, s, layout, dev)["total"]

            def trial(s):   # the search's steps: single-GPU totals read the peak alone
                shown.at(f"largest micro-batch: a fake step at micro_batch={s.micro_batch}")
                return run(s, count=False, components=layout is not None)

            tokens, unit = micro_batch, "samples"   # until the batch says
            try:
                tokens, unit = amount(cfg, kind, micro_batch, seq_len)
                shown.at("the plan's fake step")
                step = run(setting)
            except Exception as e:   # what a fake tensor cannot take is planned analytically, and said
                reason = e.reason if isinstance(e, FakeStepError) else fake_failure(e)
                if reason is None:
                    raise
                planned = analytic_plan(models.get(weights), cfg, kind, setting, dev, layout,
                                        reason, model_name(cfg, kind), tokens, unit)
                planned.notes[1:1] = (seq_note if unit == "tokens" else []) + list(dict.fromkeys(notes))
                return planned
            found = search_micro_batch(setting, trial, total_of, dev["memory"], search_limit) if search else None
            tried, advice, pruned = [], [], []
            if total_of(step, setting) > dev["memory"]:   # combinations of changes, ranked by expected tokens/s
                sharded = dict(dev, fixed=device_figures(dev["name"], setting.precision, world_size=2)["fixed"])

                def place(st, s):
                    if s.parallel:
                        completed(st, s, ("components",))
                    return _placed(st, s, _layout(s.parallel, s.world_size, s.nodes), sharded if s.parallel else dev)

                combos, tried_at = math.prod(len(d) for d in dimensions(setting)) - 1, []

                def fake(s):
                    tried_at.append(s)
                    shown.at(f"advice: combination {len(tried_at)} of at most {combos} ({_changes(setting, s)})",
                             len(tried_at) / combos)
                    return run(s, count=False, components=False)

                def count(s, st):
                    shown.at(f"advice: the FLOPs of {_changes(setting, s)}, which fits")
                    return completed(st, s, ("ops",))

                def expect(st, s, placed):
                    lay = _layout(s.parallel, s.world_size, s.nodes)
                    return expected_of(st, s, dev, amount(cfg, kind, s.micro_batch, seq_len)[0], models[s.weights],
                                       placed["comm"], lay, len(st["units"]), kernel=attention_kernel)[0]

                tried, advice, pruned = search_changes(
                    setting, step, dev["memory"], fake=fake, place=place, expect=expect, count=count,
                    sharding=layout is None and dev["name"] != "cpu")
            tries = sorted((o.as_alternative() for o in tried if len(o.changes) == 1), key=lambda a: a[1])
        placed = _placed(step, setting, layout, dev)
        if getattr(gpu, "seen", False):
            notes.append(GpuKernels.NOTE)
        notes += gpu.notes() if dev["name"] != "cpu" else []
        notes = ((seq_note if unit == "tokens" else []) + list(dict.fromkeys(notes)) + step["notes"]
                 + step["count_notes"] + dev["notes"] + placed["notes"] + pruned_note(pruned))   # samples: no seq_len
        if found is not None and found >= search_limit:
            notes.append(f"the micro-batch search stopped at search_limit={search_limit}: a larger one may fit too")
        if kind == "hf" and getattr(cfg, "is_encoder_decoder", False):
            notes.insert(0, "an encoder-decoder (AutoModelForSeq2SeqLM), trained on labels of seq_len tokens as the "
                            "inputs: tokens count the encoder's micro_batch x seq_len")
        if asked is not None and asked.compile:
            notes.append(COMPILE_NOT_MODELLED)
        notes.append("peak: every tensor the step's ops make, alive until freed; scratch a kernel allocates for "
                     "itself is not seen (within 2% of torch.profiler's reading of a real CPU step)")
        if dev["name"] != "cpu":
            notes.append("a CPU-device fake step placed on the GPU's figures: CUDA autocast's op lists and what the "
                         "caching allocator reserves beyond its 512-byte blocks are not modelled")
        shown.at("the expected step" + (": this CPU's figures (measured once, then cached)" if dev["name"] == "cpu"
                                        else ""))
        expected, enotes = expected_of(step, setting, dev, tokens, models[setting.weights], placed["comm"], layout,
                                       len(step["units"]), kernel=attention_kernel)
        notes += enotes
        # no peak for the dtype: no bound (a note of kind device.no_peak says so), not the bytes' time alone
        peak = dev["peak"]
        compute = step["bound_s"](peak, dev["bandwidth"]) if peak else math.nan
        bound_by = step["top"](peak, dev["bandwidth"]) if peak else []
        if dev["name"] != "cpu" and peak:   # a GPU's kernels are not the fake step's CPU ops: their categories
            bound_by = by_category(step["top"](peak, dev["bandwidth"], None))[:6]
        if placed["comm_s"] > compute:
            bound_by = [("communication", placed["comm_s"])] + bound_by
        return Plan(model=model_name(cfg, kind), device=dev["name"], device_memory_bytes=dev["memory"],
                    setting=setting, components=placed["components"], fixed=dev["fixed"],
                    tokens=tokens, unit=unit, executed_flops=step["executed"], model_flops=step["model"],
                    bound_step_s=max(compute, placed["comm_s"]), peak_tflops=dev["peak"],
                    bandwidth_tbs=dev["bandwidth"],
                    bound_by=bound_by, notes=notes, max_micro_batch=found, alternatives=tries,
                    peak_bytes=placed["peak"], peak_at=placed["peak_at"], phase_peaks=step["phase_peaks"],
                    timeline=_thin(step["timeline"]), parallel=layout, compute_bound_s=compute,
                    comm_s=placed["comm_s"], comm=placed["comm"], expected=expected, advice=advice,
                    not_tried=pruned)


def _layout(parallel, world_size, nodes) -> dict | None:
    """The sharding as a dict (kind, world_size, nodes, shard), checked; None for one device."""
    world_size, nodes = validate.count("world_size", world_size), validate.count("nodes", nodes)
    if parallel is None:
        if (world_size, nodes) != (1, 1):
            raise ValueError(f"world_size={world_size} and nodes={nodes} describe several GPUs: give parallel="
                             "'ddp', 'fsdp', 'fsdp_grad_op' or 'hsdp' with them")
        return None
    problems = layout_problems(parallel, 1, nodes)
    if not problems and world_size % nodes:
        problems.append(f"world_size must be a whole multiple of nodes={nodes}, got {world_size}")
    if problems:
        raise ValueError("; ".join(problems))
    return dict(kind=parallel, world_size=world_size, nodes=nodes, shard=shard_count(parallel, world_size, nodes))


def _placed(step, setting, layout, dev) -> dict:
    """Rank 0's components, peak (+ fixed costs = total) and the collectives' time."""
    half = setting.compute in HALF
    gathered = 2 if half else 4   # MixedPrecisionPolicy's param dtype
    # gradients are reduced in the parameters' dtype: fp32 over fp32 weights (autocast: tunekit's
    # ranks ask for reduce_dtype=float32), bf16/fp16 over half weights
    grads = registry.dtype(setting.grads).bytes
    if layout is None:
        comps = dict(step["components"]) if "components" in step else None   # the advice's totals: the peak alone
        peak, peak_at, comm_s, comm, notes = step["peak"], step["peak_at"], 0.0, {}, []
    else:
        kind, world, nodes = layout["kind"], layout["world_size"], layout["nodes"]
        units = step["units"] if kind != "ddp" else [[s for u in step["units"] for s in u]]
        # each phase's peak on rank 0: the highest is the rank's
        casts = step.get("casts_at", {})
        ranked = {ph: rank_peak(b, step["components"], g, units, kind, world, nodes, gathered, step["state_scalars"],
                                grads, phase=ph, casts_at_peak=casts.get(ph)) + (at,)
                  for ph, (b, at, g) in step["phase_detail"].items()}
        comps, peak, peak_at = max(ranked.values(), key=lambda v: v[1])
        net = node_net(dev["name"])
        comm_s, comm = comm_seconds(kind, units, world, nodes, gathered, dev["link"], grad_bytes=grads, net=net)
        per_node = world // nodes
        across = inter_node_gbs(net, dev["link"], per_node, per_node if kind == "hsdp" else 1)
        held = ("every rank holds the whole model, and DDP's Reducer a copy of its gradients in buckets"
                if kind == "ddp" else f"FSDP2 gives it ceil(rows / {layout['shard']}) of each parameter")
        notes = [f"{kind}: rank 0's memory ({held}); collectives as ring algorithms at the links' bandwidth"
                 + (f"; across nodes {across:g} GB/s bus bandwidth, a node's {net[0]} NIC(s) at {net[1]:g} GB/s "
                    f"each ({net[2]})" if nodes > 1 else "")]
        if dev["link"] is None:
            notes.append(f"no link bandwidth listed for {dev['name']}: no communication time")
    return dict(components=comps, peak=peak, peak_at=peak_at, total=peak + sum(b for b, _ in dev["fixed"].values()),
                comm_s=comm_s if not is_missing(comm_s) else 0.0, comm=comm, notes=notes)


def _changes(plan_setting, s) -> str:
    """What a combination the advice tries changes, in ``plan``'s keywords."""
    return ", ".join(f"{f}={getattr(s, f)!r}" for f in ("checkpointing", "weights", "optimizer", "micro_batch",
                                                       "grad_accum") if getattr(s, f) != getattr(plan_setting, f))


def _set_attention(model, attention, notes) -> None:
    if attention is None:
        return
    from tunekit.core.registry import attention as resolve
    from tunekit.models.adapters import adapt

    name = resolve(attention).name
    adapter = model.adapter if isinstance(model, Stepped) else adapt(model)
    if name == "flash":   # flash-attn needs CUDA: CPU's fused SDPA saves the same (output, logsumexp)
        notes.append("attention='flash' planned as torch's fused SDPA, which saves the same tensors for backward")
        name = "sdpa"
    if name not in adapter.attentions:
        raise ValueError(f"this model cannot switch its attention to {attention!r}: it offers {adapter.attentions}")
    adapter.set_attention(name)


def _thin(samples, most: int = 600) -> list:
    """At most ``most`` (phase, bytes) points of the timeline, keeping each stretch's highest."""
    if len(samples) <= most:
        return list(samples)
    size = -(-len(samples) // most)
    return [max(samples[i:i + size], key=lambda s: s[1]) for i in range(0, len(samples), size)]
