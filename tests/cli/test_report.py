"""The main job's report: self-contained (opens offline), every chart embedded, summary on top."""
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import plotly.graph_objects as go
import pytest

from tunekit.cli.report_html import PLOTLY, SUMMARY_ROLE, build
from tunekit.core.fmt import fmt_pct

ROOT = Path(__file__).resolve().parents[2]
# tags that would fetch something: a report must load nothing from anywhere
EXTERNAL = re.compile(r"<(script|img|iframe)[^>]+src=['\"]?(https?:)?//|<link[^>]+href=['\"]?(https?:)?//"
                      r"|@import\s+url\(['\"]?(https?:)?//", re.I)


def _nb(tmp_path):
    fig = go.Figure(go.Bar(x=["a", "b"], y=[1, 2]))
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Title\nSome *text*."),
        nbformat.v4.new_code_cell("fig", outputs=[nbformat.v4.new_output(
            "display_data", data={PLOTLY: fig.to_plotly_json(), "text/plain": "<fig>"})]),
        nbformat.v4.new_code_cell("print(1)", outputs=[nbformat.v4.new_output("stream", text="1\n")]),
        nbformat.v4.new_code_cell("widget", outputs=[nbformat.v4.new_output("display_data", data={
            "application/vnd.jupyter.widget-view+json": {"model_id": "x"}, "text/plain": "W"})]),
        nbformat.v4.new_code_cell("summary", outputs=[nbformat.v4.new_output(
            "display_data", data={"text/html": "<div class='summary'>SUMMARY</div>"},
            metadata={"tunekit": {"role": SUMMARY_ROLE}})]),
    ]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_report_embeds_charts_once_and_puts_the_summary_first(tmp_path):
    out = build(_nb(tmp_path), tmp_path / "r.html")
    page = out.read_text()
    assert page.count("Plotly.newPlot(") == 1 and page.count("<script>") == 2   # plotly.js + 1 figure
    assert page.index("SUMMARY") < page.index("Some <em>text</em>") < page.index("Plotly.newPlot(")
    assert "an interactive widget" in page and "<pre class=''>1\n</pre>" in page
    assert not EXTERNAL.search(page)


def test_make_tours_command_writes_the_report_without_a_warning(tmp_path):
    # `python -m tunekit.cli.report_html` (make tour): tunekit.cli must not import the module first,
    # else runpy warns "'tunekit.cli.report_html' found in sys.modules after import of package"
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "tunekit.cli.report_html",
                           str(_nb(tmp_path)), str(tmp_path / "r.html")], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"wrote {tmp_path / 'r.html'} (")
    import tunekit.cli
    from tunekit.cli.report_html import show_summary
    assert tunekit.cli.show_summary is show_summary     # its old home still has it


@pytest.mark.slow
def test_the_tour_report_has_every_chart_the_dashboard_and_the_summary(tmp_path):
    executed = tmp_path / "00_tour.ipynb"
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                    str(ROOT / "notebooks" / "00_tour.ipynb"), "--output-dir", str(tmp_path),
                    "--ExecutePreprocessor.timeout=600"], check=True, capture_output=True)
    page = build(executed, tmp_path / "tour.html").read_text()
    # plot_history, lab.compare(), and the dashboard's chart (throughput + memory) in its snapshot
    assert page.count("Plotly.newPlot(") == 3
    assert "Lab dashboard (snapshot)" in page and "<h3>Lab runs</h3>" in page
    assert page.index("<h2>Summary</h2>") < page.index("1. Profile a training step")
    assert not EXTERNAL.search(page)
    nb = nbformat.read(str(executed), as_version=4)
    streams = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
               if o.get("name") == "stderr" or o.output_type == "error"]
    assert streams == []   # no warning or error box in the tour


def test_results_and_history_display_as_readable_tables_and_stay_plain_dataframes():
    import pickle

    import pandas as pd

    import tunekit

    lab = tunekit.Lab()
    lab.run(steps=1, warmup=0, micro_batch=2)
    df = lab.results()
    r = lab.runs[-1]
    page = df._repr_html_()
    # separators, MFU in % (one decimal; under 1%, as on a busy machine, two significant digits)
    assert f"{r.tokens_per_s:,.0f}" in page and fmt_pct(r.mfu) in page and fmt_pct(r.mfu).endswith("%")
    assert "tokens/s" in page and "peak (MiB)" in page and "1 row;" in page
    assert type(df[["mfu"]]) is pd.DataFrame and type(df.copy()) is pd.DataFrame
    assert type(pickle.loads(pickle.dumps(df))) is pd.DataFrame
    assert df["tokens_per_s"].iloc[0] == r.tokens_per_s  # the data are the raw numbers
    with tunekit.profile(name="readable"):
        sum(range(10))
    assert "time (s)" in tunekit.history()._repr_html_()

