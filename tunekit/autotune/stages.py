"""The stages of the autotune search, in the order `core.toggles.SEARCH` declares them.

A stage proposes changes to the incumbent and races them (`race_changes`). The stages below add
the rules the documents give (what runs the same here, what cannot fit, what costs too much
budget); a stage with no rule here tries every declared value of its toggles (`try_values`).
"""
from __future__ import annotations

from tunekit.autotune.search import Search, Stop
from tunekit.core import registry
from tunekit.core import toggles as tg
from tunekit.core.registry import TF32
from tunekit.core.toggles import TF32_ON_CPU, Toggles, label


def run(s: Search) -> None:
    """Every stage in order, then the tiebreak and the judgement of the top two."""
    for name, toggles in tg.search_stages():
        s.stage = name
        RULES.get(name, try_values)(s, toggles)
        s.done.append(name)
    if not s.incumbent.runs:  # every stage was pruned to the incumbent alone
        s.stage = "start"
        s.race([s.incumbent])
    s.tiebreak()
    s.top_two()


def race_changes(s: Search, changes: list[dict], rule=None) -> None:
    """Race the incumbent against ``incumbent.replace(**c)`` for each change that is legal
    (``rule(toggles)``: why not, or None; then the Lab's check)."""
    inc = s.incumbent
    cands = [inc]
    for ch in changes:
        t = inc.toggles.replace(**ch)
        c = s.candidate(s.stage, t)
        if c is inc or c in cands:
            continue
        why = (rule(t) if rule else None) or "; ".join(s.lab.check(t))
        if why:
            s.prune(c, why)
        else:
            cands.append(c)
    if not inc.runs and len(cands) == 1:
        return  # nothing to compare with: measure nothing
    s.race(cands)


def values(name: str) -> tuple:
    """What a toggle may be set to (`core.toggles.Declared.values`); () when not a list."""
    return next(t.values for t in tg.declared() if t.name == name) or ()


def try_values(s: Search, toggles: tuple) -> None:
    """Each declared value of each of ``toggles`` (that ``space`` allows), from the incumbent."""
    race_changes(s, [{name: v} for name in toggles for v in s.allowed(name, values(name))])


def stage_precision(s: Search, _toggles=()) -> None:
    def rule(t):
        if t.precision == TF32 and s.env.device_type != "cuda":
            return "the same run as fp32 here: " + TF32_ON_CPU
        return None
    race_changes(s, [{"precision": p} for p in s.allowed("precision", values("precision"))], rule)


def stage_attention(s: Search, _toggles=()) -> None:
    if not s.env.can_set_attention:
        s.notes.append(f"attention not searched: {s.env.model} has no attention switch")
        return

    def rule(t):
        if t.attention == "flash" and not s.env.flash_installed:
            return "flash-attn is not installed here (pip install flash-attn, on CUDA)"
        return None
    race_changes(s, [{"attention": a} for a in s.allowed("attention", values("attention"))], rule)


def stage_optimizer(s: Search, _toggles=()) -> None:
    """The starting optimizer's algorithm in its other implementations, never another algorithm."""
    algo = registry.optimizer(s.start.optimizer).factory
    same = [n for n in values("optimizer") if registry.OPTIMIZERS[n].factory == algo]
    race_changes(s, [{"optimizer": o} for o in s.allowed("optimizer", same)])


def sizes(s: Search, low: int, high: int) -> list[int]:
    """Micro-batches in [low, high] to try: powers of two and ``high`` itself; with
    ``keep_global_batch`` the divisors of the global batch."""
    if high < low:
        return []
    if s.keep_global:
        out = [b for b in range(low, high + 1) if s.global_batch % b == 0]
    else:
        out = [2 ** k for k in range(high.bit_length()) if low <= 2 ** k <= high] + [high]
    out = sorted(set(out))
    wanted = s.space.get("micro_batch")
    return [b for b in out if wanted is None or b in wanted]


def with_batch(s: Search, b: int, **changes) -> dict:
    ga = s.global_batch // b if s.keep_global else s.incumbent.toggles.grad_accum
    return {"micro_batch": b, "grad_accum": ga, **changes}


def _unfinished(trials) -> str:
    """What the max-batch search said when it stopped at its limit or its budget ('' otherwise or
    for trials that keep no search, e.g. a test's)."""
    found = getattr(trials, "last_search", None)
    stopped = getattr(found, "stopped", "converged")
    return "" if stopped == "converged" else f"; {found.verdict}"


def stage_micro_batch(s: Search, _toggles=()) -> None:
    """Every micro-batch that fits (the Lab's max-batch search); checkpointing only at those that
    fit with it and not without."""
    inc = s.incumbent.toggles
    if inc.checkpointing:  # the incumbent's own setting is the one "without" here
        s.notes.append("the starting toggles checkpoint: the micro-batch search keeps it on")
    if s.elapsed() >= s.budget_s:
        raise Stop  # the max-batch search trains real steps too
    fit = s.trials.max_batch(inc, s.limit) or 0
    s.notes.append(f"largest micro-batch that fits with {label(inc, s.start)}: {fit} "
                   f"(searched up to {s.limit})" + _unfinished(s.trials))
    changes = [with_batch(s, b) for b in sizes(s, 1, min(fit, s.limit))]
    for b in sizes(s, fit + 1, s.limit):
        s.prune(s.candidate(s.stage, inc.replace(**with_batch(s, b))),
                f"does not fit (the largest micro-batch that fits is {fit})", fits=False)
    if not inc.checkpointing and True in s.allowed("checkpointing", [True]):
        changes += checkpointing_sizes(s, inc, fit)
    race_changes(s, changes)


def checkpointing_sizes(s: Search, inc: Toggles, fit: int) -> list[dict]:
    probe = s.candidate(s.stage, inc.replace(**with_batch(s, max(fit, 1)), checkpointing=True))
    if fit >= s.limit:
        s.prune(probe, f"memory is not the limit: micro-batch {s.limit} (the largest "
                "searched) fits without checkpointing, and checkpointing only pays "
                "through a bigger batch")
        return []
    problems = s.lab.check(inc.replace(checkpointing=True))
    if problems:
        s.prune(probe, "; ".join(problems))
        return []
    if s.elapsed() >= s.budget_s:
        raise Stop
    fit_ckpt = s.trials.max_batch(inc.replace(checkpointing=True), s.limit) or 0
    s.notes.append(f"largest micro-batch that fits with checkpointing: {fit_ckpt}")
    bigger = sizes(s, fit + 1, min(fit_ckpt, s.limit))
    if not bigger:
        s.prune(probe, f"lets no bigger micro-batch fit ({fit_ckpt} vs {fit} without)")
        return []
    if probe.toggles.micro_batch not in bigger:
        s.prune(probe, f"micro-batch {probe.toggles.micro_batch} fits without checkpointing: "
                "recomputation would only cost time there")
    return [with_batch(s, b, checkpointing=True) for b in bigger]


def stage_final(s: Search, _toggles=()) -> None:
    """The winner against the two best other candidates of all stages, to ``repeats + 2``
    repeats each: a stage decided while a burst of load slowed one side is decided again.
    Running out of budget here ends this race, not the search."""
    others = sorted((c for c in s.order if c.runs and c is not s.incumbent and c.status != "failed"),
                    key=lambda c: c.score, reverse=True)[:2]
    if not others:
        return
    for c in others:
        c.status = "racing"
    repeats, s.repeats = s.repeats, s.repeats + 2
    try:
        s.race([s.incumbent, *others])
    except Stop:
        s.notes.append("the final race was cut short by the budget")
        for c in others:
            if c.status == "racing":
                c.status, c.why = "kept", "still racing in the final when the budget ran out"
    finally:
        s.repeats = repeats


def stage_compile(s: Search, _toggles=()) -> None:
    if True not in s.allowed("compile", [True]) or s.incumbent.toggles.compile:
        return
    c = s.candidate(s.stage, s.incumbent.toggles.replace(compile=True))
    left = s.budget_s - s.elapsed()
    if left < s.compile_s:
        s.prune(c, f"{left:.0f} s of budget left, compile_s={s.compile_s:g} s needed "
                "(a first torch.compile costs tens of seconds)")
        return
    race_changes(s, [{"compile": True}])


# the stages with rules of their own, by name; any other stage of SEARCH is `try_values`
RULES = {"precision": stage_precision, "attention": stage_attention, "optimizer": stage_optimizer,
         "micro_batch": stage_micro_batch, "final": stage_final, "compile": stage_compile}
