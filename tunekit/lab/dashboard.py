"""ipywidgets dashboard over a Lab: it reads controls, calls the Lab, shows what it returns.

    >>> dash = lab.dashboard()            # display it in a notebook cell
    >>> dash.controls["precision"].value = "bf16"
    >>> dash.run_button.click()           # drivable from code: this is how it is tested
    >>> dash.trace_box.value = True       # the next run traced: its line against the expected step
    >>> dash.table_df                     # the rows the table shows
    >>> dash.plan_picker.value = "H100 SXM"   # the plan of the controls' toggles on an H100
    >>> dash.last_plan.fits, dash.plan_html.value

"Run on" a cluster target submits a job and returns at once (tunekit.lab.cluster_panel).
Refused combinations (fp16 on CPU, flash without CUDA, micro batch 0, ...) are explained in the
message area; a run never shows a traceback here (``dash.last_error`` keeps the exception).
"""

from __future__ import annotations

import html

import ipywidgets as W

from tunekit.autotune.view import evidence_view
from tunekit.core import toggles as tg
from tunekit.core.fmt import fmt_ms
from tunekit.core.results import runs_view
from tunekit.core.run_text import rate
from tunekit.core.summary import table_html
from tunekit.core.toggles import Declared, Env, ToggleError, notices
from tunekit.core.units import MiB
from tunekit.lab import dashboard_static as static
from tunekit.lab.cluster_panel import ClusterPanel
from tunekit.lab.dashboard_static import NO_FRONTEND  # noqa: F401 - its home's name, read here by tests
from tunekit.lab.expect_line import EXPECT_WAIT_S, ExpectLine, predicted_line
from tunekit.lab.plots import compare_figure
from tunekit.planning.panel import PlanPanel
from tunekit.view.frontend import in_notebook, shell


def _plotly_output(fig) -> dict:
    """A display_data output holding the figure as plotly's own mimetype (JupyterLab, Notebook 7
    and VS Code render it without fetching plotly.js) and as a static SVG drawing, for what draws
    the widget without plotly (the widgets' HTML manager of an nbconvert export, nbviewer)."""
    import plotly.io as pio

    from tunekit.view.figure_svg import to_svg

    fig_dict = fig.to_dict()
    data = pio.renderers["plotly_mimetype"].to_mimebundle(fig_dict)
    data["image/svg+xml"] = to_svg(fig_dict)
    data["text/plain"] = f"<plotly figure: {fig.layout.title.text or 'chart'}>"
    return {"output_type": "display_data", "data": data, "metadata": {}}


def _target_name(target) -> str:
    """A cluster target as the "Run on" menu names it: ``slurm gpu 2x8``."""
    return (f"{type(target).__name__.lower()} {getattr(target, 'partition', None) or 'default'} "
            f"{getattr(target, 'nodes', 1)}x{getattr(target, 'ranks_per_node', 1)}")


def _box(text: str, color: str) -> str:
    return (f'<div style="border-left:4px solid {color};padding:4px 8px;margin:4px 0">'
            f"{text}</div>")


def toggle_control(t: Declared, value, env: Env) -> W.ValueWidget:
    """The widget of one declared toggle (`core.toggles.declared`), its help as the tooltip. An
    optimizer unavailable here is listed, not hidden (picking it explains why); a model without
    an attention switch gets the attention dropdown disabled."""
    kw = {"value": value, "description": t.label, "tooltip": t.help}
    if t.control == "dropdown":
        options = [(f"{n} (unavailable)" if t.name == "optimizer" and n in env.unavailable_optimizers
                    else str(n), n) for n in t.choices]
        if t.name == "attention" and not env.can_set_attention:
            options, kw["disabled"] = [None], True
        return W.Dropdown(options=options, **kw)
    return {"checkbox": W.Checkbox, "int": W.IntText, "float": W.FloatText}.get(t.control, W.Text)(**kw)


class Dashboard(W.VBox):
    """Controls for every toggle, Run and Find-max-batch buttons, progress, table and charts.

    Example: ``dash = lab.dashboard()`` (or ``Dashboard(lab, max_batch=128)``); see the module docstring."""

    def __init__(self, lab, steps: int = 20, warmup: int = 2, max_batch: int = 64, on=None,
                 expect: bool | None = None):
        self.lab = lab
        # the line under the controls (ExpectLine: lab.expect on a thread), by default where widgets are drawn
        self.expect_html, expect = W.HTML(), in_notebook() if expect is None else expect
        self.expect_line = ExpectLine(lab, self.expect_html) if expect else None
        # "Run on": this machine, or a cluster target (tunekit.Slurm) given as ``on`` (one, or {name: target})
        targets = {} if on is None else on if isinstance(on, dict) else {_target_name(on): on}
        self.run_on = W.Dropdown(options=[("this machine", None)] + list(targets.items()), value=None,
                                 description="Run on",
                                 layout=W.Layout(width="260px", display="" if targets else "none"))
        d, env = lab.resolve(), lab.env()
        style = {"description_width": "110px"}
        c = self.controls = {t.name: toggle_control(t, getattr(d, t.name, t.default), env)
                             for t in tg.declared(tg.Toggles)}
        c["steps"] = W.IntText(value=steps, description="timed steps")
        c["warmup"] = W.IntText(value=warmup, description="warm-up steps")
        for name, w in c.items():
            w.style = style
            w.observe(lambda _change: self.explain(), names="value")
            if name not in ("steps", "warmup"):   # a plan shown follows the toggles, and so does the expectation
                w.observe(lambda _change: self.show_plan() if self.plan_picker.value else None, names="value")
                w.observe(lambda _change: self.update_expectation(), names="value")
        self.plan_panel, self._plan_error = PlanPanel(style), ""   # "Plan for": lab.plan on a picked device
        self.plan_picker, self.plan_html = self.plan_panel.picker, self.plan_panel.html
        self.plan_picker.observe(lambda _change: self.show_plan(), names="value")
        self.max_batch = W.IntText(value=max_batch, description="max batch", style=style)
        cpu = lab.device.type == "cpu"
        self.budget_mib = W.FloatText(value=1024.0 if cpu else 0.0, style=style,
                                      description="CPU budget MiB" if cpu else "budget MiB (0=none)")
        self.run_button = W.Button(description="Run", button_style="primary", icon="play")
        self.cluster, self.cluster_run = ClusterPanel(self), None   # Run on a cluster: its job's line, Stop
        self.stop_button, self.job_line = self.cluster.stop_button, self.cluster.line
        self.trace_box = W.Checkbox(value=False, description="trace (vs expected)", indent=False,
                                    tooltip="trace one more step and set it against the plan's expected step",
                                    layout=W.Layout(width="150px"))
        self.find_button = W.Button(description="Find max batch", icon="search",
                                    layout=W.Layout(min_width="150px"))  # the whole label, not "Find ..."
        self.autotune_button = W.Button(description="Autotune", icon="magic", layout=W.Layout(min_width="120px"))
        self.autotune_budget = W.FloatText(value=60.0, description="budget (s)", style=style)
        self.autotune_kwargs: dict = {}  # more lab.autotune arguments (space=..., keep_global_batch=...)
        self.autotune_out, self.autotune_chart = W.HTML(), W.Output()
        self.last_autotune = None
        self.progress = W.IntProgress(value=0, min=0, max=1, description="idle")
        self.message = W.HTML()
        self.table = W.HTML()
        self.chart_out = W.Output()   # throughput and the measured memory components per run
        self.figures = {}
        self.table_df = None
        self.last_error = None
        self.last_search = None
        self.last_diff = None     # tunekit.diff of the last run against the one before it
        self.run_button.on_click(self._on_run)
        self.find_button.on_click(self._on_find)
        self.autotune_button.on_click(self._on_autotune)
        names = list(c)
        grid = W.GridBox([c[n] for n in names], layout=W.Layout(
            grid_template_columns="repeat(3, 300px)"))
        for w in (self.max_batch, self.budget_mib):
            w.layout = W.Layout(width="250px")
        buttons = W.HBox([self.run_button, self.stop_button, self.run_on, self.trace_box, self.progress,
                          self.find_button, self.max_batch, self.budget_mib], layout=W.Layout(flex_flow="row wrap"))
        tune = W.HBox([self.autotune_button, self.autotune_budget, self.plan_picker])
        super().__init__([grid, self.expect_html, buttons, self.job_line, tune, self.message, self.plan_html,
                          self.autotune_out, self.autotune_chart, self.table, self.chart_out])
        self.explain()
        self.refresh()
        self.update_expectation()

    # --- reading the controls ------------------------------------------------------------

    def toggles(self) -> dict:
        """The toggles the controls describe, as keyword arguments for ``lab.run``.

        Example: ``lab.run(**dash.toggles())``."""
        skip = ("steps", "warmup")
        return {k: w.value for k, w in self.controls.items() if k not in skip}

    def explain(self) -> list[str]:
        """Show why the current controls cannot run (red) or what will differ (grey).

        Example: ``dash.controls["precision"].value = "fp16"; dash.explain()``."""
        steps, warmup = self.controls["steps"].value, self.controls["warmup"].value
        try:   # the one Setting Run would make (lab.setting_of): words none can hold are its problems
            t = self.lab.setting_of(**self.toggles()).toggles
            problems = self.lab.check(t, steps, warmup)
        except ToggleError as exc:
            problems = self.lab.check(self.lab.resolve(**self.toggles()), steps, warmup) or exc.problems
        except (TypeError, ValueError) as exc:
            self.message.value = _box(html.escape(str(exc)), "#d62728")
            return [str(exc)]
        if problems:
            self.message.value = "".join(_box("⚠ " + html.escape(p), "#d62728") for p in problems)
        else:
            notes = notices(t, self.lab.env())
            self.message.value = "".join(_box(html.escape(n), "#999") for n in notes)
        return problems

    def update_expectation(self) -> None:
        """Ask for ``lab.expect`` of the controls' setting; the line under the controls shows it
        when it comes (`ExpectLine`: a thread of its own, the newest request wins).

        Example: ``dash.update_expectation(); dash.expect_line.wait(5); dash.expect_html.value``."""
        if self.expect_line is not None:
            self.expect_line.request(self.toggles())

    @property
    def last_plan(self):
        """The Plan the panel shows (None: no device picked, or the plan failed)."""
        return self.plan_panel.last

    def show_plan(self):
        """Plan the controls' toggles on the "Plan for" device (``lab.plan``) and show it beside
        the latest run; returns the Plan (None: no device picked, or the failure, said in the
        message area, below what is there, and kept in ``last_error``).

        Example: ``dash.plan_picker.value = "A100"`` shows it; ``dash.show_plan()`` redoes it."""
        if self.expect_line is not None:   # one fake step at a time
            self.expect_line.wait(EXPECT_WAIT_S)
        self.message.value = self.message.value.replace(self._plan_error, "")   # the last plan's failure, if any
        self._plan_error = ""
        try:
            return self.plan_panel.show(self.lab, self.toggles())
        except Exception as exc:
            self.last_error = exc
            self._plan_error = _box(f"plan for {html.escape(str(self.plan_picker.value))} failed: "
                                    f"{html.escape(type(exc).__name__)}: {html.escape(str(exc))}", "#d62728")
            self.message.value += self._plan_error
        return None

    # --- actions --------------------------------------------------------------------------

    def _attempt(self, what: str, action):
        """``action()``, or None with its failure shown as a sentence (a refused toggle as the
        Lab's reasons; anything else kept in ``last_error`` for debugging). An expectation being
        planned is let finish first (its run's prediction); lab.run stops one still going."""
        if self.expect_line is not None:
            self.expect_line.wait(EXPECT_WAIT_S)
        try:
            return action()
        except ToggleError as exc:
            self.message.value = "".join(_box("⚠ " + html.escape(p), "#d62728") for p in exc.problems)
        except Exception as exc:
            self.last_error = exc
            self.message.value = _box(f"{what} failed: {html.escape(type(exc).__name__)}: "
                                      f"{html.escape(str(exc))}", "#d62728")
        return None

    def _on_run(self, _button=None):
        if self.explain():
            return  # the explanation is already on screen
        steps = self.controls["steps"].value
        self.progress.max, self.progress.value = steps, 0
        if self.run_on.value is not None:   # a cluster target: the run is a job there, followed from a thread
            return self.cluster.submit(self.run_on.value, steps)
        self.progress.description = "warm-up"  # and the FLOP count: untimed, before the clock
        self.run_button.disabled = True

        def tick(done, total):
            self.progress.value, self.progress.description = done, f"step {done}/{total}"

        try:
            r = self._attempt("run", lambda: self.lab.run(steps=steps, warmup=self.controls["warmup"].value,
                                                          progress=tick, verbose=False, trace=self.trace_box.value,
                                                          **self.toggles()))
        finally:
            self.run_button.disabled = False
            self.progress.description = "done"
        if r is not None:
            self._show_run(r)

    def _show_run(self, r) -> None:
        """A run just recorded: its line, busy warning, prediction, diff and notes; the table redrawn."""
        notes = "".join(_box(html.escape(n), "#999") for n in r.notes)
        busy = r.conditions is not None and r.conditions.busy
        head = _box(f"run #{r.run_id} ({html.escape(r.label)}): "
                    f"{rate(r)}, {fmt_ms(r.step_s)}/step, "
                    f"loss {r.loss:.3f}", "#e65100" if busy else "#2ca02c")
        if busy:  # in the colour and the words of the row's badge: these figures are not the change's
            head += _box("⚠ busy machine: " + html.escape(r.conditions.reason) + ". These figures measure "
                         "the other work too; re-run when the machine is quiet before comparing.", "#e65100")
        if predicted_line(r):   # lab.expect's answer, made before the run, against what it measured
            head += _box(html.escape(predicted_line(r)), "#1f77b4")
        if r.explained:   # a traced run against the expected step of its setting (tunekit.explain's line)
            head += _box("traced step: " + html.escape(r.explained), "#1f77b4")
        self.message.value = head + self._diff_box(r) + notes
        self.refresh()
        self.update_expectation()   # the next answer, calibrated by this run
        if self.plan_picker.value:
            self.show_plan()   # the bound beside the run just measured

    def _diff_box(self, r) -> str:
        """What changed from the run before (tunekit.diff), in its words; '' for the first run."""
        from tunekit.core.diff import diff

        earlier = [x for x in self.lab.runs if x.run_id != r.run_id and x.status == "ok"]
        self.last_diff = None
        if not earlier or r.status != "ok":
            return ""
        try:
            self.last_diff = diff(earlier[-1], r)
        except ValueError:     # another model ran before: nothing to compare with
            return ""
        lines = self.last_diff.summary.splitlines()
        return _box("<br>".join(html.escape(x) for x in lines), "#555")

    def _on_find(self, _button=None):
        toggles = self.toggles()
        toggles.pop("micro_batch")
        budget = self.budget_mib.value * MiB if self.budget_mib.value > 0 else None
        self.progress.max, self.progress.value, self.progress.description = 1, 0, "searching"
        self.find_button.disabled = True
        lines = []

        def report(trial):
            self.progress.description = f"trial {len(lines) + 1}"
            lines.append(f"micro batch {trial.micro_batch}: {'fits' if trial.fits else trial.reason}"
                         + (f" ({trial.used_bytes / MiB:.0f} MiB above baseline)"
                            if trial.used_bytes is not None else ""))
            self.message.value = _box("<br>".join(html.escape(s) for s in lines), "#1f77b4")

        try:
            found = self._attempt("search", lambda: self.lab.find_max_batch_size(
                limit=self.max_batch.value, progress=report, memory_budget_bytes=budget, verbose=False,
                **toggles))   # the dashboard's own progress bar shows it
        finally:
            self.progress.value, self.progress.description = 1, "done"
            self.find_button.disabled = False
        if found is None:
            return
        self.last_search = found
        verdict = found.verdict  # the answer and why the search stopped (converged, limit, budget)
        if found.stopped == "search limit":
            verdict += "; the limit is the 'max batch' box"
        if found.best:
            self.controls["micro_batch"].value = found.best
            verdict += f". Micro batch {found.best} is set in the control"
        # green: the answer; orange: a lower bound only (the search limit or the budget stopped it)
        color = "#2ca02c" if found.stopped == "converged" and found.best else "#e65100"
        self.message.value = _box(html.escape(verdict) + "<br>" +
                                  "<br>".join(html.escape(s) for s in lines), color)

    def _on_autotune(self, _button=None):
        budget = self.autotune_budget.value
        self.progress.max, self.progress.value = max(1, round(budget)), 0
        self.progress.description = "autotune"
        self.autotune_button.disabled = True

        def tick(elapsed_s, budget_s, text):
            self.progress.value = min(self.progress.max, round(elapsed_s))
            self.progress.description = f"{elapsed_s:.0f}/{budget_s:.0f} s"
            self.message.value = _box("autotune: " + html.escape(text), "#1f77b4")

        try:
            found = self._attempt("autotune", lambda: self.lab.autotune(budget_s=budget, progress=tick, verbose=False,
                                                                        **self.autotune_kwargs))
        finally:
            self.progress.value, self.progress.description = self.progress.max, "done"
            self.autotune_button.disabled = False
        if found is None:
            return
        self.last_autotune = found
        if found.toggles is not None and found.state.startswith("winner"):
            for k, v in found.toggles.asdict().items():  # the controls show what is now applied
                if k in self.controls:
                    self.controls[k].value = v
        # red: stopped early; orange: inconclusive or never measured quiet (no winner proven); green
        color = "#d62728" if found.partial else "#e65100" if found.inconclusive or found.busy else "#2ca02c"
        self.message.value = _box(html.escape(found.verdict), color)
        self.autotune_out.value = ("<b>autotune evidence</b>" + table_html(evidence_view(found.evidence)))
        self.refresh()
        if shell() is not None:
            self.autotune_chart.outputs = (_plotly_output(found.figure),)

    # --- a static copy, for reports that cannot run widgets ---------------------------------

    def snapshot_html(self) -> str:
        """The table and charts as they are now, as HTML (tunekit.lab.dashboard_static).
        Example: ``Path("dash.html").write_text(dash.snapshot_html())``."""
        return static.snapshot_html(self)

    def calls(self) -> list[str]:
        """The Lab calls that do what the controls say, as text (tunekit.lab.dashboard_static).
        Example: ``["lab.expect(precision='bf16')", "lab.run(steps=20, warmup=2, precision='bf16')", ...]``."""
        return static.calls(self)

    def text_fallback(self) -> str:
        """One line that says no widget can be drawn here, then `calls`.
        Example: ``print(dash.text_fallback())`` (what a terminal IPython shows)."""
        return static.text_fallback(self)

    def _repr_mimebundle_(self, **kwargs):
        # Jupyter draws the live widget; a static HTML export (nbconvert, tunekit's report) shows the
        # snapshot; a place without widgets (terminal IPython) the text
        data = super()._repr_mimebundle_(**kwargs) or {}
        data["text/html"] = self.snapshot_html()
        data["text/plain"] = static.PRINTED if getattr(self, "text_printed", False) else self.text_fallback()
        return data

    # --- output ---------------------------------------------------------------------------

    def refresh(self) -> None:
        """Redraw the table and charts from ``lab.results()``.

        Example: ``dash.refresh()`` after runs made outside the dashboard."""
        df = self.lab.results(all=True)
        self.table_df = runs_view(df)
        self.table.value = table_html(self.table_df) if len(df) else "<i>no runs yet</i>"
        self.figures = {"compare": compare_figure(df)}
        if self.last_autotune is not None:
            self.figures["autotune"] = self.last_autotune.figure
        if shell() is None:
            return  # plain Python (tests): keep the figures, nothing to draw on
        # Set the Output widget's content directly rather than capturing with `with out:`:
        # capture routes outputs through the widget's msg_id, which headless runners
        # (nbclient, hence nbconvert --execute) intermittently wait on forever.
        self.chart_out.outputs = (_plotly_output(self.figures["compare"]),)
