"""Nothing is written next to the code (issue 19): run from a folder outside the repository with a
fresh HOME, tunekit puts its run log, traces, charts and caches in the user folders, and the
package folder (a checkout's, or a wheel's in a read-only site-packages) is left as it was; and
`import torch; import tunekit` from the wheel prints nothing (issue 20)."""
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

import tunekit

ROOT = Path(__file__).resolve().parents[2]
# a Lab run traced with its memory timeline, its chart shown: every kind of file tunekit writes
SCRIPT = """\
import tunekit
lab = tunekit.Lab(peak_tflops=1.0, micro_batch=2, seq_len=16)
lab.run(steps=1, warmup=0, trace=True, memory=True)
lab.compare().show()
print("from", tunekit.__file__)
"""


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if "__pycache__" not in p.parts}


def _run_outside(argv, tmp_path, pythonpath, check=True):
    """``argv`` in ``tmp_path/work`` with HOME=``tmp_path/home`` and no tunekit or XDG variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNEKIT_", "XDG_", "PLOTLY_"))}
    env.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(pythonpath), PYTHONDONTWRITEBYTECODE="1", BROWSER="true")
    (tmp_path / "work").mkdir(exist_ok=True)
    out = subprocess.run(argv, cwd=tmp_path / "work", env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 or not check, out.stdout[-2000:] + out.stderr[-2000:]
    return out


def _user_files(home: Path) -> list:
    day = time.strftime("%Y-%m-%d")
    kinds = {}
    for p in sorted(home.rglob("*")):
        if p.is_file():
            rel = p.relative_to(home)
            kinds.setdefault(str(rel.parent), set()).add(p.suffix if day not in p.name else p.name)
    return sorted((k, sorted(v)) for k, v in kinds.items())


def _expected_user_files(cache=(".bin",)) -> list:
    return [(".cache/tunekit", list(cache)),                             # the corpus (+ calibrations)
            (".local/share/tunekit/figures", [".html", ".js"]),          # the chart and plotly.js beside
            (".local/share/tunekit/runs", [f"lab-{time.strftime('%Y-%m-%d')}.jsonl"]),
            (".local/share/tunekit/traces", [".json"])]                  # the Chrome trace


@pytest.mark.slow
def test_a_checkout_run_from_elsewhere_writes_only_to_the_user_folders(tmp_path):
    before = _tree(ROOT / "tunekit"), sorted(os.listdir(ROOT))
    out = _run_outside([sys.executable, "-c", SCRIPT], tmp_path, ROOT)
    assert f"from {ROOT / 'tunekit' / '__init__.py'}" in out.stdout
    assert (_tree(ROOT / "tunekit"), sorted(os.listdir(ROOT))) == before
    # a traced run sets its step against the expected one: this CPU's calibrations are cached (.json)
    assert _user_files(tmp_path / "home") == _expected_user_files(cache=(".bin", ".json"))
    assert sorted(os.listdir(tmp_path / "work")) == []


@pytest.mark.slow
def test_a_wheel_in_a_read_only_site_packages(tmp_path):
    src = tmp_path / "src"  # a copy: an in-tree build would leave build/ and egg-info in the checkout
    shutil.copytree(ROOT / "tunekit", src / "tunekit", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "dist"),
                    str(src)], check=True, timeout=300, capture_output=True)
    wheel = tmp_path / "dist" / f"tunekit-{tunekit.__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    info = f"tunekit-{tunekit.__version__}.dist-info"
    assert {n.split("/")[0] for n in names} == {"tunekit", info}  # no top-level data/ or anything else
    assert f"{info}/licenses/LICENSE" in names
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
                   check=True, timeout=300, capture_output=True)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "mymodels.py").write_text(
        "from tunekit import GPT, GPTConfig\n\ndef build():\n    return GPT(GPTConfig.preset('cpu-tiny'))\n")
    for p in [site, *site.rglob("*")]:  # read-only, as a system install (root writes anyway: compared below)
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        before = _tree(site)
        out = _run_outside([sys.executable, "-c", SCRIPT], tmp_path, site)
        assert f"from {site / 'tunekit' / '__init__.py'}" in out.stdout
        # importing says nothing: -W default shows the DeprecationWarnings Python hides outside
        # __main__. The dependencies are this test venv's, a core install: no [experiments] extra
        # (ipyexperiments requires the deprecated `pynvml` package, whose shim makes torch warn).
        quiet = _run_outside([sys.executable, "-W", "default", "-c", "import torch; import tunekit"], tmp_path, site)
        shim = importlib.util.find_spec("_pynvml_redirector") is not None
        assert (quiet.stdout, quiet.stderr) == ("", ""), quiet.stderr + (
            "\n(the deprecated `pynvml` package is installed in this venv: pip uninstall pynvml)" if shim else "")
        version = _run_outside([str(site / "bin" / "tunekit"), "--version"], tmp_path, site)
        assert version.stdout.startswith(f"tunekit {tunekit.__version__} (torch ")
        # the console script's sys.path starts at its bin/ folder: the current directory is searched too
        cli = _run_outside([str(site / "bin" / "tunekit"), "run", "--model", "mymodels:build", "--steps", "1",
                            "--warmup", "0", "--micro-batch", "2", "--seq-len", "16"], tmp_path, site)
        assert "log: tunekit-runs.jsonl (run #0)" in cli.stdout
        assert _tree(site) == before
        # the command calibrated this CPU's matmul peak (no --peak option): cached beside the corpus
        assert _user_files(tmp_path / "home") == _expected_user_files(cache=(".bin", ".json"))
    finally:
        for p in [site, *site.rglob("*")]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


# the modules that name their own file, and why: none opens a file beside it (a wheel holds code only,
# pyproject's [tool.setuptools.packages.find]; a data file read next to the code would need package-data
# and a check in test_a_wheel_in_a_read_only_site_packages of the wheel's names)
OWN_FILE = {
    "tunekit/core/refusals.py": "a frame is tunekit's when its file is under tunekit/",
    "tunekit/measure/interrupts.py": "the same, for the frames a Ctrl-C lands in",
    "tunekit/parallel/netns.py": "the relay (python -I) imports tunekit from the folder this one did",
}


def test_no_module_reads_a_file_beside_the_code():
    import ast

    named, resources = set(), set()
    for path in sorted((ROOT / "tunekit").rglob("*.py")):
        tree = ast.parse(path.read_text())
        rel = str(path.relative_to(ROOT))
        if any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(tree)):
            named.add(rel)
        if any(isinstance(n, (ast.Import, ast.ImportFrom)) and any(
                m in ("importlib.resources", "pkgutil", "pkg_resources")
                for m in [getattr(n, "module", None) or "", *(a.name for a in n.names)]) for n in ast.walk(tree)):
            resources.add(rel)
    assert (named, resources) == (set(OWN_FILE), set())


def test_the_install_docs_pin_the_torch_the_constraints_file_pins():
    # docs/install.md said the file "pins the CPU build of torch": it pins a version, and from the package
    # index alone torch 2.13.0 for Linux x86-64 is the CUDA build (nvidia-* packages, several GB); the pages
    # say so with the version the file holds
    pins = [line for line in (ROOT / "constraints" / "cpu.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert len(pins) == 1 and pins[0].startswith("torch==")
    version = pins[0].removeprefix("torch==")
    for page in ("README.md", "docs/install.md"):
        text = " ".join((ROOT / page).read_text().split())
        assert f"`constraints/cpu.txt` (torch {version}" in text or f"pins torch's version ({version})" in text, page


def test_no_page_sends_a_user_to_the_package_index_s_tunekit():
    # `pip install tunekit` from the package index installs an unrelated project of that name (a LoRA
    # fine-tuning tool, 0.1.1 when this was written): every install is from the repository, and once
    # tunekit is installed `pip install 'tunekit[EXTRA]'` adds an extra to it
    import re

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "notebooks" / "README.md",
             *sorted((ROOT / "notebooks").glob("*.py")), *sorted((ROOT / "tunekit").rglob("*.py"))]
    # the warnings themselves aside: "`pip install tunekit` from the package index brings ...", "... would bring"
    bare = re.compile(r"pip install (-U |--upgrade )?['\"]?tunekit(?![\[\w-]|` (from the package index|would bring))")
    assert [str(p.relative_to(ROOT)) for p in pages if bare.search(" ".join(p.read_text().split()))] == []
    assert "`pip install tunekit` from the package index brings an unrelated project" in " ".join(
        (ROOT / "README.md").read_text().split())
