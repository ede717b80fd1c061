"""Measured against expected, op by op: ``tunekit.explain``. Pure: no torch; pandas only inside
the method that builds the table.

    >>> e = lab.explain()            # the Lab's last traced run against the plan's expectation
    >>> print(e.summary)             # the largest gaps, in words
    >>> e.table                      # per group of ops: measured, expected, efficiency, share

A traced step (its `Breakdown`: every op's self time) is set beside the expected step of the same
setting on the same device (`Plan.expected`: a time per op from the device's measured or
published figures). Both sides are grouped the same way, by op name (matmuls, attention, the
optimizer, the elementwise/norm/copy ops, communication), and, on the measured side only, the
time no op ran (Python between ops). ``efficiency`` = expected / measured: the share of the
expected speed the run reached. What ran where the plan foresaw nothing (an op its step does not
make, a group it expects no time in) is *not foreseen*: ``foreseen`` False, its expected time
and efficiency NaN, never 0, and said in words (``unforeseen``, the summary).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from tunekit.core.breakdown import (
    ATTENTION,
    COMM,
    CONVOLUTION,
    DATA,
    MATMUL,
    OPTIMIZER,
    UNTRACED,
    Breakdown,
    categorize,
)
from tunekit.core.fmt import fmt_count, fmt_ms, fmt_pct
from tunekit.core.notes import Note
from tunekit.core.refusals import user_facing
from tunekit.core.units import is_missing

NaN = math.nan

# the groups both sides are read into, in the order they are shown
GROUPS = ("matmul", "convolution", "attention", "elementwise, norms, copies", "optimizer", "communication",
          "data loading", "no op running")
_MEASURED = {MATMUL: "matmul", ATTENTION: "attention", OPTIMIZER: "optimizer", COMM: "communication",
             DATA: "data loading", UNTRACED: "no op running"}
_EXPECTED = {"matmul": "matmul", "attention": "attention", "optimizer": "optimizer",
             "communication": "communication", "host": "no op running",
             "compute": "matmul"}   # an op with FLOPs besides these (_scaled_mm, _grouped_mm; a convolution: its own)
# each group in a sentence: its words and their verb
WORDS = {"matmul": "the matmuls take", "convolution": "the convolutions take", "attention": "the attention ops take",
         "elementwise, norms, copies": "the elementwise ops, norms and copies take",
         "optimizer": "the optimizer step takes", "communication": "the collectives take",
         "data loading": "data loading takes", "no op running": "the time between ops takes"}
_SCOPED = (OPTIMIZER, COMM, DATA)    # a trace knows these from the scope an op ran in, not its name
MODULE = "nn.Module: "
# the autograd engine's own time around the ops it calls (a node such as MmBackward0, its
# evaluate_function range, AccumulateGrad's glue): time between ops, not an op a plan makes
_AUTOGRAD = re.compile(r"^(autograd::engine::evaluate_function: .*|torch::autograd::.*|\w+Backward\d*)$")
PROFILER_SHOWN = 0.05   # a profiler overhead above this is said (a note, and in the one line)
# which expected figure a line sets out, in the same words in every API (explain's head, lab.expect's
# line and summary, a run's "predicted" line, the dashboard): the plan's own step, or it calibrated by a
# measured run (lab.expect). explain always sets a run against the former: calibrated by the run
# itself it would read 100%.
DEVICE_MODEL = "by the device model, uncalibrated"


def basis_words(run_id: int | None) -> str:
    """Which expected figure: 'by the device model, uncalibrated' (``run_id`` None) or 'calibrated by run #3'."""
    return DEVICE_MODEL if run_id is None else f"calibrated by run #{run_id}"


_CONV = re.compile(CONVOLUTION)


def _op_name(name: str) -> str:
    """'aten::mm' and 'mm.default' are both 'mm'; a convolution by any kernel (mkldnn_convolution,
    cudnn_convolution, conv2d, ...) is the plan's 'convolution' (its backward 'convolution_backward'),
    and the plan's '_native_batch_norm_legit' the run's 'native_batch_norm'."""
    name = name.removeprefix("aten::").split(".")[0]
    if name.startswith("_native_batch_norm_legit"):   # the fake step's name of the batch norm a run calls
        return "native_batch_norm"
    if _CONV.match(name):
        return "convolution_backward" if "backward" in name else "convolution"
    return name


def _group_of_op(name: str, category: str) -> str:
    """The group of an op by its name: a convolution is compute of its own, not elementwise."""
    if _CONV.match(name.removeprefix("aten::").split(".")[0]):
        return "convolution"
    return category


def measured_groups(trace: Breakdown, steps: int = 1) -> tuple[dict, dict]:
    """({group: seconds per step}, {op: (seconds, calls) per step}) of a traced run."""
    groups: dict = {}
    ops: dict = {}
    for o in trace.top_ops:
        name, secs = o["op"], o["self_s"] / steps
        if name.startswith(MODULE) or _AUTOGRAD.match(name):   # a module's or autograd's own time around ops
            group = "no op running"
        elif "#" in name:                            # a Python function's own time (Optimizer.step#...)
            group = _MEASURED.get(o["category"], "no op running")
        elif o["category"] in _SCOPED:
            group = _MEASURED[o["category"]]
        else:
            group = _group_of_op(name, _MEASURED.get(categorize([name if "::" in name else "aten::" + name]),
                                                     "elementwise, norms, copies"))
            s, c = ops.get(_op_name(name), (0.0, 0))
            calls = o["calls"] / steps
            # a convolution's chain (conv2d > convolution > _convolution > its kernel) is one call
            ops[_op_name(name)] = (s + secs, max(c, calls) if group == "convolution" else c + calls)
        groups[group] = groups.get(group, 0.0) + secs
    untraced = trace.untraced_s if not is_missing(trace.untraced_s) else 0.0
    groups["no op running"] = groups.get("no op running", 0.0) + max(0.0, untraced) / steps
    return groups, ops


def expected_groups(rows) -> tuple[dict, dict]:
    """({group: seconds}, {op: seconds}) of `Expected.rows` (op, category, calls, seconds, bound, source)."""
    groups: dict = {}
    ops: dict = {}
    for op, cat, _calls, secs, _bound, _src in rows:
        group = _group_of_op(op, _EXPECTED.get(cat, "elementwise, norms, copies"))
        groups[group] = groups.get(group, 0.0) + secs
        if cat not in ("optimizer", "communication", "host"):
            ops[_op_name(op)] = ops.get(_op_name(op), 0.0) + secs
    return groups, ops


def speed_pct(x: float) -> str:
    """A share of the expected speed in words that never read 0% for a run that ran: 0.404 -> '40%',
    0.004 -> '0.4%', under 0.1% -> 'under 0.1%'."""
    if is_missing(x) or x >= 0.01:
        return fmt_pct(x, 0)
    return f"{100 * x:.1f}%" if x >= 0.001 else "under 0.1%"   # one decimal, coarse as the words around it


@dataclass
class Explanation:
    """A measured step beside its expectation. ``rows``: (group, measured s, expected s, efficiency,
    share of the measured step, foreseen); ``ops``: (op, measured s, expected s, efficiency, calls,
    foreseen) of the ops that lost the most time; ``unforeseen``: (op, measured s, calls) of every
    op that ran which the plan's step does not make (or makes in no time), most time first. Not
    foreseen: expected and efficiency NaN."""

    label: str
    measured_s: float
    expected_s: float
    rows: list
    ops: list
    gaps: list                     # the largest gaps, in words
    notes: list = field(default_factory=list)
    busy: bool = False             # measured on a busy machine (a note says so too)
    overhead: float = NaN          # how much the profiler slowed the traced step (0.5: by 50%)
    unforeseen: list = field(default_factory=list)

    @property
    def efficiency(self) -> float:
        """Expected over measured step time: the share of the expected speed reached."""
        return self.expected_s / self.measured_s if self.measured_s > 0 else NaN

    @property
    def table(self):
        """pandas DataFrame: group, measured_s, expected_s, efficiency, share (of the measured step),
        foreseen (False: the plan expects no time in it; expected_s and efficiency NaN)."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=["group", "measured_s", "expected_s", "efficiency", "share", "foreseen"])

    @property
    def op_table(self):
        """pandas DataFrame of the ops that lost the most time: op, measured_s, expected_s, efficiency, calls,
        foreseen (False: an op the plan's step does not make; expected_s and efficiency NaN)."""
        import pandas as pd

        return pd.DataFrame(self.ops, columns=["op", "measured_s", "expected_s", "efficiency", "calls", "foreseen"])

    @property
    def head(self) -> str:
        """The step against its expectation, saying which: '77.4 ms per step, 4% of the expected speed
        (3.1 ms expected by the device model, uncalibrated)' (`DEVICE_MODEL`: lab.expect's line says the same
        figure in the same words beside its calibrated one)."""
        return (f"{fmt_ms(self.measured_s)} per step, {speed_pct(self.efficiency)} of the expected speed "
                f"({fmt_ms(self.expected_s)} expected {DEVICE_MODEL})")

    @property
    def caveats(self) -> list:
        """What the figures carry besides the setting's own gaps, in a few words each: a busy
        machine, a profiler that slowed the traced step by over 5%."""
        out = ["⚠ taken on a busy machine"] if self.busy else []
        if not is_missing(self.overhead) and self.overhead > PROFILER_SHOWN:
            out.append(f"the profiler slowed the traced step by {fmt_pct(self.overhead, 0)}")
        return out

    @property
    def line(self) -> str:
        """One line: the step against its expectation, the largest gap, and its caveats (what a traced
        run's summary and the dashboard show)."""
        return " · ".join([self.head + (f"; {self.gaps[0]}" if self.gaps else ""), *self.caveats])

    @property
    def summary(self) -> str:
        lines = [f"{self.label}: {self.head}"] + [f"- {g}" for g in self.gaps]
        if self.unforeseen:
            lines.append("- ops the plan did not foresee: " + ", ".join(
                f"{op} {fmt_ms(s)} ({fmt_count(c)} call{'' if c == 1 else 's'})" for op, s, c in self.unforeseen[:3])
                + (f" and {len(self.unforeseen) - 3} more" if len(self.unforeseen) > 3 else ""))
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def __repr__(self) -> str:
        return self.summary


def _hint(group: str, setting) -> str:
    """What the setting says about a group's gap, where it says something."""
    attention = getattr(setting, "attention", None)
    unfused = attention in ("math", "eager")   # attention as bmm + softmax: counted with those ops
    if group == "attention" and unfused:
        return f"the {attention} backend ran (scores materialized, not a fused kernel)"
    if group == "matmul" and unfused:
        return f"with the {attention} attention's score matmuls (a fused backend runs them in one kernel)"
    if group == "elementwise, norms, copies":
        return ("eager: each elementwise op is a kernel of its own (torch.compile fuses them)"
                if not getattr(setting, "compile", False) else "")
    if group == "no op running":
        return "Python between ops: the step is host-bound (small ops or a small batch)"
    return ""


def explain_trace(trace: Breakdown, expected, *, steps: int = 1, setting=None, conditions=None,
                  label: str = "run", top: int = 5, step_s: float | None = None) -> Explanation:
    """A traced step (``steps`` steps in the trace) against an `Expected` (core.expected).
    ``step_s``: the same step timed without the profiler (a Lab run's), which the one line sets
    against the expectation; the groups are the trace's, its shares of the traced step."""
    if trace is None:
        raise ValueError("nothing traced to explain: run it traced (lab.run(trace=True), %%gpuprofile --trace, "
                         "tunekit.Monitor(model, trace=N)) and explain that run")
    if expected is None:
        raise ValueError("no expectation to explain it with: the plan lacks a figure its device needs "
                         "(its notes say which)")
    m_groups, m_ops = measured_groups(trace, steps)
    e_groups, e_ops = expected_groups(expected.rows)
    measured_s = trace.wall_s / steps
    headline_s = step_s if step_s is not None and step_s > 0 else measured_s
    rows = []
    for g in GROUPS:
        m, e = m_groups.get(g, 0.0), e_groups.get(g, 0.0)
        if m == 0.0 and e == 0.0:
            continue
        seen = e > 0                          # the plan foresaw time here
        rows.append((g, m, e if seen else NaN, e / m if m > 0 and seen else NaN,
                     m / measured_s if measured_s > 0 else NaN, seen))
    lost = sorted(((op, s, e_ops.get(op, 0.0), c) for op, (s, c) in m_ops.items()), key=lambda r: -(r[1] - r[2]))
    ops = [(op, s, e if e > 0 else NaN, e / s if s > 0 and e > 0 else NaN, c, e > 0) for op, s, e, c in lost[:top]]
    unforeseen = [(op, s, c) for op, s, e, c in lost if e == 0 and s > 0]
    busy = getattr(conditions, "busy", False) is True
    gaps = []
    for g, m, e, eff, share, seen in sorted(rows, key=lambda r: -(r[1] - (r[2] if r[5] else 0.0))):
        if m - (e if seen else 0.0) <= 0.05 * measured_s:   # under 5% of the step: not a gap worth a sentence
            continue
        speed = ", not foreseen by the plan" if not seen else f" at {speed_pct(eff)} of the expected speed"
        hint = _hint(g, setting)
        gaps.append(f"{WORDS[g]} {fmt_pct(share, 0)} of the step{speed}" + (f": {hint}" if hint else ""))
    notes = []
    if busy:
        notes.append(Note("explain.busy", "measured on a busy machine: other work took its share of every group, "
                                          "so the gaps are not the setting's alone"))
    if not is_missing(trace.overhead) and trace.overhead > PROFILER_SHOWN:
        notes.append(Note("explain.profiler", f"the profiler slowed the traced step by {fmt_pct(trace.overhead, 0)}: "
                                              "part of every gap is its own"))
    return Explanation(label, headline_s, expected.step_s, rows, ops, gaps[:3], notes, busy, trace.overhead,
                       unforeseen)


def explain_step(expected, *, step_s: float, label: str = "run", conditions=None,
                 where: str | None = None) -> Explanation:
    """An untraced run's step (``step_s``, timed) against an `Expected`: the whole step measured
    beside the expected one, then the plan's groups with their measured side unknown (NaN: nothing
    traced them). ``where``: where it ran, in words (a cluster job's id and nodes), the first note."""
    if expected is None or is_missing(expected.step_s):
        raise ValueError("no expectation to explain it with: the plan lacks a figure its device needs "
                         "(its notes say which)")
    if is_missing(step_s) or step_s <= 0:
        raise ValueError("no measured step to explain: the run ended before a timed step")
    e_groups, _ = expected_groups(expected.rows)
    rows = [("whole step", step_s, expected.step_s, expected.step_s / step_s, 1.0, True)]
    rows += [(g, NaN, e_groups[g], NaN, NaN, True) for g in GROUPS if e_groups.get(g, 0.0) > 0]
    busy = getattr(conditions, "busy", False) is True
    notes = [Note("explain.where", where)] if where else []
    notes.append(Note("explain.untraced", "untraced: the step as a whole against its expectation; the groups "
                                          "show the plan's side only (a traced run sets each beside it)"))
    if busy:
        notes.append(Note("explain.busy", "measured on a busy machine: other work took its share of the step, "
                                          "so the gap is not the setting's alone"))
    return Explanation(label, step_s, expected.step_s, rows, [], [], notes, busy)


def _first_line(x, width: int = 80) -> str:
    """``repr(x)`` on one line: its first line, cut at ``width``, with " ..." where more was left out."""
    text = repr(x)
    line = text.splitlines()[0] if text else text
    return line[:width] + (" ..." if len(line) > width or line != text else "")


@user_facing   # a refusal: the user's line and the message (core.refusals)
def explain(result, plan=None, *, steps: int = 1) -> Explanation:
    """``result`` (a traced Lab `RunResult`, a traced `ProfileRecord`: ``%%gpuprofile --trace``'s or
    the record ``Monitor(trace=N).close()`` returns, or a `Breakdown`) against
    ``plan`` (a `Plan` of the same step on the same device, or its `Expected`); ``steps``: how many
    training steps the traced block ran (a Lab's traced run, a Monitor's: 1). A Lab's run without
    a plan is planned by the Lab that ran it (its model, setting and device: ``lab.explain(run)``).

    Example: ``tunekit.explain(tunekit.last(), lab.plan("cpu"), steps=5).summary``."""
    from tunekit.core.breakdown import as_breakdown

    if not isinstance(result, Breakdown) and not hasattr(result, "trace"):
        raise TypeError("tunekit.explain explains a traced run: a Lab's RunResult (lab.run(trace=True)), a "
                        "ProfileRecord (%%gpuprofile --trace, Monitor(trace=N).close()) or a Breakdown; got "
                        f"{type(result).__name__} {_first_line(result)}")
    if plan is None and callable(getattr(result, "explainer", None)):
        return result.explainer()   # a Lab's run: its Lab plans its step (RunResult.explainer)
    if plan is None:
        raise ValueError(_plan_call(result))
    expected = getattr(plan, "expected", plan)
    trace = as_breakdown(result if isinstance(result, Breakdown) else getattr(result, "trace", None))
    if trace is None and getattr(result, "job", None):   # a cluster run comes home untraced: its whole step
        return explain_step(expected, step_s=result.step_s, label=str(result.label),
                            conditions=result.conditions, where=job_words(result.job))
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, got {steps!r}")
    name = getattr(result, "label", None) or getattr(result, "name", None) or "traced step"
    setting = getattr(result, "toggles", None) or getattr(plan, "setting", None)   # a record's: the plan's
    return explain_trace(trace, expected, steps=steps, setting=setting,
                         conditions=getattr(result, "conditions", None), label=str(name))


def _plan_call(result) -> str:
    """Why ``result`` needs a plan, and the call that makes it: a run's own device and setting written out."""
    toggles, device = getattr(result, "toggles", None), getattr(result, "device", None)
    if toggles is None or not device:
        return ("tunekit.explain needs the plan of the step the result ran: tunekit.explain(result, "
                "tunekit.plan(model, 'cpu', ...)), or lab.explain(run) for a Lab's run")
    from tunekit.core.specs import find_spec

    spec = None if str(device).startswith("cpu") else find_spec(str(device))
    where = "cpu" if str(device).startswith("cpu") else spec.name if spec is not None else str(device)
    words = ", ".join(f"{k}={v!r}" for k, v in toggles.asdict().items() if v is not None and k != "lr")
    return (f"tunekit.explain needs the plan of the step run #{result.run_id} ({result.label}) ran, and a run read "
            f"back from a log has no Lab to plan it: tunekit.explain(run, tunekit.plan(model, {where!r}, {words})), "
            f"model: its {result.model} ({result.n_params:,} parameters)")


def job_words(job: dict) -> str:
    """Where a cluster run ran, in words: 'slurm job 12 on n[0-1] (partition debug, COMPLETED); rank 0
    on n0 (CPUs 0-1), rank 1 on n1 (CPUs 0-1)' (``RunResult.job``)."""
    text = (f"{job.get('engine', 'cluster')} job {job.get('id')} on {job.get('nodes')} "
            f"(partition {job.get('partition')}, {job.get('state')})")
    ranks = job.get("ranks") or []
    if ranks:
        text += "; " + ", ".join(f"rank {r['rank']} on {r['node']}" + (f" (CPUs {_cpu_list(r['cpus'])})"
                                                                       if r.get("cpus") else "") for r in ranks)
    return text


def _cpu_list(cpus) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (the kernel's cpulist form)."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)
