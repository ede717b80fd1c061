"""What a place without widgets shows of a Lab dashboard: a static HTML snapshot (a report, an
nbconvert export) and, where not even HTML is drawn (a terminal IPython, a frontend without the
widget manager), one line saying so and the Lab calls that do what the controls say.

    >>> print(text_fallback(dash))   # 'Lab dashboard: no widget frontend here ...' then lab.expect(...), lab.run(...)
"""
from __future__ import annotations

NO_FRONTEND = ("Lab dashboard: no widget frontend here to draw it (JupyterLab 4, Notebook 7 and VS Code have "
               "one; Colab after google.colab.output.enable_custom_widget_manager()). The same from code:")

# a dashboard's value where `lab.dashboard()` already printed the text above (a terminal IPython)
PRINTED = "<Lab dashboard: not drawn here; the calls that do what it does are printed above>"


def snapshot_html(dash) -> str:
    """The table and charts as they are now, as HTML: each chart a static drawing that plotly.js,
    where the page has it, replaces by the interactive chart (`view.renderer.static_html`)."""
    from tunekit.view.renderer import static_html

    charts = "".join(static_html(f) for f in dash.figures.values())
    note = ("<p style='color:#666;font-size:12px'>a static copy of the dashboard as it was drawn: its "
            "controls need a running kernel and a widget frontend (JupyterLab 4, Notebook 7, VS Code)</p>")
    return f"<div class='tk-dashboard'><h4>Lab dashboard (snapshot)</h4>{note}{dash.table.value}{charts}</div>"


def calls(dash) -> list[str]:
    """The Lab calls that do what ``dash``'s controls say (the toggles they changed from the Lab's,
    then the steps): its expectation, the run, the max-batch search, the results."""
    base = dash.lab.resolve()
    changed = {k: v for k, v in dash.toggles().items() if getattr(base, k, None) != v}
    args = ", ".join(f"{k}={v!r}" for k, v in changed.items())
    search = "".join(f", {k}={v!r}" for k, v in changed.items() if k != "micro_batch")
    run = f"steps={dash.controls['steps'].value}, warmup={dash.controls['warmup'].value}"
    return [f"lab.expect({args})", f"lab.run({run}{', ' if args else ''}{args})",
            f"lab.find_max_batch_size(limit={dash.max_batch.value}{search})", "lab.results()"]


def text_fallback(dash) -> str:
    """`NO_FRONTEND`, then `calls`, one per line: the text/plain of the dashboard's display."""
    return "\n".join([NO_FRONTEND] + ["    " + c for c in calls(dash)])
