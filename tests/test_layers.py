"""The architecture, enforced (docs/ARCHITECTURE.md): one layer per top-level folder of tunekit/,
imports flow downward only, no cycles between packages nor between modules, `__init__` files
re-export only, no module over 400 lines.

A module's layer is its folder: core/ < models/ < measure/ < engine/ < ui/. Sub-folders
(core/memory/, engine/dist/, engine/bench/) belong to their folder's layer.
"""
import ast
import pathlib
import subprocess
import sys
from collections import defaultdict

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "tunekit"
LAYERS = ("core", "models", "measure", "engine", "ui", "integrations")
NAMES = {"core": "pure core", "models": "models", "measure": "measurement", "engine": "engine", "ui": "UI",
         "integrations": "integrations"}
# The only upward edges: an engine object's own view, imported inside the one method that shows
# it (lab.compare(), lab.dashboard(), lab.run()'s progress, AutotuneResult.figure()). Nothing else reaches up.
VIEWS = {("engine.lab_results", "ui.lab_plots"), ("engine.lab", "ui.dashboard"), ("engine.lab", "ui.progress"),
         ("engine.autotune.result", "ui.autotune_view"), ("engine.monitor.monitor", "ui.monitor_view")}
# third-party packages a layer must not import at all (even inside a function)
FORBIDDEN = {"core": {"torch", "IPython", "ipywidgets"}, "models": {"IPython", "ipywidgets"},
             "measure": {"IPython", "ipywidgets"}, "engine": {"IPython", "ipywidgets"}}
# ... and only inside functions (a figure or table method), never at module level
LAZY_ONLY = {"pandas", "plotly"}
MAX_LINES = 400


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        yield ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts), path


def layer(module: str) -> str | None:
    """The layer of a module under tunekit. (its top folder); None for the top-level façade."""
    head = module.split(".")[0]
    if head == "__main__":
        return "ui"
    return head if head in LAYERS else None


def _imports(name, path):
    """(target under tunekit. or a third-party name, at module level?) for every import."""
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
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
                    is_mod = (ROOT / (full.replace(".", "/") + ".py")).exists() or \
                        (ROOT / full.replace(".", "/") / "__init__.py").exists()
                    yield "tunekit." + (full if is_mod else mod), id(node) in top
            else:
                yield node.module, id(node) in top


MODULES = [(m, p) for m, p in _modules() if m]  # the package's own __init__ is the public façade


def test_every_module_is_in_a_layer_folder():
    stray = [m for m, _ in MODULES if layer(m) is None]
    assert stray == [], f"modules outside the layer folders {LAYERS}: {stray}"


@pytest.mark.parametrize("name,path", MODULES, ids=[m for m, _ in MODULES])
def test_imports_flow_downward(name, path):
    mine = layer(name)
    for target, top_level in _imports(name, path):
        if not target:
            continue
        head = target.split(".")[0]
        if head == "tunekit":
            inner = target[len("tunekit."):]
            theirs = layer(inner)
            assert theirs is not None or inner == "", f"{name} imports the façade tunekit.{inner}"
            if theirs is None or (name, inner) in VIEWS:
                continue
            assert LAYERS.index(theirs) <= LAYERS.index(mine), (
                f"{name} ({NAMES[mine]}) imports {inner} ({NAMES[theirs]}): imports must flow downward")
        else:
            assert head not in FORBIDDEN.get(mine, ()), f"{name} ({NAMES[mine]}) imports {head}"
            if mine != "ui":
                assert not (head in LAZY_ONLY and top_level), \
                    f"{name} imports {head} at module level: only inside the function that draws"


def test_views_are_imported_inside_their_method_only():
    for name, path in MODULES:
        for target, top_level in _imports(name, path):
            if target and (name, target.removeprefix("tunekit.")) in VIEWS:
                assert not top_level, f"{name} imports its view {target} at module level"


def _cycle(edges):
    """The first cycle of a directed graph {node: set of nodes}, as a path, or None."""
    seen, stack = set(), []

    def visit(node):
        if node in stack:
            return stack[stack.index(node):] + [node]
        if node in seen:
            return None
        stack.append(node)
        for nxt in sorted(edges[node]):
            found = visit(nxt)
            if found:
                return found
        stack.pop()
        seen.add(node)
        return None

    for node in sorted(edges):
        found = visit(node)
        if found:
            return found
    return None


def test_no_cycles_between_packages():
    """Packages (folders, sub-folders included) form no import cycle, lazy imports included; only
    the VIEWS edges are left out (each a method that shows its own object)."""
    def package(module):  # a package's __init__ is its own (re-exporting its modules is no cycle)
        if (ROOT / module.replace(".", "/") / "__init__.py").exists():
            return module
        return module.rpartition(".")[0] or module

    edges = defaultdict(set)
    for name, path in MODULES:
        for target, _ in _imports(name, path):
            if target and target.startswith("tunekit.") and (name, target[8:]) not in VIEWS:
                a, b = package(name), package(target[8:])
                if a != b and layer(target[8:]):
                    edges[a].add(b)
    cycle = _cycle(edges)
    assert cycle is None, "package cycle: " + " -> ".join(cycle)


def test_no_cycles_between_modules():
    """Modules (files) form no import cycle either, lazy imports included: a piece two modules
    share lives in the one that owns it, not in both by turns. The VIEWS edges are left out."""
    edges = defaultdict(set)
    for name, path in MODULES:
        for target, _ in _imports(name, path):
            inner = target.removeprefix("tunekit.") if target else ""
            # `from .pkg import name` reads pkg/__init__.py: an edge to the package's module
            if target and target.startswith("tunekit.") and layer(inner) and (name, inner) not in VIEWS \
                    and inner != name:
                edges[name].add(inner)
    cycle = _cycle(edges)
    assert cycle is None, "module cycle: " + " -> ".join(cycle)


def test_a_cycle_is_found_with_its_path():
    edges = defaultdict(set, {"a": {"b"}, "b": {"c"}, "c": {"b"}, "d": {"a"}})
    assert _cycle(edges) == ["b", "c", "b"]
    assert _cycle(defaultdict(set, {"a": {"b"}, "b": {"c"}})) is None


INITS = [(m, p) for m, p in MODULES if p.name == "__init__.py"]


def _code_in(tree: ast.Module) -> list[str]:
    """What a module holds beyond a docstring, imports, ``__all__`` and re-exports, one line each."""
    code = []
    for i, node in enumerate(tree.body):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            continue  # the docstring
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                continue
        code.append(f"line {node.lineno}: {type(node).__name__}")
    return code


def test_code_in_init_is_caught():
    tree = ast.parse('"""doc"""\nfrom .a import b\n__all__ = ["b"]\nX = 1\ndef f(): pass\n')
    assert _code_in(tree) == ["line 4: Assign", "line 5: FunctionDef"]


@pytest.mark.parametrize("name,path", INITS, ids=[m for m, _ in INITS])
def test_package_inits_re_export_only(name, path):
    """A package's ``__init__`` holds its docstring, imports, ``__all__`` and re-exports, no code:
    the code has a module of its own (``tunekit/__init__.py``, the lazy façade, is not a package
    of a layer: MODULES leaves it out)."""
    code = _code_in(ast.parse(path.read_text()))
    assert code == [], f"{name}/__init__.py holds code ({', '.join(code)}): move it into a module of the package"


@pytest.mark.parametrize("name,path", MODULES, ids=[m for m, _ in MODULES])
def test_modules_stay_small(name, path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{name} has {n} lines (at most {MAX_LINES}): split it by what it does"


def test_pure_modules_load_nothing_heavy():
    pure = [f"tunekit.{m}" for m, _ in MODULES if layer(m) == "core"]
    code = (f"import sys; import {', '.join(pure)}; "
            "print(','.join(m for m in ('torch', 'IPython', 'pandas', 'plotly', 'ipywidgets') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_import_tunekit_changes_nothing():
    """No import hooks, no module aliases, no renderer: ``import tunekit`` only defines names."""
    code = ("import sys; before = list(sys.meta_path); import tunekit; "
            "assert sys.meta_path == before, sys.meta_path; "
            "print(sorted(m for m in sys.modules if m.startswith('tunekit')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['tunekit']"
