"""Layering: the pure core imports neither torch nor IPython; `import tunekit` stays light."""
import subprocess
import sys

PURE = ["tunekit.formulas", "tunekit.specs", "tunekit.records", "tunekit.units", "tunekit.report",
        "tunekit.anatomy", "tunekit.anatomy_gpt", "tunekit.advisor"]
HEAVY = ["torch", "IPython", "pandas", "plotly", "ipywidgets"]


def _loaded_after(stmt):
    code = f"import sys; {stmt}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_pure_core_imports_nothing_heavy():
    assert _loaded_after("import " + ", ".join(PURE)) == ""


def test_import_tunekit_is_lazy():
    assert _loaded_after("import tunekit") == ""


def test_public_names_resolve():
    import tunekit

    for name in ("profile", "history", "last", "peak_tflops", "calibrate", "experiment", "plot_history"):
        assert callable(getattr(tunekit, name))
