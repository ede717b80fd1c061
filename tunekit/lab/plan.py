"""``lab.plan``: `tunekit.plan` of a Lab's model under the toggles a run would start from, with
what of the Lab the plan does not model said in its notes.

The plan builds its own model from the Lab's config under fake tensors (planning), or a fake
twin of a model of the user's, stepped on the Lab's batch_fn, loss_fn and blocks: the live model,
its weights and its optimizer are not touched. Which of the Lab's toggles reach the plan is
read from `plan`'s own signature, so a keyword plan learns (``attention``, ``parallel``, ...) is
forwarded and shown by ``lab.plan`` without a change here.
"""
from __future__ import annotations

import dataclasses
import inspect

from tunekit.core.setting import HALF, STEP_WORDS, from_keywords
from tunekit.core.toggles import LAB_DEFAULT, Toggles
from tunekit.measure.device import weights_dtype
from tunekit.planning.planner import COMPILE_NOT_MODELLED, plan
from tunekit.planning.record import Plan

TOGGLES = tuple(f.name for f in dataclasses.fields(Toggles))
# Toggles that change neither one micro-step's memory nor its speed-of-light bound: gradients
# accumulate in place (grad_accum) and the optimizer's elementwise update is outside the bound.
NOT_IN_THE_STEP = ("grad_accum", "lr")


def plan_parameters() -> list:
    """`plan`'s parameters after ``target``: ``device`` and its keywords."""
    return list(inspect.signature(plan).parameters.values())[1:]


def show_plan_keywords(method):
    """Give ``method(self, device, **overrides)`` the signature ``help()`` and Jupyter's ``?`` show:
    plan's own parameters, then the Lab's toggles plan does not take (their default: the Lab's)."""
    params = plan_parameters()
    taken = {p.name for p in params}
    lab_only = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=LAB_DEFAULT, annotation=f.type)
                for f in dataclasses.fields(Toggles) if f.name not in taken]
    me = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    method.__signature__ = inspect.Signature([me, *params, *lab_only], return_annotation="Plan")
    return method


def lab_plan(lab, device: str, overrides: dict) -> Plan:
    """The plan of ``lab``'s model on ``device``: the toggles ``lab.resolve(**toggle overrides)``
    (what ``lab.run`` with them would use), plan's other keywords as given. What plan refuses
    raises plan's own error."""
    taken = {p.name for p in plan_parameters()}
    if overrides.get("setting") is not None:   # a complete Setting: planned as it is, beside plan's other keywords
        from_keywords(overrides["setting"], "lab.plan", **{k: v for k, v in overrides.items() if k in STEP_WORDS})
        return plan(lab, device, **overrides)
    t = lab.resolve(**{k: v for k, v in overrides.items() if k in TOGGLES})
    kw = {k: getattr(t, k) for k in TOGGLES if k in taken}
    kw.update((k, v) for k, v in overrides.items() if k not in TOGGLES)
    if "weights" in taken and "weights" not in overrides:
        weights = weights_dtype(lab.model.parameters())
        if weights in HALF:   # a model kept in bf16/fp16
            kw["weights"] = weights
    p = plan(lab, device, **kw)
    p.notes += unmodelled(t, taken, lab.adapter.attention)
    return p


def unmodelled(t: Toggles, taken: set, attention) -> list[str]:
    """Notes on the toggles of ``t`` set to something the plan did not model: those plan takes no
    keyword for, away from what it builds (eager, the model's current ``attention``)."""
    notes = []
    for name in TOGGLES:
        value = getattr(t, name)
        if name in taken or name in NOT_IN_THE_STEP:
            continue
        if name == "compile" and value:
            notes.append(COMPILE_NOT_MODELLED)
        elif name == "attention" and value is not None and value != attention:
            notes.append(f"attention={value!r} is not modelled: the plan builds the model with its current "
                         f"attention ({attention!r})")
        elif name not in ("compile", "attention") and value != Toggles.__dataclass_fields__[name].default:
            notes.append(f"{name}={value!r} is not modelled: the plan is of a step without it")
    return notes
