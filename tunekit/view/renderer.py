"""Which plotly renderer shows figures, by frontend: never a browser, never a wait.

    >>> tunekit.profiling.plot_history().show()     # in a terminal or a script:
    chart: /home/ada/.local/share/tunekit/figures/profiled-cells-20250601-101500-4242-0.html

Left alone, plotly picks ``"browser"`` outside a Jupyter kernel (terminal IPython, plain Python):
it starts a local web server, asks the system for a browser and blocks until one fetches the page,
forever on a machine without one (ssh, a container, CI). ``import tunekit`` changes nothing;
tunekit's renderer becomes plotly's default

- with ``%load_ext tunekit`` (undone by ``%unload_ext tunekit``) or ``tunekit.use_renderer()``;
- when a tunekit chart is made outside a kernel while plotly's default would open a browser or
  render nothing (``never_a_browser``: a tunekit chart never blocks a terminal, and its
  ``show()`` always says where it went).

Which one: in a Jupyter kernel ``"tunekit"``, plotly's own mimetype plus a static SVG
(``figure_svg``); anywhere else ``"tunekit_file"``, which writes the figure to an HTML file under
``core.paths.figures_dir()`` (plotly.js stored once beside it, so it opens offline), prints its
path and keeps the newest ``KEEP_FIGURES`` files. With ``PLOTLY_RENDERER`` set tunekit changes
nothing; setting ``plotly.io.renderers.default`` yourself afterwards also wins.
"""
from __future__ import annotations

import itertools
import os
import re
import sys
import time

from tunekit.core.paths import KEEP_FIGURES, figures_dir, prune, pruned_note

_COUNT = itertools.count()


def _title(fig_dict) -> str:
    title = fig_dict.get("layout", {}).get("title")
    return (title.get("text") if isinstance(title, dict) else title) or "chart"


def chart_path(fig_dict, folder=None):
    """Where the chart of ``fig_dict`` goes: ``<title>-<time>-<pid>-<n>.html``, unique per process."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", re.sub(r"<[^>]*>", " ", str(_title(fig_dict)))).strip("-").lower()[:50]
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_COUNT)}"
    return (folder or figures_dir()) / f"{slug or 'chart'}-{stamp}.html"


def save_chart(fig_dict) -> str:
    """Write the figure to a new HTML file in ``figures_dir()``; the line that says where (or why not)."""
    import plotly.io as pio

    path = chart_path(fig_dict)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # "directory": one plotly.min.js beside the charts instead of 4.6 MB inside each
        pio.write_html(fig_dict, str(path), include_plotlyjs="directory", auto_open=False, validate=False)
    except OSError as e:
        return f"chart not saved ({e}); set TUNEKIT_DATA_DIR to a writable folder"
    note = pruned_note(prune(path.parent, "*.html", KEEP_FIGURES), "charts", KEEP_FIGURES)
    return f"chart: {path}" + (f"\n({note})" if note else "")


def _file_renderer():
    from plotly.io.base_renderers import ExternalRenderer

    class FileRenderer(ExternalRenderer):
        """Writes each shown figure to an HTML file and prints its path; opens nothing."""

        def render(self, fig_dict):
            print(save_chart(fig_dict))

    return FileRenderer()


def in_kernel() -> bool:
    return "ipykernel" in sys.modules


_BEFORE: list = []  # plotly's default before tunekit set its own (one entry while it is set)
BROWSERS = {"browser", "firefox", "chrome", "chromium"}  # plotly renderers that open a browser and wait


def use_renderer() -> str | None:
    """Register tunekit's renderers and make the one for this frontend plotly's default; returns
    its name, or None when ``PLOTLY_RENDERER`` says which renderer the user wants.
    ``restore_renderer()`` puts plotly's previous default back.

    Example: ``tunekit.use_renderer()`` (``%load_ext tunekit`` calls it)."""
    import plotly.io as pio

    from tunekit.view.figure_svg import install

    install()
    pio.renderers["tunekit_file"] = _file_renderer()
    if os.environ.get("PLOTLY_RENDERER"):
        return None
    if not _BEFORE:
        _BEFORE.append(pio.renderers.default)
    pio.renderers.default = "tunekit" if in_kernel() else "tunekit_file"
    return pio.renderers.default


def restore_renderer() -> None:
    """Plotly's default renderer as it was before ``use_renderer()`` (no-op if it was not used)."""
    if _BEFORE:
        import plotly.io as pio

        pio.renderers.default = _BEFORE.pop()


def never_a_browser() -> None:
    """Called by tunekit's chart functions: outside a kernel, a default that would open a browser
    (and block without one) or that renders nothing (``""``: what plotly picks on a headless
    machine, where ``fig.show()`` would do nothing and say nothing) becomes ``"tunekit_file"``;
    anything else is left as it is."""
    if in_kernel() or os.environ.get("PLOTLY_RENDERER"):
        return
    import plotly.io as pio

    chosen = {r for r in str(pio.renderers.default or "").split("+") if r}
    if not chosen or chosen & BROWSERS:
        use_renderer()


def static_html(fig) -> str:
    """A plotly figure as HTML for a page that may have no plotly.js (a plain ``jupyter nbconvert
    --to html``, an untrusted notebook): a static SVG drawing (`figure_svg.to_svg`), replaced by
    the interactive chart where plotly.js is loaded (tunekit's offline report inlines it). Nothing
    is fetched.

    Example: ``Path("chart.html").write_text(static_html(fig))`` opens as a drawing anywhere."""
    import uuid

    from tunekit.view.figure_svg import to_svg

    box = f"tk-svg-{uuid.uuid4().hex[:12]}"
    chart = fig.to_html(full_html=False, include_plotlyjs=False)
    # without plotly.js, plotly's own script stops at its first line: the drawing stays
    return (f'<div class="tk-chart"><div id="{box}">{to_svg(fig.to_dict())}</div>{chart}'
            f'<script>if (window.Plotly) {{ document.getElementById("{box}").remove(); }}</script></div>')
