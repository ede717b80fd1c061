"""Do the dashboard and the charts draw in JupyterLab 4 and Notebook 7? Checked in headless Chromium.

    python tools/browser_check.py                 # both frontends
    python tools/browser_check.py notebook        # one: lab or notebook

For each frontend: a Jupyter server on a free port with a token, on a temporary notebook that
builds a Lab dashboard and a plotly chart; headless Chromium opens it over the DevTools protocol
(as tools/screenshot_dashboard.py does), runs every cell, clicks the dashboard's Run button, and
checks the page: the controls are there (the Run and Find-max-batch buttons, the toggles'
dropdowns and number boxes), no "Error displaying widget", no text fallback (which means no widget
manager drew it), the run's row in the table, and every chart an SVG drawn by plotly.js (the
dashboard's and the standalone figure's). One line per frontend, ``ok`` or what was wrong.

Needs `jupyterlab` and `notebook` (pip install 'tunekit[browser]') and Chromium (apt-get install
chromium); exit 2 when one is missing, 1 when a frontend failed a check, 0 when all passed.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
from screenshot_dashboard import Page, _port, _sleep, _wait_http, stop  # noqa: E402 - the tool beside this one

CELLS = ["import plotly.graph_objects as go\nimport tunekit\n"
         "lab = tunekit.Lab(peak_tflops=1.0, micro_batch=2, seq_len=32)\ndash = lab.dashboard()\n"
         "dash.controls['steps'].value = 1\ndash.controls['warmup'].value = 0\ndash",
         "go.Figure(go.Bar(x=['fp32', 'bf16'], y=[1.0, 1.6]), layout={'title': 'a plotly chart'})"]
FRONTENDS = {"lab": ("jupyterlab", "lab", "LabApp", "lab/tree/check.ipynb"),
             "notebook": ("notebook", "notebook", "JupyterNotebookApp", "notebooks/check.ipynb")}
# what the page must show once the cells ran and Run was clicked (JavaScript, evaluated in the page)
OUT = "document.querySelectorAll('.jp-OutputArea-output')"
STATE = ("(() => { const outs = [...%s]; const text = document.body.innerText;"
         "const buttons = [...document.querySelectorAll('.jp-OutputArea button')].map(b => b.textContent.trim());"
         "return {run: buttons.includes('Run'), find: buttons.includes('Find max batch'),"
         "selects: document.querySelectorAll('.jp-OutputArea select').length,"
         "inputs: document.querySelectorAll('.jp-OutputArea input').length,"
         "error: text.includes('Error displaying widget'), fallback: text.includes('no widget frontend here'),"
         "traceback: !!document.querySelector('.jp-OutputArea-output[data-mime-type*=error]'),"
         "rows: document.querySelectorAll('.jp-OutputArea table.tk tbody tr').length,"
         "charts: document.querySelectorAll('.jp-OutputArea .js-plotly-plot .main-svg').length,"
         "expect: /expected [0-9.,]+ (µs|ms|s)\\/step/.test(text),"
         "outputs: outs.length}; })()") % OUT


def missing() -> str | None:
    """What this machine lacks for the check ('' parts joined), None when nothing."""
    lacks = [f"{pkg} (pip install 'tunekit[browser]')" for pkg in ("jupyterlab", "notebook")
             if importlib.util.find_spec(pkg) is None]
    if browser() is None:
        lacks.append("Chromium (apt-get install chromium)")
    return ", ".join(lacks) or None


def browser() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def problems(state: dict) -> list[str]:
    """What is wrong with the page's state (`STATE`), as sentences; [] when it drew everything."""
    out = []
    if state.get("error"):
        out.append("'Error displaying widget' on the page")
    if state.get("fallback"):
        out.append("the dashboard's text fallback shows: no widget manager drew it")
    if state.get("traceback"):
        out.append("a cell raised")
    if not (state.get("run") and state.get("find")):
        out.append("no Run / Find max batch buttons")
    if state.get("selects", 0) < 3 or state.get("inputs", 0) < 3:
        out.append(f"{state.get('selects', 0)} dropdowns and {state.get('inputs', 0)} inputs: "
                   "the toggles' controls are missing")
    if state.get("rows", 0) < 1:
        out.append("no row in the runs table after Run")
    if not state.get("expect"):
        out.append("no expectation line ('expected ... ms/step') under the controls")
    if state.get("charts", 0) < 2:
        out.append(f"{state.get('charts', 0)} plotly SVG chart(s), expected the dashboard's and the figure's")
    return out


async def drive(debug_port: int, url: str, seconds: float) -> dict:
    """Open ``url``, run every cell, click Run; the page's `STATE` once it drew all or time ran out."""
    targets = json.loads(_wait_http(f"http://127.0.0.1:{debug_port}/json/list", 30))
    from tornado.websocket import websocket_connect

    page = next(t for t in targets if t["type"] == "page")
    p = Page(await websocket_connect(page["webSocketDebuggerUrl"], max_message_size=64 << 20))
    await p.call("Page.navigate", url=url)
    end = time.time() + seconds
    await p.until("!!(window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell'))", end - time.time(),
                  "the notebook")
    await p.until("(() => { const b = document.querySelector('.jp-Dialog .jp-mod-accept'); if (b) b.click();"
                  "const w = window.jupyterapp.shell.currentWidget || [...window.jupyterapp.shell.widgets('main')][0];"
                  "return !b && w?.sessionContext?.session?.kernel?.status === 'idle'; })()",
                  end - time.time(), "the kernel")
    await p.js("(() => { const a = window.jupyterapp;"
               "const w = a.shell.currentWidget || [...a.shell.widgets('main')][0]; a.shell.activateById(w.id);"
               "a.commands.execute('notebook:run-all-cells'); })()")
    click = "[...document.querySelectorAll('.jp-OutputArea button')].find(b => b.textContent.trim() === 'Run')"
    try:
        await p.until(f"!!{click} || !!document.querySelector('.jp-OutputArea-output[data-mime-type*=error]')"
                      "|| document.body.innerText.includes('Error displaying widget')", end - time.time(),
                      "the dashboard")
    except TimeoutError:   # never drawn: the page as it is says what is missing
        return await p.js(STATE)
    await p.js(f"{click}?.click()")
    while True:   # read at least once, however late the dashboard came
        state = await p.js(STATE)
        if not problems(state) or state.get("error") or state.get("traceback") or time.time() > end:
            return state
        await _sleep(0.5)


def check(frontend: str, seconds: float = 240) -> tuple[list[str], float]:
    """(problems, seconds taken) of one frontend ("lab" or "notebook"); ``seconds`` for the page to
    draw everything once opened (about 50 s on 2 quiet cores, twice that and more when busy)."""
    from tornado.ioloop import IOLoop

    _, command, app, path = FRONTENDS[frontend]
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=f"tk-browser-{frontend}-"))
    (work / "nb").mkdir()
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS], metadata=kernel),
                   work / "nb" / "check.ipynb")
    token, port, debug_port = secrets.token_hex(8), _port(), _port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(work / "cfg"), "JUPYTERLAB_WORKSPACES_DIR": str(work / "ws"),
           "JUPYTER_RUNTIME_DIR": str(work / "run"), "TUNEKIT_DATA_DIR": str(work / "data")}
    server = subprocess.Popen([sys.executable, "-m", "jupyter", command, "--no-browser", f"--port={port}",
                               "--ip=127.0.0.1", f"--IdentityProvider.token={token}", "--allow-root",
                               f"--{app}.expose_app_in_browser=True", f"--ServerApp.root_dir={work / 'nb'}",
                               "--LabApp.news_url=", "--ServerApp.disable_check_xsrf=True"],
                              env=env, stdout=subprocess.DEVNULL, stderr=(work / "server.log").open("w"))
    chrome = subprocess.Popen([browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                               f"--remote-debugging-port={debug_port}", "--window-size=1400,1400",
                               f"--user-data-dir={work / 'chrome'}", "about:blank"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = {}
    try:
        _wait_http(f"http://127.0.0.1:{port}/api/status?token={token}", 60)
        url = f"http://127.0.0.1:{port}/{path}?token={token}" + ("&reset" if frontend == "lab" else "")
        state = IOLoop.current().run_sync(lambda: drive(debug_port, url, seconds), timeout=seconds + 60)
        found = problems(state)
    except (TimeoutError, RuntimeError, StopIteration, OSError) as e:
        found = [f"{type(e).__name__}: {e}"]
    finally:
        stop((chrome, server), work)
    if found:
        print(frontend, state, flush=True)   # what the page showed, for a failure's report
    return found, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("frontends", nargs="*", metavar="FRONTEND", help="lab, notebook (default: both)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    unknown = [f for f in args.frontends if f not in FRONTENDS]
    if unknown:
        ap.error(f"unknown frontend {', '.join(unknown)}: choose from {', '.join(FRONTENDS)}")
    lacks = missing()
    if lacks:
        print(f"skipped: this machine lacks {lacks}")
        return 2
    failed = False
    for frontend in args.frontends or FRONTENDS:
        found, took = check(frontend)
        failed |= bool(found)
        print(f"{FRONTENDS[frontend][0]}: " + ("ok" if not found else "; ".join(found)) + f" ({took:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
