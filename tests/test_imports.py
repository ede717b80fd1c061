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
    assert _loaded_after("import tunekit; tunekit.formulas; tunekit.advise; tunekit.Toggles") == ""


def test_every_export_resolves():
    for name in tunekit.__all__:
        assert getattr(tunekit, name) is not None, name
    assert callable(tunekit.median_s) and isinstance(tunekit.Lab, type)


def test_every_module_is_reachable_by_its_short_and_old_name():
    for short, real in tunekit._MODULES.items():
        module = importlib.import_module(f"tunekit.{real}")
        assert getattr(tunekit, short) is module, short
        assert importlib.import_module(f"tunekit.{short}") is module, short  # `import tunekit.x`
        assert module.__spec__.name == f"tunekit.{real}"  # the alias left the real spec alone
    for package in tunekit._PACKAGES:
        assert getattr(tunekit, package).__name__ == f"tunekit.{package}"


def test_old_import_paths_keep_working():
    from tunekit.model import GPT
    from tunekit.toggles import Toggles as T2

    from tunekit.lab.toggles import Toggles
    from tunekit.models.gpt import GPT as GPT2

    assert GPT is GPT2 and Toggles is T2
    code = "from tunekit.anatomy import estimate_memory; import tunekit.widgets; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
