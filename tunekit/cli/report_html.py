"""A self-contained HTML report of an executed notebook: it opens offline, anywhere.

    python -m tunekit.cli.report_html build/00_tour.ipynb build/tour.html

At the top, the session summary the notebook displayed with `tunekit.cli.show_summary(lab)` (device,
the peak MFU is measured against and its source, the profiled cells, the Lab's runs); then every
cell: its source, and its outputs with each plotly figure drawn by plotly.js inlined once, widgets
shown through the static HTML snapshot they carry (the dashboard's table and charts), images
embedded. No script, stylesheet or font is fetched from anywhere.
"""
from __future__ import annotations

import argparse
import html
import json
import sys
from pathlib import Path

from tunekit.cli.summary import SUMMARY_ROLE, busy_banner, show_summary  # noqa: F401  (show_summary: its old home)
from tunekit.core.units import MiB, is_missing

PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"

_CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:24px auto;padding:0 16px;color:#222}
pre{background:#f6f8fa;padding:8px;overflow-x:auto;font-size:12px}
pre:not(.src){white-space:pre-wrap}
pre.src{border-left:3px solid #1f77b4}
pre.err{border-left:3px solid #d62728;background:#fff0f0}
table.tk,table.dataframe{border-collapse:collapse;font-size:12px;margin:6px 0}
table.tk td,table.tk th,table.dataframe td,table.dataframe th{
  padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}
.summary{border:1px solid #ccc;padding:8px 16px;margin-bottom:24px;background:#fafafa}
.note{color:#666;font-size:12px}
"""


def _figure(spec: dict, n: int) -> str:
    data = json.dumps(spec.get("data", []))
    layout = json.dumps(spec.get("layout", {}))
    return (f"<div id='fig{n}' class='plotly-figure'></div>"
            f"<script>Plotly.newPlot('fig{n}', {data}, {layout}, {{responsive: true}});</script>")


def _output(out: dict, counter: list) -> str:
    kind = out.get("output_type")
    if kind == "stream":
        cls = "err" if out.get("name") == "stderr" else ""
        return f"<pre class='{cls}'>{html.escape(''.join(out.get('text', '')))}</pre>"
    if kind == "error":
        tb = "\n".join(out.get("traceback", []))
        return f"<pre class='err'>{html.escape(_strip_ansi(tb))}</pre>"
    data = out.get("data", {})
    if PLOTLY in data:
        counter[0] += 1
        return _figure(data[PLOTLY], counter[0])
    if "text/html" in data:
        return "".join(data["text/html"])
    if "image/png" in data:
        return f"<img src='data:image/png;base64,{''.join(data['image/png']).strip()}'>"
    if WIDGET in data:
        return "<p class='note'>(an interactive widget: open the notebook in Jupyter to use it)</p>"
    if "text/plain" in data:
        return f"<pre>{html.escape(''.join(data['text/plain']))}</pre>"
    return ""


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _markdown(text: str) -> str:
    try:
        import mistune  # comes with nbconvert
    except ImportError:
        return f"<pre>{html.escape(text)}</pre>"
    return mistune.html(text)


def build(notebook, out) -> Path:
    """Write the report of an executed notebook; returns its path."""
    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    counter, summary, body = [0], "", []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            body.append(_markdown(cell.source))
            continue
        if cell.cell_type != "code":
            continue
        body.append(f"<pre class='src'>{html.escape(cell.source)}</pre>")
        for output in cell.get("outputs", []):
            rendered = _output(output, counter)
            if output.get("metadata", {}).get("tunekit", {}).get("role") == SUMMARY_ROLE:
                summary = f"<div id='summary'>{rendered}</div>"  # on top; its cell points there
                body.append("<p class='note'>The summary this cell displays is at the "
                            "<a href='#summary'>top of this report</a>.</p>")
            else:
                body.append(rendered)
    return _write_page(Path(notebook).stem, summary + "".join(body), out)


def _write_page(title: str, body: str, out) -> Path:
    """One self-contained page: tunekit's CSS and plotly.js inlined once, no external URL."""
    from plotly.offline import get_plotlyjs

    title = html.escape(title)
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{_CSS}</style><script>{get_plotlyjs()}</script></head><body>"
            f"<h1>{title}</h1>{body}</body></html>")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


def runs_report(runs, out, title: str = "tunekit runs", baseline: int | None = None) -> Path:
    """Write a self-contained page of RunResults (no notebook needed): where they ran, the peaks
    MFU used, which run the others are compared with and why, the runs table (each run named by
    what it changes relative to that baseline), tokens/s and memory per run drawn by plotly.js
    inlined once, and each run's toggles, communication and notes. ``baseline``: a run id; None:
    the newest run with default toggles. ``tunekit run`` redraws it from its log after every run."""
    from tunekit.core.baseline import comm_lines, difference, pick
    from tunekit.core.results import results_frame
    from tunekit.core.summary import table_html
    from tunekit.lab.plots import compare_figure

    runs = list(runs)
    df = results_frame(runs)
    devices = sorted({d for d in df["device"] if isinstance(d, str)})
    peaks = {s: float(v) for v, s in zip(df["peak_tflops"], df["peak_tflops_source"])
             if isinstance(s, str) and not is_missing(v)}
    listed = "".join(f"<li>{v:.4g} TFLOPS: {html.escape(s)}</li>" for s, v in peaks.items())
    parts = [f"<div class='summary'><p><b>device</b> {html.escape(', '.join(devices) or 'n/a')}</p>"
             f"<p><b>peaks MFU is measured against</b></p><ul>{listed or '<li>none</li>'}</ul>"
             f"<p><b>runs</b> {len(df)}</p>{busy_banner(df['conditions'])}</div>"]
    if len(df):
        i, why = pick(runs, baseline)
        base = runs[i]
        parts.append(f"<p class='baseline'><b>baseline</b>: {html.escape(why)}. Each run is named by what it "
                     "changes relative to it; ratios are to its tokens/s.</p>")
        parts += ["<h2>Runs</h2>", table_html(runs_table(runs, i))]
        parts.append(_figure(json.loads(compare_figure(df, baseline=base.run_id).to_json()), 1))
        parts.append("<h2>Each run</h2>")
        for r in runs:
            toggles = ", ".join(f"{k}={v}" for k, v in r.toggles.asdict().items())
            notes = "".join(f"<li>{html.escape(str(x))}</li>" for x in r.notes)
            comm = "".join(f"<li>communication per step, {html.escape(x)}</li>" for x in comm_lines(r.comm))
            error = f"<pre class='err'>{html.escape(r.error)}</pre>" if r.error else ""
            parts.append(f"<h3>#{r.run_id} {html.escape(difference(r, base))} ({html.escape(str(r.status))})</h3>"
                         f"<p class='note'>{html.escape(str(r.time))} · {html.escape(toggles)}"
                         f"{'' if r.steps is None else ' · '}"
                         f"{'' if r.steps is None else f'{r.steps} steps'}</p>{error}"
                         f"<ul class='note'>{comm}{notes}</ul>")
    return _write_page(title, "".join(parts), out)


def runs_table(runs, base: int):
    """runs_view of the runs, each named by what it changes relative to ``runs[base]``, with
    'vs baseline' (tokens/s ratio); distributed runs add their layout and bytes per step."""
    from tunekit.core.baseline import comm_total, difference, layout
    from tunekit.core.results import results_frame, runs_view

    df = results_frame(runs)
    view = runs_view(df)
    ref = runs[base].tokens_per_s
    view["run"] = [difference(r, runs[base]) for r in runs]
    view.insert(3, "vs baseline", [f"{r.tokens_per_s / ref:.2f}x" if not is_missing(ref) and ref and
                                   not is_missing(r.tokens_per_s) else "n/a" for r in runs])
    if any(r.world_size for r in runs):
        view["layout"] = [layout(r) for r in runs]
        view["comm/step (MiB)"] = [comm_total(r.comm) / MiB for r in runs]
    return view


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Self-contained HTML report of an executed notebook.")
    ap.add_argument("notebook")
    ap.add_argument("out")
    args = ap.parse_args(argv)
    path = build(args.notebook, args.out)
    print(f"wrote {path} ({path.stat().st_size / MiB:.1f} MiB, opens offline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
