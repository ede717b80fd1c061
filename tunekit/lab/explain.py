"""``lab.explain``: a Lab's traced run against the expectation of its own step on its own device
(``lab.plan`` under the run's toggles), op group by op group (core.explain); and its one line,
which ``lab.run(trace=True)`` keeps in ``RunResult.explained`` (`run_line`).

    >>> line, notes = run_line(lab, result)   # after the run's steps: its trace is taken already
"""
from __future__ import annotations

import dataclasses
import weakref

from tunekit.core.breakdown import as_breakdown
from tunekit.core.explain import Explanation, explain_trace
from tunekit.core.notes import Note, of_kind
from tunekit.core.specs import find_spec

ONCE_A_STEP = ("optimizer", "communication")   # categories (and groups) a step runs once, whatever its grad_accum


def per_step(rows, accum) -> list:
    """The plan's expected rows for a whole step of ``accum`` micro-batches: the fake step is one
    micro-batch and one update (planner.SAME_STEP), so every row but the update's and the
    collectives' runs ``accum`` times (calls and seconds)."""
    accum = int(accum or 1)
    if accum <= 1:
        return list(rows)
    return [r if r[1] in ONCE_A_STEP else (r[0], r[1], r[2] * accum, r[3] * accum, *r[4:]) for r in rows]


def expected_step(expected, accum):
    """``expected`` (a plan's `Expected`: one micro-batch and one update) for a whole step of ``accum``
    micro-batches (`per_step`): what a run's step (and ``lab.expect``'s device model) takes."""
    accum = int(accum or 1)
    if accum <= 1:
        return expected
    rows = per_step(expected.rows, accum)
    grown = sum(r[3] for r in rows) - sum(r[3] for r in expected.rows)
    return dataclasses.replace(expected, rows=rows, step_s=expected.step_s + grown)


def plan_device(device: str) -> str:
    """The plan's name for the device a run took: "cpu", or the spec table's name of its GPU."""
    if str(device).startswith("cpu"):
        return "cpu"
    spec = find_spec(str(device))
    if spec is None:
        raise ValueError(f"no spec-table row for {device!r}: nothing to expect this run's step on")
    return spec.name


def lab_explain(lab, run=None) -> Explanation:
    """``run`` (a RunResult or a run id; None: the Lab's last traced run) against its expectation."""
    runs = lab.runs
    if run is None:
        traced = [r for r in runs if r.trace is not None and r.status == "ok"]
        if not traced:
            raise ValueError("no traced run to explain: lab.run(trace=True) traces one more step")
        run = traced[-1]
    elif isinstance(run, int) and not isinstance(run, bool):
        found = [r for r in runs if r.run_id == run]
        if not found:
            raise ValueError(f"no run #{run}: the runs are " + ", ".join(f"#{r.run_id}" for r in runs))
        run = found[-1]
    return explained(lab, run, f"run #{run.run_id} ({run.label})")


def explainer(lab, run):
    """What a Lab's run keeps as ``RunResult.explainer``: () -> ``lab.explain(run)``, so that
    ``tunekit.explain(run)`` plans the step itself. The Lab is held weakly (a run kept after its
    Lab does not keep the model alive)."""
    ref = weakref.ref(lab)

    def explain_run() -> Explanation:
        lab = ref()
        if lab is None:
            raise ValueError("the Lab that ran this run is gone, and with it the model to plan: "
                             "tunekit.explain(run, tunekit.plan(model, device, ...)) takes the plan")
        return lab_explain(lab, run)
    return explain_run


def explained(lab, run, label: str, plan=None) -> Explanation:
    """``run`` against ``lab.plan`` of its toggles on its device (``plan``: that plan, made
    already: lab.expect's cache); a ValueError says why it cannot be (a distributed run, a device
    without a spec row, a plan without an expected step)."""
    if run.parallel:
        raise ValueError("lab.explain explains a one-process run (each rank's trace is its own)")
    if plan is None:   # planned once per shape: lab.expect's cache (the Setting lab.expect makes of a base run)
        from tunekit.core.setting import Setting
        from tunekit.lab.plan import cached_plan
        from tunekit.planning.target import lab_setting

        setting = Setting(**lab_setting(lab, **run.toggles.asdict()))
        plan = cached_plan(lab, plan_device(run.device), setting, verbose=True)
    missing = of_kind(plan.notes, "expected.missing", "device.no_peak")
    if plan.expected is None:
        # as lab.expect says it: why the plan has none (a mixture of experts' fake step that failed: analytic)
        raise ValueError(str(missing[0]) if missing else f"lab.explain: the plan of this run has no expected step "
                         f"on {plan.device}: " + "; ".join(str(n) for n in plan.notes[:2]))
    # the headline takes the run's own step (timed without the profiler); the groups, the trace's
    expected = expected_step(plan.expected, run.toggles.grad_accum)   # the run's step: all its micro-batches
    e = explain_trace(as_breakdown(run.trace), expected, steps=1, setting=run.toggles,
                      conditions=run.conditions, label=label, step_s=run.step_s)
    e.notes += missing
    return e


def run_line(lab, run) -> tuple[str | None, list]:
    """(``Explanation.line``, []) of a traced run, or (None, [a Note of kind "explain.none" saying
    why there is none]); (None, []) for a run with no trace. The plan is made here, after the run's
    steps; whatever it cannot do is said, never raised: the run stands without its line."""
    if run.trace is None or run.status != "ok":
        return None, []
    try:
        return explained(lab, run, run.label).line, []
    except ValueError as exc:
        why = str(exc)
    except Exception as exc:   # noqa: BLE001 - planning a model of the user's may fail in any way
        why = f"planning its step failed ({type(exc).__name__}: {exc})"
    return None, [Note("explain.none", f"no expected step to set this traced run against: {why}")]
