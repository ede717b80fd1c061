"""ARCHITECTURE.md's recipe "add a toggle", checked: a field added to the declaration of `Toggles`
(core/setting.py), and nothing else, reaches every entry point. The fixture declares one more
toggle in place, as a line in the class body would (`Toggles` and `Setting` rebuilt by
``dataclasses.dataclass`` with the field added; every module holds the same class objects), and
takes it out again after the test."""
import argparse
import dataclasses

import pytest

import tunekit
from tunekit.core import setting as setting_module
from tunekit.core import validate
from tunekit.core.setting import Setting, Toggles, choices_of, toggle

NAME = "fused_loss"
FIELD = toggle(False, "compute the loss in one fused kernel (declared by the test)", tune=True)

# what a dataclass generates, removed before it is made again
_MADE = ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__", "__match_args__",
         "__dataclass_fields__", "__dataclass_params__")


def _redeclare(cls, add: tuple | None = None, remove: str | None = None) -> None:
    """Make the frozen dataclass ``cls`` again, in place, with the field ``add`` = (name,
    annotation, Field) added or the field ``remove`` removed; its own fields keep their Field
    (default and metadata)."""
    own = cls.__dict__.get("__annotations__", {})
    for f in cls.__dataclass_fields__.values():
        if f.name in own:
            setattr(cls, f.name, f)
    if add is not None:
        name, annotation, fld = add
        cls.__annotations__[name] = annotation
        setattr(cls, name, fld)
    if remove is not None:
        del cls.__annotations__[remove]
        delattr(cls, remove)
    for attr in _MADE:
        if attr in cls.__dict__:
            delattr(cls, attr)
    dataclasses.dataclass(frozen=True)(cls)


def _setting_checked() -> None:
    """Setting's __init__ refuses a misspelt keyword naming the one meant (as core/setting.py does)."""
    Setting.__init__ = validate.keywords_checked(choices_of(Setting))(Setting.__init__)


@pytest.fixture
def declared_toggle():
    """One more toggle in the declaration: ``fused_loss: bool = toggle(False, ..., tune=True)``."""
    _redeclare(Toggles, add=(NAME, "bool", FIELD))
    _redeclare(Setting)
    _setting_checked()
    try:
        yield NAME
    finally:
        _redeclare(Toggles, remove=NAME)
        _redeclare(Setting)
        _setting_checked()
        assert NAME not in {f.name for f in dataclasses.fields(Setting)}


def test_the_fixture_declares_one_field_and_takes_it_back(declared_toggle):
    names = [f.name for f in dataclasses.fields(Setting)]
    # after Toggles' nine (lr the last), before what a Setting adds
    assert names.index(NAME) == names.index("lr") + 1 == 9 and names[10] == "weights"
    assert Setting(fused_loss=True).toggles.fused_loss is True
    assert Setting.of(Toggles(fused_loss=True)).fused_loss is True
    with pytest.raises(TypeError, match="did you mean fused_loss=True"):
        Setting(fused_los=True)


def test_a_declared_toggle_reaches_the_labs_run(declared_toggle, make_lab):
    lab = make_lab(fused_loss=True, micro_batch=2, seq_len=16)
    r = lab.run(steps=1, warmup=0, verbose=False)
    assert r.toggles.fused_loss is True and r.label == "baseline"
    r = lab.run(steps=1, warmup=0, verbose=False, fused_loss=False)
    assert r.toggles.fused_loss is False and r.label == "fused_loss=False"
    assert lab.run(steps=1, warmup=0, verbose=False, setting=Setting(micro_batch=2, seq_len=16)).toggles.fused_loss \
        is False   # a Setting is complete: its declared default


def test_a_declared_toggle_is_in_the_signatures_help_shows(declared_toggle, make_lab):
    import inspect

    from tunekit.lab.maxbatch import find_max_batch_size

    lab_calls = (tunekit.Lab.run, tunekit.Lab.plan, tunekit.Lab.find_max_batch_size, tunekit.Lab.autotune,
                 tunekit.Lab.setting_of, tunekit.Lab.resolve, find_max_batch_size)
    for fn in (*lab_calls, tunekit.plan):
        shown = inspect.signature(fn).parameters
        assert NAME in shown and shown[NAME].kind is inspect.Parameter.KEYWORD_ONLY, fn.__qualname__
        assert f"{NAME}: 'bool' = " in str(inspect.signature(fn))   # what help() and Jupyter's ? print
    assert NAME in inspect.signature(make_lab(micro_batch=2, seq_len=16).run).parameters   # a bound method's


def test_a_toggle_taken_back_leaves_the_signatures():
    import inspect

    assert NAME not in inspect.signature(tunekit.Lab.run).parameters
    assert NAME not in inspect.signature(tunekit.plan).parameters


def test_a_declared_toggle_is_a_column_of_the_results(declared_toggle, make_lab):
    lab = make_lab(micro_batch=2, seq_len=16)
    r = lab.run(steps=1, warmup=0, verbose=False, fused_loss=True)
    assert r.fused_loss is True   # a record reads its toggles by name
    frame = lab.results(all=True)
    columns = list(frame.columns)
    assert columns.index(NAME) == columns.index("lr") + 1   # after the nine toggles, in declared order
    assert frame[NAME].tolist() == [True]


def test_a_declared_toggle_is_one_the_plan_panel_compares(declared_toggle):
    pytest.importorskip("ipywidgets")
    from tunekit.planning.panel import planned_toggles

    # the nine declared toggles and this one, but grad_accum, lr and compile (planner.SAME_STEP)
    assert planned_toggles() == ("precision", "checkpointing", "micro_batch", "seq_len", "optimizer", "attention",
                                 NAME)


def test_the_one_setting_of_a_lab_call_carries_a_declared_toggle(declared_toggle, make_lab):
    lab = make_lab(fused_loss=True, micro_batch=2, seq_len=16)
    assert lab.setting_of().fused_loss is True and lab.setting_of(fused_loss=False).fused_loss is False
    assert isinstance(lab.setting_of(), Setting)


def test_a_declared_toggle_reaches_the_plans_setting(declared_toggle, make_lab):
    cfg = tunekit.GPTConfig.preset("cpu-tiny")
    p = tunekit.plan(cfg, "H100 SXM", fused_loss=True, micro_batch=1, seq_len=16, verbose=False)
    assert isinstance(p.setting, Setting) and p.setting.fused_loss is True
    # the plan has no rule for it: it says so (the recipe's next step is its effect)
    assert "fused_loss=True is not modelled: the plan is of a step without it" in p.notes
    lab = make_lab(fused_loss=True, micro_batch=1, seq_len=16)
    assert lab.plan("H100 SXM", verbose=False).setting.fused_loss is True   # the Lab's run's Setting


def test_the_other_lab_entries_and_the_memory_answers_take_it(declared_toggle, make_lab):
    from tunekit.lab.expect import asked_setting

    lab = make_lab(micro_batch=2, seq_len=16)
    s = asked_setting(lab, None, {NAME: True})   # lab.expect's edge (the dashboard's line before Run)
    assert s == lab.setting_of(fused_loss=True) and s.fused_loss is True
    report = tunekit.measure_memory(lab, setting=s, estimate=False)   # taken, not refused as unknown
    assert report.measured["weights"] > 0
    estimate = tunekit.estimate_memory(tunekit.GPTConfig.preset("cpu-tiny"), setting=Setting(fused_loss=True,
                                                                                             micro_batch=2, seq_len=16))
    assert estimate.total_bytes > 0


class _Queue:
    """A cluster target that keeps what it was sent (`tunekit.lab.cluster.submit_run` reads no more of one)."""

    ranks_per_node, nodes, gpus_per_node, partition, max_jobs = 1, 1, None, None, 1

    def __init__(self, folder):
        self.folder, self.sent = str(folder), []

    def check(self, *expected) -> list:
        return []

    def submit(self, spec, folder, name):
        self.sent.append(spec)
        return f"job {len(self.sent)}"


def test_a_declared_toggle_reaches_a_cluster_jobs_spec(declared_toggle, make_lab, tmp_path):
    from tunekit.lab.cluster import submit_run

    lab = make_lab(micro_batch=2, seq_len=16)
    queue = _Queue(tmp_path / "jobs")
    job, sent = submit_run(lab, queue, 1, 0, lab.setting_of(fused_loss=True))   # lab.run(on=queue)'s Setting
    assert job == "job 1" and sent["toggles"].fused_loss is True
    assert queue.sent[0]["toggles"][NAME] is True   # what the rank worker on the cluster is given


def test_a_declared_toggle_is_an_option_of_both_commands(declared_toggle):
    from tunekit.cli.main import changed_toggles, parser
    from tunekit.cli.plan import setting_of

    run = parser().parse_args(["run", "--fused-loss"])
    assert run.fused_loss is True and changed_toggles(run)[NAME] is True   # what tunekit run gives lab.run
    planned = parser().parse_args(["plan", "--fused-loss"])
    assert setting_of(planned).fused_loss is True
    assert parser().parse_args(["plan"]).fused_loss is False   # its declared default
    helps = {a.dest: a for a in _actions(parser(), "run") + _actions(parser(), "plan") if a.dest == NAME}
    assert helps[NAME].help == FIELD.metadata["help"]
    for command in ("run", "plan"):   # what `tunekit run --help` / `tunekit plan --help` print
        shown = " ".join(_command(parser(), command).format_help().split())
        assert "--fused-loss, --no-fused-loss compute the loss in one fused kernel" in shown, command


def _command(p: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _actions(p: argparse.ArgumentParser, command: str) -> list:
    return _command(p, command)._actions


def test_a_declared_toggle_is_a_dashboard_control(declared_toggle, make_lab):
    pytest.importorskip("ipywidgets")
    from tunekit.lab.dashboard import Dashboard

    lab = make_lab(micro_batch=2, seq_len=16)
    dash = Dashboard(lab)
    control = dash.controls[NAME]
    assert control.value is False and control.description == "fused loss"   # a checkbox, labelled by its name
    control.value = True
    assert dash.toggles()[NAME] is True   # what Run gives lab.run


def test_a_declared_toggle_is_one_of_autotunes_choices(declared_toggle):
    from tunekit.autotune.options import check_space, searched
    from tunekit.core.toggles import search_stages

    assert searched()[NAME] == (False, True)   # a flag: both settings
    assert check_space("space", {NAME: [True]}) == {NAME: [True]}   # lab.autotune(space=...) may restrict it
    stages = [name for name, _ in search_stages()]
    assert stages.index(NAME) == stages.index("final") - 1   # its own stage, before the final race


def test_the_recipe_names_the_one_file():
    """ARCHITECTURE.md's "add a toggle" row says what this file checks."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| a toggle |"))
    assert "core/setting.py" in row and "tests/project/test_toggle_declaration.py" in row
    assert setting_module.Toggles is Toggles
