"""The options of ``lab.autotune``: each with its default and its check.

`AutotuneOptions` is the one list: ``autotune()``'s keyword signature mirrors it (a test holds
them equal) and `AutotuneOptions.problems` checks every value through ``core.validate``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from tunekit.core import toggles as tg
from tunekit.core.validate import choice, flag, function, is_whole, memory_budget_bytes, optional, real, whole

OBJECTIVES = ("tokens_per_s",)
KEEP = ("winner", "start")


def searched() -> dict:
    """Toggle -> the values ``space`` may hold for it (None: whole numbers >= 1), for every
    toggle a stage of `core.toggles.search_stages` changes."""
    decl = {t.name: t for t in tg.declared()}
    return {name: decl[name].values for _, names in tg.search_stages() for name in names}


def check_space(name: str, space):
    """None, or a dict restricting searched toggles to non-empty lists of their legal values."""
    if space is None:
        return None
    if not isinstance(space, dict):
        raise ValueError(f"{name} must be a dict of toggle -> values (got {type(space).__name__}).")
    known, out = searched(), []
    for k, v in space.items():
        if k not in known:
            out.append(f"{name}: {k!r} is not searched; one of {tuple(known)}.")
        elif not isinstance(v, (list, tuple)) or not v:
            out.append(f"{name}[{k!r}] must be a non-empty list of values (got {v!r}).")
        elif any(x not in known[k] for x in v) if known[k] is not None else \
                not all(is_whole(x) and x >= 1 for x in v):
            out.append(f"{name}[{k!r}] may hold only {known[k] or 'whole numbers >= 1'} (got {v!r}).")
    if out:
        raise ValueError(" ".join(out))
    return dict(space)


def check_target(name: str, target):
    """None, or a cluster target such as tunekit.Slurm(...) (anything that can ``submit`` a run)."""
    if target is not None and not (hasattr(target, "submit") and hasattr(target, "max_jobs")):
        raise ValueError(f"{name}= is a cluster target such as tunekit.Slurm(partition=...), got {target!r}.")
    return target


def option(default, check, *args):
    """A field with its default and its check: ``check(name, value, *args)`` returns the value
    in its plain type or raises ValueError/TypeError naming it (``core.validate``'s form)."""
    return field(default=default, metadata={"check": lambda name, v: check(name, v, *args)})


@dataclass(frozen=True)
class AutotuneOptions:
    """Everything ``lab.autotune`` takes besides the Lab (see ``autotune()`` for what each means)."""

    budget_s: float = option(60.0, real)
    objective: str = option("tokens_per_s", choice, OBJECTIVES)
    keep_global_batch: bool = option(False, flag)
    max_micro_batch: int | None = option(None, optional(whole))
    steps: int = option(3, whole)
    warmup: int = option(1, whole, 0)
    repeats: int = option(3, whole)
    noise: float = option(0.03, real, 0.0, 1.0, False, True)   # a relative difference in [0, 1)
    memory_budget_bytes: float | None = option(None, memory_budget_bytes)
    space: dict | None = option(None, check_space)
    keep: str = option("winner", choice, KEEP)
    compile_s: float = option(60.0, real)
    trial_s: float = option(0.25, real, 0.0, math.inf, False)
    progress: object = option(None, optional(function), "(elapsed_s, budget_s, text)")
    trials: object = option(None, lambda name, v: v)   # an object like LabTrials; tests inject one
    on: object = option(None, check_target)            # a cluster target: each trial a job (autotune.cluster)

    def checked(self) -> tuple[AutotuneOptions, list[str]]:
        """(these options with every value in its plain type, what is wrong with them: one
        sentence per bad option, all of them; the values of bad options are kept as given)."""
        values, problems = {}, []
        for f in fields(self):
            v = getattr(self, f.name)
            try:
                values[f.name] = f.metadata["check"](f.name, v)
            except (TypeError, ValueError) as e:
                values[f.name] = v
                problems.append(str(e))
        return AutotuneOptions(**values), problems
