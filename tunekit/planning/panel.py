"""The dashboard's "Plan for" panel: pick a device and see the plan of the controls' toggles on
it (``lab.plan``): whether one step fits, in GiB of the device's GiB, and the speed-of-light
bound beside the latest measured run: it formats what ``lab.plan`` returns.

The bound is an upper limit, not a prediction (planning.record): a run is put beside it as a ratio only
when it was measured on the planned device with the planned toggles; otherwise both are shown,
each labelled, and nothing is divided.
"""
from __future__ import annotations

import html

import ipywidgets as W

from tunekit.core import specs
from tunekit.core.fmt import fmt_gib, fmt_pct, fmt_rate, fmt_tflops
from tunekit.core.setting import Toggles, step_words
from tunekit.core.specs import find_spec
from tunekit.core.units import is_missing
from tunekit.planning.planner import SAME_STEP
from tunekit.planning.record import Plan, to_text


def planned_toggles() -> tuple:
    """The toggles whose values make the planned step, as declared now (`Toggles`): every one but
    those the plan knows change nothing in its step (`planner.SAME_STEP`: grad_accum, lr, compile).
    A run under other values of these is not the planned step (no ratio to the bound)."""
    return tuple(n for n in step_words(Toggles) if n not in SAME_STEP)


NO_PLAN = "—"


def plan_devices() -> list:
    """The picker's options: none (no plan), this machine, then every GPU row (core.gpus) with a
    memory size (a plan needs one)."""
    return [(NO_PLAN, None), ("cpu", "cpu")] + [(g.name, g.name) for g in specs.rows() if g.memory_gb]


def measured_on(run_device: str, plan_device: str) -> bool:
    """Whether a run's device ('cpu (2 threads)', 'cuda:0 (NVIDIA H100 80GB HBM3)') is the
    planned one ('cpu', 'H100 SXM')."""
    if plan_device == "cpu":
        return run_device.startswith("cpu")
    spec = find_spec(run_device)
    return spec is not None and spec.name == plan_device


def latest_run(runs):
    """The latest run that measured something (a failed run's figures are NaN)."""
    return next((r for r in reversed(runs) if r.status == "ok" and not is_missing(r.tokens_per_s)), None)


def plan_html(p: Plan, run=None) -> str:
    """The panel: the plan's head line, fits or not, the bound, the measured run beside it."""
    fits = (f"✓ fits: {fmt_gib(p.total_bytes)} of {fmt_gib(p.device_memory_bytes)} "
            f"({fmt_gib(p.headroom_bytes)} free)" if p.fits else
            f"✗ does NOT fit: {fmt_gib(p.total_bytes)} of {fmt_gib(p.device_memory_bytes)} "
            f"({fmt_gib(-p.headroom_bytes)} over)")
    if is_missing(p.bound_tokens_per_s):
        bound = "no speed bound (the device lists no peak for this precision: see the plan's notes)"
    else:
        bound = (f"≤ {fmt_rate(p.bound_tokens_per_s, f'{p.unit}/s')}"
                 + (f" · MFU ≤ {fmt_pct(p.bound_mfu)} of {fmt_tflops(p.peak_tflops)}"
                    if not is_missing(p.bound_mfu) else ""))
    lines = [f"<b>{html.escape(to_text(p).splitlines()[0])}</b>", fits, f"bound (upper limit): {bound}"]
    lines += advice_lines(p)
    if run is not None:
        here = measured_on(run.device, p.device)
        # each MFU is against its own peak (a Lab may be given one): both are said
        lines.append(f"measured on {html.escape(run.device)}, run #{run.run_id} {html.escape(run.label)}: "
                     + fmt_rate(run.tokens_per_s, f"{getattr(run, 'throughput_unit', 'tokens') or 'tokens'}/s")
                     + (f" · MFU {fmt_pct(run.mfu)} of {fmt_tflops(run.peak_tflops)}"
                        if here and not is_missing(run.mfu) and run.peak_tflops else "")
                     + (" · busy machine" if run.conditions is not None and run.conditions.busy else ""))
        same = all(getattr(run.toggles, k) == getattr(p.setting, k) for k in planned_toggles())
        if here and same and not is_missing(p.bound_tokens_per_s):
            lines.append(f"measured / bound: {fmt_pct(run.tokens_per_s / p.bound_tokens_per_s)} of the speed of light")
        elif here:
            lines.append("the run's toggles differ from the plan's: no ratio")
    color = "#2ca02c" if p.fits else "#d62728"
    full = f"<details><summary>the plan in full</summary><pre>{html.escape(to_text(p))}</pre></details>"
    return (f'<div style="border-left:4px solid {color};padding:4px 8px;margin:4px 0">'
            + "<br>".join(lines) + full + "</div>")


def advice_lines(p: Plan) -> list:
    """The best three combinations of changes that fit (plan.advice), each with its caveats' kinds."""
    out = []
    for i, o in enumerate(p.advice[:3], 1):
        rate = ("no expected speed" if is_missing(o.tokens_per_s) else
                f"expected {fmt_rate(o.tokens_per_s, f'{p.unit}/s')}" + (" per GPU" if o.gpus > 1 else ""))
        caveats = "".join(f" ⚠ {html.escape(n)}" for n in o.notes)
        out.append(f"try {i}: <code>{html.escape(o.label)}</code>: {fmt_gib(o.total_bytes)}, {rate}"
                   f"<small>{caveats}</small>")
    return out


class PlanPanel:
    """The picker (``picker``: a device, or none) and what it shows (``html``; ``last``: the
    Plan shown, None when none is)."""

    def __init__(self, style: dict):
        self.picker = W.Dropdown(options=plan_devices(), value=None, description="Plan for", style=style,
                                 tooltip="plan one step of the controls' toggles on a device (lab.plan): "
                                         "fits or not, and the speed-of-light bound")
        self.html = W.HTML()
        self.last = None

    def show(self, lab, toggles: dict):
        """Plan ``toggles`` on the picked device and show it (nothing when none is picked); a
        failure clears the panel and is raised for the dashboard to explain."""
        self.last, self.html.value = None, ""
        if self.picker.value is None:
            return None
        p = lab.plan(self.picker.value, **toggles)
        self.last = p
        self.html.value = plan_html(p, latest_run(lab.runs))
        return p
