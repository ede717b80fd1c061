"""plotly figures of Lab results: it draws what the Lab measured, measures nothing.

    >>> compare_figure(lab.results(all=True), baseline=0)      # tokens/s and memory per run

Every run is named by what it changes relative to the baseline (``core.baseline.difference``),
and memory is drawn as the measured components a toggle changes (parameters, gradients,
optimizer state, saved activations), with the process's or device's peak written above each bar
as context: on a CPU that peak is the whole process's RSS, interpreter and libraries included,
where a 20 MiB saving of activations cannot show.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tunekit.core.baseline import difference, pick
from tunekit.core.fmt import fmt_bytes
from tunekit.core.run_text import common_unit
from tunekit.core.units import MiB, is_missing
from tunekit.view.axes import BASE_COLOR, COMPONENTS, RUN_COLOR, value_range
from tunekit.view.renderer import never_a_browser

__all__ = ["BASE_COLOR", "RUN_COLOR", "compare_figure", "run_names"]


def _rows(df) -> list[dict]:
    return [dict(r) for _, r in df.iterrows()]


def run_names(df, baseline: int | None = None) -> tuple[list[str], int, str]:
    """('#id what-differs' for each run, index of the baseline, why it is the baseline)."""
    rows = _rows(df)
    i, why = pick(rows, baseline)
    return [f"#{int(r['run_id'])} {difference(r, rows[i])}" for r in rows], i, why


def _peak_word(source) -> str:
    src = str(source or "")
    return "RSS" if "RSS" in src or "VmHWM" in src else "allocated" if "alloc" in src else "device"


def _memory(fig, df, names, row=None, col=None, legend=True) -> None:
    """Stacked measured components per run; the measured peak as text above each bar."""
    rows = _rows(df)
    tops = [sum(float(r[c] or 0) for c, _, _ in COMPONENTS if not is_missing(r[c])) / MiB for r in rows]
    for col_name, title, color in COMPONENTS:
        last = col_name == COMPONENTS[-1][0]
        peaks = [f"{_peak_word(r['peak_mem_source'])} {fmt_bytes(r['peak_mem_bytes'])}" for r in rows]
        fig.add_trace(go.Bar(x=names, y=df[col_name].astype(float) / MiB, name=title, marker_color=color,
                             legendgroup=title, showlegend=legend,
                             text=peaks if last else None, textposition="outside" if last else None,
                             hovertemplate="%{x}<br>%{y:.2f} MiB<extra>" + title + "</extra>"),
                      **({} if row is None else dict(row=row, col=col)))
    rng = value_range(tops, pad=0.25)
    if row is None:
        fig.update_yaxes(range=rng, title_text="MiB (2^20 B)")
    else:
        fig.update_yaxes(range=rng, row=row, col=col)


def compare_figure(df, baseline: int | None = 0) -> go.Figure:
    """Throughput with each run's ratio to the baseline (red), and the measured memory
    components per run. ``baseline``: a run id; None: the newest run with default toggles."""
    never_a_browser()
    unit = common_unit(df["throughput_unit"]) if "throughput_unit" in df else "tokens"
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55],
                        subplot_titles=(f"throughput ({unit}/s)",
                                        "memory the toggles change (MiB); above: measured peak"))
    if len(df) == 0:
        fig.update_layout(title="no runs yet", height=360)
        return fig
    ids = [int(i) for i in df["run_id"]]
    names, i, why = run_names(df, baseline if baseline in ids else None)
    colors = [BASE_COLOR if k == i else RUN_COLOR for k in range(len(df))]
    base_tps = float(df["tokens_per_s"].iloc[i])
    ratios = [f"{v / base_tps:.2f}x" if not is_missing(base_tps) and base_tps and not is_missing(v) else ""
              for v in df["tokens_per_s"].astype(float)]
    fig.add_trace(go.Bar(x=names, y=df["tokens_per_s"], marker_color=colors, text=ratios,
                         textposition="outside", name=f"{unit}/s", showlegend=False,
                         hovertemplate=f"%{{x}}<br>%{{y:,.0f}} {unit}/s<extra></extra>"), row=1, col=1)
    fig.update_yaxes(range=value_range(df["tokens_per_s"], pad=0.2), row=1, col=1)
    _memory(fig, df, names, row=1, col=2)
    fig.update_layout(title=f"each run against baseline #{ids[i]} (red), named by what it changes",
                      barmode="stack", height=420, margin=dict(t=80, b=40), uniformtext=dict(minsize=9, mode="show"),
                      legend=dict(orientation="h", y=-0.2))
    fig.layout.meta = {"baseline": ids[i], "why": why}
    return fig
