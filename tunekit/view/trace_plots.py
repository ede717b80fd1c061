"""Figures of a traced run: the time breakdown and the memory timeline. Never measures.

    >>> rec = tunekit.last()                       # after %%gpuprofile --trace --memory
    >>> tunekit.view.plot_breakdown(rec.trace).show(); tunekit.view.plot_memory_timeline(rec.memory).show()
"""
from __future__ import annotations

from tunekit.core.breakdown import CATEGORIES, MEMORY_CATEGORIES, UNTRACED, Breakdown, MemoryTimeline
from tunekit.core.fmt import fmt_mib, fmt_ms
from tunekit.core.units import MiB, is_missing
from tunekit.view.renderer import never_a_browser

_COLORS = dict(zip(CATEGORIES, ("#1f77b4", "#9467bd", "#2ca02c", "#ff7f0e", "#d62728", "#8c564b",
                                "#e377c2", "#17becf", "#7f7f7f", "#c7c7c7")))
_MEM_COLORS = dict(zip(MEMORY_CATEGORIES, ("darkgreen", "mediumblue", "goldenrod", "red", "mediumpurple")))


def _part(x, cls, attr):
    """``x`` itself when it is a ``cls``, else the record's ``attr`` (None when not traced)."""
    return x if isinstance(x, cls) else getattr(x, attr, None)


def plot_breakdown(breakdown, title: str | None = None):
    """One horizontal stacked bar: the traced run's wall time split by op category (ms).

    Takes a Breakdown or a record that has one (``rec.trace``).

    Example: ``tunekit.view.plot_breakdown(lab.run(steps=5, trace=True).trace)``."""
    import plotly.graph_objects as go

    b = _part(breakdown, Breakdown, "trace")
    if b is None:
        raise ValueError("no trace in this record: profile it with --trace / trace=True")
    never_a_browser()
    fig = go.Figure()
    parts = b.parts()
    for cat, share in b.shares().items():  # the categories and, on CPU, the time between ops: 100%
        if parts[cat] > 0:
            fig.add_bar(y=["step"], x=[parts[cat] * 1e3], name=cat, orientation="h",
                        marker_color=_COLORS.get(cat, "#eeeeee"),
                        hovertemplate=f"{cat}{': no op running' if cat == UNTRACED else ''}: "
                                      f"%{{x:.2f}} ms ({share:.0%})")
    over = b.overhead_text()
    over = "" if over == "unknown" else f", profiler overhead {over}"
    fig.update_layout(barmode="stack", height=220, xaxis_title="ms of the traced run",
                      title=title or f"Where the {b.device} time went ({fmt_ms(b.wall_s)} traced{over})",
                      legend=dict(orientation="h", y=-0.5), margin=dict(l=50, r=20, t=50, b=20))
    return fig


def plot_memory_timeline(timeline, title: str | None = None):
    """Stacked area: bytes alive by category (MiB) through the traced run, the peak marked.

    Takes a MemoryTimeline or a record that has one (``rec.memory``).

    Example: ``tunekit.view.plot_memory_timeline(lab.run(steps=5, memory=True).memory)``."""
    import plotly.graph_objects as go

    tl = _part(timeline, MemoryTimeline, "memory")
    if tl is None:
        raise ValueError("no memory timeline in this record: profile it with --memory / memory=True")
    ms = [t * 1e3 for t in tl.times_s]
    never_a_browser()
    fig = go.Figure()
    for cat in MEMORY_CATEGORIES:
        fig.add_scatter(x=ms, y=[v / MiB for v in tl.bytes[cat]], name=cat, stackgroup="mem", mode="lines",
                        line=dict(width=0.5, color=_MEM_COLORS[cat]))
    t_peak, peak, _ = tl.peak()
    if not is_missing(peak):
        fig.add_vline(x=t_peak * 1e3, line_dash="dot", annotation_text=f"peak {fmt_mib(peak)}")
    fig.update_layout(title=title or f"Memory through the step on {tl.device} (MiB, 2^20 bytes)",
                      xaxis_title="ms since the run started", yaxis_title="MiB", height=380)
    return fig


def show_trace(rec) -> None:
    """Display what a traced record holds: the breakdown, its top ops and the memory timeline."""
    from IPython.display import display

    if rec.trace is not None:
        display(plot_breakdown(rec.trace))
        display(rec.trace.table(10))
        where = f"Chrome trace: {rec.trace.path} (open in https://ui.perfetto.dev or TensorBoard)"
        display({"text/plain": where}, raw=True)
    if rec.memory is not None:
        display(plot_memory_timeline(rec.memory))
        if rec.memory.snapshot_path:
            display({"text/plain": f"allocator snapshot: {rec.memory.snapshot_path} "
                                   "(drag into https://pytorch.org/memory_viz)"}, raw=True)
