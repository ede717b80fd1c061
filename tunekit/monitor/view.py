"""The live view of a `tunekit.Monitor`: progress with ETA and four small charts (tokens/s, MFU,
memory, loss) updated in place in a notebook; one line redrawn on a terminal.

Cheap by construction, since it runs between the user's steps: at most one redraw every
``EVERY_S`` seconds whatever the step time, the figure is a plain plotly JSON dict (no
plotly.graph_objects), and at most ``POINTS`` points per series (every k-th step past that).
`benchmarks/bench_monitor.py` measures what it costs per step.
"""
from __future__ import annotations

import html
import math
import sys
import time

from tunekit.core.fmt import fmt_elapsed, fmt_pct, fmt_rate
from tunekit.core.units import is_missing
from tunekit.monitor.steps import measured, speed_column
from tunekit.view.frontend import in_notebook, shell
from tunekit.view.progress import text_bar

EVERY_S = 1.0        # notebook: at most one redraw a second
TEXT_EVERY_S = 0.2   # terminal
POINTS = 300
PLOTLY = "application/vnd.plotly.v1+json"
clock = time.perf_counter


class MonitorView:
    """``view = MonitorView.open(name)``; ``view.update(rows, total)`` after each step (it decides
    whether to redraw); ``view.close(rows, record)`` draws the last state and the summary line, or
    the last step's line where ``summary_follows`` (a callback shows the record's summary next,
    which holds that line: shown once)."""

    @staticmethod
    def open(name: str, forced: bool = False) -> "MonitorView | None":
        """A notebook view in a Jupyter kernel, a text line on a terminal; else None (``forced``:
        text lines on stderr even without a terminal)."""
        if in_notebook():
            return MonitorView(name, "notebook")
        tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
        return MonitorView(name, "terminal" if tty else "lines") if tty or forced else None

    def __init__(self, name: str, mode: str):
        self.name, self.mode = name, mode
        self.t0, self._drawn, self.handle = clock(), -math.inf, None
        self.summary_follows = False
        self.every = EVERY_S if mode == "notebook" else TEXT_EVERY_S if mode == "terminal" else 5.0

    def update(self, rows, total: int | None) -> None:
        now = clock()
        if now - self._drawn < self.every:
            return
        self._drawn = now
        self._draw(rows, total, None)

    def close(self, rows, record) -> None:
        self._draw(rows, None, None if self.summary_follows else record, last=True)

    def clear(self) -> None:
        """Erase the terminal line now (another logger prints next: on a line of its own); the
        next update draws it again, under that output."""
        if self.mode == "terminal":
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()

    def _draw(self, rows, total, record, last: bool = False) -> None:
        line = status(self.name, rows, total, clock() - self.t0, record)
        if self.mode != "notebook":
            end = "\n" if last or self.mode == "lines" else ""
            sys.stderr.write(("\r" if self.mode == "terminal" else "") + line +
                             ("\x1b[K" if self.mode == "terminal" else "") + end)
            sys.stderr.flush()
            return
        from IPython.display import display, update_display

        done = len(rows) / total if total else None
        bar = "" if done is None else f" <progress value='{min(done, 1):.3f}' max='1' style='width:12em'></progress>"
        bundle = {"text/plain": line,
                  "text/html": f"<div style='font-family:monospace;font-size:12px'>{html.escape(line)}{bar}</div>"}
        if self.handle is None:
            self.handle = display(bundle, raw=True, display_id=True)
            self.chart = display({"text/plain": "(charts appear after the first steps)"}, raw=True, display_id=True)
        else:
            update_display(bundle, raw=True, display_id=self.handle.display_id)
        if rows:
            update_display({PLOTLY: figure(rows, self.name), "text/plain": f"{self.name}: {len(rows)} steps"},
                           raw=True, display_id=self.chart.display_id)


def status(name: str, rows, total: int | None, elapsed_s: float, record=None) -> str:
    """``run 3: step 40/100 · 12.3 s, ETA 18.4 s · 31,905 tokens/s · MFU 21.0% · loss 3.12``;
    at the end, the summary line."""
    if record is not None:
        return f"{name}: " + record.notes[0] + (" · ⚠ machine busy" if record.conditions is not None
                                                  and record.conditions.busy else "")
    n = len(rows)
    head = f"{name}: step {n}" + (f"/{total}" if total else "") + f" · {fmt_elapsed(elapsed_s)}"
    if total and n:
        head += f", ETA {fmt_elapsed(elapsed_s / n * max(total - n, 0))}" + " " + text_bar(n / total)
    last = next((r for r in reversed(rows) if measured(r)), None)
    if last is None:
        return head + (" · warm-up / FLOP count" if rows else "")
    col = speed_column(rows)
    parts = [head]
    if not is_missing(last[col]):
        parts.append(fmt_rate(last[col], col.replace("_per_s", "/s")))
    if not is_missing(last["mfu"]):
        parts.append(f"MFU {fmt_pct(last['mfu'])}")
    if isinstance(last.get("loss"), float) and not is_missing(last["loss"]):
        parts.append(f"loss {last['loss']:.4g}")
    return " · ".join(parts)


def figure(rows, name: str) -> dict:
    """A plotly figure as a JSON dict: tokens/s (or samples/s), MFU, memory and loss per step,
    measured steps only for the rates (warm-up and counted steps are not speeds)."""
    k = max(1, math.ceil(len(rows) / POINTS))
    shown = rows[::k]
    col = speed_column(rows)
    steps = [r["step"] for r in shown]

    def series(key, scale=1.0, only_measured=True):
        out = []
        for r in shown:
            v = r.get(key)
            ok = isinstance(v, float) and not is_missing(v) and not (only_measured and not measured(r))
            out.append(v * scale if ok else None)
        return out

    gpu = any(not is_missing(r["gpu_peak_bytes"]) for r in rows)
    mem_key, mem_name = ("gpu_peak_bytes", "GPU peak (MiB)") if gpu else ("cpu_peak_bytes", "CPU peak RSS (MiB)")
    panels = [(col, 1.0, col.replace("_per_s", "/s"), True), ("mfu", 100.0, "MFU (%)", True),
              (mem_key, 2.0**-20, mem_name, False), ("loss", 1.0, "loss", False)]
    from_zero = {col, "mfu", mem_key}   # rates and memory from 0; the loss on its own range
    data, layout = [], {"height": 360, "margin": {"l": 50, "r": 10, "t": 40, "b": 30}, "showlegend": False,
                        "title": {"text": f"{name}: per step", "font": {"size": 13}}, "annotations": []}
    for i, (key, scale, title, only) in enumerate(panels):
        ax = "" if i == 0 else str(i + 1)
        col_i, row_i = i % 2, i // 2
        data.append({"type": "scatter", "mode": "lines+markers", "marker": {"size": 3}, "x": steps,
                     "y": series(key, scale, only), "xaxis": "x" + ax, "yaxis": "y" + ax, "name": title})
        layout["xaxis" + ax] = {"domain": [col_i * 0.53, col_i * 0.53 + 0.47], "anchor": "y" + ax,
                                "tickfont": {"size": 9}}
        layout["yaxis" + ax] = {"domain": [0.55 - row_i * 0.55, 1.0 - row_i * 0.55], "anchor": "x" + ax,
                                "tickfont": {"size": 9}, "rangemode": "tozero" if key in from_zero else "normal"}
        layout["annotations"].append({"text": title, "showarrow": False, "xref": "x" + ax + " domain",
                                      "yref": "y" + ax + " domain", "x": 0, "y": 1.12, "xanchor": "left",
                                      "font": {"size": 11}})
    return {"data": data, "layout": layout}



def watch_cells(mon):
    """In IPython, after each cell: a step still going from ``mon.iter`` (the loop was left with
    the iterator held) or from a cell that failed ends there, as ``left`` or with the cell's
    error, so no FLOP counter outlives it. A step started by hand and ended in a later cell is
    left alone. Returns ``unwatch()``, which unregisters the hook (``mon.close()`` calls it: gone
    at once, not at the next cell); the hook unregisters itself too once ``mon`` is closed, also
    when a Ctrl-C cuts it short. None outside IPython."""
    ip = shell()
    if ip is None:
        return None

    def after(result, mon=mon):
        try:
            step = mon._open
            if step is not None and not mon.closed:
                error = result.error_in_exec or result.error_before_exec
                if error is not None:
                    mon.end_step(error)
                elif step.get("from_iter"):
                    mon.end_step("left")
        finally:   # a KeyboardInterrupt above (IPython shows it and goes on) leaves no closed Monitor watched
            if mon.closed:
                unwatch()

    def unwatch() -> None:
        if after in ip.events.callbacks["post_run_cell"]:
            ip.events.unregister("post_run_cell", after)

    ip.events.register("post_run_cell", after)
    return unwatch
