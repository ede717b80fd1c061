"""One plotly figure per microbenchmark result; `plot(df)` picks it from `df.attrs["bench"]`."""
from __future__ import annotations

from tunekit.view.renderer import never_a_browser


def _bar(df, x, title, y="median_s", ytitle="seconds (median; bars: min..max)", color=None):
    import plotly.graph_objects as go
    never_a_browser()
    fig = go.Figure()
    groups = [(None, df)] if color is None else list(df.groupby(color, sort=False))
    for name, g in groups:
        fig.add_bar(name=None if name is None else str(name), x=g[x].astype(str), y=g[y],
                    error_y=dict(type="data", symmetric=False, array=g["max_s"] - g[y],
                                 arrayminus=g[y] - g["min_s"]) if y == "median_s" else None)
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=ytitle, barmode="group")
    return fig


def _line(df, x, y, title, ytitle):
    import plotly.graph_objects as go
    never_a_browser()
    fig = go.Figure(go.Scatter(x=df[x], y=df[y], mode="lines+markers"))
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=ytitle)
    return fig


def plot(df):
    """The figure for any result of tunekit.bench (dispatch on `df.attrs["bench"]`).

    Example: ``bench.plot(bench.dataloader_workers())``."""
    kind = df.attrs.get("bench")
    dev = df.attrs.get("device")
    if kind == "forward_backward":
        return _bar(df, "case", f"forward vs backward on {dev}", color="phase")
    if kind == "softmax":
        return _bar(df, "variant", f"naive vs fused softmax on {dev}")
    if kind == "swiglu_dff":
        d = df.sort_values("d_ff")
        fig = _line(d, "d_ff", "tflops", f"SwiGLU MLP GEMMs by d_ff on {dev} "
                    f"(baseline 8/3*h = {df.attrs.get('baseline_d_ff')})", "TFLOPS")
        base = d[d["is_baseline"]]
        fig.add_scatter(x=base["d_ff"], y=base["tflops"], mode="markers", name="8/3*h",
                        marker=dict(size=12, symbol="x"))
        return fig
    if kind == "matmul_sweep":
        dim = df.attrs.get("dim", "n")
        return _line(df, dim, "tflops", f"matmul TFLOPS over {dim} on {dev}", "TFLOPS")
    if kind == "compile":
        return _bar(df, "variant", f"torch.compile on/off, forward+backward on {dev}")
    if kind == "dataloader_workers":
        return _bar(df, "num_workers", "DataLoader pass time by num_workers")
    if kind == "pin_memory":
        d = df.assign(case=[f"pin={p}, nb={n}" for p, n in zip(df["pin_memory"], df["non_blocking"])])
        return _bar(d, "case", f"pin_memory x non_blocking on {dev}")
    if kind == "gc":
        return _bar(df, "variant", f"training step with Python gc automatic vs manual on {dev}")
    if kind == "all_reduce":
        return _line(df, "size_bytes", "busbw_gb_per_s", f"all-reduce busbw ({dev})",
                     "busbw GB/s (1e9 bytes)").update_xaxes(type="log")
    raise ValueError(f"no plot for bench result {kind!r}")
