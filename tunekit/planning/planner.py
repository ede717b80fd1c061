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
from dataclasses import fields, replace

from torch._subclasses.fake_tensor import FakeTensorMode

from tunekit.core import registry, validate
from tunekit.core.breakdown import by_category
from tunekit.core.efficiency import ATTENTION_KERNELS
from tunekit.core.gpus import DEFAULT_DEVICE  # a Setting whose device is None is planned for it
from tunekit.core.refusals import user_facing
from tunekit.core.setting import (
    HALF,
    PLAN_DEFAULTS,
    SETTING_CHOICES,
    Setting,
    best_precision,
    from_keywords,
    from_words,
    step_keywords,
)
from tunekit.core.units import is_missing
from tunekit.measure.device import torch_dtype
from tunekit.planning.advice import (
    MAX_FAKED,
    changed_words,
    dimensions,
    not_searched_note,
    placements,
    pruned_note,
    search_changes,
)
from tunekit.planning.analytic import FakeStepError, analytic_plan, fake_failure, far_past_the_card
from tunekit.planning.cuda_like import GpuKernels, quiet_fake_logs
from tunekit.planning.device import compute_note, device_figures
from tunekit.planning.expect import expected_of
from tunekit.planning.fsdp_work import FSDP1_AUTOCAST, FSDP2, FSDP_VERSIONS
from tunekit.planning.module import ModuleTarget
from tunekit.planning.record import Placed, Plan, PlanDevice, thin_timeline
from tunekit.planning.shard import comm_seconds, inter_node_gbs, layout_of, node_net, rank_peak
from tunekit.planning.step import COUNTED, FakeStep, complete, fake_step, in_param_dtype, search_micro_batch
from tunekit.planning.target import amount, build, config_of, masks_as_in_eager, max_len, model_name, set_attention
from tunekit.view.progress import wait_progress

COMPILE_NOT_MODELLED = ("compile=True: the memory is an eager step's (a compiled step often saves fewer activations); "
                        "plan.expected fuses the memory-bound ops")


# plan's own defaults where the Lab's differ: one sample a micro-batch (the other step words: the
# target's, else the Setting's declaration, the precision by the device's rule, `best_precision`)
# the step words the plan knows change nothing in its step: gradients accumulate in place (grad_accum),
# the optimizer's elementwise update is outside the bound (lr), compile: a note
SAME_STEP = ("grad_accum", "lr", "compile")
# the step words the plan models, or knows change nothing in its step
PLANNED = ("precision", "weights", "micro_batch", "seq_len", "checkpointing", "optimizer", "attention", "parallel",
           "world_size", "nodes", "device", "model", *SAME_STEP)


@user_facing   # a refusal: the user's line and the message
@validate.keywords_checked(SETTING_CHOICES)
@step_keywords
def plan(target, device: str = DEFAULT_DEVICE, *, search: bool = False, search_limit: int = 4096,
         batch_fn=None, loss_fn=None, blocks=None, setting: Setting | None = None,
         attention_kernel: str | None = None, fsdp: str = FSDP2, verbose: bool = True, **step) -> Plan:
    """Plan one training step of ``target`` on ``device`` without running it.

    ``target``: a ``tunekit.GPTConfig``, a transformers config, an ``nn.Module`` (built on the
    meta device, or a real one: a fake twin is stepped, the module is only read), or a
    ``tunekit.Lab`` (its model, batches, loss and the Setting its next run would use). A module
    tunekit has no batch for needs ``batch_fn(micro_batch, seq_len) -> (x, y)``, called inside the
    fake mode; ``loss_fn(model, x, y) -> loss`` (default: the model's own loss, else its output
    summed) and ``blocks`` (what checkpointing recomputes) as the Lab takes them. A step a fake
    tensor cannot take (a value read, a value-dependent shape: Adafactor, a token-dispatching
    router) is planned by ``estimate_memory`` instead, and the plan says so (``method="analytic"``).
    ``device``: a name of the spec table ("H100 SXM", "A100", "MI300X", ...) or "cpu" (this
    machine's RAM and calibrated peak).

    The step: ``setting`` (a ``tunekit.Setting``, complete; its ``device``, when set, instead of
    ``device``) or the Setting's keywords (``precision``, ``weights``, ``micro_batch``, ``seq_len``,
    ``checkpointing``, ``optimizer``, ``attention``, ``parallel``, ``world_size``, ``nodes``, ...:
    `tunekit.Setting` says what each means), the rest the target's (a Lab's next run, a module's
    weights and checkpointing), else ``micro_batch=1``, the model's longest ``seq_len`` and the best
    precision the device trains in (`core.setting.best_precision`: bf16 on an H100, fp16 on a T4,
    fp32 on a CPU). ``parallel`` over ``world_size`` GPUs on ``nodes`` nodes gives rank 0's memory
    and the collectives' time on the device's links (``micro_batch`` per rank); ``grad_accum``,
    ``lr`` and ``compile`` are kept in ``plan.setting`` but not planned (compile: a note).
    ``search=True`` also finds the largest micro-batch that fits (fake steps, doubling then
    bisection up to ``search_limit``).

    ``attention_kernel``: which fused kernel the expectation takes attention at ("flash":
    FlashAttention-2, torch's SDPA flash, the default; "fa3"; "triton": the 2023 FlashAttention-1-era
    Triton kernel of llm-foundry's attn_impl="triton"); the memory plan is the same. ``fsdp``: which FSDP
    a sharded step runs, for its own copies, casts and divides each micro-step ("fsdp2", tunekit's;
    "fsdp1", "fsdp1_autocast": planning.fsdp_work.FSDP_VERSIONS says what each does, from torch's code).

    ``plan.expected`` (core.expected.Expected): what a well-written run of this step reaches on the
    device, op by op over the same fake step (``.step_s``, ``.tokens_per_s`` per GPU, ``.mfu``,
    ``.by_op``); None, with a note saying which figure is missing, for a device tunekit lacks one for.

    ``verbose`` (default): a plan that takes over 2 s says what it is doing (the fake step, its pass
    and phase, the advice's combination k of n) on one line that updates (tunekit.view.progress:
    stderr in a terminal, a display in a notebook), then how long it took; ``verbose=False`` nothing.
    Ctrl-C stops it: the KeyboardInterrupt reaches you, with nothing of yours changed.

    Example: ``tunekit.plan(LlamaConfig(...), "H100 SXM", weights="bf16", micro_batch=1, seq_len=8192)``.

    long: its docstring says what every keyword means; the body is 43 lines."""
    cfg, kind, brought = config_of(target, batch_fn, loss_fn, blocks)
    s, seq_note = planned_setting(setting, device, step, brought, cfg, kind)
    _check_options(search, search_limit, verbose, attention_kernel, fsdp)
    layout = layout_of(s)
    dev = PlanDevice(**device_figures(s.device, s.compute, layout["world_size"] if layout else 1))
    dev.notes[:0] = compute_note(s)
    s = s.replace(device=dev.name)
    if not search and (far := far_past_the_card(cfg, kind, s, dev, layout, model_name(cfg, kind))) is not None:
        return far
    with wait_progress("tunekit.plan", verbose) as shown:
        shown.at("starting torch's fake-tensor mode (its first use in a process imports torch._dynamo)")
        steps = _Steps(cfg, kind, s, dev, layout, shown, fsdp)
        with steps.mode():
            tokens, unit = s.micro_batch, "samples"   # until the batch says
            try:
                tokens, unit = amount(cfg, kind, s.micro_batch, s.seq_len)
                shown.at("the plan's fake step")
                step = steps.run(s)
            except Exception as e:   # what a fake tensor cannot take is planned analytically, and said
                reason = e.reason if isinstance(e, FakeStepError) else fake_failure(e)
                if reason is None:
                    raise
                planned = analytic_plan(steps.models.get(s.weights), cfg, kind, s, dev, layout,
                                        reason, model_name(cfg, kind), tokens, unit)
                planned.notes[1:1] = (seq_note if unit == "tokens" else []) + list(dict.fromkeys(steps.notes))
                return planned
            found = search_micro_batch(s, steps.trial, steps.total, dev.memory, search_limit) if search else None
            tried, advice, pruned = (_advise(steps, s, step, attention_kernel) if steps.total(step, s) > dev.memory
                                     else ([], [], []))
        placed = _placed(step, s, layout, dev)
        notes = _notes(steps, s, step, placed, cfg, kind, unit, seq_note, found, search_limit, pruned)
        shown.at("the expected step" + (": this CPU's figures (measured once, then cached)" if dev.name == "cpu"
                                        else ""))
        expected, enotes = expected_of(step, s, dev, tokens, steps.models[s.weights], placed.comm, layout,
                                       len(step.units), kernel=attention_kernel, say=shown.say, fsdp=fsdp)
        compute, bound_by = _bound(step, dev, placed)
        tries = sorted((o.as_alternative() for o in tried if len(o.changes) == 1), key=lambda a: a[1])
        return Plan(model=model_name(cfg, kind), device=dev.name, device_memory_bytes=dev.memory,
                    setting=s, components=placed.components, fixed=dev.fixed,
                    tokens=tokens, unit=unit, executed_flops=step.executed, model_flops=step.model_flops,
                    bound_step_s=max(compute, placed.comm_s), peak_tflops=dev.peak, bandwidth_tbs=dev.bandwidth,
                    bound_by=bound_by, notes=notes + enotes + unmodelled(s), max_micro_batch=found, alternatives=tries,
                    peak_bytes=placed.peak, peak_at=placed.peak_at, phase_peaks=step.phase_peaks,
                    timeline=thin_timeline(step.timeline), parallel=layout, compute_bound_s=compute,
                    comm_s=placed.comm_s, comm=placed.comm, expected=expected, advice=advice, not_tried=pruned)


def planned_setting(setting, device, step: dict, brought: dict, cfg, kind) -> tuple[Setting, list]:
    """(the Setting planned, a note on its seq_len): plan's edge, where its keywords become one
    Setting. ``setting`` as given (complete: what it leaves None, the model's own, is the
    target's), or ``step``'s keywords over the target's (``brought``), plan's defaults and the
    device's precision; its device ``device`` unless the Setting names one. Checked once, by the
    Setting; then what the model allows (its positions, its blocks)."""
    given = {k: v for k, v in step.items() if v is not None and not (k in ("world_size", "nodes") and v == 1)}
    asked = from_keywords(setting, "plan", **given)
    if asked is not None:
        if asked.device is not None and device not in (DEFAULT_DEVICE, asked.device):
            raise ValueError(f"plan: the device is {device!r} and the Setting's {asked.device!r}: give one "
                             "(setting.replace(device=...) changes it)")
        own = {k: v for k, v in brought.items() if v is not None and k != "device" and getattr(asked, k, 0) is None}
        s = asked.replace(device=asked.device or validate.text("device", device), **own)
    else:
        device = validate.text("device", device)
        words = {**PLAN_DEFAULTS, "precision": best_precision(device), **brought, **given, "device": device}
        s = from_words(**{k: v for k, v in words.items() if v is not None})
    limit = max_len(cfg, kind)   # None: a module without a position limit
    note = []
    if s.seq_len is None:
        if limit is None:
            note = ["seq_len not given: batch_fn was called with seq_len=1, as a Lab on your own batch_fn calls it"]
        s = s.replace(seq_len=limit or 1)
    if s.checkpointing and not getattr(cfg, "can_checkpoint", True):
        raise ValueError("checkpointing needs the blocks to recompute: tunekit.plan(..., blocks='layers'), an "
                         "attribute path of the model or a list of its modules")
    if limit is not None and s.seq_len > limit:
        raise ValueError(f"seq_len={s.seq_len} is longer than the model's {limit} positions")
    return s, note


def _check_options(search, search_limit, verbose, attention_kernel, fsdp) -> None:
    """plan's options that are not the step's."""
    validate.choice("fsdp", fsdp, tuple(FSDP_VERSIONS))
    if attention_kernel is not None:
        validate.choice("attention_kernel", attention_kernel, tuple(ATTENTION_KERNELS))
    validate.flag("search", search)
    validate.flag("verbose", verbose)
    validate.count("search_limit", search_limit)


class _Steps:
    """The plan's fake steps inside one fake mode: a model per weights' dtype and a step per shape, shared
    by the plan, its micro-batch search and its advice (a step lacking a pass gets it where it is read)."""

    def __init__(self, cfg, kind, setting: Setting, dev: PlanDevice, layout, shown, fsdp: str = FSDP2):
        self.cfg, self.kind, self.setting, self.dev, self.layout, self.shown = cfg, kind, setting, dev, layout, shown
        self.models, self.steps, self.notes, self.fsdp = {}, {}, [], fsdp
        self.gpu = GpuKernels(dev.name) if dev.name != "cpu" else contextlib.nullcontext()

    @contextlib.contextmanager
    def mode(self):
        """The fake mode (a module's batch_fn may hand back real tensors and a module real
        constants: taken as fakes), transformers' notices silenced, a GPU's kernels named."""
        with FakeTensorMode(allow_non_fake_inputs=isinstance(self.cfg, ModuleTarget)), warnings.catch_warnings(), \
                masks_as_in_eager(self.kind), quiet_fake_logs(), self.gpu:
            warnings.simplefilter("ignore")   # transformers' init notices; nothing here runs for real
            yield

    def run(self, s: Setting, count: bool = True, components: bool = True) -> FakeStep:
        """The fake step of ``s`` (made once per shape), with the passes asked for."""
        if s.weights not in self.models:
            self.shown.say(f"building the model ({s.weights or 'fp32'} weights, fake)")
            self.models[s.weights] = build(self.cfg, self.kind, torch_dtype(s.weights) if s.weights else None)
            set_attention(self.models[s.weights], self.setting.attention, self.notes)
        half = self.on_half(s)   # on FSDP's half param dtype: stepped and counted on the half model only
        key = (s.precision, s.weights, s.micro_batch, s.seq_len, s.checkpointing, s.optimizer, s.attention, half)
        step = self.steps.get(key)
        if step is None:
            step = fake_step(self.models[s.weights], self.kind, self.cfg, s, s.micro_batch, self.dev.round_to,
                             count and not half, components, self.shown.say, held_only=half)
        else:   # what this use reads that the first did not
            self.complete(step, s, ("components",) * components + ("ops",) * (count and not half))
        self.steps[key] = step
        return self.on_param_dtype(step, s, count)

    def on_half(self, s: Setting) -> bool:   # sharded over fp32 weights under autocast, on FSDP's half param dtype
        return s.parallel not in (None, "ddp") and s.autocast and self.fsdp != FSDP1_AUTOCAST

    def on_param_dtype(self, step: FakeStep, s: Setting, count: bool | None = None) -> FakeStep:
        """``step`` as ``s`` places it: `in_param_dtype` of the half model's step (counted where ``count``, None:
        where ``step`` is) if `on_half`, else ``step``. `run` applies it, the advice to a step it places sharded."""
        count = step.has("ops") if count is None else count
        return in_param_dtype(step, self.run(s.replace(weights=s.compute), count, False)) if self.on_half(s) else step

    def complete(self, step: FakeStep, s: Setting, parts) -> FakeStep:
        """``step`` with the passes of ``parts`` it lacks made. The count (FLOPs op by op) steps no
        optimizer: a step of the same shape under another optimizer lends its own; one `on_half`, the half's."""
        key = (s.precision, s.weights, s.micro_batch, s.seq_len, s.checkpointing, s.attention)
        twin = next((t for k, t in self.steps.items() if k[:5] + k[6:7] == key and t.has("ops")), None)
        if "ops" in parts and self.on_half(s) and not step.has("ops"):   # the half model's count
            twin = self.run(s.replace(weights=s.compute), count=True, components=False)
        for name in COUNTED if "ops" in parts and not step.has("ops") and twin is not None else ():
            setattr(step, name, getattr(twin, name))
        parts = tuple(p for p in parts if not step.has(p))
        if parts:
            complete(self.models[s.weights], self.kind, self.cfg, s, s.micro_batch, step, parts, self.shown.say)
        return step

    def total(self, step: FakeStep, s: Setting) -> float:
        """The step's total on the plan's device and layout (the search's test)."""
        return _placed(step, s, self.layout, self.dev).total

    def trial(self, s: Setting) -> FakeStep:
        """A step of the micro-batch search: single-GPU totals read the peak alone."""
        self.shown.at(f"largest micro-batch: a fake step at micro_batch={s.micro_batch}")
        return self.run(s, count=False, components=self.layout is not None)


def _advise(steps: _Steps, setting: Setting, step: FakeStep, kernel) -> tuple[list, list, list]:
    """For a step that does not fit: the combinations of changes tried, those that fit (ranked by
    expected tokens/s) and those not tried (`planning.advice.search_changes`)."""
    dev, shown = steps.dev, steps.shown
    sharded = replace(dev, fixed=device_figures(dev.name, setting.precision, world_size=2)["fixed"])
    combos, tried_at = min(math.prod(len(d) for d in dimensions(setting)) - 1, MAX_FAKED), []

    def as_placed(st, s):   # a plan sharded already: `_Steps.run` placed its steps; else here, as the plan of s would
        return st if setting.parallel not in (None, "ddp") else steps.on_param_dtype(st, s)

    def place(st, s):
        if s.parallel:
            steps.complete(st, s, ("components",))
        return _placed(as_placed(st, s), s, layout_of(s), sharded if s.parallel else dev)

    def fake(s):
        tried_at.append(s)
        shown.at(f"advice: combination {len(tried_at)} of at most {combos} ({changed_words(setting, s)})",
                 len(tried_at) / combos)
        return steps.run(s, count=False, components=False)

    def count(s, st):
        shown.at(f"advice: the FLOPs of {changed_words(setting, s)}, which fits")
        return steps.complete(st, s, ("ops",))

    def expect(st, s, placed):   # on FSDP's half param dtype: the half model's count (no autocast casts)
        st, tokens = as_placed(st, s), amount(steps.cfg, steps.kind, s.micro_batch, setting.seq_len)[0]
        return expected_of(st, s, dev, tokens, steps.models[s.weights], placed.comm, layout_of(s), len(st.units),
                           kernel=kernel, fsdp=steps.fsdp)[0]

    return search_changes(setting, step, dev.memory, fake=fake, place=place, expect=expect, count=count,
                          places=placements(setting, sharding=dev.name != "cpu"))


def _notes(steps: _Steps, s: Setting, step: FakeStep, placed: Placed, cfg, kind, unit, seq_note, found,
           search_limit, pruned) -> list:
    """The plan's notes, in order: the sequence, the fake step's, the count's, the device's, the
    placement's, the advice's (the expectation's and what the plan does not model follow)."""
    from tunekit.planning.target import window_notes

    gpu, dev = steps.gpu, steps.dev
    if getattr(gpu, "seen", False):
        steps.notes.append(GpuKernels.NOTE)
    steps.notes += gpu.notes() if dev.name != "cpu" else []
    notes = ((seq_note if unit == "tokens" else []) + list(dict.fromkeys(steps.notes)) + step.notes
             + step.count_notes + dev.notes + placed.notes + pruned_note(pruned)   # samples: no seq_len
             + ([not_searched_note()] if placed.total > dev.memory else [])
             + window_notes(cfg, kind, s.seq_len, s.attention))
    if found is not None and found >= search_limit:
        notes.append(f"the micro-batch search stopped at search_limit={search_limit}: a larger one may fit too")
    if kind == "hf" and getattr(cfg, "is_encoder_decoder", False):
        notes.insert(0, "an encoder-decoder (AutoModelForSeq2SeqLM), trained on labels of seq_len tokens as the "
                        "inputs: tokens count the encoder's micro_batch x seq_len")
    notes.append("peak: every tensor the step's ops make, alive until freed; scratch a kernel allocates for "
                 "itself is not seen (within 2% of torch.profiler's reading of a real CPU step)")
    if dev.name != "cpu":
        notes.append("a CPU-device fake step placed on the GPU's figures: CUDA autocast's op lists and what the "
                     "caching allocator reserves beyond its 512-byte blocks are not modelled")
    return notes


def unmodelled(s: Setting) -> list:
    """Notes on the step words of ``s`` set away from their declared default that the plan does
    not model (a toggle declared without a rule here); compile says what the plan does instead."""
    notes = [COMPILE_NOT_MODELLED] if s.compile else []
    for f in fields(Setting):
        if f.name not in PLANNED and getattr(s, f.name) != f.default:
            notes.append(f"{f.name}={getattr(s, f.name)!r} is not modelled: the plan is of a step without it")
    return notes


def _bound(step: FakeStep, dev: PlanDevice, placed: Placed) -> tuple[float, list]:
    """(the roofline of the FLOP-doing ops, the ops that take longest): no peak for the dtype, no
    bound (a note of kind device.no_peak says so), not the bytes' time alone; a GPU's kernels are
    not the fake step's CPU ops: their categories; the collectives first when they take longer."""
    peak = dev.peak
    compute = step.bound_s(peak, dev.bandwidth) if peak else math.nan
    bound_by = step.top(peak, dev.bandwidth) if peak else []
    if dev.name != "cpu" and peak:
        bound_by = by_category(step.top(peak, dev.bandwidth, None))[:6]
    if placed.comm_s > compute:
        bound_by = [("communication", placed.comm_s)] + bound_by
    return compute, bound_by


def _placed(step: FakeStep, setting, layout, dev: PlanDevice) -> Placed:
    """Rank 0's components, peak (+ fixed costs = total) and the collectives' time."""
    half = setting.compute in HALF
    gathered = 2 if half else 4   # MixedPrecisionPolicy's param dtype
    # gradients are reduced in the parameters' dtype: fp32 over fp32 weights (autocast: tunekit's
    # ranks ask for reduce_dtype=float32), bf16/fp16 over half weights
    grads = registry.dtype(setting.grads).bytes
    if layout is None:
        comps = dict(step.components) if step.has("components") else None   # the advice's totals: the peak alone
        peak, peak_at, comm_s, comm, notes = step.peak, step.peak_at, 0.0, {}, []
    else:
        kind, world, nodes = layout["kind"], layout["world_size"], layout["nodes"]
        units = step.units if kind != "ddp" else [[s for u in step.units for s in u]]
        # each phase's peak on rank 0: the highest is the rank's
        ranked = {ph: rank_peak(b, step.components, g, units, kind, world, nodes, gathered, step.state_scalars,
                                grads, phase=ph, casts_at_peak=step.casts_at.get(ph)) + (at,)
                  for ph, (b, at, g) in step.phase_detail.items()}
        comps, peak, peak_at = max(ranked.values(), key=lambda v: v[1])
        net = node_net(dev.name)
        comm_s, comm = comm_seconds(kind, units, world, nodes, gathered, dev.link, grad_bytes=grads, net=net)
        per_node = world // nodes
        across = inter_node_gbs(net, dev.link, per_node, per_node if kind == "hsdp" else 1)
        held = ("every rank holds the whole model, and DDP's Reducer a copy of its gradients in buckets"
                if kind == "ddp" else f"FSDP2 gives it ceil(rows / {layout['shard']}) of each parameter")
        notes = [f"{kind}: rank 0's memory ({held}); collectives as ring algorithms at the links' bandwidth"
                 + (f"; across nodes {across:g} GB/s bus bandwidth, a node's {net[0]} NIC(s) at {net[1]:g} GB/s "
                    f"each ({net[2]})" if nodes > 1 else "")]
        if dev.link is None:
            notes.append(f"no link bandwidth listed for {dev.name}: no communication time")
    return Placed(components=comps, peak=peak, peak_at=peak_at, total=peak + sum(b for b, _ in dev.fixed.values()),
                  comm_s=comm_s if not is_missing(comm_s) else 0.0, comm=comm, notes=notes)
