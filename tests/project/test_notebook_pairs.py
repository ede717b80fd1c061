"""Every notebook is a pair: notebooks/NN_name.py (jupytext percent script, the source) and
notebooks/NN_name.ipynb (committed with outputs stripped). These tests fail when the two differ."""
import re
from pathlib import Path

import pytest

jupytext = pytest.importorskip(
    "jupytext", reason="jupytext is not installed (pip install -e '.[dev]'); notebook pairs not checked")
nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
SCRIPTS = sorted(NOTEBOOKS.glob("*.py"))
IPYNBS = sorted(NOTEBOOKS.glob("*.ipynb"))


def _cells(nb):
    return [(cell.cell_type, "\n".join(line.rstrip() for line in cell.source.rstrip().split("\n")))
            for cell in nb.cells]


def _sync_hint(path):
    return f"run: jupytext --sync notebooks/{path.stem}.py"


def test_notebooks_exist():
    assert SCRIPTS and IPYNBS, f"no notebooks found in {NOTEBOOKS}"


def test_every_notebook_has_both_halves():
    scripts, ipynbs = {p.stem for p in SCRIPTS}, {p.stem for p in IPYNBS}
    no_py, no_ipynb = sorted(ipynbs - scripts), sorted(scripts - ipynbs)
    assert not no_py, "notebooks without their .py; run: " + "; ".join(
        f"jupytext --sync notebooks/{s}.ipynb" for s in no_py)
    assert not no_ipynb, "scripts without their .ipynb; run: " + "; ".join(
        f"jupytext --sync notebooks/{s}.py" for s in no_ipynb)


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_pair_in_sync(script):
    ipynb = script.with_suffix(".ipynb")
    if not ipynb.exists():
        pytest.fail(f"{ipynb.name} is missing; {_sync_hint(script)}")
    text_cells = _cells(jupytext.read(script))
    nb_cells = _cells(nbformat.read(ipynb, as_version=4))
    assert len(text_cells) == len(nb_cells), (
        f"{script.name} has {len(text_cells)} cells, {ipynb.name} has {len(nb_cells)}; {_sync_hint(script)}")
    for i, (a, b) in enumerate(zip(text_cells, nb_cells)):
        assert a == b, (f"cell {i} differs between {script.name} and {ipynb.name}:\n"
                        f"--- .py ({a[0]})\n{a[1]}\n--- .ipynb ({b[0]})\n{b[1]}\n{_sync_hint(script)}")


@pytest.mark.parametrize("ipynb", IPYNBS, ids=[p.stem for p in IPYNBS])
def test_ipynb_is_stripped(ipynb):
    nb = nbformat.read(ipynb, as_version=4)
    executed = [i for i, c in enumerate(nb.cells)
                if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not executed, (f"{ipynb.name}: cells {executed} have outputs or execution counts; run: "
                          f"jupyter nbconvert --clear-output --inplace notebooks/{ipynb.name}")
    kernel = nb.metadata.get("kernelspec", {})
    assert (kernel.get("name"), kernel.get("display_name")) == ("python3", "Python 3"), (
        f"{ipynb.name}: kernelspec is {kernel}, expected python3 / 'Python 3'")


@pytest.mark.parametrize("ipynb", IPYNBS, ids=[p.stem for p in IPYNBS])
def test_first_cell_imports_tunekit_and_sets_its_renderer(ipynb):
    """Imports in the usual order (torch and the other libraries, then tunekit: `import tunekit`
    changes nothing, so its place does not matter), and tunekit's plotly renderer set in the first
    cell (`%load_ext tunekit` or `tunekit.use_renderer()`), so every figure is also an SVG."""
    nb = nbformat.read(ipynb, as_version=4)
    first = next((c.source for c in nb.cells if c.cell_type == "code"), "")
    tunekit_at = re.search(r"^import tunekit\b", first, re.M)
    torch_at = re.search(r"^(import torch\b|from torch\b|import [\w, ]*\btorch\b)", first, re.M)
    assert tunekit_at, f"{ipynb.name}: the first code cell does not import tunekit"
    assert torch_at is None or torch_at.start() < tunekit_at.start(), (
        f"{ipynb.name}: the first code cell imports tunekit before torch; third-party modules come first")
    assert re.search(r"^(%load_ext tunekit|tunekit\.use_renderer\(\))", first, re.M), (
        f"{ipynb.name}: the first code cell sets no renderer; add `tunekit.use_renderer()` (or %load_ext tunekit)")
