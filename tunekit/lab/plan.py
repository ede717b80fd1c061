"""``lab.plan``: `tunekit.plan` of a Lab's model under the toggles a run would start from, with
what of the Lab the plan does not model said in its notes.

The plan builds its own model from the Lab's config under fake tensors (planning), or a fake
twin of a model of the user's, stepped on the Lab's batch_fn, loss_fn and blocks: the live model,
its weights and its optimizer are not touched. The Lab's toggles reach the plan as one Setting
(every declared toggle: what the plan does not model, it says in its notes). `cached_plan`: a
plan once per shape and live model, for lab.expect, lab.explain and the dashboard's line.
"""
from __future__ import annotations

import dataclasses
import inspect
import threading
import weakref

from tunekit.core.setting import Setting, from_keywords, step_words
from tunekit.core.toggles import LAB_DEFAULT, Toggles
from tunekit.core.validate import LiveSignature
from tunekit.lab.setting import setting_of
from tunekit.planning.planner import plan
from tunekit.planning.record import Plan

NOT_STEP = ("lr",)          # setting words that leave the fake step as it is
KEPT_PLANS = 64             # plans kept per Lab (each holds its op records, no tensors)


def plan_parameters() -> list:
    """`plan`'s parameters after ``target``: ``device`` and its keywords."""
    return list(inspect.signature(plan).parameters.values())[1:]


def show_plan_keywords(method):
    """Give ``method(self, device, **overrides)`` the signature ``help()`` and Jupyter's ``?`` show:
    plan's own parameters, then the Lab's toggles plan does not take (their default: the Lab's)."""
    me = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)

    def build():   # read when the signature is: a toggle declared after import is shown
        params = plan_parameters()
        taken = {p.name for p in params}
        return [me, *params, *[inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=LAB_DEFAULT,
                                                 annotation=f.type)
                               for f in dataclasses.fields(Toggles) if f.name not in taken]]
    method.__signature__ = LiveSignature(build(), return_annotation="Plan", build=build)
    return method


def lab_plan(lab, device: str, overrides: dict) -> Plan:
    """The plan of ``lab``'s model on ``device``: the Setting of the run ``lab.run(**toggle
    overrides)`` would take (`tunekit.lab.setting.setting_of`, the one every Lab entry point makes),
    with plan's other step words and options as given; one Setting goes to ``plan``. What plan
    refuses raises plan's own error."""
    words = set(step_words())
    given = {k: v for k, v in overrides.items() if k in words}
    rest = {k: v for k, v in overrides.items() if k not in words}
    if rest.get("setting") is not None:   # a complete Setting: planned as it is, beside plan's other keywords
        from_keywords(rest["setting"], "lab.plan", **given)
        return plan(lab, device, **overrides)
    toggles = set(step_words(Toggles))
    s = setting_of(lab, changes={k: v for k, v in given.items() if k in toggles}, api="lab.plan", refuse=False)
    s = s.replace(**{k: v for k, v in given.items() if k not in toggles and v is not None})
    return plan(lab, device, setting=s, **rest)


_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_PLANS_LOCK = threading.Lock()


def shape_key(device: str, s: Setting) -> tuple:
    """What a fake step depends on: the device and every setting word but ``NOT_STEP``."""
    return (device,) + tuple((k, v) for k, v in sorted(s.asdict().items()) if k not in NOT_STEP)


def cached_plan(lab, device: str, s: Setting, verbose: bool = False):
    """``lab.plan(device, setting=s)``, once per shape and live model (the dashboard's thread and
    the kernel's may both ask: the cache is read and written under a lock, the planning outside it)."""
    key = (id(lab.model),) + shape_key(device, s)
    with _PLANS_LOCK:
        plans = _PLANS.setdefault(lab, {})
        if key in plans:
            plans[key] = plans.pop(key)    # the latest asked: kept the longest
            return plans[key]
    planned = lab.plan(device, setting=s, verbose=verbose)   # quiet by default: the dashboard asks from a thread
    with _PLANS_LOCK:
        while len(plans) >= KEPT_PLANS:   # the shapes asked least recently go first
            del plans[next(iter(plans))]
        plans[key] = planned
    return planned
