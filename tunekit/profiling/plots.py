"""Plotly figures of profiled cells: it takes records or DataFrames, never measures."""
from __future__ import annotations

from tunekit.core.bounds import WORDS
from tunekit.core.fmt import fmt_pct
from tunekit.core.units import MiB
from tunekit.view.axes import (
    CPU_COLOR,
    ERROR_COLOR,
    GPU_COLOR,
    RUN_COLOR,
    SLOWED_COLOR,
    SLOWED_PATTERN,
    slowed_by,
    value_range,
)
from tunekit.view.renderer import never_a_browser


def plot_history(df=None, title: str = "Profiled cells"):
    """Time, memory and TFLOPS per profiled cell as one plotly figure (three stacked panels).

    A cell timed while the FLOP counter, a profiler trace or a memory timeline ran in it (the one
    rule, `core.slowed.slowed_by`, read from the frame's ``slowed_by`` column) is drawn grey and hatched
    and named "slowed by ...": its time is not comparable with the others'. Every panel's axis
    starts at zero, also for a single point.

    >>> tunekit.profiling.plot_history().show()
    """
    from plotly.subplots import make_subplots

    from tunekit.measure.history import history

    df = history(all=True) if df is None else df
    if len(df) == 0:
        raise ValueError("nothing profiled yet: run a %%gpuprofile cell or a tunekit.profile() block first")
    labels = [f"{i}: {n}" for i, n in enumerate(df["name"])]
    never_a_browser()
    rows = [dict(r) for _, r in df.iterrows()]
    slowed = [slowed_by(r) for r in rows]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=("wall time (s)" + (": grey hatched = slowed by the measuring, not comparable"
                                                           if any(slowed) else ""),
                                        "memory peak above start (MiB)", "achieved TFLOPS"))
    errors = df["error"].notna().tolist()
    fig.add_bar(x=labels, y=df["wall_s"], name="wall time", showlegend=False,  # its panel's title says it
                marker_color=[ERROR_COLOR if e else SLOWED_COLOR if s else RUN_COLOR for e, s in zip(errors, slowed)],
                marker_pattern={**SLOWED_PATTERN, "shape": ["/" if s else "" for s in slowed]},
                text=[f"slowed: {s}" if s else "" for s in slowed], textposition="inside",
                hovertext=[(f"slowed by {s}; " if s else "") + (e if isinstance(e, str) else "")
                           for s, e in zip(slowed, df["error"])], row=1, col=1)
    cpu = df["cpu_peak_delta_bytes"].astype(float) / MiB
    fig.add_bar(x=labels, y=cpu, name="CPU RSS peak", marker_color=CPU_COLOR, row=2, col=1)
    mem = list(cpu)
    if df["gpu_peak_delta_bytes"].notna().any():
        gpu = df["gpu_peak_delta_bytes"].astype(float) / MiB
        fig.add_bar(x=labels, y=gpu, name="GPU allocated peak", marker_color=GPU_COLOR, row=2, col=1)
        mem += list(gpu)
    hover = [f"MFU {fmt_pct(m)}" + (f" {WORDS}: {b}" if isinstance(b, str) and b else "")
             for m, b in zip(df["mfu"], df.get("above_peak", [None] * len(df)))]
    fig.add_scatter(x=labels, y=df["tflops"], mode="markers+lines", name="TFLOPS", hovertext=hover,
                    marker_color=RUN_COLOR, marker_size=9, row=3, col=1)
    for row, values in ((1, df["wall_s"]), (2, mem), (3, df["tflops"])):
        fig.update_yaxes(range=value_range(values), row=row, col=1)
    fig.update_layout(title=title, height=620, barmode="group", legend=dict(orientation="h", y=-0.08))
    return fig
