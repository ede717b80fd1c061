"""`import tunekit` stays light; every public name and every module path resolves."""
import importlib
import subprocess
import sys

import tunekit

HEAVY = ["torch", "IPython", "pandas", "plotly", "ipywidgets"]


def _loaded_after(stmt):
    code = f"import sys; {stmt}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_import_tunekit_is_lazy():
    assert _loaded_after("import tunekit") == ""
    assert _loaded_after("import tunekit; import tunekit.core.formulas; tunekit.advise; tunekit.lab.Toggles") == ""


def test_every_export_resolves():
    for name in tunekit.__all__:
        assert getattr(tunekit, name) is not None, name
    assert callable(tunekit.measure.median_s) and isinstance(tunekit.Lab, type)


def test_the_flat_names_of_0_1_are_gone_and_the_layers_are_reachable():
    # tunekit 0.2 dropped the module aliases of 0.1 (CHANGELOG.md): one path per module
    for old in ("toggles", "model", "anatomy", "formulas", "widgets"):
        assert not hasattr(tunekit, old), old
        out = subprocess.run([sys.executable, "-c", f"import tunekit.{old}"], capture_output=True, text=True)
        assert "ModuleNotFoundError" in out.stderr, old
    for layer in ("core", "models", "measure", "train", "view", "lab", "planning", "profiling", "monitor"):
        assert getattr(tunekit, layer) is importlib.import_module(f"tunekit.{layer}")
    assert tunekit.bench is importlib.import_module("tunekit.bench")


def test_import_torch_then_tunekit_prints_nothing():
    # the natural order in a notebook; a warning here would be a box in every user's notebook
    out = subprocess.run([sys.executable, "-W", "default", "-c", "import torch; import tunekit; tunekit.Lab"],
                         capture_output=True, text=True, check=True)
    assert (out.stdout, out.stderr) == ("", "")
