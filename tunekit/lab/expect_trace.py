"""What a traced base run says of each op and group for ``lab.expect`` (tunekit.lab.expect): the
profiler's own time out (`untimed`), the run's steady step (`steady_s`), measured over expected per
op and group (`trace_factors`), and the plan's rows for a whole step of ``grad_accum`` micro-batches
(`per_step`, lab.explain).

    >>> by_op, rest, carried, notes = trace_factors(lab, run, plan)   # {op: factor}, {group: factor}, ...
"""
from __future__ import annotations

import math
import statistics
from dataclasses import replace

from tunekit.core.breakdown import Breakdown, as_breakdown
from tunekit.core.explain import GROUPS, _op_name, expected_groups, measured_groups
from tunekit.core.fmt import fmt_ms
from tunekit.core.notes import Note
from tunekit.core.units import is_missing
from tunekit.lab.explain import ONCE_A_STEP, explained, per_step  # noqa: F401 (per_step: lab.expect reads it here)

NaN = math.nan
GROUP_OF = {"matmul": "matmul", "attention": "attention", "optimizer": "optimizer",
            "communication": "communication", "host": "no op running"}   # core.explain's groups
OTHER = "elementwise, norms, copies"
OWN_OPS = ("matmul", "attention", "compute", "memory-bound")   # categories a trace names op by op


def steady_s(run) -> float:
    """The step ``run`` settled at: its timed steps' median (``RunResult.steady_step_s``: one slow step
    calibrates nothing), its mean ``step_s`` where it has no median (a log from before)."""
    median = getattr(run, "step_s_median", NaN)
    return median if isinstance(median, (int, float)) and not is_missing(median) and median > 0 else run.step_s


def untimed(trace: Breakdown, step_s: float) -> tuple[Breakdown, float]:
    """The trace with the profiler's own time taken out, and the scale still left to ``step_s``.

    torch.profiler's cost is per recorded op (its callbacks at each op's entry and exit), not per
    second of work: a trace's wall over the untraced step, spread over its recorded op calls, is the
    cost of one call, taken out of each op's self time by its calls. Scaling every op by traced /
    untraced time instead would shrink the long ops (the matmuls a bigger batch grows) and keep the
    many short ones' overhead, so a change that grows the long ops would be expected too small.
    Where the traced step was no slower (noise), nothing is taken out; what remains is scaled to
    ``step_s`` (an op's time is never taken below nothing)."""
    calls = sum(o["calls"] for o in trace.top_ops)
    excess = trace.wall_s - step_s
    per_call = excess / calls if excess > 0 and calls else 0.0
    ops = [{**o, "self_s": max(0.0, o["self_s"] - o["calls"] * per_call)} for o in trace.top_ops]
    untraced = trace.untraced_s if not is_missing(trace.untraced_s) else 0.0
    wall = sum(o["self_s"] for o in ops) + max(0.0, untraced)
    out = replace(trace, top_ops=ops, wall_s=wall)
    return out, (step_s / wall if wall > 0 else 1.0)


def trace_factors(lab, run, base_plan, base_rows=None) -> tuple[dict, dict, dict, list]:
    """From a traced run and its plan: ({op: factor}, {group: factor of its other ops},
    {group: measured seconds nothing was expected for}, notes). The profiler's own time is taken
    out of the trace per recorded op (`untimed`) and the rest scaled to the run's own steady step,
    read by lab.explain's grouping. ``base_rows``: the plan's rows for the run's whole step
    (`per_step`; None: the plan's own, one micro-batch).

    One traced step is one sample of a shared machine: a factor more than ``SANE_CARRY`` times its
    group's (an op's; a group's rest of ops likewise) or ``FAR_GROUP`` times the median of the other
    groups' (a group's: `far_groups`) was slowed by something else and is not carried: the group's factor is
    taken instead (a group's: the other groups' together), and a note (``expect.outlier``) names it."""
    e = explained(lab, run, f"run #{run.run_id}", plan=base_plan)   # refuses what cannot be set against its plan
    trace, scale = untimed(as_breakdown(run.trace), steady_s(run))
    m_groups, m_ops = measured_groups(trace)
    base_rows = base_plan.expected.rows if base_rows is None else base_rows
    e_groups, _ = expected_groups(base_rows)
    e_ops_by_group: dict = {}    # group -> {op: expected seconds} of the ops a trace names
    for op, cat, _calls, secs, _b, _s in base_rows:
        if cat in OWN_OPS:
            ops = e_ops_by_group.setdefault(GROUP_OF.get(cat, OTHER), {})
            ops[_op_name(op)] = ops.get(_op_name(op), 0.0) + secs
    by_op, rest, carried, outliers = {}, {}, {}, []
    measured = {g: m_groups.get(g, 0.0) * scale for g in GROUPS}
    far, others = far_groups(measured, e_groups)   # a burst of load on one group (an update measured at 18x)
    for group in GROUPS:
        m, exp = measured[group], e_groups.get(group, 0.0)
        whole = m / exp if exp > 0 and m > 0 else NaN
        if group in far:
            outliers.append((group, whole, "the other groups'", others))
            rest[group] = others
            continue
        m_left, e_left = m, exp
        for name, e_o in e_ops_by_group.get(group, {}).items():
            m_o = m_ops.get(name, (0.0, 0))[0] * scale
            if m_o > 0 and e_o > 0:
                if not _within(m_o / e_o, whole):   # its time stays in its group's rest
                    outliers.append((name, m_o / e_o, f"{group}'s", whole))
                    continue
                by_op[name] = m_o / e_o
                m_left, e_left = m_left - m_o, e_left - e_o
        if e_left > 1e-12 and m_left > 0:
            rest[group] = m_left / e_left if _within(m_left / e_left, whole) else whole
        elif e_left > 1e-12:   # its other expected ops ran under names the trace did not show
            rest[group] = whole if exp > 0 and m > 0 else 1.0
        elif m_left > 1e-12:
            carried[group] = m_left
    notes = list(e.notes) + ([outlier_note(outliers)] if outliers else [])
    if carried:
        said = ", ".join(f"{g} {fmt_ms(s)}" for g, s in carried.items())
        notes.append(Note("expect.not_carried", "measured time the base plan foresaw nothing for, carried as "
                                                f"measured: {said}"))
    return by_op, rest, carried, notes


SANE_CARRY = 4.0   # a traced op's factor carries while at most this factor over its group's
# a group's while at most this factor over the other groups' median: wider, since a whole group the device
# model leaves out some of (the host's Python between ops in a transformers model) is off by itself
FAR_GROUP = 8.0


def _within(f: float, ref: float, sane: float = SANE_CARRY) -> bool:
    """Whether factor ``f`` is at most ``sane`` times ``ref`` (True where either is unknown). Only
    above: other work on the machine only ever slows a step, so a factor far below its group's is
    the op's own (the device model over-counts it), not a burst of load."""
    if is_missing(f) or is_missing(ref) or not (f > 0 and ref > 0):
        return True
    return f / ref <= sane


def far_groups(measured: dict, expected: dict) -> tuple[set, float]:
    """(the groups whose factor, measured over expected seconds, is more than ``FAR_GROUP`` times
    the median of the other groups' factors; the factor of the step's other foreseen groups,
    measured over expected seconds). Judged only with at least three groups measured, and only
    where some group is left to take the factor of (else none is far)."""
    f = {g: measured[g] / e for g, e in expected.items() if e > 0 and measured.get(g, 0.0) > 0}
    if len(f) < 3:
        return set(), NaN
    far = {g for g in f if not _within(f[g], statistics.median(v for o, v in f.items() if o != g), FAR_GROUP)}
    kept = [g for g in f if g not in far]
    if not far or not kept:
        return set(), NaN
    return far, sum(measured[g] for g in kept) / sum(expected[g] for g in kept)


def outlier_note(outliers) -> Note:
    """The note of the traced factors `trace_factors` did not carry: far outside their group's."""
    said = ", ".join(f"{what} {f:.1f}x ({ref_name} {ref:.2f}x)" for what, f, ref_name, ref in outliers[:6])
    return Note("expect.outlier", f"traced factors more than {SANE_CARRY:g}x their group's (a group: "
                                  f"{FAR_GROUP:g}x the other groups' median) not carried, that factor "
                                  f"taken instead (one traced step slowed by other work): {said}"
                                  + (" ..." if len(outliers) > 6 else ""))


def traced_factors(lab, run, base_plan, notes: list, base_rows=None):
    """`trace_factors` as ``calibrated_rows`` takes them, its notes added to ``notes``; None (and
    a note why) where the trace cannot be set against the plan: the step time calibrates then."""
    try:
        by_op, rest, carried, more = trace_factors(lab, run, base_plan, base_rows)
    except ValueError as exc:
        notes.append(Note("expect.step_only", f"run #{run.run_id}'s trace was not set against its plan ({exc})"))
        return None
    notes += more
    return by_op, rest, carried, "trace"


# --- the carry: which factor each row of the new setting takes ------------------------------------

RESIZED_CARRY = 4.0   # an op's own factor carries while its expected time per call stays within this factor


def calibrated_rows(rows, base_rows, factors, dtypes=None, base_dtypes=None) -> tuple[list, list, list]:
    """The new setting's expected rows, each with its factor and what gave it; the names of its ops
    the base plan did not have (new: the device model uncalibrated); and (op, base signatures, new
    signatures) of the ops whose kernels run at other dtypes than the base run measured them at.

    A factor is a property of the kernel that ran: (op name, dtypes, size). ``dtypes`` /
    ``base_dtypes`` (`Expected.dtypes`: {op: its kernels' dtype signatures}) say which kernel each
    row is; an op whose signatures differ from the base's (a bf16 step's matmuls, casts and SDPA
    under the names of the fp32 ones) takes no factor measured of its name at the other dtype: its
    group's where the group's measured kernels include its own signatures, else the base's kernels'
    together (`whole_step`: how fast this machine ran the step's kernels against the device model,
    no one kernel's efficiency; by "step"). The device model alone would drop that: at 1.2-5x on a
    CPU, a bf16 step expected at 0.3x of the fp32 base it measured 1.0x of. A row neither names (the
    host's rows, the update on fp32 parameters either way, a plan without signatures) counts as the
    same kernel."""
    by_op, rest, carried, how = factors
    dtypes, base_dtypes = dtypes or {}, base_dtypes or {}
    base_call: dict = {}   # op name -> (expected seconds, calls) in the base plan
    group_sigs: dict = {}  # group -> the dtype signatures of the base's kernels in it
    for r in base_rows:
        s0, c0 = base_call.get(_op_name(r[0]), (0.0, 0))
        base_call[_op_name(r[0])] = (s0 + r[3], c0 + r[2])
        group_sigs.setdefault(GROUP_OF.get(r[1], OTHER), set()).update(base_dtypes.get(r[0], ()))
    out, new, other, step_f = [], [], [], None
    for op, cat, calls, secs, _bound, _src in rows:
        name, group = _op_name(op), GROUP_OF.get(cat, OTHER)
        sigs, base_sigs = dtypes.get(op), base_dtypes.get(op)
        if how == "none":
            f, by = 1.0, "device model"
        elif name not in base_call:
            f, by = 1.0, "device model"
            new.append(op)
        elif sigs != base_sigs and (how != "trace" or not set(sigs or ()) <= group_sigs.get(group, set())):
            f, by = whole_step(base_rows, factors) if step_f is None else step_f, "step"
            step_f = f
            other.append((op, base_sigs or (), sigs or ()))
        elif how == "step time":
            f, by = rest, "step"
        elif sigs == base_sigs and cat in OWN_OPS and name in by_op and _same_size(secs, calls, *base_call[name]):
            f, by = by_op[name], "op"
        else:
            f, by = rest.get(group, 1.0), "group"
        out.append((op, cat, calls, secs, f, secs * f, by))
    for group, secs in (carried.items() if how == "trace" else ()):
        out.append((f"{group} (measured, not foreseen)", group, 0, 0.0, NaN, secs, "measured"))
    return out, new, other


def from_the_base(rows, base_rows, skip=()) -> list:
    """The new setting's calibrated ``rows`` (`calibrated_rows`) as changes to the base's
    (``base_rows``: the base setting's rows calibrated by the same factors), op by op: an op the
    new setting runs more of (its planned seconds grow) keeps what the base measured of it and adds
    its planned growth at its new factor; one it runs less of is never expected above the base's.
    A change of factor (the op resized past `RESIZED_CARRY`, the group's factor in place of its
    own) then never turns more work into less time: checkpointing, which adds a forward and removes
    nothing, is never expected faster (issue 39's property). Ops in ``skip`` (other dtypes' kernels,
    ops the base did not have) and rows of no planned time (measured, not foreseen) are kept as they are."""
    def sums(rs) -> dict:
        d: dict = {}
        for r in rs:
            plan_s, got = d.get(r[0], (0.0, 0.0))
            d[r[0]] = (plan_s + r[3], got + r[5])
        return d
    new, old = sums(rows), sums(base_rows)
    scale = {}
    for op, (plan_s, got) in new.items():
        if op in skip or op not in old or not (plan_s > 0 and got > 0):
            continue
        base_plan, base_got = old[op]
        target = base_got + (plan_s - base_plan) * got / plan_s if plan_s >= base_plan else min(got, base_got)
        scale[op] = target / got
    return [(*r[:4], r[4] * scale[r[0]], r[5] * scale[r[0]], r[6]) if r[0] in scale else r for r in rows]


def whole_step(base_rows, factors, categories=OWN_OPS) -> float:
    """The base's calibrated kernels over its plan's: how fast this machine ran the step's kernels
    (the rows of ``categories``: the matmuls, attention and memory-bound ops) against the device
    model, each row by the factor it takes as itself; the host's Python between ops and the update
    aside (a kernel at another dtype is neither). 1.0 where there is none."""
    rows = [r for r in calibrated_rows(base_rows, base_rows, factors)[0] if r[1] in categories]
    plan, got = sum(r[3] for r in rows), sum(r[5] for r in rows)
    return got / plan if plan > 0 and got > 0 else 1.0


def other_dtype_note(run_id, other) -> Note:
    """The note of the ops `calibrated_rows` could not calibrate: their kernels run at other dtypes."""
    def sig(s):
        return "/".join(s) or "none"
    said = ", ".join(f"{op} ({sig(a)} -> {sig(b)})" for op, a, b in other[:5]) + (" ..." if len(other) > 5 else "")
    return Note("expect.other_dtype", f"ops whose kernels run at other dtypes than run #{run_id} measured them "
                                      f"at: at the device model times run #{run_id}'s kernels' factor together, "
                                      f"not their own (a factor measured at one dtype is no rate for another's "
                                      f"kernel): {said}")


def _same_size(secs, calls, base_secs, base_calls) -> bool:
    """An op's measured/expected factor is a property of the op at its size: what a tiny call
    measured beyond the plan (a fixed cost per call) is no rate for a call hundreds of times
    larger (a bf16 cast of every weight: 1.3 ms where fp32's cast of an index was 4 us, measured
    30x its plan). Past ``RESIZED_CARRY`` either way, its group's factor carries instead."""
    if not (secs > 0 and base_secs > 0 and calls and base_calls):
        return True
    k = (secs / calls) / (base_secs / base_calls)
    return 1 / RESIZED_CARRY <= k <= RESIZED_CARRY
