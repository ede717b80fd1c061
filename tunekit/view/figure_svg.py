"""A static SVG drawing of a plotly figure, stored next to the interactive one.

JupyterLab and VS Code draw plotly's own mimetype; GitHub and nbviewer cannot (they run no
plotly.js), so an executed notebook would show them nothing. tunekit's renderer (`install`) adds
this SVG to every figure's output: bars (grouped, stacked, horizontal), lines, markers and stacked
areas on any number of subplots, linear or log axes, secondary y axes, subplot titles, horizontal
and vertical reference lines, a legend. It draws the data the figure holds, nothing more: the
interactive chart stays the one to explore.

    >>> svg = to_svg(fig.to_dict())       # a string: <svg ...>...</svg>
"""
from __future__ import annotations

import base64
import html
import math
from typing import NamedTuple

import numpy as np

from tunekit.core.units import is_missing
from tunekit.view.axes import tick_label

COLORWAY = ["#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692", "#B6E880"]
PLOTLY = "application/vnd.plotly.v1+json"
HATCH = ('<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
         '<line x1="0" y1="0" x2="0" y2="6" stroke="#555" stroke-width="1.5"/></pattern></defs>')


def _values(v) -> list:
    """A trace's x/y as a list: plain lists, numpy arrays, or plotly's base64 typed arrays."""
    if v is None:
        return []
    if isinstance(v, dict) and "bdata" in v:
        arr = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return arr.reshape(v["shape"]).tolist() if "shape" in v else arr.tolist()
    return list(np.asarray(v).tolist()) if not isinstance(v, list) else v


def _num(v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:  # decades, and 2x / 5x between them when fewer than three decades show
        mults = (1,) if hi - lo > 2 else (1, 2, 5)
        return [m * 10.0 ** e for e in range(math.floor(lo), math.ceil(hi) + 1) for m in mults]
    step = 10 ** math.floor(math.log10((hi - lo) / 5)) if hi > lo else 1
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= 6:
            step *= m
            break
    return [k * step for k in range(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1)]


def _label(v: float) -> str:
    return tick_label(_round(v))


def _round(v: float) -> float:  # 0.30000000000000004 -> 0.3: a tick is a round number
    return float(f"{v:.12g}")


def _text(x, y, s, size=11, anchor="middle", color="#2a3f5f", rotate=None, weight="normal") -> str:
    rot = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate is not None else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{color}" '
            f'font-weight="{weight}"{rot}>{html.escape(str(s))}</text>')


def _rect(x, y, w, h, fill) -> str:
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"/>'


def _title(t) -> str:
    if isinstance(t, dict):
        t = t.get("text")
    return "" if t is None else str(t).replace("<br>", " ")


class _Axis:
    def __init__(self, spec: dict, horizontal: bool, px0: float, px1: float):
        self.spec, self.horizontal, self.px0, self.px1 = spec, horizontal, px0, px1
        self.log = spec.get("type") == "log"
        self.categories: list = []
        self.values: list[float] = []

    def add(self, values, is_bar_base=False):
        for v in values:
            if isinstance(v, str):
                if v not in self.categories:
                    self.categories.append(v)
            elif not is_missing(_num(v)):
                self.values.append(_num(v))
        if is_bar_base and not self.log:
            self.values.append(0.0)

    def finish(self):
        if self.categories:
            self.lo, self.hi = -0.5, len(self.categories) - 0.5
            return
        given = self.spec.get("range")  # the figure's own range (plotly: log10 units on a log axis)
        if given and len(given) == 2 and all(isinstance(v, (int, float)) for v in given) and given[1] > given[0]:
            self.lo, self.hi = float(given[0]), float(given[1])
            return
        vals = [math.log10(v) for v in self.values if v > 0] if self.log else self.values
        lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
        pad = (hi - lo) * 0.05 or (abs(hi) * 0.1 or 1.0)
        self.lo, self.hi = lo - pad, hi + pad

    def pos(self, v) -> float:
        if self.categories:
            f = self.categories.index(v) if v in self.categories else _num(v)
        else:
            f = _num(v)
            if self.log:
                f = math.log10(f) if f > 0 else math.nan
        return self.px0 + (f - self.lo) / (self.hi - self.lo) * (self.px1 - self.px0)

    def tick_marks(self):
        if self.categories:
            return [(i, c) for i, c in enumerate(self.categories)]
        vals, texts = _values(self.spec.get("tickvals")), _values(self.spec.get("ticktext"))
        if vals:  # the figure's own ticks: exactly those, with their texts
            texts = texts if len(texts) == len(vals) else [_label(_num(v)) for v in vals]
            marks = [(math.log10(_num(v)) if self.log and _num(v) > 0 else _num(v), str(t))
                     for v, t in zip(vals, texts)]
            return [(f, t) for f, t in marks if self.lo <= f <= self.hi]
        raw = _ticks(self.lo, self.hi, self.log)
        return [(math.log10(t) if self.log else t, _label(t)) for t in raw
                if self.lo <= (math.log10(t) if self.log else t) <= self.hi]

    def tick_pos(self, f) -> float:
        return self.px0 + (f - self.lo) / (self.hi - self.lo) * (self.px1 - self.px0)


class _Canvas:
    """The page: its size, the margins around the plot area (room for the legend's rows), and the
    axes by name ("x", "x2", "y3"), each placed by its domain."""

    def __init__(self, layout: dict, traces: list, width: int, height: int | None):
        self.layout = layout
        self.width = int(layout.get("width") or width)
        self.height = int(height or layout.get("height") or 450)
        self.shown = [t for t in traces if t.get("showlegend", True) is not False and t.get("name")]
        self.legend_h = 18 * math.ceil(len(self.shown) / 3) if self.shown else 0
        self.ml, mr, self.mt = 70, 70, 60 + (20 if layout.get("annotations") else 0)
        self.pw, self.ph = self.width - self.ml - mr, self.height - self.mt - 70 - self.legend_h
        self.axes: dict[str, _Axis] = {}

    def axis(self, name: str) -> _Axis:
        if name not in self.axes:
            spec = self.layout.get(name[0] + "axis" + name[1:], {})
            if spec.get("overlaying"):
                base = self.layout.get(spec["overlaying"][0] + "axis" + spec["overlaying"][1:], {})
                dom = base.get("domain", [0, 1])
            else:
                dom = spec.get("domain", [0, 1])
            if name[0] == "x":
                self.axes[name] = _Axis(spec, True, self.ml + dom[0] * self.pw, self.ml + dom[1] * self.pw)
            else:
                self.axes[name] = _Axis(spec, False, self.mt + (1 - dom[0]) * self.ph, self.mt + (1 - dom[1]) * self.ph)
        return self.axes[name]


class _Trace(NamedTuple):
    """A bar or scatter trace ready to draw: its axes, categories, values (stacked: on their lows)."""
    t: dict
    kind: str
    horiz: bool
    cat_ax: _Axis
    val_ax: _Axis
    cats: list
    vals: list
    lows: list
    color: str
    stacked: bool
    bar_colors: list | None


def _prepare(canvas: _Canvas, traces: list) -> list[_Trace]:
    """The bar and scatter traces with their axes fed (then finished) and their colours chosen."""
    layout = canvas.layout
    colorway = (layout.get("colorway") or layout.get("template", {}).get("layout", {}).get("colorway")
                or COLORWAY)
    barmode = layout.get("barmode", "group")
    stacks: dict = {}
    prepared = []
    for i, t in enumerate(traces):
        kind = t.get("type", "scatter")
        if kind not in ("bar", "scatter"):
            continue
        xs, ys = _values(t.get("x")), _values(t.get("y"))
        if not xs and ys:
            xs = list(range(len(ys)))
        if not ys and xs:
            ys = list(range(len(xs)))
        horiz = kind == "bar" and t.get("orientation") == "h"
        xa, ya = canvas.axis(t.get("xaxis", "x")), canvas.axis(t.get("yaxis", "y"))
        cat_ax, val_ax = (ya, xa) if horiz else (xa, ya)
        cats, vals = (ys, xs) if horiz else (xs, ys)
        group = t.get("stackgroup") if kind == "scatter" else ("bars" if barmode in ("stack", "relative") else None)
        if group:  # stacked: each value sits on the sum of the traces before it
            base = stacks.setdefault((id(val_ax), group), {})
            lows = [base.get(c, 0.0) for c in cats]
            vals = [lo + (_num(v) if not is_missing(_num(v)) else 0.0) for lo, v in zip(lows, vals)]
            for c, v in zip(cats, vals):
                base[c] = v
        else:
            lows = [0.0] * len(vals)
        cat_ax.add(cats)
        val_ax.add(vals, is_bar_base=kind == "bar" or bool(group))
        color = ((t.get("marker") or {}).get("color") if kind == "bar" else (t.get("line") or {}).get("color")) \
            or (t.get("marker") or {}).get("color") or colorway[i % len(colorway)]
        per_bar = None
        if kind == "bar" and isinstance(color, (list, tuple)) and all(isinstance(c, str) for c in color):
            per_bar = list(color)  # one colour per bar (a baseline, a slowed cell)
            color = color[0] if color else colorway[i % len(colorway)]
        if not isinstance(color, str):
            color = colorway[i % len(colorway)]
        prepared.append(_Trace(t, kind, horiz, cat_ax, val_ax, cats, vals, lows, color, bool(group), per_bar))
    for ax in canvas.axes.values():
        ax.finish()
    return prepared


def _grids(axes: dict) -> list[str]:
    """Plot areas, grid lines, tick labels and axis titles: x axes (with their anchor's area), then y."""
    out = []
    for name, ax in axes.items():
        spec = ax.spec
        if name[0] != "x" or axes.get(spec.get("anchor", "y")) is None:
            continue
        ya = axes[spec.get("anchor", "y")]
        y0, y1 = min(ya.px0, ya.px1), max(ya.px0, ya.px1)
        out.append(_rect(ax.px0, y0, ax.px1 - ax.px0, y1 - y0, "#E5ECF6"))
        rotate = len(ax.categories) > 4 or any(len(str(c)) > 12 for c in ax.categories)
        for f, lab in ax.tick_marks():
            x = ax.tick_pos(f)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0:.1f}" y2="{y1:.1f}" stroke="white"/>')
            if spec.get("showticklabels") is not False:  # shared x: only the bottom panel labels
                out.append(_text(x, y1 + 14, str(lab)[:24], 10, "end" if rotate else "middle",
                                 rotate=-30 if rotate else None))
        if _title(spec.get("title")):
            out.append(_text((ax.px0 + ax.px1) / 2, y1 + (52 if rotate else 34), _title(spec.get("title")), 11))
    for name, ax in axes.items():
        spec = ax.spec
        if name[0] != "y" or axes.get(spec.get("anchor", "x")) is None:
            continue
        xa = axes[spec.get("anchor", "x")]
        right = spec.get("side") == "right"
        xe = xa.px1 if right else xa.px0
        for f, lab in ax.tick_marks():
            y = ax.tick_pos(f)
            if not spec.get("overlaying"):
                out.append(f'<line x1="{xa.px0:.1f}" x2="{xa.px1:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="white"/>')
            out.append(_text(xe + (6 if right else -6), y + 4, lab, 10, "start" if right else "end"))
        if _title(spec.get("title")):
            x = xe + (50 if right else -50)
            out.append(_text(x, (ax.px0 + ax.px1) / 2, _title(spec.get("title")), 11, rotate=90 if right else -90))
    return out


def _bars(p: _Trace, k: int, n: int) -> list[str]:
    """One bar trace, the ``k``-th of ``n`` side by side in each category slot."""
    t, cat_ax, val_ax, cats = p.t, p.cat_ax, p.val_ax, p.cats
    slot = abs(cat_ax.pos(1) - cat_ax.pos(0)) if cat_ax.categories or len(cats) < 2 else \
        abs(cat_ax.pos(cats[1]) - cat_ax.pos(cats[0]))
    slot = slot or 20
    w = 0.8 * slot / n
    colors = p.bar_colors or [p.color] * len(cats)
    shapes = _values(((t.get("marker") or {}).get("pattern") or {}).get("shape"))
    shapes = shapes if isinstance(shapes, list) else [shapes] * len(cats)
    texts = t.get("text") if isinstance(t.get("text"), list) else [t.get("text")] * len(cats)
    out = []
    for j, (c, v, lo) in enumerate(zip(cats, p.vals, p.lows)):
        if is_missing(_num(v)):
            continue
        mid = cat_ax.pos(c) - 0.4 * slot + (k + 0.5) * w
        a = val_ax.pos(lo if not val_ax.log else max(_num(v) * 1e-9, 10 ** val_ax.lo))
        b = val_ax.pos(v)
        box = (min(a, b), mid - w / 2, abs(b - a), w) if p.horiz else (mid - w / 2, min(a, b), w, abs(b - a))
        out.append(_rect(*box, colors[j % len(colors)]))
        if j < len(shapes) and shapes[j]:  # hatched: measured under a slowing instrument
            out.append(_rect(*box, "url(#hatch)"))
        text = texts[j] if j < len(texts) else None
        if text and not p.horiz:
            inside = t.get("textposition") == "inside"
            out.append(_text(mid, (min(a, b) + 14) if inside else (min(a, b) - 4), text, 10))
    return out


def _lines(p: _Trace) -> list[str]:
    """One scatter trace: a stacked area, a line and/or markers."""
    pts = [(p.cat_ax.pos(c), p.val_ax.pos(v)) for c, v in zip(p.cats, p.vals)]
    pts = [(x, y) for x, y in pts if not (is_missing(x) or is_missing(y))]
    mode = p.t.get("mode") or ("lines" if p.stacked else "lines+markers")
    out, color = [], p.color
    if p.stacked and pts:
        base = [(p.cat_ax.pos(c), p.val_ax.pos(lo)) for c, lo in zip(p.cats, p.lows)][::-1]
        poly = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts + base)
        out.append(f'<polygon points="{poly}" fill="{color}" fill-opacity="0.5" stroke="{color}"/>')
    elif "lines" in mode and len(pts) > 1:
        dash = ' stroke-dasharray="6,4"' if (p.t.get("line") or {}).get("dash") else ""
        out.append(f'<polyline points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in pts)}" fill="none" '
                   f'stroke="{color}" stroke-width="2"{dash}/>')
    if "markers" in mode:
        out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}"/>' for x, y in pts]
    return out


def _data(prepared: list[_Trace], barmode: str) -> list[str]:
    """Every trace; unstacked bars on one category axis share its slots (grouped) or overlap."""
    n_bars: dict = {}
    for p in prepared:
        if p.kind == "bar" and not p.stacked:
            n_bars.setdefault(id(p.cat_ax), []).append(id(p.t))
    out = []
    for p in prepared:
        if p.kind == "bar":
            group = n_bars.get(id(p.cat_ax), [id(p.t)])
            k, n = (group.index(id(p.t)), len(group)) if not p.stacked and barmode == "group" else (0, 1)
            out += _bars(p, k, n)
        else:
            out += _lines(p)
    return out


def _references(canvas: _Canvas) -> list[str]:
    """Reference lines (add_hline / add_vline), subplot titles and the figure's title."""
    layout, axes, out = canvas.layout, canvas.axes, []
    for s in layout.get("shapes", []):
        if s.get("type") != "line":
            continue
        xref, yref = s.get("xref", "x"), s.get("yref", "y")
        xa, ya = axes.get(xref.split()[0]), axes.get(yref.split()[0])
        if xa is None or ya is None:
            continue
        x0 = xa.px0 + s.get("x0", 0) * (xa.px1 - xa.px0) if "domain" in xref else xa.pos(s.get("x0"))
        x1 = xa.px0 + s.get("x1", 1) * (xa.px1 - xa.px0) if "domain" in xref else xa.pos(s.get("x1"))
        y0 = ya.px0 + s.get("y0", 0) * (ya.px1 - ya.px0) if "domain" in yref else ya.pos(s.get("y0"))
        y1 = ya.px0 + s.get("y1", 1) * (ya.px1 - ya.px0) if "domain" in yref else ya.pos(s.get("y1"))
        color = (s.get("line") or {}).get("color") or "#2a3f5f"
        out.append(f'<line x1="{x0:.1f}" x2="{x1:.1f}" y1="{y0:.1f}" y2="{y1:.1f}" stroke="{color}" '
                   'stroke-dasharray="5,4"/>')
    for a in layout.get("annotations", []):
        if a.get("xref") == "paper" and a.get("yref") == "paper" and a.get("text"):
            out.append(_text(canvas.ml + a.get("x", 0.5) * canvas.pw, canvas.mt + (1 - a.get("y", 1)) * canvas.ph - 8,
                             _title(a["text"]), 12))
    if _title(layout.get("title")):
        out.append(_text(canvas.width / 2, 24, _title(layout.get("title")), 15, weight="bold"))
    return out


def _legend(canvas: _Canvas, prepared: list[_Trace]) -> list[str]:
    """Three entries per row under the plot, each in its trace's colour."""
    out = []
    for j, t in enumerate(canvas.shown):
        x, y = canvas.ml + (j % 3) * (canvas.pw / 3), canvas.height - canvas.legend_h + 4 + 18 * (j // 3)
        color = next((p.color for p in prepared if p.t is t), "#888")
        out.append(_rect(x, y - 9, 12, 10, color))
        out.append(_text(x + 18, y, str(t["name"])[:48], 11, "start"))
    return out


def to_svg(fig: dict, width: int = 900, height: int | None = None) -> str:
    """The figure (``fig.to_dict()``) as an SVG string."""
    layout, traces = fig.get("layout", {}), fig.get("data", [])
    canvas = _Canvas(layout, traces, width, height)
    prepared = _prepare(canvas, traces)
    w, h = canvas.width, canvas.height
    head = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
            f'viewBox="0 0 {w} {h}" font-family="Arial, sans-serif">', HATCH,
            f'<rect width="{w}" height="{h}" fill="white"/>']
    return "\n".join(head + _grids(canvas.axes) + _data(prepared, layout.get("barmode", "group"))
                     + _references(canvas) + _legend(canvas, prepared) + ["</svg>"])


def install() -> None:
    """Register plotly renderer ``"tunekit"``: plotly's own mimetype (JupyterLab, VS Code: the
    interactive chart) plus this SVG (GitHub, nbviewer: a static drawing). ``renderer.use_renderer``
    makes it the default in a Jupyter kernel."""
    import plotly.io as pio
    from plotly.io.base_renderers import MimetypeRenderer

    class Renderer(MimetypeRenderer):
        def to_mimebundle(self, fig_dict):
            bundle = pio.renderers["plotly_mimetype"].to_mimebundle(fig_dict)
            bundle["image/svg+xml"] = to_svg(fig_dict)
            title = _title(fig_dict.get("layout", {}).get("title")) or "chart"
            bundle["text/plain"] = f"<plotly figure: {title}>"
            return bundle

    pio.renderers["tunekit"] = Renderer()
