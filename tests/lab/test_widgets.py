"""The dashboard, driven from code the way a user drives it with the mouse."""
import html

import pytest

from tunekit.lab.dashboard import Dashboard


def test_controls_cover_every_toggle(dash):
    from tunekit.core.toggles import Toggles
    assert isinstance(dash, Dashboard)
    assert set(Toggles().asdict()) <= set(dash.controls)
    labels = [lbl for lbl, _ in dash.controls["optimizer"].options]
    assert "adamw_fused" in labels
    if "lion" in dash.lab.env().unavailable_optimizers:
        assert "lion (unavailable)" in labels  # shown, not hidden


def test_a_new_declared_toggle_gets_a_control_and_an_option(dash, monkeypatch):
    import dataclasses

    import ipywidgets as W

    from tunekit.cli import main as cli
    from tunekit.core import toggles as tg

    @dataclasses.dataclass(frozen=True)
    class More(tg.Toggles):  # a copy of the declaration with two more toggles
        loss_kernel: str = tg.toggle("eager", "cross-entropy kernel", ("eager", "fused"))
        dropout: float = 0.0

    monkeypatch.setattr(tg, "Toggles", More)
    controls = Dashboard(dash.lab).controls
    w = controls["loss_kernel"]
    assert (w.description, w.tooltip, w.value) == ("loss kernel", "cross-entropy kernel", "eager")
    assert [v for _, v in w.options] == ["eager", "fused"] and isinstance(w, W.Dropdown)
    assert isinstance(controls["dropout"], W.FloatText) and controls["dropout"].tooltip == "the Lab's dropout toggle"
    help_text = " ".join(cli.run_parser().format_help().split())
    assert "--loss-kernel {eager,fused} cross-entropy kernel (default: eager)" in help_text
    assert cli.run_parser().parse_args(["--loss-kernel", "fused"]).loss_kernel == "fused"


@pytest.mark.slow
def test_run_button_adds_rows_and_charts(dash):
    assert dash.table_df.empty
    dash.run_button.click()
    dash.controls["precision"].value = "bf16"
    dash.controls["checkpointing"].value = True
    dash.run_button.click()
    assert list(dash.table_df["run"]) == ["baseline", "bf16 ckpt"]
    assert dash.progress.value == dash.progress.max == 2 and dash.progress.description == "done"
    assert not dash.run_button.disabled
    assert len(dash.figures["compare"].data[0].y) == 2  # tokens/s bars
    # beside them, once: params, grads, optimizer, saved (the memory the toggles change)
    assert [t.name for t in dash.figures["compare"].data[1:]] == ["parameters", "gradients", "optimizer state",
                                                                  "saved activations (one micro-batch)"]
    assert "run #1" in dash.message.value and "Traceback" not in dash.message.value
    # what changed from the run before, in tunekit.diff's words
    assert dash.last_diff.changed == [("precision", "fp32", "bf16"), ("checkpointing", False, True)]
    assert "changed: precision fp32 -&gt; bf16, checkpointing False -&gt; True" in dash.message.value


def test_a_traced_run_shows_its_line_against_the_expected_step(dash):
    dash.run_button.click()                        # untraced: no line, nothing planned
    assert dash.lab.runs[-1].explained is None and "traced step: " not in dash.message.value
    dash.trace_box.value = True
    dash.run_button.click()
    r = dash.lab.runs[-1]
    assert r.trace is not None and r.explained       # the run's own one line (tunekit.explain's .line) ...
    shown = html.unescape(dash.message.value)
    assert f"traced step: {r.explained}" in shown       # ... shown above the diff against the run before
    assert shown.index("traced step: ") < shown.index(dash.last_diff.summary.splitlines()[0])


@pytest.mark.parametrize("control,value,text", [
    ("precision", "fp16", "GradScaler"),
    ("attention", "flash", "CUDA"),
    ("micro_batch", 0, "micro_batch must be"),
    ("steps", 0, "steps must be"),
])
def test_invalid_combinations_are_explained_not_raised(dash, control, value, text):
    dash.controls[control].value = value
    assert text in dash.message.value  # explained as soon as the control changes
    dash.run_button.click()
    assert text in dash.message.value and dash.table_df.empty


def test_run_failure_is_a_sentence(dash, monkeypatch):
    def boom(**kw):
        raise RuntimeError("disk on fire")
    monkeypatch.setattr(dash.lab, "run", boom)
    dash.run_button.click()
    assert "run failed: RuntimeError: disk on fire" in dash.message.value
    assert isinstance(dash.last_error, RuntimeError)


# not marked slow (three trials of 4 x 64 tokens): the find-max button's only test, kept in `make test`
def test_find_max_button_reports_trials(dash):
    dash.max_batch.value = 4
    dash.budget_mib.value = 4096
    dash.find_button.click()
    found = dash.last_search
    assert found.best == 4 and [t.micro_batch for t in found.trials] == [1, 2, 4]
    assert dash.controls["micro_batch"].value == 4
    assert "micro batch 2: fits" in dash.message.value
    # 4 is the limit and it fit: the message says the true maximum may be higher, and where to raise it
    text = html.unescape(dash.message.value)
    assert found.stopped == "search limit" and "the search limit (limit=4)" in text
    assert "the true maximum may be higher" in text and "the limit is the 'max batch' box" in text
    assert not dash.find_button.disabled and dash.progress.description == "done"


def test_charts_are_set_on_the_output_widgets_without_capturing(dash, shell):
    # In IPython the charts go into the Output widgets' `outputs` directly: capturing with
    # `with out:` sets msg_id, which made nbclient (nbconvert --execute) hang now and then.
    dash.run_button.click()
    for out in (dash.chart_out,):
        assert out.msg_id == ""
        assert len(out.outputs) == 1
        assert "application/vnd.plotly.v1+json" in out.outputs[0]["data"]
