"""A plan drawn: what the step holds against the device's memory, and the bytes alive over the
step with its peak. (plotly)

    >>> tunekit.planning.plot_plan(tunekit.plan(cfg, "H100 SXM", precision="bf16")).show()
"""
from __future__ import annotations

from tunekit.core.fmt import fmt_gib
from tunekit.core.units import GiB, is_missing
from tunekit.planning.record import Plan
from tunekit.view.axes import value_range
from tunekit.view.renderer import never_a_browser

PHASES = (("forward", "#1f77b4"), ("backward", "#d62728"), ("optimizer step", "#2ca02c"))
FIXED_COLOR = "#7f7f7f"
PARTS = {"weights": "#636efa", "master_weights": "#19d3f3", "gradients": "#EF553B", "optimizer_states": "#00cc96",
         "weight_casts": "#FFA15A", "activations": "#ab63fa", "buffers": "#B6E880", "gathered_params": "#FF97FF",
         "unsharded_grads": "#FECB52", "ddp_buckets": "#FF6692"}


def plot_plan(plan: Plan, title: str | None = None):
    """Two panels: the components (and fixed costs) stacked beside the device's memory, and the
    live bytes over the step (one device, in allocation order, by phase) with the peak marked.
    Bytes in GiB, axes from zero.

    Example: ``tunekit.planning.plot_plan(tunekit.plan(cfg, "A100", precision="bf16")).show()``."""
    from plotly.subplots import make_subplots

    if not isinstance(plan, Plan):
        raise TypeError(f"plot_plan takes a tunekit.Plan (tunekit.plan(...)), got {type(plan).__name__}")
    never_a_browser()
    fig = make_subplots(rows=1, cols=2, column_widths=[0.3, 0.7], horizontal_spacing=0.12,
                        subplot_titles=("the components (not all alive at once)",
                                        "alive over one step" + (" (the model unsharded, on one device)"
                                                                 if plan.parallel else "")))
    parts = [(k, v) for k, v in plan.components.items() if v] + [(k, b) for k, (b, _) in plan.fixed.items()]
    for name, size in parts:
        fig.add_bar(x=["components"], y=[size / GiB], name=name.replace("_", " "), row=1, col=1,
                    marker_color=PARTS.get(name, FIXED_COLOR), legendgroup="parts",
                    hovertemplate=f"{name}: %{{y:.3f}} GiB<extra></extra>")
    memory = plan.device_memory_bytes / GiB
    fig.add_hline(y=memory, line_dash="dash", line_color="black", row=1, col=1,
                  annotation_text=f"{plan.device}: {fmt_gib(plan.device_memory_bytes, 1)}",
                  annotation_position="top left")
    if not is_missing(plan.peak_bytes):
        fig.add_hline(y=plan.total_bytes / GiB, line_color="black", row=1, col=1,
                      annotation_text=f"peak + fixed {fmt_gib(plan.total_bytes)}",
                      annotation_position="bottom right")
    heights = [sum(v for _, v in parts) / GiB, memory, plan.total_bytes / GiB]
    fig.update_yaxes(title_text="GiB", range=value_range(heights), row=1, col=1)
    fig.update_layout(barmode="stack")
    _timeline(fig, plan)
    fig.update_layout(title=title or f"plan · {plan.model} on {plan.device}: "
                      f"{'fits' if plan.fits else 'does NOT fit'}"
                      + (f" (rank 0 of {plan.parallel['kind']} over {plan.world_size})" if plan.parallel else ""),
                      height=520, legend=dict(font=dict(size=11), tracegroupgap=6))
    return fig


def _timeline(fig, plan: Plan) -> None:
    points = plan.timeline
    for phase, color in PHASES:
        xs = [i for i, (ph, _) in enumerate(points) if ph == phase]
        if xs:
            fig.add_scatter(x=xs, y=[points[i][1] / GiB for i in xs], mode="lines", name=phase, row=1, col=2,
                            line=dict(color=color), legendgroup="phases")
    top = max(points, key=lambda p: p[1], default=None)
    if top is not None:
        i = points.index(top)
        side = "top left" if i > 0.7 * len(points) else "top right" if i < 0.3 * len(points) else "top center"
        fig.add_scatter(x=[i], y=[top[1] / GiB], mode="markers+text", name="peak", row=1, col=2,
                        marker=dict(color="black", size=9), text=[f"peak {fmt_gib(top[1])}"],
                        textposition=side, showlegend=False,
                        hovertext=[plan.peak_at], hoverinfo="text")
    fig.update_xaxes(title_text="the step, allocation by allocation (highest of each stretch when long)",
                     rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title_text="GiB alive", range=value_range([p[1] / GiB for p in points], pad=0.25),
                     row=1, col=2)
