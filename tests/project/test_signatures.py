"""The public surface shows its real signatures and an example (``inspect.signature``, ``help()``,
Jupyter's ``?``): no ``**kwargs`` passed through to somewhere else, and every public function,
class and method has a docstring with an example (a ``>>>`` line or "Example:")."""
import dataclasses
import importlib
import inspect
import re

import pytest

import tunekit
from tunekit import bench
from tunekit.core.toggles import LAB_DEFAULT, Toggles, toggle_keywords

EXAMPLE = re.compile(r">>>|Example")

# Real varargs, not a pass-through of tunekit's own options: name -> the varargs it may take.
VARARGS = {
    # forwards the user's own call: it counts the FLOPs of fn(*args, **kwargs), and what fn takes
    # is the user's to say
    "tunekit.count_flops": {"args", "kwargs"},
}
# Names still missing their real keywords or an example (none now); each entry must still be
# missing what it is listed for, so the lists only shrink.
PENDING_VARARGS: dict = {}
PENDING_EXAMPLES: set = set()


def _methods(cls, prefix: str) -> dict:
    """The public methods ``cls`` and its tunekit bases define (a mixin such as `LabResults` is
    part of the Lab's surface; ipywidgets' are not ours); a class's own docstring covers its __init__."""
    out = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("tunekit."):
            continue
        for name, v in vars(klass).items():
            if isinstance(v, (staticmethod, classmethod)):
                v = v.__func__
            if not name.startswith("_") and inspect.isfunction(v):
                out[f"{prefix}.{name}"] = v
    return out


def public_surface() -> dict:
    from tunekit.autotune import AutotuneResult
    from tunekit.lab.dashboard import Dashboard
    from tunekit.lab.lab import Lab

    out = {f"tunekit.{name}": getattr(tunekit, name) for name in tunekit._EXPORTS}
    # the names that left the top level, at their homes (tunekit.measure.median_s)
    out.update({f"{home}.{name}": getattr(importlib.import_module(home), name) for name, home in tunekit.MOVED.items()})
    out.update({f"bench.{name}": getattr(bench, name) for name in bench.__all__
                if callable(getattr(bench, name))})
    out["Dashboard"] = Dashboard
    # AutotuneResult has no methods of its own today (its views are properties), only the class
    for cls, prefix in ((Lab, "Lab"), (AutotuneResult, "AutotuneResult"), (Dashboard, "Dashboard")):
        out.update(_methods(cls, prefix))
    return out


SURFACE = public_surface()


def varargs(fn) -> set:
    return {p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def test_the_surface_is_all_there():
    assert {"tunekit.lab.maxbatch.find_max_batch_size", "Lab.find_max_batch_size", "Lab.autotune", "Lab.results",
            "bench.plot", "tunekit.autotune.AutotuneResult", "Dashboard.refresh"} <= set(SURFACE)
    assert set(VARARGS) | set(PENDING_VARARGS) | PENDING_EXAMPLES <= set(SURFACE)


@pytest.mark.parametrize("name", sorted(SURFACE))
def test_no_varargs_pass_through(name):
    found = varargs(SURFACE[name])
    if name in PENDING_VARARGS:
        assert found == PENDING_VARARGS[name], f"{name} is done: take it off PENDING_VARARGS"
        return
    assert found <= VARARGS.get(name, set()), \
        f"{name}{inspect.signature(SURFACE[name])} passes {sorted(found)} through: give it its real parameters"


@pytest.mark.parametrize("name", sorted(SURFACE))
def test_a_docstring_with_an_example(name):
    doc = inspect.getdoc(SURFACE[name]) or ""
    has = bool(EXAMPLE.search(doc))
    if name in PENDING_EXAMPLES:
        assert not has, f"{name} has its example: take it off PENDING_EXAMPLES"
        return
    assert doc, f"{name} has no docstring"
    assert has, f"{name}'s docstring shows no example (a '>>>' line or 'Example: ...')"


def test_lab_autotune_takes_exactly_the_autotune_options():
    from tunekit.autotune import AutotuneOptions, autotune
    from tunekit.lab.lab import Lab

    method = list(inspect.signature(Lab.autotune).parameters.values())[1:]   # after self
    function = list(inspect.signature(autotune).parameters.values())[1:]     # after the lab
    toggles = [f.name for f in dataclasses.fields(Toggles)]
    # the search's start: setting= or the toggle keywords, one Setting at the Lab's edge (lab.setting_of)
    assert [p.name for p in method[-len(toggles):]] == toggles
    method = method[:-len(toggles)]
    assert method[-1].name == "verbose" and method[-1].default is True   # the Lab's display (view.progress)
    method = method[:-1]
    assert function[-1].name == method[-1].name == "setting"   # the starting Setting (None: the Lab's toggles)
    assert [(p.name, p.default) for p in method[:-1]] == \
        [(f.name, f.default) for f in dataclasses.fields(AutotuneOptions)]
    assert [(p.name, p.kind, p.default) for p in method] == [(p.name, p.kind, p.default) for p in function]


def test_lab_find_max_batch_size_takes_exactly_the_search_arguments():
    from tunekit.lab import maxbatch
    from tunekit.lab.lab import Lab

    # the Lab shows the search (verbose) through the engine's display hook (trying): each has its own
    method = [p for p in list(inspect.signature(Lab.find_max_batch_size).parameters.values())[1:]
              if p.name != "verbose"]
    function = [p for p in list(inspect.signature(maxbatch.find_max_batch_size).parameters.values())[1:]
                if p.name != "trying"]
    assert [(p.name, p.kind, p.default) for p in method] == [(p.name, p.kind, p.default) for p in function]
    assert inspect.signature(Lab.find_max_batch_size).parameters["budget_s"].default == 60.0


def test_toggle_keywords_show_every_toggle_and_change_no_call():
    @toggle_keywords
    def run(steps=20, **changes):
        return steps, changes

    params = inspect.signature(run).parameters
    assert list(params) == ["steps"] + [f.name for f in dataclasses.fields(Toggles)]
    assert params["precision"].kind is inspect.Parameter.KEYWORD_ONLY and params["precision"].default is LAB_DEFAULT
    assert "precision: 'str' = <lab.defaults>" in str(inspect.signature(run))
    assert run(3, precision="bf16") == (3, {"precision": "bf16"})
    with pytest.raises(TypeError, match="no \\*\\*changes"):
        toggle_keywords(lambda steps=20: steps)
