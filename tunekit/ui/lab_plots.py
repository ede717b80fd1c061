"""plotly figures of Lab results. UI layer: draws what the Lab measured, measures nothing.

    >>> compare_figure(lab.results(), baseline=0)      # tokens/s and peak memory per run
    >>> memory_breakdown_figure(lab.results())          # params / grads / optimizer / saved
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..core.units import GiB, MiB
from .renderer import never_a_browser

BASE_COLOR, RUN_COLOR = "#d62728", "#1f77b4"


def _names(df) -> list[str]:
    return [f"#{int(r)} {lbl}" for r, lbl in zip(df["run_id"], df["label"])]


def compare_figure(df, baseline: int = 0) -> go.Figure:
    """Two bar charts side by side; the baseline run is red and annotated with ratios."""
    never_a_browser()
    fig = make_subplots(rows=1, cols=2, subplot_titles=("throughput (tokens/s)", "peak memory (GiB, 2^30 B)"))
    if len(df) == 0:
        fig.update_layout(title="no runs yet", height=360)
        return fig
    names = _names(df)
    is_base = (df["run_id"] == baseline).tolist()
    colors = [BASE_COLOR if b else RUN_COLOR for b in is_base]
    base_rows = df[df["run_id"] == baseline]
    base_tps = float(base_rows["tokens_per_s"].iloc[0]) if len(base_rows) else None
    ratios = [f"{v / base_tps:.2f}x" if base_tps else "" for v in df["tokens_per_s"]]
    fig.add_trace(go.Bar(x=names, y=df["tokens_per_s"], marker_color=colors, text=ratios,
                         textposition="outside", name="tokens/s",
                         hovertemplate="%{x}<br>%{y:.4g} tokens/s<extra></extra>"), row=1, col=1)
    mem = df["peak_mem_bytes"].astype(float) / GiB
    fig.add_trace(go.Bar(x=names, y=mem, marker_color=colors, name="peak memory",
                         hovertemplate="%{x}<br>%{y:.3f} GiB<extra></extra>"), row=1, col=2)
    src = str(df["peak_mem_source"].iloc[-1]).split(":")[0]
    fig.update_layout(title=f"runs vs baseline #{baseline} (red); memory: {src}",
                      showlegend=False, height=380, margin=dict(t=70, b=40))
    return fig


def memory_breakdown_figure(df) -> go.Figure:
    """Stacked bars of what each run holds: parameters, gradients, optimizer state, and the
    activations saved for backward by one micro-batch (from the untimed probe step)."""
    never_a_browser()
    fig = go.Figure()
    if len(df) == 0:
        fig.update_layout(title="no runs yet", height=320)
        return fig
    names = _names(df)
    for col, title in (("params_bytes", "parameters"), ("grads_bytes", "gradients"),
                       ("optimizer_bytes", "optimizer state"), ("saved_bytes", "saved activations")):
        fig.add_trace(go.Bar(x=names, y=df[col].astype(float) / MiB, name=title,
                             hovertemplate="%{x}<br>%{y:.2f} MiB<extra>" + title + "</extra>"))
    fig.update_layout(barmode="stack", title="memory breakdown per run (MiB, 2^20 B)", height=340,
                      margin=dict(t=50, b=40))
    return fig
