"""The dashboard and the charts in a real browser: `tools/browser_check.py` runs a notebook that
builds a Lab dashboard and a plotly chart in JupyterLab 4 and in Notebook 7, in headless Chromium,
clicks Run, and reads the page. Skipped, saying what is missing, without jupyterlab/notebook
(pip install 'tunekit[browser]') or Chromium; about a minute per frontend on 2 busy cores."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("browser_check", ROOT / "tools" / "browser_check.py")
bc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bc)

# what the page showed in JupyterLab 4.6 / Notebook 7.6 (one dashboard of 5 dropdowns, one run)
DRAWN = {"run": True, "find": True, "selects": 5, "inputs": 12, "error": False, "fallback": False,
         "traceback": False, "rows": 1, "charts": 6, "outputs": 3, "expect": True}


def test_a_drawn_page_passes_and_each_lack_is_named():
    assert bc.problems(DRAWN) == []
    assert bc.problems({**DRAWN, "error": True}) == ["'Error displaying widget' on the page"]
    # no widget manager: the text fallback shows, and so no control, no run, no dashboard chart
    assert bc.problems({**DRAWN, "fallback": True, "run": False, "find": False, "selects": 0, "inputs": 0,
                        "rows": 0, "charts": 1, "expect": False}) == [
        "the dashboard's text fallback shows: no widget manager drew it",
        "no Run / Find max batch buttons",
        "0 dropdowns and 0 inputs: the toggles' controls are missing",
        "no row in the runs table after Run",
        "no expectation line ('expected ... ms/step') under the controls",
        "1 plotly SVG chart(s), expected the dashboard's and the figure's"]


@pytest.mark.slow
@pytest.mark.parametrize("frontend", ["lab", "notebook"])
def test_the_dashboard_and_a_chart_draw_in(frontend):
    lacks = bc.missing()
    if lacks:
        pytest.skip(f"the browser check needs {lacks}")
    found, _took = bc.check(frontend)
    assert found == [], f"{bc.FRONTENDS[frontend][0]}: {found}"
