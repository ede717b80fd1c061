"""Plotly figures of profiled cells. UI layer: takes records or DataFrames, never measures."""
from __future__ import annotations

from ..core.bounds import WORDS
from ..core.units import MiB
from .renderer import never_a_browser


def plot_history(df=None, title: str = "Profiled cells"):
    """Time, memory and TFLOPS per profiled cell as one plotly figure (three stacked panels).

    >>> tunekit.plot_history().show()
    """
    from plotly.subplots import make_subplots

    from ..measure.history import history

    df = history() if df is None else df
    if len(df) == 0:
        raise ValueError("nothing profiled yet: run a %%gpuprofile cell or a tunekit.profile() block first")
    labels = [f"{i}: {n}" for i, n in enumerate(df["name"])]
    never_a_browser()
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("wall time (s)", "memory peak above start (MiB)", "achieved TFLOPS"))
    errors = df["error"].notna()
    fig.add_bar(x=labels, y=df["wall_s"], name="wall time",
                marker_color=["#d62728" if e else "#1f77b4" for e in errors],
                hovertext=df["error"].fillna(""), row=1, col=1)
    fig.add_bar(x=labels, y=df["cpu_peak_delta_bytes"] / MiB, name="CPU RSS peak", row=2, col=1)
    if df["gpu_peak_delta_bytes"].notna().any():
        fig.add_bar(x=labels, y=df["gpu_peak_delta_bytes"] / MiB, name="GPU allocated peak", row=2, col=1)
    hover = [(f"MFU {m:.1%}" if m == m else "MFU n/a") + (f" {WORDS}: {b}" if isinstance(b, str) and b else "")
             for m, b in zip(df["mfu"], df.get("above_peak", [None] * len(df)))]
    fig.add_scatter(x=labels, y=df["tflops"], mode="markers+lines", name="TFLOPS", hovertext=hover, row=3, col=1)
    fig.update_layout(title=title, height=600, barmode="group", legend=dict(orientation="h", y=-0.08))
    return fig
