"""``lab.explain``: a Lab's traced run against the expectation of its own step on its own device
(``lab.plan`` under the run's toggles), op group by op group (core.explain)."""
from __future__ import annotations

from tunekit.core.breakdown import as_breakdown
from tunekit.core.explain import Explanation, explain_trace
from tunekit.core.specs import find_spec


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
    if run.parallel:
        raise ValueError("lab.explain explains a one-process run (each rank's trace is its own)")
    plan = lab.plan(plan_device(run.device), **run.toggles.asdict())
    e = explain_trace(as_breakdown(run.trace), plan.expected, steps=1, setting=run.toggles,
                      conditions=run.conditions, label=f"run #{run.run_id} ({run.label})")
    e.notes += [n for n in plan.notes if getattr(n, "kind", None) == "expected.missing"]
    return e
