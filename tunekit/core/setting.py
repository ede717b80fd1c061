"""One training step, described completely: `Setting`. Pure: no torch.

    >>> s = Setting(precision="bf16", micro_batch=4, seq_len=1024, checkpointing=True)
    >>> s.autocast, s.compute, s.memory_layout        # fp32 weights under bf16 autocast
    ('bf16', 'bf16', 'amp')
    >>> Setting(weights="bf16").memory_layout          # pure bf16: weights, gradients, states
    'bf16'

Every entry point takes one (``lab.run(setting=s)``, ``tunekit.plan(cfg, setting=s)``,
``tunekit.estimate_memory(cfg, setting=s)``, ``tunekit.measure_memory(model, batch, setting=s)``)
and its keywords are sugar that build one, so a word means the same wherever it is written:

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
from dataclasses import dataclass, field, fields

from . import registry

PRECISIONS = tuple(registry.PRECISIONS)
OPTIMIZERS = registry.LAB_OPTIMIZERS
ATTENTIONS = tuple(registry.ATTENTIONS)
PARALLEL = ("ddp", "fsdp", "fsdp_grad_op", "hsdp")
HALF = ("bf16", "fp16")   # the dtypes that half weights may take


def toggle(default, help: str, choices: tuple | None = None, label: str | None = None):
    """A field of `Toggles` with what the UIs show of it: ``help`` (the CLI option's, the
    dashboard control's tooltip), ``choices`` (a dropdown, the CLI's choices, the values autotune
    tries), ``label`` (the dashboard's; default: the name with spaces)."""
    return field(default=default, metadata={"help": help, "choices": choices, "label": label})


@dataclass(frozen=True)
class Toggles:
    """Everything ``lab.run`` can change between runs. ``None`` means "the model's current".

    The declaration the dashboard controls, the ``tunekit run`` options and autotune's stages
    are built from (`declared`, `SEARCH`): a new toggle is a field here (its rule in `problems`,
    a row in `SEARCH` when autotune should try it) and its effect in the engine's step.

    Example: ``Toggles(precision="bf16", micro_batch=16).replace(checkpointing=True)``."""

    precision: str = toggle("fp32", "training precision", PRECISIONS)
    checkpointing: bool = toggle(False, "recompute each block in backward")
    micro_batch: int = toggle(8, "samples per micro-step (per rank)")
    grad_accum: int = toggle(1, "micro-steps per optimizer step")
    seq_len: int | None = toggle(None, "tokens per sample; None: the model's position limit")
    optimizer: str = toggle("adamw", "optimizer", OPTIMIZERS)
    attention: str | None = toggle(None, "attention kernel; None: the model's own", ATTENTIONS)
    compile: bool = toggle(False, "torch.compile the model", label="torch.compile")
    lr: float = toggle(1e-3, "learning rate")

    def replace(self, **changes) -> "Toggles":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"unknown toggle(s) {sorted(unknown)}; "
                            f"valid: {[f.name for f in dataclasses.fields(self)]}")
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
        return "fp32" if c == "tf32" and device_type != "cuda" else c

    @property
    def grads(self) -> str:
        """The gradients' dtype: the parameters' (fp32 under autocast)."""
        return self.half_weights or "fp32"

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


def _more(default, help: str, choices: tuple | None = None):
    """A field a Setting adds to the toggles (not a dashboard control)."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class Setting(Toggles):
    """A training step: the toggles of a Lab run plus ``weights`` (parameter dtype), ``parallel``
    / ``world_size`` / ``nodes`` (the layout over GPUs), ``device`` and ``model`` (what is
    trained: a preset or a config path, for the CLI; an API that takes the model itself leaves it
    None). ``micro_batch`` is per rank.

    Example: ``tunekit.Setting(precision="bf16", micro_batch=16).replace(checkpointing=True)``."""

    weights: str | None = _more(None, "parameter dtype; None: the model's own (fp32 from a config)", (None,) + HALF)
    parallel: str | None = _more(None, "ddp | fsdp | fsdp_grad_op | hsdp over world_size ranks", PARALLEL)
    world_size: int = _more(1, "ranks (GPUs) in all")
    nodes: int = _more(1, "machines the ranks are spread over")
    device: str | None = _more(None, "a spec-table device, 'cpu' or 'cuda'; None: this machine's")
    model: str | None = _more(None, "what is trained: a preset name or a config file (the CLI's)")

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
        key = registry.memory_layout_name(precision)   # a ValueError for an unknown name
        if weights is not None:
            raise ValueError(f"precision={precision!r} is a memory layout, not a training precision: "
                             f"write layout={precision!r} (without weights=)")
        return key, (f"estimate_memory(precision={precision!r}) names a memory layout: write "
                     f"layout={precision!r} (precision= takes the training precisions "
                     f"{tuple(registry.PRECISIONS)} as the Lab does)")
    if weights is not None and weights not in ("fp32",) + HALF:
        raise ValueError(f"weights must be one of {('fp32',) + HALF}, got {weights!r}")
    if precision in HALF and weights is None:
        raise ValueError(AMBIGUOUS_PRECISION.format(p=precision, layouts=tuple(registry.MEMORY_LAYOUTS)))
    return Setting(precision=precision or "fp32", weights=weights).memory_layout, None
