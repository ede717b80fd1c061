"""Open a tunekit report in headless Chromium: every plotly figure must have drawn, offline.

    python tools/check_report.py build/tour.html [--screenshot build/tour.png]

Exit 0 when every `Plotly.newPlot` drew its SVG; 1 when one did not; 2 when no Chromium is
installed (`apt-get install chromium`). The browser runs with networking disabled, so a chart
that needed a download would fail here.
"""
import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--proxy-server=127.0.0.1:9", "--virtual-time-budget=15000"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--screenshot", default=None)
    args = ap.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        print("no Chromium installed: skipped (apt-get install chromium)")
        return 2
    page = Path(args.report).resolve()
    expected = page.read_text().count("Plotly.newPlot(")
    with tempfile.TemporaryDirectory() as profile:
        flags = FLAGS + [f"--user-data-dir={profile}"]
        dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True,
                             text=True, timeout=120).stdout
        if args.screenshot:
            subprocess.run([browser, *flags, "--window-size=1200,2400", f"--screenshot={args.screenshot}",
                            page.as_uri()], capture_output=True, timeout=120)
    drawn = len(re.findall(r"<div[^>]*class=\"[^\"]*plot-container", dom))
    print(f"{drawn} of {expected} plotly figures drew in headless Chromium (offline)")
    return 0 if expected and drawn == expected else 1


if __name__ == "__main__":
    sys.exit(main())
