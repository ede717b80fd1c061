"""A Lab call's one `tunekit.Setting`, made at its edge (`setting_of`): the toggles of a run and
its layout over ranks, and what a live model cannot be given.

    >>> s = setting_of(lab, Setting(precision="bf16"))       # or setting_of(lab, changes={...})
    >>> changes, (parallel, nproc, nodes) = lab_keywords(lab, Setting(precision="bf16"), {}, (None, 1, 1))
"""
from __future__ import annotations

from tunekit.core import registry
from tunekit.core.comm import layout_problems
from tunekit.core.setting import HALF, REFUSED, Setting, Toggles, choices_of, from_keywords, step_words
from tunekit.core.toggles import ToggleError, problems
from tunekit.core.validate import DEVICE_TYPES, is_whole
from tunekit.measure.device import weights_dtype
from tunekit.models.gpt import PRESETS
from tunekit.models.naming import model_label

# what the Lab's keywords take, for the help a value given to the wrong one gets (validate.meant):
# ``Lab("gpt2-124m")`` -> did you mean preset='gpt2-124m'?
LAB_CHOICES = {"model": lambda v: not isinstance(v, str) or ":" in v, "preset": tuple(PRESETS),
               "device": lambda v: isinstance(v, str) and v.partition(":")[0] in DEVICE_TYPES,
               **choices_of(Toggles)}


def lab_keywords(lab, setting: Setting, changes: dict, layout: tuple, parallel: bool = True,
                 api: str = "lab.run") -> tuple[dict, tuple]:
    """(toggles, (parallel, nproc, nodes)) of ``lab.run(setting=...)``: one description per
    call (toggle keywords or a layout given beside the Setting are refused); ``ToggleError`` for
    what the Lab cannot do with its live model (other weights, another device, another model).
    A Setting is complete: its toggles replace the Lab's defaults, except those it leaves None
    (attention, seq_len: the model's own), which keep the Lab's."""
    kind, nproc, nodes = layout
    given = dict(changes, parallel=kind, world_size=None if nproc == 1 else nproc, nodes=None if nodes == 1 else nodes)
    s = from_keywords(setting, api, **given)
    why = []
    live = weights_dtype(lab.model.parameters())
    if s.weights is not None and s.weights != live:
        why.append(f"weights={s.weights!r}: the Lab trains its live model in the dtype it has ({live}); converting "
                   "it would round its weights. Plan it instead (tunekit.plan(lab, setting=s)) or give the Lab a "
                   f"model in {s.weights}.")
    if s.device is not None and s.device not in (lab.device.type, str(lab.device)):
        why.append(f"device={s.device!r}: this Lab's model is on {lab.device}; plan another device with "
                   "tunekit.plan(lab, setting=s).")
    if s.model is not None:
        why.append(f"model={s.model!r}: a Lab trains the model it was made with; Setting.model names what the "
                   "tunekit command builds.")
    if s.parallel is not None and not parallel:
        why.append(f"parallel={s.parallel!r}: this searches one process; run the ranks with lab.run(setting=s).")
    if why:
        raise ToggleError(why)
    toggles = {k: getattr(s, k) for k in step_words(Toggles) if getattr(s, k) is not None}
    return toggles, (s.parallel, s.world_size // s.nodes, s.nodes)


def setting_of(lab, setting: Setting | None = None, changes: dict | None = None, layout: tuple = (None, 1, 1), *,
               api: str = "lab.run", one_process: bool = False, steps=1, warmup=0, refuse: bool = True) -> Setting:
    """The one Setting of a Lab call: ``setting`` (checked against the live model: `lab_keywords`)
    or the toggle keywords ``changes`` and ``layout`` = (parallel, nproc, nodes), with the Lab's
    defaults and the model's own state filled in (``lab.resolve``) and the live model's weights'
    dtype where it keeps them in bf16/fp16. Every Lab entry point (``lab.run``, ``lab.plan``,
    ``lab.find_max_batch_size``, ``lab.autotune``, ``lab.setting_of``) makes its Setting here and
    passes only it inward.

    An unknown keyword raises TypeError (`Toggles.replace`); keywords no Setting can hold raise
    ``ToggleError`` with what ``lab.check`` (and, for ranks, `layout_problems`) says of them, before
    any work (``refuse=False``: the Setting's own ValueError, as ``lab.plan`` says it). What the
    machine or the model refuses of a valid Setting is for the entry point to check (``lab.check``).

    >>> setting_of(lab, changes={"precision": "bf16"}).precision
    'bf16'
    """
    kind, nproc, nodes = layout
    changes = dict(changes or {})
    if setting is not None:
        changes, (kind, nproc, nodes) = lab_keywords(lab, setting, changes, layout, not one_process, api)
    t = lab.resolve(**changes)
    try:
        s = Setting.of(t, parallel=kind, world_size=nproc * nodes, nodes=nodes)
    except (TypeError, ValueError) as e:
        if not refuse:
            raise
        ranks = kind is not None or (nproc, nodes) != (1, 1)
        errors = (layout_problems(kind, nproc, nodes) if ranks else []) + lab.check(t, steps, warmup)
        raise ToggleError(errors or [str(e).removeprefix(REFUSED)]) from None
    if refuse and s.optimizer != t.optimizer:   # an alias ("adam"): a Lab takes the names it builds (lab.check)
        raise ToggleError(lab.check(t, steps, warmup))
    live = weights_dtype(lab.model.parameters())
    return s.replace(weights=live) if live in HALF and s.weights is None else s


def toggles_of(s: Setting) -> dict:
    """The toggles of ``s`` as keywords (``lab.resolve(**toggles_of(s))``, as `tunekit.lab.expect`
    re-checks them): every declared toggle, those it leaves None (the model's own) left out."""
    return {k: v for k, v in s.toggles.asdict().items() if v is not None}


def resolve(lab, changes: dict) -> Toggles:
    """``lab.resolve(**changes)``: the Lab's defaults with ``changes``, the model's own state for
    what they leave None, the model's position limit for a None ``seq_len`` (your own batch_fn:
    1, its runs count samples), an attention alias by its name ("eager" is math)."""
    t = lab.model_state(lab.defaults.replace(**changes))
    if t.seq_len is None:
        t = t.replace(seq_len=lab.adapter.default_seq_len(lab.device.type) or (1 if lab.batcher is None else None))
    if isinstance(t.attention, str) and t.attention in registry.ATTENTION_ALIASES:
        t = t.replace(attention=registry.attention(t.attention).name)
    return t


def check(lab, t: Toggles, steps=1, warmup=0) -> list[str]:
    """``lab.check(t)``: why ``t`` cannot run here (empty: it can)."""
    out = problems(t, lab.env())
    if not is_whole(steps) or steps < 1:
        out.append(f"steps must be a whole number >= 1 (got {steps!r}): nothing would be timed.")
    if not is_whole(warmup) or warmup < 0:
        out.append(f"warmup must be a whole number >= 0 (got {warmup!r}).")
    if t.seq_len is None:
        out.append(f"seq_len is needed: {model_label(lab.model)} has no known position "
                   "limit to take it from (lab.run(seq_len=...) or Lab(..., seq_len=...)).")
    return out
