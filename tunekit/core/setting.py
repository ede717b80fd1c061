"""One training step, described completely: `Setting`. Pure: no torch.

    >>> s = Setting(precision="bf16", micro_batch=4, seq_len=1024, checkpointing=True)
    >>> s.autocast, s.compute, s.memory_layout        # fp32 weights under bf16 autocast
    ('bf16', 'bf16', 'amp')
    >>> Setting(weights="bf16").memory_layout          # pure bf16: weights, gradients, states
    'bf16'

Every entry point takes one (``lab.run(setting=s)``, ``tunekit.plan(cfg, setting=s)``,
``tunekit.estimate_memory(cfg, setting=s)``, ``tunekit.measure_memory(model, batch, setting=s)``)
and its keywords remain (each API's own spelling of a step, with its own defaults; the precision,
where a step is described by its device, is one rule: `best_precision`); a word means the same
wherever it is written:

- ``precision``: the training precision, one of `registry.PRECISIONS`. ``"bf16"``/``"fp16"`` run
  the forward under ``torch.autocast`` to that dtype over the weights as they are; ``"tf32"``
  keeps fp32 storage with tf32 matmuls on CUDA; ``"fp32"`` casts nothing.
- ``weights``: the parameters' dtype (None: the model's own; a model built from a config is fp32).
  Half weights train in their dtype: gradients and optimizer states follow, and autocast to the
  same dtype casts nothing (``Setting(precision="bf16", weights="bf16")`` is pure bf16).

`Toggles` (the base class) is the part of a Setting that ``lab.run`` changes on a live model; a
Setting adds what the Lab cannot change between runs (the weights' dtype, the parallel layout,
the device, the model).
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field, fields

from tunekit.core import registry, validate
from tunekit.core.comm import PARALLEL
from tunekit.core.registry import BF16, FP16, FP32, TF32

PRECISIONS = tuple(registry.PRECISIONS)
OPTIMIZERS = registry.LAB_OPTIMIZERS
ATTENTIONS = tuple(registry.ATTENTIONS)
HALF = tuple(d.name for d in registry.DTYPES.values() if d.bytes == 2)   # bf16, fp16: what half weights may be


# what a plan takes where a word is not given (beside the device's precision, `best_precision`): one
# sequence a step, the question a plan answers first (tunekit.plan and `tunekit plan` alike)
PLAN_DEFAULTS = {"micro_batch": 1}


def best_precision(device: str | None, bf16: bool | None = None) -> str:
    """The best precision ``device`` trains in: the one rule for the default precision where a
    step is described by a device name without a Lab (``tunekit.plan``, ``tunekit plan``,
    ``tunekit run``).

    - a GPU of the spec table (`core.specs`): bf16 where the table lists its dense bf16 peak (Ampere
      and newer, MI200/MI300); else the half precision it trains in instead (``specs.runs_instead``:
      fp16 with a GradScaler on a V100 or T4); else fp32;
    - ``"cuda"`` (this machine's GPU, by its type): bf16 when ``bf16`` (``torch.cuda.is_bf16_supported()``),
      else fp16 with a GradScaler;
    - ``"cpu"`` (or None): fp32, unless ``bf16`` says this CPU has fast bf16 (AMX / AVX512-BF16);
      tunekit does not detect that, and bf16 elsewhere on a CPU runs slower than fp32.

    A Lab's runs start from fp32 whatever the device (its baseline, the step every toggle is
    compared against: ``Toggles.precision``'s declared default).

    >>> best_precision("H100 SXM"), best_precision("T4"), best_precision("cpu")
    ('bf16', 'fp16', 'fp32')
    """
    from tunekit.core.specs import device_type, find_spec, runs_instead, spec_peak

    kind = device_type(device or "cpu")
    if kind == "cuda":
        return BF16 if bf16 is not False else FP16
    if kind is not None:
        return BF16 if bf16 else FP32

    spec = find_spec(device)
    if spec is None:
        return FP32
    if spec_peak(spec.name, BF16)[0] is not None:
        return BF16
    instead = runs_instead(spec, BF16)
    return instead[0] if instead else FP32


def toggle(default, help: str, choices: tuple | None = None, label: str | None = None,
           device_default=None, tune: bool = False):
    """A field of `Toggles` with what the UIs show of it: ``help`` (the CLI option's, the
    dashboard control's tooltip), ``choices`` (a dropdown, the CLI's choices, the values autotune
    tries), ``label`` (the dashboard's; default: the name with spaces). ``device_default``: a rule
    ``(device name, bf16) -> value`` giving the default where a step is described by its device
    (`best_precision`; the CLIs show it); ``tune``: autotune tries the toggle's values in a stage
    of its own (`core.toggles.search_stages`) when no stage of ``SEARCH`` names it."""
    return field(default=default, metadata={"help": help, "choices": choices, "label": label,
                                            "device_default": device_default, "tune": tune})


@dataclass(frozen=True)
class Toggles:
    """Everything ``lab.run`` can change between runs. ``None`` means "the model's current".

    The declaration the dashboard controls, the ``tunekit run`` options and autotune's stages
    are built from (`declared`, `SEARCH`): a new toggle is a field here (its rule in `problems`,
    a row in `SEARCH` when autotune should try it) and its effect in the engine's step.

    Example: ``Toggles(precision="bf16", micro_batch=16).replace(checkpointing=True)``."""

    precision: str = toggle(FP32, "training precision", PRECISIONS, device_default=best_precision)
    checkpointing: bool = toggle(False, "recompute each block in backward")
    micro_batch: int = toggle(8, "samples per micro-step (per rank)")
    grad_accum: int = toggle(1, "micro-steps per optimizer step")
    seq_len: int | None = toggle(None, "tokens per sample; None: the model's position limit")
    optimizer: str = toggle("adamw", "optimizer", OPTIMIZERS)
    attention: str | None = toggle(None, "attention kernel; None: the model's own", ATTENTIONS)
    compile: bool = toggle(False, "torch.compile the model", label="torch.compile")
    lr: float = toggle(1e-3, "learning rate")

    def replace(self, **changes) -> "Toggles":
        names = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(changes) - set(names))
        if unknown:
            hints = [h for h in (validate.meant(k, changes[k], names, choices_of(type(self))) for k in unknown) if h]
            raise TypeError(f"unknown toggle(s) {unknown}"
                            + (f": {'; '.join(hints)}" if hints else f"; valid: {names}"))
        return dataclasses.replace(self, **changes)

    def asdict(self) -> dict:
        return dataclasses.asdict(self)

    # --- what the words mean, derived once (a Setting adds the weights' dtype) ----------------

    @property
    def half_weights(self) -> str | None:
        """``"bf16"``/``"fp16"`` when the parameters are kept in that dtype, else None (the Lab's
        toggles leave the weights as the model has them)."""
        return None

    @property
    def autocast(self) -> str | None:
        """The dtype name the forward is autocast to, or None: fp32/tf32 cast nothing, and half
        weights train in their own dtype (autocast to it would cast nothing)."""
        return None if self.half_weights else registry.PRECISIONS[self.precision].autocast_dtype

    @property
    def compute(self) -> str:
        """The dtype the matmuls run in (tf32 is fp32 off CUDA: see `compute_on`)."""
        return self.half_weights or registry.PRECISIONS[self.precision].compute

    def compute_on(self, device_type: str) -> str:
        """The matmuls' dtype on a device type: tf32 exists only on CUDA."""
        c = self.compute
        return FP32 if c == TF32 and device_type != "cuda" else c

    @property
    def grads(self) -> str:
        """The gradients' dtype: the parameters' (fp32 under autocast)."""
        return self.half_weights or FP32

    @property
    def grad_scaler(self) -> bool:
        """fp16 under autocast needs a GradScaler."""
        return self.autocast is not None and registry.PRECISIONS[self.precision].grad_scaler

    @property
    def memory_layout(self) -> str:
        """The key of `registry.MEMORY_LAYOUTS` this step keeps its bytes in."""
        return self.half_weights or registry.PRECISIONS[self.precision].memory_layout

    @property
    def toggles(self) -> "Toggles":
        """The part a Lab run changes, as plain `Toggles` (what a RunResult records)."""
        if type(self) is Toggles:
            return self
        return Toggles(**{f.name: getattr(self, f.name) for f in fields(Toggles)})


# why a value a step word refuses would be wrong, said after the refusal (one wording per refusal)
WHY = {"micro_batch": "a step needs at least one sample",
       "grad_accum": "a step needs at least one sample per micro-step",
       "lr": "0 trains nothing, and an infinite or NaN learning rate turns every weight into NaN",
       "precision": "the training precision; weights= names the parameters' dtype"}


def word_problems(t: Toggles) -> tuple[list[str], dict]:
    """(a sentence per toggle of ``t`` holding what it cannot, with the value probably meant; its values in
    canonical form): the one place each toggle's rule is worded (a Setting raises them, `core.toggles.problems`
    lists them); a numpy int becomes an int, "adam" "adamw", "eager" attention "math". Machines, models: not here.

    >>> word_problems(Toggles(micro_batch=0))[0]
    ['micro_batch must be a whole number >= 1, got 0: a step needs at least one sample']
    """
    errors, fixed = [], {}
    checks = [(n, validate.whole) for n in ("micro_batch", "grad_accum", "world_size", "nodes") if hasattr(t, n)]
    checks += [("seq_len", validate.whole)] if t.seq_len is not None else []
    checks += [("checkpointing", validate.flag), ("compile", validate.flag), ("lr", validate.real)]
    for name, check in checks:
        try:
            fixed[name] = check(name, getattr(t, name))
        except ValueError as e:
            errors.append(f"{e}: {WHY[name]}" if name in WHY else str(e))
    if t.precision not in PRECISIONS:
        near = validate.did_you_mean(registry.precision_meant(t.precision))
        errors.append(f"precision must be one of {PRECISIONS}, got {t.precision!r} ({WHY['precision']}){near}")
    for name, resolve in (("optimizer", registry.optimizer), ("attention", registry.attention)):
        value = getattr(t, name)
        if value is not None:
            try:
                fixed[name] = resolve(value).name
            except (ValueError, TypeError, AttributeError) as e:
                errors.append(str(e))
    return errors, fixed


REFUSED = "tunekit.Setting: "   # how a Setting's refusal starts


def _more(default, help: str, choices: tuple | None = None):
    """A field a Setting adds to the toggles (not a dashboard control)."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class Setting(Toggles):
    """A training step, described completely; every API takes it (``setting=``) and means the
    same by each field:

    - ``precision``: the training precision (fp32 | tf32 | bf16 | fp16); bf16/fp16 run the
      forward under ``torch.autocast`` over the weights as they are (fp16 with a GradScaler).
    - ``weights``: the parameters' dtype (None: the model's own, fp32 from a config); bf16/fp16
      weights train in their dtype, gradients and optimizer states too (pure half training).
    - ``micro_batch`` (per rank), ``seq_len`` (None: the model's position limit), ``grad_accum``,
      ``checkpointing``, ``optimizer`` (the registry's name: adamw, adamw_fused, sgd, ...),
      ``attention`` (sdpa | math | flash; None: the model's own), ``compile``, ``lr``.
    - ``parallel`` (ddp | fsdp | fsdp_grad_op | hsdp) over ``world_size`` ranks on ``nodes``.
    - ``device``: a spec-table GPU, "cpu" or "cuda" (None: each API's own: this machine's, and
      plan's ``device`` argument); ``model``: what the ``tunekit`` command builds (a preset or a
      config file; APIs given the model leave it None).

    Checked when made (ValueError); derived once: ``autocast``, ``compute``, ``grads``,
    ``grad_scaler``, ``memory_layout``. A Setting is complete: given to an API, its fields
    replace that API's keyword defaults.

    Example: ``tunekit.Setting(precision="bf16", micro_batch=16).replace(checkpointing=True)``."""

    weights: str | None = _more(None, "parameter dtype; None: the model's own (fp32 from a config)",
                                (None, FP32) + HALF)
    parallel: str | None = _more(None, "ddp | fsdp | fsdp_grad_op | hsdp over world_size ranks", PARALLEL)
    world_size: int = _more(1, "ranks (GPUs) in all")
    nodes: int = _more(1, "machines the ranks are spread over")
    device: str | None = _more(None, "a spec-table device, 'cpu' or 'cuda'; None: each API's own")
    model: str | None = _more(None, "what is trained: a preset name or a config file (the CLI's)")

    def __post_init__(self):
        """Checked and put in canonical form when made (a numpy int becomes an int, "adam" the
        registry's "adamw", "eager" attention "math"); a ValueError lists every problem. What a
        machine or a model allows (fp16 on a CPU, a sequence past the model's positions) is for
        the API that runs it to refuse."""
        errors, fixed = word_problems(self)
        if self.weights not in (None, FP32) + HALF:
            errors.append(f"weights must be None (the model's own), 'fp32', 'bf16' or 'fp16', got {self.weights!r}")
        if self.parallel not in (None,) + PARALLEL:
            errors.append(f"parallel must be None (one process) or one of {PARALLEL}, got {self.parallel!r}")
        elif self.parallel is None and (fixed.get("world_size", 1), fixed.get("nodes", 1)) != (1, 1):  # valid ones
            errors.append(f"world_size={self.world_size!r} and nodes={self.nodes!r} describe several ranks: say how "
                          f"they share the step with parallel= one of {PARALLEL}")
        if not errors and self.world_size % self.nodes:
            errors.append(f"world_size={self.world_size} is not a whole multiple of nodes={self.nodes}")
        for name in ("device", "model"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                errors.append(f"{name} must be a name (a str) or None, got {getattr(self, name)!r}")
        if errors:
            raise ValueError(REFUSED + "; ".join(errors))
        for name, value in fixed.items():
            object.__setattr__(self, name, value)

    @property
    def half_weights(self) -> str | None:
        return self.weights if self.weights in HALF else None

    def __getitem__(self, name: str):
        """``plan.setting["precision"]`` as before (Plan.setting was a dict): deprecated for
        ``plan.setting.precision``."""
        import warnings

        warnings.warn(f"Plan.setting is a tunekit.Setting now: write .setting.{name} instead of "
                      f".setting[{name!r}]", DeprecationWarning, stacklevel=2)
        if name not in {f.name for f in fields(self)}:
            raise KeyError(name)
        return getattr(self, name)

    @classmethod
    def of(cls, base: Toggles | None = None, **changes) -> "Setting":
        """A Setting from toggles (or a Setting) with ``changes``; unknown names are refused."""
        base = base if base is not None else cls()
        kept = {f.name: getattr(base, f.name) for f in fields(base)}
        return cls(**kept).replace(**changes)


STEP_WORDS = tuple(f.name for f in fields(Setting))   # the keywords that describe a step, in every API


def from_words(base: Toggles | None = None, **words) -> Setting:
    """``Setting.of(base, **words)`` for an API's own keywords: refused as the Setting refuses
    them, without naming the class its caller did not write (``micro_batch must be ...``)."""
    try:
        return Setting.of(base, **words)
    except ValueError as e:
        raise ValueError(str(e).removeprefix(REFUSED)) from None


def step_words(cls: type | None = None) -> tuple:
    """The names of ``cls``'s fields (default `Setting`) as declared now (`STEP_WORDS` at import)."""
    return tuple(f.name for f in fields(cls or Setting))


def step_keywords(fn):
    """Show ``fn(target, device, ..., **step)``'s step keywords in its signature: ``**step``
    becomes one keyword-only parameter per `Setting` field ``fn`` does not name itself (but
    ``model``: the target is the model), default None (the target's, else ``fn``'s default);
    ``help()`` and Jupyter's ``?`` list them. Calls are unchanged; a field declared after
    import is taken too (``validate.keywords_checked`` reads ``fn._step_words``).

    Example: ``@step_keywords`` over ``def plan(target, device="H100 SXM", *, setting=None, **step)``."""
    sig = inspect.signature(fn)
    kept = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    taken = {p.name for p in kept} | {"model"}

    def build():   # the step words as declared when the signature is read
        return kept + [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=f.type)
                       for f in fields(Setting) if f.name not in taken]
    validate.live_signature(fn, build)
    fn._step_words = lambda: set(step_words()) - taken
    return fn


def choices_of(cls) -> dict:
    """Each field of a Toggles/Setting class with declared choices -> them (what `validate.meant`
    reads to name the keyword a value belongs to)."""
    return {f.name: f.metadata["choices"] for f in fields(cls) if f.metadata.get("choices")}


# what a step's keywords take: a keyword Setting (or plan) lacks, or a value its keyword refuses and
# another takes, is refused naming that one
SETTING_CHOICES = choices_of(Setting)
Setting.__init__ = validate.keywords_checked(SETTING_CHOICES)(Setting.__init__)


def from_keywords(setting: Setting | None, api: str, **given) -> Setting | None:
    """The Setting an API was called with: ``setting`` itself, or None when none was given; a
    step keyword given beside a Setting is refused (one description per call, not two that may
    disagree). ``given``: the API's step keywords as called (None: not given)."""
    both = sorted(k for k, v in given.items() if v is not None)
    if setting is None:
        return None
    if not isinstance(setting, Toggles):
        raise TypeError(f"{api}(setting=...) takes a tunekit.Setting, got {type(setting).__name__}")
    if both:
        raise ValueError(f"{api}: give either setting= or the step keywords {both}, not both "
                         f"(setting.replace({both[0]}=...) changes one)")
    return setting if isinstance(setting, Setting) else Setting.of(setting)


# What estimate_memory's `precision` used to mean (a memory layout), and how to ask now.
AMBIGUOUS_PRECISION = (
    "precision={p!r} is ambiguous in estimate_memory: it used to mean pure {p} training (weights, "
    "gradients and optimizer states in {p}), while everywhere else in tunekit (the Lab, plan, "
    "measure_memory, the CLI) precision={p!r} means fp32 weights under {p} autocast. Ask for one: "
    "weights={p!r} (pure {p}), or precision={p!r}, weights='fp32' (autocast; layout 'amp'); "
    "layout= names any of {layouts}.")


def memory_layout(precision: str | None, weights: str | None, layout: str | None,
                  default: str = "mixed") -> tuple[str, str | None]:
    """(layout key, deprecation) for estimate_memory's words: ``layout`` as given, else the
    Setting's layout for ``precision``/``weights``. ``precision`` naming a layout that is not a
    training precision ("mixed", "amp", "bf16-mixed", ...) still works for one release, with the
    deprecation's text; ``precision="bf16"``/``"fp16"`` alone is refused (it changed meaning);
    none of the three: ``default``."""
    if layout is None and precision is None and weights is None:
        return registry.memory_layout_name(default), None
    if layout is not None:
        if precision is not None or weights is not None:
            raise ValueError("give layout= alone, or precision=/weights= (a layout is what they make)")
        return registry.memory_layout_name(layout), None
    if precision is not None and precision not in registry.PRECISIONS:
        try:
            key = registry.memory_layout_name(precision)
        except ValueError:
            raise ValueError(f"precision must be one of {PRECISIONS} (the training precision), got {precision!r}; "
                             f"layout= names a memory layout ({tuple(registry.MEMORY_LAYOUTS)})") from None
        if key in HALF and weights is None:   # "bfloat16", "float16": a dtype's other name, as ambiguous
            raise ValueError(AMBIGUOUS_PRECISION.format(p=key, layouts=tuple(registry.MEMORY_LAYOUTS)))
        if weights is not None:
            raise ValueError(f"precision={precision!r} is a memory layout, not a training precision: "
                             f"write layout={precision!r} (without weights=)")
        return key, (f"estimate_memory(precision={precision!r}) names a memory layout: write "
                     f"layout={precision!r} (precision= takes the training precisions "
                     f"{tuple(registry.PRECISIONS)} as the Lab does)")
    if weights is not None and weights not in (FP32,) + HALF:
        raise ValueError(f"weights must be one of {('fp32',) + HALF}, got {weights!r}")
    if precision in HALF and weights is None:
        raise ValueError(AMBIGUOUS_PRECISION.format(p=precision, layouts=tuple(registry.MEMORY_LAYOUTS)))
    return Setting(precision=precision or FP32, weights=weights).memory_layout, None
