"""The Lab's toggles and the rules for which combinations make sense. Pure: no torch import.

    >>> t = Toggles(precision="bf16", micro_batch=16)
    >>> problems(t, Env(device_type="cpu"))     # [] -> fine; otherwise sentences saying why not

The rules live here, apart from the Lab and the dashboard, so both explain a refusal the same
way and the rules can be tested without tensors.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass, field

from tunekit.core.registry import BF16, FP16, TF32
from tunekit.core.setting import (  # noqa: F401
    ATTENTIONS,
    HALF,
    OPTIMIZERS,
    PRECISIONS,
    Toggles,
    toggle,
    word_problems,
)
from tunekit.core.validate import did_you_mean, is_whole, live_signature

# Why fp16 is refused on CPU (the Lab's decision, shown verbatim in the dashboard).
FP16_ON_CPU = (
    "fp16 training is refused on CPU. fp16 has a 5-bit exponent, so small gradients underflow to "
    "zero unless the loss is scaled (a GradScaler), and CPUs mostly lack fast fp16 matrix units: "
    "torch would run it slower than fp32 and less safely than bf16. Use bf16 on CPU: it keeps "
    "fp32's exponent range (no scaler needed) and runs fast on CPUs with AVX512-BF16 or AMX.")
TF32_ON_CPU = ("tf32 is a CUDA tensor-core mode (Ampere and newer); on CPU matmuls stay fp32, "
               "so this run is an fp32 run and is recorded as such.")


@dataclass(frozen=True)
class Declared:
    """One toggle as the UIs and autotune read it: its field in `Toggles` and the field's metadata."""

    name: str
    kind: type            # bool | int | float | str: the CLI option's type
    default: object
    help: str
    label: str
    choices: tuple | None  # None: any value of ``kind``
    device_default: object = None   # (device, bf16) -> the default where a step is described by its device
    tune: bool = False              # autotune tries its values in a stage of its own (`search_stages`)

    @property
    def control(self) -> str:
        """The dashboard's widget: dropdown | checkbox | int | float | text."""
        if self.choices is not None:
            return "dropdown"
        return {bool: "checkbox", int: "int", float: "float"}.get(self.kind, "text")

    @property
    def values(self) -> tuple | None:
        """What autotune may try: the choices, both settings of a flag; None: not a list."""
        return (False, True) if self.kind is bool else self.choices


def declared(cls: type | None = None) -> tuple[Declared, ...]:
    """Every toggle of ``cls`` (default `Toggles`, or a dataclass extending it) in field order;
    a field declared without `toggle` gets a generic help and no choices."""
    cls = cls or Toggles
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind = next((a for a in typing.get_args(hints[f.name]) if a is not type(None)), hints[f.name])
        meta = f.metadata
        out.append(Declared(f.name, kind, f.default, meta.get("help") or f"the Lab's {f.name} toggle",
                            meta.get("label") or f.name.replace("_", " "), meta.get("choices"),
                            meta.get("device_default"), bool(meta.get("tune"))))
    return tuple(out)


class _LabDefault:
    """The default a toggle keyword shows: left out, the toggle keeps the Lab's (``lab.defaults``)."""

    def __repr__(self):
        return "<lab.defaults>"


LAB_DEFAULT = _LabDefault()


def toggle_keywords(fn):
    """Show ``fn(..., **changes)``'s toggle keywords in its signature: ``**changes`` becomes one
    keyword-only parameter per `Toggles` field (``inspect.signature``, ``help()`` and Jupyter's
    ``?`` list them). Calls are unchanged; an unknown name is still refused by `Toggles.replace`.

    Example: ``@toggle_keywords`` over ``def run(self, steps=20, **changes)`` shows
    ``run(self, steps=20, *, precision=<lab.defaults>, checkpointing=<lab.defaults>, ...)``."""
    sig = inspect.signature(fn)
    kept = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    if len(kept) == len(sig.parameters):
        raise TypeError(f"{fn.__qualname__} takes no **changes to show as toggles")
    taken = {p.name for p in kept}

    def build():   # the toggles as declared when the signature is read (help(), ?): one declared later too
        return kept + [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=LAB_DEFAULT,
                                         annotation=f.type) for f in dataclasses.fields(Toggles) if f.name not in taken]
    live_signature(fn, build)
    fn._step_words = lambda: {f.name for f in dataclasses.fields(Toggles)} - taken   # one declared after this
    return fn


# How lab.autotune searches the toggles: its stages in order, each with the toggles it changes
# ("final" re-races the best candidates so far). A stage the engine has no rule for tries each of
# its toggles' `Declared.values` from the incumbent. Toggles in no stage are never searched:
# grad_accum follows micro_batch (keep_global_batch), seq_len and lr change what is trained.
SEARCH = (("precision", ("precision",)),       # first: it changes what fits
          ("attention", ("attention",)),
          ("optimizer", ("optimizer",)),       # the same algorithm in its other implementations
          ("micro_batch", ("checkpointing", "micro_batch")),  # checkpointing pays only through the batch
          ("final", ()),
          ("compile", ("compile",)))           # last: a first compile costs tens of seconds


def search_stages() -> tuple:
    """`SEARCH`, and a stage of its own before "final" for each toggle declared with ``tune=True``
    that no stage names (it tries the toggle's `Declared.values`): what autotune runs."""
    named = {n for _, names in SEARCH for n in names}
    extra = tuple((t.name, (t.name,)) for t in declared() if t.tune and t.name not in named)
    names = [name for name, _ in SEARCH]
    at = names.index("final") if "final" in names else len(names)
    return SEARCH[:at] + extra + SEARCH[at:]


@dataclass
class Env:
    """What the machine and the model allow; the Lab fills it in, tests build it by hand."""

    device_type: str = "cpu"
    bf16_supported: bool = True
    flash_installed: bool = False
    unavailable_optimizers: dict = field(default_factory=dict)  # name -> why
    block_size: int | None = None
    can_set_attention: bool = True
    can_checkpoint: bool = True
    model: str = "this model"
    blocks_example: str = "Lab(model, blocks='layers')"   # models.naming.blocks_example: from the model's modules


class ToggleError(ValueError):
    """Raised by ``lab.run`` for a combination that cannot run; ``.problems`` lists why.

    Example: ``try: lab.run(precision="fp16")`` / ``except tunekit.lab.ToggleError as e: print(e.problems)``."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def problems(t: Toggles, env: Env) -> list[str]:
    """Sentences explaining why ``t`` cannot run in ``env``; empty when it can."""
    out, fixed = word_problems(t)   # each toggle's own rule, worded once (core.setting)
    cuda = env.device_type == "cuda"
    if t.seq_len is not None and is_whole(t.seq_len) and env.block_size is not None and t.seq_len > env.block_size:
        out.append(f"seq_len={t.seq_len} is longer than the model's position limit "
                   f"({env.block_size}: block_size / max_position_embeddings); pick seq_len <= "
                   f"{env.block_size}.")
    if t.precision == FP16 and not cuda:
        out.append(FP16_ON_CPU)
    elif t.precision == BF16 and cuda and not env.bf16_supported:
        out.append("this GPU has no bf16 support (pre-Ampere): use fp16 (with its GradScaler) or fp32.")
    if "optimizer" in fixed and t.optimizer not in OPTIMIZERS:   # the registry's, not one a Lab builds
        named = fixed["optimizer"]   # an alias ('adam'): the registry's name for it, which a Lab may build
        out.append(f"optimizer must be one of {OPTIMIZERS} in a Lab (those it can build), got {t.optimizer!r}"
                   + (did_you_mean(named) if named in OPTIMIZERS else "."))
    elif t.optimizer in env.unavailable_optimizers:
        out.append(f"optimizer {t.optimizer!r} is unavailable here: {env.unavailable_optimizers[t.optimizer]}")
    if t.attention in ATTENTIONS:
        if not env.can_set_attention:
            out.append(f"{env.model} has no attention switch tunekit knows (tunekit's GPT and "
                       "transformers models have one); leave attention unset.")
        elif t.attention == "flash" and not cuda:
            out.append("flash attention (the flash-attn package) runs only on CUDA GPUs; "
                       "use 'sdpa' (torch picks its best CPU kernel) or 'math' to see the naive cost.")
        elif t.attention == "flash" and t.compute not in HALF:
            out.append("flash-attn kernels take fp16/bf16 tensors only; choose precision bf16 (or fp16).")
    if t.checkpointing and not env.can_checkpoint:
        out.append(f"tunekit does not know {env.model}'s blocks: name them to checkpoint them, "
                   f"e.g. {env.blocks_example}.")
    return out


def normalized(t: Toggles) -> Toggles:
    """The same toggles in plain Python types (a numpy int64 micro-batch becomes an int), as
    the model and the log want them; call after `problems` found none."""
    return t.replace(micro_batch=int(t.micro_batch), grad_accum=int(t.grad_accum),
                     seq_len=None if t.seq_len is None else int(t.seq_len), lr=float(t.lr))


def notices(t: Toggles, env: Env) -> list[str]:
    """What will run differently from what was asked (not errors): recorded in the run's notes."""
    out = []
    if t.precision == TF32 and env.device_type != "cuda":
        out.append(TF32_ON_CPU)
    if t.attention == "flash" and env.device_type == "cuda" and not env.flash_installed:
        out.append("flash-attn is not installed: attention falls back to torch SDPA "
                   "(attention_ran says what ran).")
    if t.compile and env.device_type == "cpu":
        out.append("torch.compile on CPU compiles C++ at the first step (tens of seconds); "
                   "the warm-up absorbs it.")
    return out


def label(t: Toggles, base: Toggles) -> str:
    """Short name of what differs from ``base``: e.g. ``"bf16 ckpt mb=16"``, or ``"baseline"``
    (the toggles of a Setting; its layout is said by the run's own fields)."""
    t, base = t.toggles, base.toggles
    parts = []
    for f in dataclasses.fields(t):
        v, b = getattr(t, f.name), getattr(base, f.name)
        if v == b:
            continue
        if f.name == "precision":
            parts.append(v)
        elif f.name in ("checkpointing", "compile"):
            parts.append(("ckpt" if f.name == "checkpointing" else "compile") + ("" if v else " off"))
        elif f.name in ("optimizer", "attention"):
            parts.append(str(v))
        else:
            short = {"micro_batch": "mb", "grad_accum": "ga", "seq_len": "T"}.get(f.name, f.name)
            parts.append(f"{short}={v}")
    return " ".join(parts) or "baseline"
