"""The architecture, enforced (docs/ARCHITECTURE.md): shared layers that know no product, a
folder per product over them, imports flow downward only, no cycles between packages nor between
modules, `__init__` files re-export only, no module over 400 lines.

A module's place is its top folder under tunekit/. Shared layers, lowest first: core/ (pure) <
models/ < measure/ < train/ < view/; each imports only the ones below it, and none imports a
product. A product folder imports any shared layer, itself and the products it is declared to
build on (PRODUCTS), nothing else.
"""
import ast
import pathlib
import subprocess
import sys
from collections import defaultdict

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "tunekit"
SHARED = ("core", "models", "measure", "train", "view")
# each product and the products it builds on: the Lab plans, autotunes and runs over ranks; the
# all-reduce benchmark starts ranks as parallel does; the trainer callbacks are Monitors; the
# command runs the Lab, plans and ranks and reports what profiling recorded
PRODUCTS = {"profiling": (), "planning": (), "monitor": (), "parallel": (), "autotune": (),
            "bench": ("parallel",), "lab": ("planning", "autotune", "parallel"),
            "integrations": ("monitor",), "cli": ("lab", "planning", "parallel", "profiling")}
LAYERS = SHARED + tuple(PRODUCTS)
# third-party packages a shared layer must not import at all (even inside a function)
FORBIDDEN = {"core": {"torch", "IPython", "ipywidgets"}, "models": {"IPython", "ipywidgets"},
             "measure": {"IPython", "ipywidgets"}, "train": {"IPython", "ipywidgets"}}
# ... and only inside functions (a figure or table method), never at module level, except in view/
# and in a product's own drawing modules
LAZY_ONLY = {"pandas", "plotly"}
DRAWING = {"plots", "view", "dashboard", "panel", "magics", "experiments", "report_html"}
MAX_LINES = 400


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        yield ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts), path


def layer(module: str) -> str | None:
    """The folder of a module under tunekit. (its top folder); None for the top-level façade."""
    head = module.split(".")[0]
    if head == "__main__":
        return "cli"
    return head if head in LAYERS else None


def may_import(mine: str, theirs: str) -> bool:
    """Whether a module of folder ``mine`` may import one of folder ``theirs``."""
    if theirs in SHARED:
        return mine not in SHARED or SHARED.index(theirs) <= SHARED.index(mine)
    return theirs == mine or theirs in PRODUCTS.get(mine, ())


def _is_module(full: str) -> bool:
    path = ROOT / full.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _imports(name, path):
    """(target under tunekit. or a third-party name, at module level?) for every import; an imported
    name that is a module (`from tunekit.lab import fit`, `from . import runlog`) is that module."""
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
            elif node.module == "tunekit" or (node.module or "").startswith("tunekit."):
                mod = node.module[len("tunekit."):] if node.module != "tunekit" else ""
            else:
                yield node.module, id(node) in top
                continue
            for a in node.names:
                full = f"{mod}.{a.name}" if mod else a.name
                yield "tunekit." + (full if _is_module(full) else mod), id(node) in top


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
            if theirs is None:
                continue
            assert may_import(mine, theirs), (
                f"{name} ({mine}/) imports {inner} ({theirs}/): shared layers import only those below "
                f"them, a product only shared layers and {PRODUCTS.get(mine, ())}")
        else:
            assert head not in FORBIDDEN.get(mine, ()), f"{name} ({mine}/) imports {head}"
            if mine != "view" and name.rpartition(".")[2] not in DRAWING:
                assert not (head in LAZY_ONLY and top_level), \
                    f"{name} imports {head} at module level: only inside the function that draws"


def test_the_folder_rules_read_as_declared():
    assert may_import("measure", "core") and not may_import("core", "measure")
    assert may_import("lab", "planning") and not may_import("planning", "lab")
    assert may_import("monitor", "view") and not may_import("view", "monitor")
    assert not may_import("profiling", "monitor") and may_import("profiling", "profiling")


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
    """Packages (folders, sub-folders included) form no import cycle, lazy imports included."""
    def package(module):  # a package's __init__ is its own (re-exporting its modules is no cycle)
        if (ROOT / module.replace(".", "/") / "__init__.py").exists():
            return module
        return module.rpartition(".")[0] or module

    edges = defaultdict(set)
    for name, path in MODULES:
        for target, _ in _imports(name, path):
            if target and target.startswith("tunekit."):
                a, b = package(name), package(target[8:])
                if a != b and layer(target[8:]):
                    edges[a].add(b)
    cycle = _cycle(edges)
    assert cycle is None, "package cycle: " + " -> ".join(cycle)


def test_no_cycles_between_modules():
    """Modules (files) form no import cycle either, lazy imports included: a piece two modules
    share lives in the one that owns it, not in both by turns."""
    edges = defaultdict(set)
    for name, path in MODULES:
        for target, _ in _imports(name, path):
            inner = target.removeprefix("tunekit.") if target else ""
            # `from .pkg import name` reads pkg/__init__.py: an edge to the package's module
            if target and target.startswith("tunekit.") and layer(inner) and inner != name:
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
