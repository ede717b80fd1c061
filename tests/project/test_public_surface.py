"""The top level a person can hold (issue 40, item 4): at most ~30 names, grouped by product in
``__all__`` and in ``help(tunekit)``, each with a docstring; the public contract's names present and
silent; every name that left the top level still resolves there for one release, with one
DeprecationWarning that names its new home, where it is the very same object.
"""
import importlib
import subprocess
import sys
import warnings

import pytest

import tunekit

# the public contract (../shared/DESIGN.md): these stay at the top level, without a warning
CONTRACT = ("load_ipython_extension", "unload_ipython_extension", "history", "last", "profile",
            "peak_tflops", "calibrate", "Lab", "estimate_memory", "measure_memory", "advise", "Monitor",
            "Setting", "plan", "explain", "diff", "experiment")


def test_the_top_level_holds_at_most_30_names_without_repeats():
    assert len(tunekit.__all__) <= 30, len(tunekit.__all__)
    assert len(set(tunekit.__all__)) == len(tunekit.__all__)
    assert not set(tunekit.__all__) & set(tunekit.MOVED)


def test_contract_names_are_there_and_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in CONTRACT:
            assert name in tunekit.__all__, name
            assert getattr(tunekit, name) is not None, name
    assert importlib.import_module("tunekit.integrations.transformers").TunekitCallback
    assert importlib.import_module("tunekit.integrations.lightning").TunekitCallback


def _summary(obj) -> str:
    doc = (obj.__doc__ or "").strip()
    return doc.split("\n\n")[0].strip()


@pytest.mark.parametrize("name", tunekit.__all__)
def test_every_name_has_a_docstring_and_a_line_in_help(name):
    assert _summary(getattr(tunekit, name)), f"tunekit.{name} has no docstring"
    # help(tunekit) lists it in its product's group, with its one line
    lines = [line.split() for line in tunekit.__doc__.splitlines()]
    assert any(len(words) > 1 and words[0] == name for words in lines), f"help(tunekit) does not list {name}"


def test_help_groups_follow_all():
    """``__all__`` is in the order help(tunekit) lists the names (group by group)."""
    listed = [line.split()[0] for line in tunekit.__doc__.splitlines()
              if line.startswith("    ") and line.split() and line.split()[0] in tunekit.__all__]
    assert listed == tunekit.__all__


@pytest.mark.parametrize("name", sorted(tunekit.MOVED))
def test_a_moved_name_warns_once_with_its_new_home(name):
    home = tunekit.MOVED[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(tunekit, name)
    assert [w.category for w in caught] == [DeprecationWarning]
    assert str(caught[0].message) == (f"tunekit.{name} moved to {home}.{name}; the top-level name goes "
                                      "in the next release")
    assert caught[0].filename == __file__  # the warning points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(importlib.import_module(home), name) is value  # the home is silent
    assert name not in dir(tunekit)


def test_one_access_to_a_moved_name_warns_once_whatever_its_form():
    # `from tunekit import NAME` reads the name twice (importlib's hasattr probe, then the
    # statement's own read): one warning, at this line, as `tunekit.NAME` gives
    for form in ("from", "attribute"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if form == "from":
                from tunekit import Toggles as value
            else:
                value = tunekit.Toggles
        assert [(w.category, w.filename) for w in caught] == [(DeprecationWarning, __file__)], form
        assert value is importlib.import_module("tunekit.lab").Toggles


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'plot_plans'"):
        tunekit.plot_plans  # noqa: B018


def test_import_torch_then_tunekit_warns_nothing():
    out = subprocess.run([sys.executable, "-W", "error", "-c", "import torch; import tunekit; "
                          "[getattr(tunekit, n) for n in tunekit.__all__ if n[0].isupper()]"],
                         capture_output=True, text=True)
    assert (out.returncode, out.stderr) == (0, "")
