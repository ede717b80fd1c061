"""Screenshot the dashboard as a user sees it: a live JupyterLab, driven by headless Chromium.

    python tools/screenshot_dashboard.py docs/dashboard.png [--allow-busy]

Starts JupyterLab on a temporary notebook (`lab = tunekit.Lab(); lab.dashboard()`), opens it in
headless Chromium over the DevTools protocol, runs the cell, clicks the dashboard's Run button
twice (fp32, then bf16 picked in its precision dropdown the way a user would), waits for the
table rows and the charts, and takes a PNG of the cell's output.

The picture shows throughput, so it is only as good as the machine was quiet: the kernel logs
its runs to a temporary data folder, and each run's record is read back from that log. The
caption for the README (the picture's alt text and the line under it) is printed with them: it
states the conditions, when, on what device, which model, how many steps, and how busy the
machine was during each run (quiet or busy, with the reason). If a run was measured busy, or carries no conditions, the
picture is not written (exit 3): run it again on a quiet machine. ``--allow-busy`` writes it
anyway, with a caption that says the machine was busy.

Needs `jupyterlab` (`make lab` installs it) and Chromium; exit 2 when either is missing, 1 when
the page never got there.
"""
import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
from tornado.ioloop import IOLoop
from tornado.websocket import websocket_connect

CELL = "import tunekit\nlab = tunekit.Lab()\ndash = lab.dashboard()\ndash.controls['steps'].value = 20\ndash"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, seconds: float) -> str:
    end = time.time() + seconds
    while time.time() < end:
        try:
            return urllib.request.urlopen(url, timeout=2).read().decode()
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(url)


class Page:
    """The few DevTools calls this script needs, over one websocket."""

    def __init__(self, ws):
        self.ws, self.n = ws, 0

    async def call(self, method, **params):
        self.n += 1
        await self.ws.write_message(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(await self.ws.read_message())
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    async def js(self, expr):
        r = await self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        return r["result"].get("value")

    async def until(self, expr, seconds, what):
        print(f"waiting for {what}", flush=True)
        end = time.time() + seconds
        while time.time() < end:
            if await self.js(expr):
                return
            await _sleep(0.5)
        raise TimeoutError(f"waited {seconds} s for {what}")


async def _sleep(s):
    import asyncio

    await asyncio.sleep(s)


# --- the runs in the picture and their conditions ------------------------------------------------


def stop(procs, work: Path) -> None:
    """End the browser and the server (kill what does not stop within 10 s) and remove ``work``."""
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    shutil.rmtree(work, ignore_errors=True)


def logged_runs(data_dir: Path) -> list:
    """The runs the dashboard logged: every record of the Lab's day logs under ``data_dir``
    (the kernel's TUNEKIT_DATA_DIR), oldest first."""
    runs = []
    for log in sorted((Path(data_dir) / "runs").glob("lab-*.jsonl")):
        for line in log.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:   # a partial last line
                continue
            if isinstance(rec, dict) and "tokens_per_s" in rec:
                runs.append(rec)
    return runs


def _verdict(rec: dict) -> tuple:
    """(verdict, reason) of one logged run; a run without conditions is 'unknown'."""
    cond = rec.get("conditions")
    if isinstance(cond, dict) and cond.get("verdict"):
        return cond["verdict"], cond.get("reason") or ""
    return "unknown", "no conditions recorded"


def setting(runs: list) -> str:
    """How the runs in the picture were taken, from their log records: when, on what device, which
    model, how many steps ('' for what the records do not say)."""
    first = runs[0]
    cond = first.get("conditions") if isinstance(first.get("conditions"), dict) else {}
    parts = []
    if first.get("time"):
        parts.append(f"on {first['time']}")
    if first.get("device"):
        parts.append(str(first["device"]) + (f" of a {cond['cpus']}-CPU machine" if cond.get("cpus") else ""))
    if first.get("model"):
        n = first.get("n_params")
        parts.append(str(first["model"]) + (f" ({n / 1e3:,.1f}k params)" if isinstance(n, (int, float)) else ""))
    if first.get("steps") is not None:
        parts.append(f"{first['steps']} timed steps after {first.get('warmup', '?')} warm-up per run")
    return ", ".join(parts)


def caption(runs: list) -> tuple:
    """(alt text, the line under the picture, quiet): what the picture shows and the conditions it
    was taken under (when, where, which model, how many steps, and how busy the machine was while
    each run in it was measured). ``quiet`` is False when any run was busy or unknown."""
    if not runs:
        return "the dashboard in JupyterLab", "No run was logged: the picture shows no measurement.", False
    cpus = next((r["conditions"].get("cpus") for r in runs if isinstance(r.get("conditions"), dict)
                 and r["conditions"].get("cpus")), None)
    where = f"a {cpus}-CPU machine" if cpus else "this machine"
    names = ", then ".join(str(r.get("label", "?")) for r in runs)
    verdicts = [_verdict(r) for r in runs]
    quiet = all(v == "quiet" for v, _ in verdicts)
    alt = (f"the dashboard in JupyterLab after {len(runs)} run(s) ({names}) on {where}, "
           + ("measured on a quiet machine" if quiet else "measured on a BUSY machine"))
    parts = [f"#{r.get('run_id', i)} {r.get('label', '?')}: {float(r['tokens_per_s']):,.0f} "
             f"{r.get('throughput_unit') or 'tokens'}/s, machine {v} ({why})"
             for i, (r, (v, why)) in enumerate(zip(runs, verdicts))]
    how = setting(runs)
    line = ("Measured while the picture was taken" if quiet else
            "BUSY machine: these throughputs measured other work too, do not quote them. Measured") + \
        (f" {how}" if how else "") + ": " + "; ".join(parts) + "."
    return alt, line, quiet


async def drive(debug_port: int, url: str) -> bytes:
    targets = json.loads(_wait_http(f"http://127.0.0.1:{debug_port}/json/list", 30))
    page = next(t for t in targets if t["type"] == "page")
    p = Page(await websocket_connect(page["webSocketDebuggerUrl"], max_message_size=64 << 20))
    await p.call("Page.enable")
    await p.call("Page.navigate", url=url)
    await p.until("!!(window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell'))", 120, "JupyterLab")
    # a new notebook may ask which kernel to start: accept the one it names (Python 3)
    await p.until("(() => { const b = document.querySelector('.jp-Dialog .jp-mod-accept'); if (b) b.click();"
                  "const k = [...window.jupyterapp.shell.widgets('main')][0]?.sessionContext?.session?.kernel;"
                  "return !b && k?.status === 'idle'; })()", 120, "the kernel")
    # a headless window has no focus: make the notebook the current widget, then run its cell
    await p.js("(() => { const w = [...window.jupyterapp.shell.widgets('main')][0];"
               "window.jupyterapp.shell.activateById(w.id); })()")
    await p.js("void window.jupyterapp.commands.execute('notebook:run-all-cells')")
    await p.until("(() => { if (document.querySelector('.jp-OutputArea-output[data-mime-type*=error]'))"
                  "throw new Error(document.querySelector('.jp-OutputArea').innerText);"
                  "return [...document.querySelectorAll('.jp-OutputArea button')]"
                  ".some(b => b.textContent.trim() === 'Run')"
                  "})()", 180, "the dashboard")
    click_run = ("[...document.querySelectorAll('.jp-OutputArea button')]"
                 ".find(b => b.textContent.trim() === 'Run').click()")
    rows = "document.querySelectorAll('.jp-OutputArea table.tk tbody tr').length"
    await p.js(click_run)
    await p.until(f"{rows} >= 1", 180, "the first run's row")
    # pick bf16 in the precision dropdown as a user would, then run again
    await p.js("(() => { const s = [...document.querySelectorAll('.jp-OutputArea select')]"
               ".find(s => [...s.options].some(o => o.value === 'bf16' || o.text === 'bf16'));"
               "const o = [...s.options].find(o => o.text === 'bf16'); s.value = o.value;"
               "s.dispatchEvent(new Event('change', {bubbles: true})); })()")
    await _sleep(1)
    await p.js(click_run)
    await p.until(f"{rows} >= 2", 180, "the second run's row")
    await p.until("document.querySelectorAll('.jp-OutputArea .js-plotly-plot .main-svg').length >= 2", 60, "the charts")
    await _sleep(2)
    await p.js("document.querySelectorAll('.Toastify, .jp-toast-container').forEach(e => e.remove())")  # news pop-up
    box = await p.js("(() => { const o = document.querySelector('.jp-Cell .jp-OutputArea');"
                     "o.scrollIntoView(); const r = o.getBoundingClientRect();"
                     "return {x: r.x, y: r.y, width: r.width, height: r.height}; })()")
    shot = await p.call("Page.captureScreenshot", format="png",
                        clip={**box, "scale": 1}, captureBeyondViewport=True)
    import base64

    return base64.b64decode(shot["data"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", default="docs/dashboard.png")
    ap.add_argument("--allow-busy", action="store_true",
                    help="write the picture even when a run in it was measured on a busy machine")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        print("jupyterlab is not installed (make lab installs it): skipped")
        return 2
    if browser is None:
        print("no Chromium installed: skipped (apt-get install chromium)")
        return 2
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp())
    (work / "nb").mkdir()
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL)], metadata=kernel),
                   work / "nb" / "dash.ipynb")
    token, lab_port, debug_port = secrets.token_hex(8), _port(), _port()
    # the kernel logs its runs here: their conditions are read back for the caption
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(work / "cfg"), "JUPYTERLAB_WORKSPACES_DIR": str(work / "ws"),
           "TUNEKIT_DATA_DIR": str(work / "data")}
    server = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={lab_port}",
                               "--ip=127.0.0.1", f"--IdentityProvider.token={token}", "--allow-root",
                               "--LabApp.expose_app_in_browser=True", f"--ServerApp.root_dir={work / 'nb'}"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    chrome = subprocess.Popen([browser, "--headless", "--no-sandbox", "--disable-gpu",
                               f"--remote-debugging-port={debug_port}",
                               "--window-size=1500,1400", f"--user-data-dir={work / 'chrome'}", "about:blank"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_http(f"http://127.0.0.1:{lab_port}/api/status?token={token}", 60)
        url = f"http://127.0.0.1:{lab_port}/lab/tree/dash.ipynb?token={token}&reset"
        png = IOLoop.current().run_sync(lambda: drive(debug_port, url), timeout=600)
        runs = logged_runs(work / "data")
    except (TimeoutError, RuntimeError, StopIteration) as e:
        print(f"failed: {e}")
        return 1
    finally:
        stop((chrome, server), work)
    alt, line, quiet = caption(runs)
    for r in runs:
        print(f"run #{r.get('run_id')} {r.get('label')}: {float(r['tokens_per_s']):,.0f} tokens/s, "
              "machine {}: {}".format(*_verdict(r)))
    if not quiet and not args.allow_busy:
        print(f"not written: a run in the picture was not measured on a quiet machine, so its numbers "
              f"would mislead; stop what else runs and try again (or --allow-busy). {out} is unchanged.")
        return 3
    out.write_bytes(png)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB) in {time.perf_counter() - t0:.0f} s; "
          f"for the README:\n\n![{alt}]({out.as_posix()})\n\n{line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
