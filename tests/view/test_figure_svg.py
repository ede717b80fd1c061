"""The static SVG stored next to every plotly figure (GitHub and nbviewer show it)."""
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tunekit.view.figure_svg import PLOTLY, install, to_svg

NS = "{http://www.w3.org/2000/svg}"


def _parse(svg: str):
    root = ET.fromstring(svg)  # well-formed XML, or this raises
    return root, [t.text for t in root.iter(NS + "text")]


def test_bars_lines_subplots_and_labels_are_drawn():
    fig = make_subplots(rows=1, cols=2, subplot_titles=["speed", "memory"], specs=[[{"secondary_y": True}, {}]])
    fig.add_bar(x=["fp32", "bf16", "ckpt"], y=[1000, 1500, 1400], name="tokens/s", row=1, col=1)
    fig.add_scatter(x=["fp32", "bf16", "ckpt"], y=[3.0, 3.0, 1.0], name="MiB", row=1, col=1, secondary_y=True)
    fig.add_bar(x=["a", "b"], y=np.array([1.5, 2.5]), name="numpy <&>", row=1, col=2)  # base64 typed array
    fig.update_yaxes(title_text="tokens/s", row=1, col=1)
    fig.update_layout(title="ladder")
    root, texts = _parse(to_svg(fig.to_dict()))
    rects = [r for r in root.iter(NS + "rect")]
    # 1 background + 2 plot areas + 3 + 2 bars + 3 legend swatches = 11
    assert len(rects) == 11
    assert len(list(root.iter(NS + "circle"))) == 3 and len(list(root.iter(NS + "polyline"))) == 1
    for label in ("ladder", "speed", "memory", "tokens/s", "fp32", "ckpt", "numpy <&>", "1,500"):
        assert label in texts, label


def test_stacked_areas_horizontal_bars_and_log_axes():
    fig = go.Figure()
    fig.add_scatter(x=[0, 1, 2], y=[1, 1, 1], stackgroup="m", name="params")
    fig.add_scatter(x=[0, 1, 2], y=[0, 2, 0], stackgroup="m", name="activations")
    root, _ = _parse(to_svg(fig.to_dict()))
    polys = list(root.iter(NS + "polygon"))
    assert len(polys) == 2
    # the second area sits on the first: at x=1 its top is 1 + 2 = 3. The y axis spans -0.15..3.15
    # (0..3 padded 5%) over the plot height 450 - 60 (top) - 88 (bottom: 70 + one legend row of 18)
    # = 302 px from y=362 up, so 3 lands at 362 - 302 * 3.15 / 3.3 = 73.7
    top = polys[1].get("points").split()[1]
    assert top.split(",")[1] == "73.7"
    h = go.Figure(go.Bar(x=[3, 1], y=["matmul", "other"], orientation="h"))
    _, texts = _parse(to_svg(h.to_dict()))
    assert "matmul" in texts and "other" in texts
    log = go.Figure(go.Scatter(x=[128, 1024], y=[1, 30]))
    log.update_xaxes(type="log")
    _, texts = _parse(to_svg(log.to_dict()))
    assert {"200", "500", "1,000"} <= set(texts)   # 2x and 5x ticks when under three decades show


def test_the_renderer_stores_plotly_json_and_svg_and_a_kernel_uses_it():
    import plotly.io as pio

    before = pio.renderers.default
    try:
        install()
        bundle = pio.renderers["tunekit"].to_mimebundle(go.Figure(go.Bar(y=[1, 2])).to_dict())
        assert set(bundle) >= {PLOTLY, "image/svg+xml"}
    finally:
        pio.renderers.default = before
    code = ("import ipykernel, plotly.io as pio, tunekit; tunekit.use_renderer(); print(pio.renderers.default)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "tunekit"   # in a kernel process (what %load_ext tunekit calls)
    env_code = "import os; os.environ['PLOTLY_RENDERER']='json'; " + code
    out = subprocess.run([sys.executable, "-c", env_code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "json"      # a renderer the user chose wins


def test_the_figures_own_range_ticks_bar_colours_text_and_hatching_are_drawn():
    fig = go.Figure()
    fig.add_bar(x=["slow", "clean"], y=[2.9, 0.32], marker_color=["#c7c7c7", "#1f77b4"],
                marker_pattern={"shape": ["/", ""]}, text=["slowed", "1.00x"], textposition="outside", name="t")
    fig.add_scatter(x=[1, 2, 4, 8, 16], y=[1, 2, 3, 4, 5], xaxis="x2", yaxis="y2", name="k")
    fig.update_layout(yaxis=dict(range=[0, 4], domain=[0.55, 1]), yaxis2=dict(domain=[0, 0.45], anchor="x2"),
                      xaxis2=dict(type="log", tickvals=[1, 2, 4, 8, 16], ticktext=["1", "2", "4", "8", "16"],
                                  anchor="y2"))
    root, texts = _parse(to_svg(fig.to_dict()))
    fills = [r.get("fill") for r in root.iter(NS + "rect")]
    assert "#c7c7c7" in fills and "#1f77b4" in fills and fills.count("url(#hatch)") == 1
    assert "slowed" in texts and "1.00x" in texts
    ticks = [(t.text, t.get("text-anchor")) for t in root.iter(NS + "text")]
    x2 = [t for t, anchor in ticks[2:7]]
    y = [t for t, anchor in ticks if anchor == "end"][:5]
    assert x2 == ["1", "2", "4", "8", "16"]             # the figure's tickvals, no minor 0.9 or 2..9
    assert y == ["0", "1", "2", "3", "4"]               # its range [0, 4], not the data's
