"""``lab.expect``: a setting's expected step time, tokens/s, MFU and peak memory on the Lab's own
device, before it runs, calibrated by the Lab's measured runs.

    >>> e = lab.expect(checkpointing=True)   # what lab.run(checkpointing=True) would take here
    >>> e.line                # 'expected 31.2 ms/step calibrated by run #3 (+24% vs run #3; 2.1 ms by the
    ...                       #  device model, uncalibrated), peak 1.2 GiB (-38%)'
    >>> e.changes                             # the ops the change adds, removes or resizes

The device model is the plan's expected step (``lab.plan(device, setting=...)``: `Plan.expected`,
each op of the fake step at the speed its kind reaches on the device) and the plan's peak. A
measured run of the same Lab on the same device (the last one; ``base=run`` picks another)
calibrates it, the way ``lab.explain`` sets a run against its plan (lab.explain.explained):

- a traced run: each op the trace and the base plan share gets measured / expected of that op;
  the other ops of a group (matmul, attention, elementwise, optimizer, the host's time) the
  group's rest ratio; the new setting's rows take the factor of the same op, so an op the change
  resizes keeps its measured efficiency. A factor belongs to the kernel that ran (op name, dtypes,
  size): an op whose kernels run at other dtypes (bf16's matmuls, casts, SDPA under fp32's names)
  takes its group's only where the group measured kernels of its dtypes, else the base's whole
  step's factor (note ``expect.other_dtype``). A traced run's factors come from the median of its
  traced steps, and a factor far over its group's (a burst of load) is not carried
  (``expect.outlier``). Ops new to the setting (in its plan, not in the base's)
  get the device model uncalibrated; measured time the base plan foresaw nothing for is carried
  as it was measured. The trace's seconds are scaled to the run's own steady step (the median of its
  timed steps, without the profiler). The new setting is the base's calibrated rows changed op by op
  (`from_the_base`: an op it runs more of keeps the base's measured time and adds its growth), and
  what of the base's step no factor carried (an outlier's time) is kept as measured (``expect.kept``):
  the base setting's expectation is the base run's step exactly, and more work never less time;
- an untraced run: one ratio, measured (median) / expected step, for the whole step;
- memory: the plan's peak plus what the base run measured beyond its plan: on a GPU the
  allocator's (measured / planned, a ratio); on a CPU the meter is the process's RSS from a
  settled start (measure.device_meter.DeviceMeter): the process's floor as it is now, plus the plan's
  peak, plus the base run's unplanned bytes scaled by the tokens of a micro-batch (`peak_of`), plus
  what a CPU kernel library keeps once per process for the setting's matmul and attention kernels
  tunekit's steps in this process have not run yet (lab.expect_peak, measure.first_use).

Plans are cached per Lab by the device and the setting words that change the fake step (all
but ``lr``), so asking again is instant.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

from tunekit.core.explain import DEVICE_MODEL, basis_words
from tunekit.core.fmt import fmt_bytes, fmt_ms, fmt_pct, fmt_rate
from tunekit.core.notes import Note
from tunekit.core.setting import Setting, step_words
from tunekit.core.toggles import ToggleError, Toggles, label
from tunekit.core.units import is_missing
from tunekit.lab import fit
from tunekit.lab.expect_peak import HELD, held_bytes, lab_floor_bytes, peak_of, prepare_first_use  # noqa: F401 (their home: expect_peak)
from tunekit.lab.expect_trace import (
    ONCE_A_STEP,
    calibrated_rows,
    from_the_base,
    other_dtype_note,
    per_step,
    steady_s,
    traced_factors,
)
from tunekit.lab.explain import plan_device
from tunekit.lab.plan import cached_plan
from tunekit.lab.setting import setting_of, toggles_of
from tunekit.planning.target import lab_setting
from tunekit.view.progress import wait_progress

NaN = math.nan
CHANGED = 0.01              # an op whose expected time moves by more than this share is "resized"


@dataclass
class Expectation:
    """A setting's expected step on the Lab's device. ``rows``: (op, category, calls, plan_s,
    factor, expected_s, by) with ``by`` "op" / "group" (calibrated by the base run's op or its
    group), "step" (by its step time alone, or a kernel at other dtypes by the base's whole step),
    "device model" (uncalibrated) or "measured" (time the base plan foresaw nothing for, carried as
    measured); ``changes``: (op, category, base_s, expected_s, "added" | "removed" | "resized")
    against the base setting's expectation."""

    setting: Setting
    device: str
    step_s: float
    tokens_per_s: float
    mfu: float
    peak_bytes: float
    plan_step_s: float                  # the device model's, uncalibrated
    plan_peak_bytes: float
    base_run: int | None                # the run that calibrated it (None: none)
    base_step_s: float = NaN            # what it measured (or, with no run, the base plan's)
    base_peak_bytes: float = NaN
    calibration: str = "none"           # "trace" | "step time" | "none"
    rows: list = field(default_factory=list)
    changes: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    tokens_per_step: float = NaN        # the setting's, and the base's: a step of another size is also said per token
    base_tokens_per_step: float = NaN
    base_busy: bool = False             # the calibrating run was measured on a busy machine
    unit: str = "tokens"                # what a step counts: "tokens", or "samples" (a batch_fn of your own)
    available_bytes: float = NaN        # memory free beyond what the process holds (NaN: not known)
    fits: bool = True                   # False: lab.run would refuse it (note expect.wont_fit)
    base_differs: str = ""              # what the base run ran that this setting does not ("T=64 ckpt off")

    @property
    def vs(self) -> str:
        if self.base_run is None:
            return "the Lab's setting"
        return f"run #{self.base_run}" + (f" ({self.base_differs})" if self.base_differs else "")

    @property
    def line(self) -> str:
        """'expected 31.2 ms/step calibrated by run #3 (+24% vs run #3; 2.1 ms by the device model,
        uncalibrated), peak 1.2 GiB (-38%)': which figure it is, and the device model's own (the one
        ``lab.explain`` sets a run against), in the same words (core.explain.basis_words)."""
        def delta(new, old):
            return times_or_pct(new, old) if old and not is_missing(old) else "n/a"
        vs = f"{delta(self.step_s, self.base_step_s)} vs {self.vs}"
        tokens, base_tokens = self.tokens_per_step, self.base_tokens_per_step
        if tokens > 0 and base_tokens > 0 and tokens != base_tokens:
            vs += f", {delta(self.step_s / tokens, self.base_step_s / base_tokens)} per {self.unit.removesuffix('s')}"
        if self.base_run is not None:
            vs += f"; {fmt_ms(self.plan_step_s)} {DEVICE_MODEL}"
        if self.base_busy:
            vs += f"; run #{self.base_run} was busy: uncertain"
        fit = "" if self.fits else f": does not fit, {fmt_bytes(self.available_bytes)} available"
        return f"expected {fmt_ms(self.step_s)}/step {basis_words(self.base_run)} ({vs}), " \
               f"peak {fmt_bytes(self.peak_bytes)} ({delta(self.peak_bytes, self.base_peak_bytes)}){fit}"

    @property
    def table(self):
        """pandas DataFrame of ``rows``."""
        import pandas as pd
        return pd.DataFrame(self.rows, columns=["op", "category", "calls", "plan_s", "factor", "expected_s", "by"])

    def summary(self) -> str:
        run = f"run #{self.base_run}"
        how = {"trace": f"calibrated op by op by {run}'s trace",
               "step time": f"calibrated by {run}'s step time (one ratio)",
               "none": f"{DEVICE_MODEL} (no measured run of this Lab here)"}[self.calibration]
        lines = [self.line, f"{fmt_rate(self.tokens_per_s, self.unit + '/s')}, MFU {fmt_pct(self.mfu)}; {how}"]
        for op, _cat, base, new, what in self.changes[:6]:
            lines.append(f"- {op}: {what} ({fmt_ms(base, True)} -> {fmt_ms(new, True)})")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        head, *rest = self.summary().split("\n")
        items = "".join(f"<li>{html.escape(x.lstrip('- '))}</li>" for x in rest)
        return f"<div><b>{html.escape(head)}</b><ul>{items}</ul></div>"


def times_or_pct(new: float, old: float) -> str:
    """``new`` against ``old`` as a signed percentage, or as a multiple from 100x on (where a
    percentage runs to many digits): ``times_or_pct(0.072, 0.036) == "+100%"``, 10**9 times "1e+09x"."""
    ratio = new / old
    return f"{ratio:.3g}x" if ratio >= 100 else fmt_pct(ratio - 1, 0, signed=True)


# --- the setting asked about, and the base run ----------------------------------------------------

def asked_setting(lab, setting, changes: dict) -> Setting:
    """The Setting ``lab.run(setting=..., **changes)`` would take; bad keywords and settings that
    cannot run here are refused (ToggleError / TypeError / ValueError) before any planning."""
    unknown = sorted(set(changes) - set(step_words(Toggles)))
    if unknown:
        raise TypeError(f"lab.expect: unknown keyword(s) {unknown}; it takes the toggles "
                        f"{list(step_words(Toggles))} or setting=tunekit.Setting(...)")
    if isinstance(setting, Setting) and (setting.parallel is not None or setting.world_size not in (None, 1)):
        raise ValueError("lab.expect expects a one-process step on the Lab's device; a sharded setting's "
                         "step: lab.plan(device, setting=...).expected")
    s = setting_of(lab, setting, changes, api="lab.expect", one_process=True)   # the Lab's edge, as lab.run's
    t = lab.resolve(**toggles_of(s))
    why = lab.check(t)
    if why:
        raise ToggleError(why)
    fit.refuse_cheaply(lab, t, "lab.expect: this setting")   # lab.run's memory check, before a fake step
    return s


def base_run(lab, device: str, base=None):
    """The run that calibrates: ``base`` (a RunResult or run id), else the Lab's last measured
    one-process run on ``device`` (None: there is none)."""
    runs = lab.runs
    if isinstance(base, int) and not isinstance(base, bool):
        found = [r for r in runs if r.run_id == base]
        if not found:
            raise ValueError(f"no run #{base}: " + ("the runs are " + ", ".join(f"#{r.run_id}" for r in runs)
                                                   if runs else "this Lab has no run yet (lab.run() first, or "
                                                                "lab.expect() without base=: the device model)"))
        base = found[-1]
    # a log the Lab resumed may hold runs of other models: only a run of this model calibrates it
    n_params = sum(p.numel() for p in lab.model.parameters())
    if base is not None:
        if not hasattr(base, "step_s") or getattr(base, "status", None) != "ok" or base.parallel \
                or not base.step_s > 0 or _device_of(base) != device or base.n_params != n_params:
            raise ValueError(f"lab.expect(base=...) takes a finished one-process run of this Lab's model "
                             f"({n_params:,} parameters) on {device} (a RunResult or its run id), got {base!r:.120}")
        return base
    session = getattr(lab.log, "session", None)
    for r in reversed(runs):
        if (r.status == "ok" and not r.parallel and r.step_s and r.step_s > 0 and r.n_params == n_params
                and (session is None or r.session == session) and _device_of(r) == device):
            return r
    return None


def _device_of(run) -> str | None:
    try:
        return plan_device(str(run.device).split(" ")[0])
    except ValueError:
        return None


# --- the calibration --------------------------------------------------------------------------

def changes_of(rows, base_rows) -> list:
    """(op, category, base_s, new_s, what) of the ops the setting adds, removes or resizes."""
    def by_name(rs):
        d: dict = {}
        for r in rs:
            d[r[0]] = (r[1], d.get(r[0], (None, 0.0))[1] + r[3])
        return d
    new, old = by_name(rows), by_name(base_rows)
    out = []
    for op in dict.fromkeys([*old, *new]):
        (cat, b), (cat2, n) = old.get(op, (None, 0.0)), new.get(op, (None, 0.0))
        what = "added" if op not in old else "removed" if op not in new else \
            "resized" if abs(n - b) > CHANGED * max(b, n) else None
        if what:
            out.append((op, cat or cat2, b, n, what))
    return sorted(out, key=lambda r: -abs(r[3] - r[2]))


def lab_expect(lab, setting=None, base=None, *, verbose: bool = True, **changes) -> Expectation:
    """`Expectation` of the setting ``lab.run(setting=..., **changes)`` would take, on the Lab's device.
    ``verbose``: the plans' progress (`tunekit.plan`'s: over 2 s, what it is doing and how far, the
    first CPU calibration's rounds included), shown where the plan shows it; False: nothing."""
    s = asked_setting(lab, setting, changes)
    device = plan_device(str(lab.device))
    run = base_run(lab, device, base)
    base_setting = Setting(**lab_setting(lab, **({} if run is None else run.toggles.asdict())))
    plan = cached_plan(lab, device, s, verbose=verbose)
    if plan.expected is None:
        raise ValueError("lab.expect: the plan of this setting has no expected step on "
                         f"{device}: " + "; ".join(str(n) for n in plan.notes[:2]))
    base_plan = cached_plan(lab, device, base_setting, verbose=verbose)
    with wait_progress("lab.expect", verbose) as shown:   # the outer line where lab.expect shows one
        prepare_first_use(lab, plan, shown)
    e = expectation(lab, s, device, plan, base_plan, run, base_setting.grad_accum or 1)
    if run is not None and (differs := label(base_setting, s)) != "baseline":   # the line says what it compares
        e.base_differs = differs
    fit_of(lab, e)
    lab.log.expecting(s, e.step_s, e.peak_bytes, e.base_run)   # the run of this setting keeps it (run log)
    return e


def in_use_bytes(lab) -> float:
    """What the Lab's process holds on its device now: its settled RSS (CPU), the allocator's reserve (GPU)."""
    if lab.device.type == "cpu":
        from tunekit.measure.device_meter import settled_rss_bytes
        return float(settled_rss_bytes())
    import torch
    return float(torch.cuda.memory_reserved(lab.cuda_index)) if lab.device.type == "cuda" else 0.0


def fit_of(lab, e: Expectation) -> None:
    """``e.fits`` False, with a note, where its peak needs more than the memory available now (what
    lab.run checks before it allocates: tunekit.lab.fit)."""
    from tunekit.measure import memavail

    limit = memavail.available(lab.device, lab.cuda_index)
    if limit is None or is_missing(e.peak_bytes):
        return
    need = e.peak_bytes - in_use_bytes(lab)
    e.available_bytes = float(limit.bytes)
    if need > limit.bytes:
        e.fits = False
        e.notes.append(Note("expect.wont_fit", f"the step needs {fmt_bytes(need)} more than the process holds now, "
                                               f"{fmt_bytes(limit.bytes)} is available ({limit.source}): lab.run "
                                               "refuses it (lab.find_max_batch_size finds the largest micro_batch "
                                               "that fits)"))


def expectation(lab, s, device, plan, base_plan, run, base_accum=None) -> Expectation:
    """The Expectation of ``plan`` calibrated by ``run`` (None: uncalibrated) of ``base_plan``; each
    for its whole step (`per_step`: ``s.grad_accum`` micro-batches; ``base_accum``, the base's,
    None: the run's)."""
    notes: list = []
    base_factors = None   # the factors as the base run's own step takes them (its carried time unscaled)
    e, base_e = plan.expected, base_plan.expected
    if base_accum is None:
        base_accum = getattr(getattr(run, "toggles", None), "grad_accum", None) or 1
    accum = s.grad_accum or 1
    e_rows, base_rows = per_step(e.rows, accum), per_step(base_e.rows, base_accum)
    plan_step, base_plan_step = sum(r[3] for r in e_rows), sum(r[3] for r in base_rows)
    if run is None:
        factors, base_step = ({}, {}, {}, "none"), base_plan_step
        notes.append(Note("expect.uncalibrated", "no measured run of this Lab on this device: the device "
                                                 "model alone (lab.run once, traced, to calibrate it)"))
    elif run.trace is not None and (traced := traced_factors(lab, run, base_plan, notes, base_rows)) is not None:
        by_op, rest, carried, how = base_factors = traced
        # what the base plan foresaw nothing for (data, unnamed copies) comes with each micro-batch
        carried = {g: v if g in ONCE_A_STEP else v * accum / base_accum for g, v in carried.items()}
        factors, base_step = (by_op, rest, carried, how), steady_s(run)
    else:
        factors, base_step = ({}, steady_s(run) / base_plan_step, {}, "step time"), steady_s(run)
        if run.trace is None:
            notes.append(Note("expect.step_only", f"run #{run.run_id} was not traced: one ratio (measured / "
                                                  "expected step) for the whole step"))
    rows, new, other = calibrated_rows(e_rows, base_rows, factors, e.dtypes, base_e.dtypes)
    base_cal = calibrated_rows(base_rows, base_rows, base_factors or factors, base_e.dtypes, base_e.dtypes)[0]
    rows = from_the_base(rows, base_cal, skip={*new, *(op for op, _a, _b in other)})
    left = base_step - sum(r[5] for r in base_cal)   # what the base measured that no op's factor carried
    if run is not None and abs(left) > 1e-9 * base_step:
        rows.append((f"run #{run.run_id}, not carried op by op", "measured", 0, 0.0, NaN, left, "measured"))
        notes.append(Note("expect.kept", f"{fmt_ms(left)} of run #{run.run_id}'s step no op's factor carries "
                                         "(factors far past their group's, not carried to other ops) kept as it "
                                         f"was measured: the base setting is expected at run #{run.run_id}'s step"))
    if other and run is not None:
        notes.append(other_dtype_note(run.run_id, other))
    if new and run is not None:
        notes.append(Note("expect.new_ops", "ops the measured run did not have, at the device model "
                                            "uncalibrated: " + ", ".join(new[:5]) + (" ..." if len(new) > 5 else "")))
    step = sum(r[5] for r in rows)
    peak, base_peak, more = peak_of(lab, plan, run, base_plan)
    busy = getattr(getattr(run, "conditions", None), "busy", False) is True
    if busy:
        notes.append(Note("expect.busy", f"run #{run.run_id} was measured on a busy machine: its calibration "
                                         "carries the load"))
    # the plan's rates are one micro-batch's over its step: the whole step's tokens over the expected time
    ratio = e.step_s * accum / step if step > 0 else NaN
    tokens = e.tokens_per_s * e.step_s * accum    # a micro-batch's tokens (the plan's rate x its step), x accum
    base_tokens = (run.tokens_per_step if run is not None and getattr(run, "tokens_per_step", 0)
                   else base_e.tokens_per_s * base_e.step_s * base_accum)
    return Expectation(s, device, step, e.tokens_per_s * ratio, e.mfu * ratio, peak, plan_step, plan.total_bytes,
                       None if run is None else run.run_id, base_step, base_peak, factors[3], rows,
                       changes_of(e_rows, base_rows), notes + more, tokens, base_tokens, busy,
                       getattr(plan, "unit", None) or "tokens")
