"""``%%gpuprofile``'s option line checked before the cell runs, and ``--plan``: a traced cell set
against a plan's expected step in one line (``ProfileRecord.explained``, core.explain).

    >>> check(args)                      # a UsageError for a bad option line, before any work
    >>> plan = planned(ns, args)         # the Plan ``--plan NAME`` names (checked), or None
    >>> explain_record(rec, plan, args.steps)   # after the cell: rec.explained, or a note why not

    %%gpuprofile --trace --plan p --steps 5     # p = tunekit.plan(model, "cpu", ...) in the notebook
"""
from __future__ import annotations

import math

from tunekit.core.expected import Expected
from tunekit.core.notes import Note, of_kind


def wants_help(line: str) -> bool:
    """Whether an option line asks for the usage: ``-h`` or ``--help`` among its words (IPython's
    magic parser has no help option of its own: `%%gpuprofile?` is its help)."""
    return any(word in ("-h", "--help") for word in line.split())


def check(args) -> None:
    """Refuse an option line that cannot be run as it says (a UsageError naming the option)."""
    from IPython.core.error import UsageError  # the magic's; tunekit.profile runs without IPython

    if args.model_flops is not None and not 0 <= args.model_flops < math.inf:
        raise UsageError(f"--model-flops must be a finite FLOP count >= 0, got {args.model_flops!r}")
    if args.peak is not None and not 0 < args.peak < math.inf:
        raise UsageError(f"--peak must be a finite TFLOPS figure > 0, got {args.peak!r}")
    if args.flops == "always" and (args.trace or args.memory):
        raise UsageError("--flops always counts every run, and a traced run counts none (the counter "
                         "would be traced as the work): use --trace/--memory with --flops auto or never")
    if args.plan is not None and not args.trace:
        raise UsageError("--plan sets the cell's traced step against the plan's expected step: add --trace")
    if args.steps < 1:
        raise UsageError(f"--steps is how many training steps the cell runs (>= 1), got {args.steps}")
    if args.steps != 1 and args.plan is None:
        raise UsageError("--steps divides a traced cell for --plan: give --plan NAME with it")


def planned(ns: dict, args):
    """The Plan (or its `Expected`) that ``--plan NAME`` names in the notebook ``ns`` (None without
    --plan); a UsageError, before the cell runs, for a name that is not there, is not a Plan, or is
    a plan without an expected step (its note says which figure the device lacks)."""
    from IPython.core.error import UsageError

    name = args.plan
    if name is None:
        return None
    if name not in ns:
        raise UsageError(f"--plan {name}: no variable {name!r} in the notebook; make the plan first, e.g. "
                         f"{name} = tunekit.plan(model, 'cpu', micro_batch=8, seq_len=256)")
    why = plan_error(ns[name], name)
    if why:
        raise UsageError(f"--plan {name}: {why}")
    return ns[name]


def plan_error(plan, name: str = "plan") -> str | None:
    """Why ``plan`` (called ``name``) cannot be a traced run's expectation, or None: a Plan with an
    expected step, or an `Expected`, can."""
    if isinstance(plan, Expected):
        return None
    expected = getattr(plan, "expected", False)
    if expected is False or not (expected is None or isinstance(expected, Expected)):
        return f"{name} is of type {type(plan).__name__}, not a Plan (tunekit.plan(...) or lab.plan(...) makes one)"
    if expected is None:
        missing = of_kind(getattr(plan, "notes", []), "expected.missing")
        return "the plan has no expected step to set the run against" + (f": {missing[0]}" if missing else "")
    return None


def explain_record(rec, plan, steps: int) -> None:
    """After a traced cell: ``rec.explained``, its one line against ``plan``'s expected step
    (``steps`` training steps in the cell), or a note of kind "explain.none" saying why there is
    none (the cell raised, no trace was taken). Nothing without a plan."""
    from tunekit.core.explain import explain

    if plan is None:
        return
    if rec.error or rec.trace is None:
        why = f"the cell raised ({rec.error})" if rec.error else "no trace was taken"
        rec.notes.append(Note("explain.none", f"no line against the plan's expected step: {why}"))
        return
    try:
        rec.explained = explain(rec, plan, steps=steps).line
    except ValueError as e:   # a trace explain cannot read: said, the record stands
        rec.notes.append(Note("explain.none", f"no line against the plan's expected step: {e}"))
