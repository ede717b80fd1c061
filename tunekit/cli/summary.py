"""The session summary a notebook shows with ``tunekit.cli.show_summary(lab)``: where it ran, the
peaks MFU is measured against, every profiled cell and Lab run; `report_html` puts it on top of the
report. Its own module, so that ``python -m tunekit.cli.report_html`` (make tour) does not find
report_html imported by the package first (runpy's RuntimeWarning).
"""
from __future__ import annotations

import html

from tunekit.core.units import is_missing

SUMMARY_ROLE = "tunekit-summary"


class SessionSummary:
    """What a person wants first: where it ran, against which peak, what was measured."""

    def __init__(self, lab=None):
        from tunekit.core.summary import history_view, table_html
        from tunekit.measure.history import history

        h = history(all=True)
        parts = ["<h2>Summary</h2>"]
        runs = lab.results(all=True) if lab is not None else None
        devices = [d for d in (list(h["device"]) + (list(runs["device"]) if runs is not None else [])) if d]
        peaks = {}   # every peak an MFU here was measured against, with its source
        for df, value, source in ((h, "peak_tflops", "peak_tflops_source"),
                                  (runs, "peak_tflops", "peak_tflops_source")):
            if df is not None and len(df):
                for v, src in zip(df[value], df[source]):
                    if isinstance(src, str) and not is_missing(v):
                        peaks[src] = float(v)
        listed = "".join(f"<li>{v:.4g} TFLOPS: {html.escape(src)}</li>" for src, v in peaks.items())
        parts.append(f"<p><b>device</b> {html.escape(devices[-1] if devices else 'n/a')}</p>"
                     f"<p><b>peaks MFU is measured against</b></p><ul>{listed or '<li>none</li>'}</ul>")
        parts.append(busy_banner([*h.get("conditions", [])] + ([*runs["conditions"]] if runs is not None else [])))
        if len(h):
            parts += ["<h3>Profiled cells</h3>", table_html(history_view(h))]
        if runs is not None and len(runs):
            from tunekit.core.results import runs_view

            parts += ["<h3>Lab runs</h3>", table_html(runs_view(runs))]
        self.html = "\n".join(parts)

    def _repr_html_(self) -> str:
        return f"<div class='summary'>{self.html}</div>"


def busy_banner(verdicts) -> str:
    """A visible line when any measurement was taken on a busy machine; '' when none was."""
    verdicts = [v for v in verdicts if isinstance(v, str)]
    busy = sum(v == "busy" for v in verdicts)
    if not busy:
        return ""
    return (f"<p class='tk-busy' style='background:#fff3e0;border-left:4px solid #e65100;padding:4px 8px'>"
            f"<b style='color:#e65100'>⚠ busy machine</b>: {busy} of {len(verdicts)} measurements were "
            "taken while other work used the machine (column <i>machine</i>); their times measure that "
            "work too and are not comparisons of the settings. Re-run them when the machine is quiet.</p>")


def show_summary(lab=None) -> None:
    """Display the session summary in a notebook, marked so that the report puts it on top.

    Example: ``tunekit.cli.show_summary(lab)`` in a notebook's last cell."""
    from IPython.display import display

    display(SessionSummary(lab), metadata={"tunekit": {"role": SUMMARY_ROLE}})
