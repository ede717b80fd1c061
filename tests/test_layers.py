"""The architecture, enforced: imports flow downward only (docs/ARCHITECTURE.md).

Every module of the package is assigned a layer here; a new module fails this test until it is.
"""
import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "tunekit"
CORE, MODELS, MEASURE, ENGINE, UI = range(5)
NAMES = ["pure core", "models", "measurement", "engine", "UI"]

# module (dotted, under tunekit.) -> layer; package __init__ files are facades (re-exports)
LAYERS = {
    **{f"core.{m}": CORE for m in ("units", "formulas", "specs", "registry", "shapes", "records",
                                    "summary", "advisor", "validate", "breakdown", "conditions", "paths", "bounds")},
    "core.comm": CORE, "dist.spec": MODELS, "measure.comm": MEASURE,
    "dist.worker": ENGINE, "dist.launch": ENGINE,
    "memory.estimate": CORE, "memory.gpt_count": CORE, "memory.hf_count": CORE, "lab.toggles": CORE, "lab.runlog": CORE,
    "models.gpt": MODELS, "models.data": MODELS, "models.adapters": MODELS, "lab.optimizers": MODELS,
    **{f"measure.{m}": MEASURE for m in ("device", "meters", "nvml", "torch_private", "flops",
                                          "fingerprint", "peaks", "timing", "oom", "probe", "interrupts",
                                          "energy", "trace", "conditions", "model_flops", "memavail")},
    "memory.tally": MEASURE, "memory.measure": MEASURE, "lab.step": MEASURE,
    "lab.lab": ENGINE, "lab.maxbatch": ENGINE, "lab.guard": ENGINE, "lab.precision": ENGINE, "lab.fit": ENGINE,
    "bench._frame": ENGINE, "bench._rank": ENGINE,
    "bench.allreduce": ENGINE, "bench.compute": ENGINE, "bench.host": ENGINE,
    "lab.autotune": ENGINE, "dist.netns": ENGINE, "lab.autotune_view": UI,
    "lab.plots": UI, "lab.dashboard": UI, "bench.plots": UI, "magics": UI, "experiments": UI,
    "plots": UI, "report_html": UI, "figure_svg": UI, "renderer": UI, "trace_plots": UI, "cli": UI,
    "__main__": UI,
}
# Convenience entry points where a lower layer reaches up lazily, inside one method:
# lab.compare() and lab.dashboard() open the Lab's UI.
ALLOWED_UP = {("lab.lab", "lab.plots"), ("lab.lab", "lab.dashboard"),
              ("lab.autotune", "lab.autotune_view")}  # AutotuneResult.figure draws itself
# third-party packages a layer must not import at all (even inside a function)
FORBIDDEN = {CORE: {"torch", "IPython", "ipywidgets"}, MODELS: {"IPython", "ipywidgets"},
             MEASURE: {"IPython", "ipywidgets"}, ENGINE: {"IPython", "ipywidgets"}}
# ... and only inside functions (a figure or table method), never at module level
LAZY_ONLY = {"pandas", "plotly"}


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        if rel.name == "__init__":
            continue
        yield ".".join(rel.parts), path


def _imports(name, path):
    """(target, top-level?) for every import in the module; targets relative to tunekit."""
    tree = ast.parse(path.read_text())
    package = name.split(".")[:-1]
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, id(node) in top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                for a in node.names:  # `from . import runlog` names a module
                    full = f"{mod}.{a.name}" if mod else a.name
                    yield "tunekit." + (full if full in LAYERS else mod), id(node) in top
            else:
                yield node.module, id(node) in top


def test_every_module_has_a_layer():
    missing = [m for m, _ in _modules() if m not in LAYERS]
    assert missing == [], f"assign a layer to {missing} in tests/test_layers.py"
    assert set(LAYERS) <= {m for m, _ in _modules()}, "LAYERS names a module that does not exist"


@pytest.mark.parametrize("name,path", list(_modules()), ids=[m for m, _ in _modules()])
def test_imports_flow_downward(name, path):
    layer = LAYERS[name]
    for target, top_level in _imports(name, path):
        if not target:
            continue
        head = target.split(".")[0]
        if head == "tunekit":
            inner = target[len("tunekit."):]
            if inner not in LAYERS or (name, inner) in ALLOWED_UP:
                continue  # a package facade, or an allowed entry point
            assert LAYERS[inner] <= layer, (f"{name} ({NAMES[layer]}) imports {inner} "
                                            f"({NAMES[LAYERS[inner]]}): imports must flow downward")
        else:
            assert head not in FORBIDDEN.get(layer, ()), f"{name} ({NAMES[layer]}) imports {head}"
            if layer < UI:
                assert not (head in LAZY_ONLY and top_level), \
                    f"{name} imports {head} at module level: only inside the function that draws"


def test_pure_modules_load_nothing_heavy():
    pure = [f"tunekit.{m}" for m, layer in LAYERS.items() if layer == CORE]
    code = (f"import sys; import {', '.join(pure)}; "
            "print(','.join(m for m in ('torch', 'IPython', 'pandas', 'plotly', 'ipywidgets') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
