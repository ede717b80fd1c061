"""Shared presentation that knows no product: axes and marks that cannot mislead (`axes`), the
static SVG twin of a figure (`figure_svg`), which plotly renderer shows figures (`renderer`),
progress lines and bars (`progress`) and the figures of a traced step (`trace_plots`). Draws
records it is given; never measures.
"""
from tunekit.view.trace_plots import plot_breakdown, plot_memory_timeline

__all__ = ["plot_breakdown", "plot_memory_timeline"]
