"""The dashboard where no widget is drawn: a static HTML export (nbconvert --to html) shows its
snapshot (table and charts as drawings), a place without a widget frontend (terminal IPython, Colab
before its custom widget manager) says so in one line and prints the same calls as text."""
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tunekit.lab.dashboard import NO_FRONTEND

WIDGET = "application/vnd.jupyter.widget-view+json"
ROOT = Path(__file__).resolve().parents[2]


def _calls(text: str) -> list[str]:
    lines = text.splitlines()
    assert lines[0] == NO_FRONTEND       # one line says why, the rest are the calls
    assert all(x.startswith("    lab.") for x in lines[1:]), lines
    return [x.strip() for x in lines[1:]]


def test_the_text_says_so_in_one_line_and_gives_the_calls_of_the_controls(dash):
    dash.controls["precision"].value = "bf16"
    dash.controls["micro_batch"].value = 8
    data = dash._repr_mimebundle_()
    assert set(data) == {WIDGET, "text/html", "text/plain"}
    expect = ["lab.expect(precision='bf16', micro_batch=8)"] if callable(getattr(dash.lab, "expect", None)) else []
    # the fixture's Lab is 4 x 64 with 2 timed steps, no warm-up: only the changed toggles are named;
    # the search varies the micro batch, so it is not passed to it
    assert _calls(data["text/plain"]) == expect + [
        "lab.run(steps=2, warmup=0, precision='bf16', micro_batch=8)",
        "lab.find_max_batch_size(limit=64, precision='bf16')", "lab.results()"]


def test_the_expectation_call_is_listed_where_the_lab_has_one(dash):
    dash.lab.expect = lambda **changes: None
    assert _calls(dash.text_fallback()) == ["lab.expect()", "lab.run(steps=2, warmup=0)",
                                            "lab.find_max_batch_size(limit=64)", "lab.results()"]


def test_a_text_only_frontend_gets_the_text():
    # a kernel whose frontend draws no widget (Colab before its widget manager) shows the text/plain
    from IPython.core.formatters import DisplayFormatter

    import tunekit
    from tunekit.lab.dashboard import Dashboard

    dash = Dashboard(tunekit.Lab(peak_tflops=1.0))
    data, _ = DisplayFormatter().format(dash, include={"text/plain"})
    assert list(data) == ["text/plain"] and data["text/plain"].startswith(NO_FRONTEND)


def test_a_terminal_ipython_prints_the_text_once_wherever_the_call_is(make_lab, monkeypatch, capsys):
    # a terminal IPython shows only a cell's last value: `d = lab.dashboard()` mid-cell showed nothing.
    # The text is printed at the call; the value, where it is the last expression, is one line
    import IPython
    from IPython.core.formatters import DisplayFormatter
    from IPython.terminal.interactiveshell import TerminalInteractiveShell

    from tunekit.lab.dashboard_static import PRINTED

    shell = object.__new__(TerminalInteractiveShell)
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    dash = make_lab(peak_tflops=1.0, micro_batch=4, seq_len=64).dashboard()
    printed = capsys.readouterr().out
    assert printed.count(NO_FRONTEND) == 1 and _calls(printed.rstrip("\n"))[-1] == "lab.results()"
    data, _ = DisplayFormatter().format(dash, include={"text/plain"})
    assert data == {"text/plain": PRINTED}


def test_only_a_widget_frontend_gets_the_expectation_line(make_lab, monkeypatch):
    # the line under the controls is lab.expect on a thread of its own: a terminal IPython shows the
    # text, never the line, so no plan runs behind it (the interpreter waited for it at exit); a
    # Jupyter kernel (a shell with a kernel) draws the widget and gets it
    from types import SimpleNamespace

    import IPython
    from IPython.terminal.interactiveshell import TerminalInteractiveShell

    import tunekit.lab.dashboard as dmod

    lab = make_lab(peak_tflops=1.0, micro_batch=4, seq_len=64)
    asked = []
    monkeypatch.setattr(lab, "expect", lambda **changes: asked.append(changes) or SimpleNamespace(
        line="expected (made up)", base_run=None))
    monkeypatch.setattr(dmod, "_plotly_output", lambda fig: {})   # the charts: nothing to draw on here
    shell = object.__new__(TerminalInteractiveShell)   # what get_ipython() is in a terminal IPython
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)    # read by tunekit.view.frontend, its one home
    terminal = lab.dashboard()
    terminal.controls["micro_batch"].value = 8
    assert terminal.expect_line is None and asked == []
    assert _calls(terminal.text_fallback())[0] == "lab.expect(micro_batch=8)"   # the call is still given
    monkeypatch.setattr(IPython, "get_ipython", lambda: SimpleNamespace(kernel=object(), execution_count=1))
    kernel = lab.dashboard()
    assert kernel.expect_line.wait(10) and len(asked) == 1
    assert "expected (made up)" in kernel.expect_html.value


def test_a_script_gets_the_text_printed_and_no_thread(make_lab, monkeypatch, capsys):
    # plain `python script.py`: nothing displays the returned widget, so lab.dashboard() prints the
    # text a terminal IPython shows, and plans nothing on a thread: a plan left running held the
    # process at exit (a daemon thread cut inside torch aborted pytest instead)
    import threading

    lab = make_lab(peak_tflops=1.0, micro_batch=4, seq_len=64)
    asked = []
    monkeypatch.setattr(lab, "expect", lambda **changes: asked.append(changes))
    # no IPython shell, as in a script (an earlier test of this process may have made one)
    monkeypatch.setattr("IPython.get_ipython", lambda: None)
    before = {t for t in threading.enumerate() if t.name == "tunekit-expect"}
    dash = lab.dashboard()
    dash.controls["micro_batch"].value = 8
    assert capsys.readouterr().out.startswith(NO_FRONTEND)
    assert dash.expect_line is None and asked == []
    assert {t for t in threading.enumerate() if t.name == "tunekit-expect"} <= before


@pytest.mark.slow
def test_terminal_ipython_prints_the_text(tmp_path):
    script = ("import tunekit, threading\nlab = tunekit.Lab(peak_tflops=1.0)\nlab.dashboard()\n"
              "print('threads:', sorted(t.name for t in threading.enumerate()))\n")
    out = subprocess.run([sys.executable, "-m", "IPython", "--no-banner", "--colors=NoColor", "--simple-prompt"],
                         input=script, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "TUNEKIT_DATA_DIR": str(tmp_path),   # this checkout's tunekit
                              "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert NO_FRONTEND in out.stdout and "    lab.run(steps=20, warmup=2)" in out.stdout, out.stdout + out.stderr
    assert "threads:" in out.stdout and "tunekit-expect" not in out.stdout, out.stdout   # no plan to wait for


def _exported(dash, widget_state: bool) -> str:
    """The HTML of a notebook whose one cell displayed ``dash``, by nbconvert's HTML exporter (the
    lab template, as ``jupyter nbconvert --to html``), with or without the widget state saved."""
    from nbconvert import HTMLExporter

    data = dash._repr_mimebundle_()
    cell = nbformat.v4.new_code_cell("lab.dashboard()", outputs=[
        nbformat.v4.new_output("display_data", data=data)])
    nb = nbformat.v4.new_notebook(cells=[cell])
    if widget_state:
        model = data[WIDGET]["model_id"]
        nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {
            "version_major": 2, "version_minor": 0, "state": {model: {"model_name": "VBoxModel", "state": {}}}}}
    return HTMLExporter().from_notebook_node(nb)[0]


def test_nbconvert_html_shows_the_snapshot_with_its_charts_drawn(dash):
    dash.run_button.click()
    page = _exported(dash, widget_state=False)
    # the snapshot: heading, the run's row, the compare chart as an SVG drawing (plotly.js is not
    # on this page, so the interactive chart cannot replace it)
    assert "Lab dashboard (snapshot)" in page and "<table" in page and "<svg" in page
    assert 'type="application/vnd.jupyter.widget-view+json"' not in page


def test_nbconvert_with_saved_widget_state_renders_the_widget_view(dash):
    # a notebook saved with its widget state (nbclient's --execute does) is drawn by the widgets'
    # HTML manager instead, which nbconvert loads from a CDN: the snapshot is not in it. That page
    # needs the network; tunekit's own report (python -m tunekit.cli.report_html) shows the snapshot.
    page = _exported(dash, widget_state=True)
    assert 'type="application/vnd.jupyter.widget-view+json"' in page and "Lab dashboard (snapshot)" not in page


def test_the_dashboard_chart_carries_a_drawing_for_places_without_plotly(dash, shell):
    # the widgets' HTML manager (an nbconvert export with widget state, nbviewer) has no plotly
    # renderer: it draws the SVG; JupyterLab and Notebook 7 draw plotly's mimetype
    dash.run_button.click()
    data = dash.chart_out.outputs[0]["data"]
    assert "application/vnd.plotly.v1+json" in data and data["image/svg+xml"].startswith("<svg ")
