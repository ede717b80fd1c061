"""What ``lab.autotune`` found, drawn and tabulated. UI layer: reads the result, measures nothing.

    >>> autotune_figure(found)          # tokens/s per measured candidate, min-max bars, winner green
    >>> evidence_view(found.evidence)   # the columns a person reads, units in the headers
"""
from __future__ import annotations

import math

import plotly.graph_objects as go

from ..core.units import MiB

STATUS_COLORS = {"winner": "#2ca02c", "kept": "#1f77b4", "dropped": "#aaaaaa", "failed": "#d62728"}

_VIEW = {"stage": "stage", "label": "candidate", "tokens_per_s": "tokens/s", "median_txt": "median tokens/s",
         "spread_pct": "spread (%)",
         "repeats": "repeats", "steps": "timed steps", "peak_mib": "peak (MiB)", "fits": "fits",
         "status": "status", "why": "why"}


def _pct(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1%}"


def evidence_view(df):
    """The evidence with units in the headers: ``tokens/s`` is the best repeat's (what decides),
    ``median tokens/s`` and ``spread (%)`` ((max - min) / median of the repeats) are text.
    Format the numbers with ``core.summary.table_html``."""
    view = df.assign(peak_mib=df["peak_mem_bytes"].astype(float) / MiB,
                     median_txt=["n/a" if math.isnan(v) else f"{v:,.0f}" for v in df["tokens_per_s_median"]],
                     spread_pct=[_pct(v) for v in df["spread"]],
                     fits=["n/a" if v is None else ("yes" if v else "no") for v in df["fits"]])
    return view[list(_VIEW)].rename(columns=_VIEW)


def autotune_figure(result) -> go.Figure:
    """Bars of the measured candidates' best tokens/s down to their slowest repeat, in the order
    tried, colored by what became of them; pruned candidates are listed in the evidence only."""
    df = result.evidence
    fig = go.Figure()
    measured = df[df["repeats"] > 0] if len(df) else df
    if not len(measured):
        fig.update_layout(title="autotune: nothing measured", height=320)
        return fig
    lows = [c.score - min(c.scores()) for c in result.candidates if c.runs]
    names = [f"{s}: {lbl}" for s, lbl in zip(measured["stage"], measured["label"])]
    fig.add_trace(go.Bar(
        x=names, y=measured["tokens_per_s"],
        marker_color=[STATUS_COLORS.get(s, "#1f77b4") for s in measured["status"]],
        error_y=dict(type="data", symmetric=False, array=[0] * len(lows), arrayminus=lows),
        customdata=list(zip(measured["status"], measured["repeats"])),
        hovertemplate="%{x}<br>%{y:,.0f} tokens/s<br>%{customdata[0]}, %{customdata[1]} repeats"
                      "<extra></extra>"))
    noise = " (top two within noise)" if result.within_noise else ""
    partial = f" [partial: {result.status}]" if result.partial else ""
    fig.update_layout(title=f"autotune: tokens/s per candidate, winner green{noise}{partial}",
                      yaxis_title="tokens/s (best repeat; whisker: slowest repeat)", showlegend=False,
                      height=420, margin=dict(t=60, b=140))
    return fig
