"""Never block without a frontend (issue 19): outside a Jupyter kernel plotly's own default
("browser") serves the page on a local socket and waits for a browser to fetch it, forever where
none will. tunekit's figures are returned; shown, they are written to an HTML file whose path is
printed. BROWSER=true below is a browser that starts and never fetches: plotly's choice hangs."""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tunekit.core import paths
from tunekit.view import renderer

ROOT = Path(__file__).resolve().parents[2]


def _default_renderer(code, plotly_renderer=None):
    env = {k: v for k, v in os.environ.items() if k != "PLOTLY_RENDERER"}
    env.update({"PYTHONPATH": str(ROOT)}, **({"PLOTLY_RENDERER": plotly_renderer} if plotly_renderer else {}))
    out = subprocess.run([sys.executable, "-c", code + "; print(pio.renderers.default)"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_changes_no_renderer_a_tunekit_chart_never_opens_a_browser():
    # import tunekit leaves plotly alone; BROWSER=true makes plotly's own default "browser"
    browser = "import os; os.environ['BROWSER'] = 'true'; "
    plotly_own = _default_renderer(browser + "import plotly.io as pio")
    assert _default_renderer(browser + "import tunekit, plotly.io as pio") == plotly_own
    # a tunekit chart made outside a kernel replaces a browser default by the file renderer
    chart = (browser + "import pandas as pd, plotly.io as pio; from tunekit.bench.plots import _line; "
             "_line(pd.DataFrame({'a': [1], 'b': [2]}), 'a', 'b', 'title', 'y')")
    assert _default_renderer(chart) == ("tunekit_file" if "browser" in plotly_own else plotly_own)
    # the explicit call, by frontend; a renderer the user names wins
    assert _default_renderer("import tunekit, plotly.io as pio; tunekit.use_renderer()") == "tunekit_file"
    assert _default_renderer("import ipykernel, tunekit, plotly.io as pio; tunekit.use_renderer()") == "tunekit"
    assert _default_renderer("import tunekit, plotly.io as pio; tunekit.use_renderer()",
                             plotly_renderer="json") == "json"


def test_use_renderer_and_restore_put_plotlys_default_back():
    import plotly.io as pio

    before = pio.renderers.default
    try:
        mine = "tunekit" if renderer.in_kernel() else "tunekit_file"  # pytest loads ipykernel (nbval)
        assert renderer.use_renderer() == mine and pio.renderers.default == mine
        renderer.restore_renderer()
        assert pio.renderers.default == before
        renderer.restore_renderer()  # a second restore changes nothing
        assert pio.renderers.default == before
    finally:
        pio.renderers.default = before


def test_a_shown_chart_is_a_file_beside_one_plotly_js_and_the_oldest_go(monkeypatch, tmp_path):
    import plotly.graph_objects as go

    monkeypatch.setenv("TUNEKIT_DATA_DIR", str(tmp_path))
    folder = tmp_path / "figures"
    folder.mkdir()
    for i in range(paths.KEEP_FIGURES):
        (folder / f"old-{i:02d}.html").write_text("")
        os.utime(folder / f"old-{i:02d}.html", (1e9 + i, 1e9 + i))
    fig = go.Figure(go.Bar(y=[1, 2]), layout_title_text="Tokens/s <b>per run</b>")
    line = renderer.save_chart(fig.to_dict())
    path = Path(re.match(r"chart: (\S+)", line).group(1))
    assert path.parent == folder and re.fullmatch(r"tokens-s-per-run-\d{8}-\d{6}-\d+-\d+\.html", path.name)
    assert line == (f"chart: {path}\n(removed 1 older charts from {folder} (tunekit keeps the newest 50): "
                    "old-00.html)")
    assert 'src="plotly.min.js"' in path.read_text() and (folder / "plotly.min.js").stat().st_size > 1e6
    assert len(list(folder.glob("*.html"))) == paths.KEEP_FIGURES
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TUNEKIT_DATA_DIR", str(tmp_path / "file"))  # its figures/ cannot be made
    assert renderer.save_chart(fig.to_dict()).startswith("chart not saved ([Errno 20] Not a directory")


def _run(argv, code, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNEKIT_DATA_DIR": str(tmp_path), "BROWSER": "true"}
    env.pop("PLOTLY_RENDERER", None)
    try:
        out = subprocess.run([*argv, textwrap.dedent(code)], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=240)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"blocked: {e.stdout!r}") from None
    assert out.returncode == 0 and "Traceback" not in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    charts = re.findall(r"chart: (\S+\.html)", out.stdout)
    assert all(Path(c).parent == tmp_path / "figures" and Path(c).is_file() for c in charts)
    return out.stdout, [Path(c).name for c in charts]


# the same work in both: a traced cell/block with its memory timeline, the history, a Lab's
# comparison and an autotune with a small budget
LAB = ("lab = tunekit.Lab(peak_tflops=1.0, micro_batch=2, seq_len=32); lab.run(steps=1, warmup=0)\n"
       "found = lab.autotune(budget_s=4, space={'compile': [False]}, repeats=1)\n")
CHARTS = ("where-the-cpu-time-went", "memory-through-the-step", "profiled-cells", "each-run-against-baseline-0",
          "autotune-")  # the start of each figure's title (autotune's says whether it could decide)


@pytest.mark.slow
def test_terminal_ipython_prints_chart_paths_and_never_waits(tmp_path):
    # `ipython -c` runs a TerminalInteractiveShell, where plotly would pick "browser"
    code = ("%load_ext tunekit\n"
            "get_ipython().run_cell('%%gpuprofile --trace --memory --flops never --peak 1 -n step\\n"
            "x = torch.randn(64, 64, requires_grad=True)\\n(x @ x).sum().backward()')\n"
            "display(tunekit.profiling.plot_history())\n" + LAB + "display(lab.compare())\nfound.figure\n")
    out, charts = _run([sys.executable, "-m", "IPython", "--no-banner", "--colors=nocolor", "-c"],
                       "import torch, tunekit\n" + code, tmp_path)
    assert len(charts) == len(CHARTS) and all(map(str.startswith, charts, CHARTS)), out
    assert f"Chrome trace: {tmp_path / 'traces'}" in out


@pytest.mark.slow
def test_plain_python_returns_figures_and_show_writes_them(tmp_path):
    code = """\
        import io, contextlib, torch, tunekit
        with tunekit.profile(name="step", flops="never", peak=1.0, trace=True, memory=True) as rec:
            x = torch.randn(64, 64, requires_grad=True); (x @ x).sum().backward()
        """ + LAB.replace("\n", "\n        ") + """
        said = io.StringIO()
        with contextlib.redirect_stdout(said):  # building a figure shows nothing
            figs = [tunekit.view.plot_breakdown(rec.trace), tunekit.view.plot_memory_timeline(rec.memory),
                    tunekit.profiling.plot_history(), lab.compare(), found.figure]
        assert said.getvalue() == "", said.getvalue()
        for fig in figs:
            fig.show()
        """
    out, charts = _run([sys.executable, "-c"], code, tmp_path)
    assert len(charts) == len(CHARTS) and all(map(str.startswith, charts, CHARTS)), out


@pytest.mark.parametrize("plotly_default", ["", "browser", "png"])
def test_a_tunekit_chart_on_a_headless_machine_is_written_and_said(monkeypatch, tmp_path, capsys, plotly_default):
    # issue 33: with no display plotly's default renderer is "" and fig.show() did nothing, said
    # nothing; like a browser, it becomes the file renderer; a renderer that does something stays
    import pandas as pd
    import plotly.io as pio

    from tunekit.bench.plots import _line

    monkeypatch.setenv("TUNEKIT_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("PLOTLY_RENDERER", raising=False)
    monkeypatch.setattr(renderer, "in_kernel", lambda: False)
    monkeypatch.setattr(renderer, "_BEFORE", [])
    monkeypatch.setattr(pio.renderers, "default", plotly_default)
    fig = _line(pd.DataFrame({"a": [1], "b": [2]}), "a", "b", "headless", "y")
    if plotly_default == "png":
        assert pio.renderers.default == "png"
        return
    assert pio.renderers.default == "tunekit_file"
    fig.show()
    (path,) = re.findall(r"chart: (\S+\.html)", capsys.readouterr().out)
    assert Path(path).parent == tmp_path / "figures" and Path(path).is_file()


def test_static_html_is_a_drawing_that_plotly_js_replaces():
    import re

    import plotly.graph_objects as go

    from tunekit.view.renderer import static_html

    page = static_html(go.Figure(go.Bar(x=["a", "b"], y=[1, 2]), layout={"title": "tokens/s"}))
    box = re.search(r'<div id="(tk-svg-[0-9a-f]{12})"><svg ', page).group(1)
    assert page.count("<svg ") == 1 and 'class="plotly-graph-div"' in page and "Plotly.newPlot(" in page
    # the drawing comes first and is removed only where plotly.js is loaded; nothing is fetched
    assert page.index(box) < page.index("Plotly.newPlot(")
    assert f'if (window.Plotly) {{ document.getElementById("{box}").remove(); }}' in page
    assert "src=" not in page
