"""What ``lab.autotune`` found, drawn and tabulated: it reads the result, measures nothing.

    >>> autotune_figure(found)          # tokens/s per measured candidate, min-max bars, winner green
                                        # (inconclusive: the winner and its ties one colour, marked)
    >>> evidence_view(found.evidence)   # the columns a person reads, units in the headers
"""
from __future__ import annotations

import plotly.graph_objects as go

from tunekit.core.fmt import FORMATS, fmt_pct, formatted
from tunekit.core.units import MiB
from tunekit.view.renderer import never_a_browser

STATUS_COLORS = {"winner": "#2ca02c", "kept": "#1f77b4", "dropped": "#aaaaaa", "failed": "#d62728",
                 "tied": "#ff7f0e"}

_VIEW = {"stage": "stage", "label": "candidate", "tokens_per_s": "tokens/s", "median_txt": "median tokens/s",
         "spread_pct": "spread (%)", "busy_trials": "busy trials",
         "repeats": "repeats", "steps": "timed steps", "peak_mib": "peak (MiB)", "fits": "fits",
         "status": "status", "why": "why"}


def evidence_view(df):
    """The evidence with units in the headers: ``tokens/s`` is the best repeat's (what decides),
    ``median tokens/s`` and ``spread (%)`` ((max - min) / median of the repeats) are text.
    Format the numbers with ``core.summary.table_html``."""
    view = df.assign(peak_mib=df["peak_mem_bytes"].astype(float) / MiB,
                     median_txt=[formatted(v, FORMATS["tokens/s"]) for v in df["tokens_per_s_median"]],
                     spread_pct=[fmt_pct(v) for v in df["spread"]],
                     fits=["n/a" if v is None else ("yes" if v else "no") for v in df["fits"]])
    return view[list(_VIEW)].rename(columns=_VIEW)


def autotune_figure(result) -> go.Figure:
    """Bars of the measured candidates' best tokens/s down to their slowest repeat, in the order
    tried, colored by what became of them; pruned candidates are listed in the evidence only.
    When the result is inconclusive the winner is no lone green bar: it and the candidates it is
    tied with share one colour and a 'tied' mark. Candidates measured busy in every trial are
    hatched (shown, never judged)."""
    df = result.evidence
    never_a_browser()
    fig = go.Figure()
    measured = df[df["repeats"] > 0] if len(df) else df
    if not len(measured):
        fig.update_layout(title="autotune: nothing measured", height=320)
        return fig
    cands = [c for c in result.candidates if c.runs]
    lows = [c.score - min(c.scores()) for c in cands]
    names = [f"{s}: {lbl}" for s, lbl in zip(measured["stage"], measured["label"])]
    tied = [st == "tied" or (st == "winner" and result.inconclusive) for st in measured["status"]]
    fig.add_trace(go.Bar(
        x=names, y=measured["tokens_per_s"],
        marker_color=[STATUS_COLORS["tied" if t else s] if t or s in STATUS_COLORS else "#1f77b4"
                      for s, t in zip(measured["status"], tied)],
        marker_pattern_shape=["/" if c.busy else "" for c in cands],
        error_y=dict(type="data", symmetric=False, array=[0] * len(lows), arrayminus=lows),
        customdata=list(zip(measured["status"], measured["repeats"], measured["busy_trials"])),
        hovertemplate="%{x}<br>%{y:,.0f} tokens/s<br>%{customdata[0]}, %{customdata[1]} trials "
                      "(%{customdata[2]} busy)<extra></extra>"))
    for name, y, t, st in zip(names, measured["tokens_per_s"], tied, measured["status"]):
        if t:
            fig.add_annotation(x=name, y=y, text="tied (kept)" if st == "winner" else "tied",
                               showarrow=False, yshift=10)
    if result.inconclusive:
        head = (f"INCONCLUSIVE: {len(result.tied) + 1} candidates tied (orange) within the noise band "
                f"±{fmt_pct(result.band, 0)}; the incumbent is kept")
    else:
        head = "tokens/s per candidate, winner green" + (" (top two within noise)" if result.within_noise else "")
    busy = " (hatched: measured busy, not judged)" if result.busy else ""
    partial = f" [partial: {result.status}]" if result.partial else ""
    fig.update_layout(title=f"autotune: {head}{busy}{partial}",
                      yaxis_title="tokens/s (best repeat; whisker: slowest repeat)", showlegend=False,
                      height=420, margin=dict(t=60, b=140))
    return fig
