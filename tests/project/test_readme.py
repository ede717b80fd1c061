"""README.md and the docs pages are working examples: every ```python block runs as written, on this
machine.

Blocks run in order, one fresh IPython namespace per ``##`` section of the README and per page of
docs/ (a section or page may use what its earlier blocks defined, never another's), through a real
InteractiveShell so that ``%load_ext`` and ``%%gpuprofile`` cells run as in a notebook, with the
section's own temporary folder as the current directory (and on sys.path, as a notebook's folder
is).

The words after ``python`` in a fence say what a block needs; where that is missing the block
is skipped (with the reason), and a word this test does not know fails it, so a typo cannot hide
a block:

- ```` ```python gpu ````: a CUDA device (``torch.cuda.is_available()``);
- ```` ```python netns ````: emulated nodes, i.e. root, iproute2 and tc (``netns.check()``);
- ```` ```python hf ````: the ``[hf]`` extra (transformers importable);
- ```` ```python lightning ````: the ``[lightning]`` extra;
- ```` ```python file=NAME ````: not run; saved as NAME in the section's folder, as a reader
  saves it next to the notebook (a later block imports it).

Shell blocks (```` ```bash ````) are not run; the ``make`` targets and ``tunekit`` options they
name are checked to exist (tests/project/test_docs.py checks the docs site's structure). The dashboard
picture's caption (tools/screenshot_dashboard.py) is tested here too: it says how the machine was
while the runs in it were measured.
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# the docs pages with code (docs/notebooks links to the notebooks, which nbval runs)
PAGES = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs" / "api").glob("*.md"))
NEEDS = ("gpu", "netns", "hf", "lightning")


@dataclass
class Block:
    section: str       # README.md: its ``##`` section; a docs page: the page (docs/lab.md)
    line: int          # of the opening fence, 1-based
    lang: str
    words: list
    code: str


def fenced_blocks(text: str, page: str | None = None) -> list[Block]:
    """Every fenced block (``` at the start of a line), with the ``##`` section it is in, or the
    whole ``page`` when one is named. Fences of exactly three backticks: the README and the docs
    use no longer ones."""
    out, section, fence = [], page or "", None
    for i, line in enumerate(text.splitlines(), 1):
        if fence is None:
            if line.startswith("## ") and page is None:
                section = line[3:].strip()
            elif line.startswith("```") and "`" not in line.lstrip("`"):   # CommonMark: no ` in the info
                info = line[3:].split()
                fence = Block(section, i, info[0] if info else "", info[1:], "")
                body = []
        elif line.startswith("```"):
            fence.code = "\n".join(body) + "\n"
            out.append(fence)
            fence = None
        else:
            body.append(line)
    assert fence is None, f"{page or 'README.md'} line {fence.line}: a fence that is never closed"
    return out


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


README_BLOCKS = fenced_blocks(README.read_text())
DOC_BLOCKS = [b for p in PAGES for b in fenced_blocks(p.read_text(), _rel(p))]
BLOCKS = README_BLOCKS + DOC_BLOCKS
PY = [b for b in BLOCKS if b.lang == "python"]
SECTIONS = list(dict.fromkeys(b.section for b in PY))
README_SECTIONS = list(dict.fromkeys(b.section for b in README_BLOCKS if b.lang == "python"))
DOCS_TEXT = "".join(p.read_text() for p in PAGES)


def covering_page(section: str) -> str | None:
    """The docs page whose first python blocks are this README section's, word for word (code and
    fence words), or None. Running that page runs them as a reader of the README would (in order,
    from a fresh namespace), so such a section is not run a second time: CI's time is tight."""
    mine = [(b.code, b.words) for b in PY if b.section == section]
    for page in dict.fromkeys(b.section for b in DOC_BLOCKS if b.lang == "python"):
        if [(b.code, b.words) for b in PY if b.section == page][:len(mine)] == mine:
            return page
    return None


RUN = [s for s in SECTIONS if s.startswith("docs/") or covering_page(s) is None]


def where(b: Block) -> str:
    """README.md line 12 / docs/lab.md line 3."""
    return f"{b.section if b.section.startswith('docs/') else 'README.md'} line {b.line}"


def missing(words: list) -> str | None:
    """Why a block marked with ``words`` cannot run here, or None."""
    for w in words:
        if w.startswith("file="):
            continue
        assert w in NEEDS, f"unknown fence word {w!r}: one of {NEEDS} or file=NAME"
        if w == "gpu":
            import torch

            if not torch.cuda.is_available():
                return "needs a CUDA device"
        elif w == "netns":
            from tunekit.parallel import netns

            if netns.check() is not None:
                return netns.check()
        elif w == "hf" and importlib.util.find_spec("transformers") is None:
            return "needs the [hf] extra (transformers)"
        elif w == "lightning" and importlib.util.find_spec("lightning") is None:
            return "needs the [lightning] extra"
    return None


def test_readme_has_python_blocks_in_the_expected_sections():
    # the README introduces: one example per product
    assert README_SECTIONS == ["Profile a cell", "The Lab and its dashboard", "Your own loop: `tunekit.Monitor`",
                               "Plan before you rent"]
    # the docs pages hold the rest
    assert {"docs/profile.md", "docs/lab.md", "docs/own-model.md", "docs/monitor.md", "docs/parallel.md",
            "docs/why-slow.md", "docs/plan.md", "docs/memory.md"} <= set(SECTIONS)
    for b in PY:
        missing(b.words)   # every fence word is known


def test_readme_examples_are_the_docs_pages_first_ones():
    """The README's examples are copies of a page's opening examples and run there (RUN leaves
    them out): each once."""
    assert {s: covering_page(s) for s in README_SECTIONS} == {
        "Profile a cell": "docs/profile.md", "The Lab and its dashboard": "docs/lab.md",
        "Your own loop: `tunekit.Monitor`": "docs/monitor.md", "Plan before you rent": "docs/plan.md"}
    assert RUN == [s for s in SECTIONS if s.startswith("docs/")]


@pytest.fixture
def shell(tmp_path, monkeypatch):
    """A fresh namespace in the process-wide InteractiveShell, in its own folder; afterwards the
    extension is unloaded and modules the section saved are forgotten."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.reset(new_session=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield ip
    if "tunekit" in ip.extension_manager.loaded:
        ip.run_line_magic("gpuprofile", "off")
        ip.run_line_magic("unload_ext", "tunekit")
    for name in set(sys.modules) - before:
        if getattr(sys.modules[name], "__file__", None) and str(tmp_path) in sys.modules[name].__file__:
            del sys.modules[name]
    ip.reset(new_session=False)


# pages whose runs take 12-40 s each on 2 busy cores (CI's durations; own-model and memory: 10-20 s with
# their set-up): `make test-slow` runs them; the README's first example and its Monitor run in `make
# test` (docs/profile.md, docs/monitor.md); what the slow pages show is tested fast in tests/lab,
# tests/planning, tests/parallel (own-model: tests/planning/test_plan_modules.py, tests/lab/test_lab.py;
# memory: tests/measure/test_memory.py, tests/core/test_advisor.py)
SLOW_PAGES = {"docs/lab.md", "docs/parallel.md", "docs/plan.md", "docs/why-slow.md", "docs/own-model.md",
              "docs/memory.md"}


@pytest.mark.parametrize("section", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW_PAGES else s for s in RUN])
def test_readme_and_docs_section_runs_as_written(section, shell, tmp_path):
    skipped = []
    for b in (b for b in PY if b.section == section):
        name = next((w[5:] for w in b.words if w.startswith("file=")), None)
        if name:
            (tmp_path / name).write_text(b.code)
            continue
        why = missing(b.words)
        if why:
            skipped.append(f"{where(b)}: {why}")
            continue
        r = shell.run_cell(b.code, store_history=True)
        error = r.error_before_exec or r.error_in_exec
        assert error is None, (f"{where(b)} ({section}) failed: {type(error).__name__}: "
                               f"{error}\n{b.code}")
    if skipped:
        pytest.skip("; ".join(skipped))


@pytest.mark.parametrize("section", ["Profile a cell", "docs/profile.md"])
def test_profile_example_defines_what_the_magic_cell_calls(section):
    """The %%gpuprofile example is preceded, in its section, by a block defining train_step."""
    blocks = [b for b in PY if b.section == section]
    magic = next(i for i, b in enumerate(blocks) if b.code.startswith("%%gpuprofile"))
    assert "train_step()" in blocks[magic].code
    assert any("def train_step(" in b.code for b in blocks[:magic])


def test_docs_show_the_signatures_users_write():
    text = (ROOT / "docs" / "own-model.md").read_text()
    for sig in ("batch_fn(micro_batch, seq_len) -> (x, y)", "loss_fn(model, x, y) -> loss",
                '"package.module:function"', "blocks"):
        assert sig in text, sig
    # each of them used in an example that runs
    code = "".join(b.code for b in PY if b.section == "docs/own-model.md")
    assert "def batch_fn(micro_batch, seq_len)" in code and "def loss_fn(model, x, y)" in code
    assert 'blocks="layers"' in code and re.search(r'Lab\("\w+:\w+"', code)


# --- shell blocks: what they name exists ------------------------------------------------------


def _make_targets() -> set:
    return set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def _make_named(text: str, blocks: list) -> set:
    named = set(re.findall(r"`make ([a-z][\w-]*)`", text))
    for b in blocks:
        if b.lang == "bash":
            named |= set(re.findall(r"^make ([a-z][\w-]*)", b.code, re.M))
    return named


def test_make_targets_named_in_the_readme_and_docs_exist():
    in_readme = _make_named(README.read_text(), README_BLOCKS)
    in_docs = _make_named(DOCS_TEXT, DOC_BLOCKS)
    assert {"tour", "test", "docs"} <= in_readme
    assert {"tour", "test", "lab", "test-fast", "docs"} <= in_docs
    named = in_readme | in_docs
    assert named <= _make_targets(), named - _make_targets()


def test_tunekit_options_named_in_shell_blocks_exist():
    lines = [line.split("#")[0] for b in BLOCKS if b.lang == "bash" for line in b.code.splitlines()]
    runs = [line.split("tunekit run", 1)[1] for line in lines if "tunekit run" in line]
    assert runs, "the docs show `tunekit run`"
    flags = {f for rest in runs for f in re.findall(r"(--[a-z][\w-]*)", rest)}
    out = subprocess.run([sys.executable, "-m", "tunekit", "run", "--help"], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    known = set(re.findall(r"(--[a-z][\w-]*)", out))
    assert flags and flags <= known, flags - known
    version = subprocess.run([sys.executable, "-m", "tunekit", "--version"], capture_output=True, text=True,
                             cwd=ROOT, check=True).stdout
    assert version.startswith("tunekit ")


# --- the dashboard picture: its caption says how the machine was -------------------------------


def _screenshot_tool():
    return load_script("tools/screenshot_dashboard.py")


def _run(run_id, label, tps, verdict=None, reason=""):
    rec = {"run_id": run_id, "label": label, "tokens_per_s": tps}
    if verdict:
        rec["conditions"] = {"verdict": verdict, "reason": reason, "cpus": 2}
    return rec


def test_screenshot_caption_names_each_runs_conditions(tmp_path):
    tool = _screenshot_tool()
    import json

    (tmp_path / "runs").mkdir()
    quiet = [_run(0, "baseline", 38660.2, "quiet", "tasks waited for a CPU 3% of the time"),
             _run(1, "bf16", 47130.0, "quiet", "tasks waited for a CPU 0% of the time")]
    (tmp_path / "runs" / "lab-2026-01-01.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in quiet) + '{"run_id": 2, "tok')   # a partial last line
    runs = tool.logged_runs(tmp_path)
    assert [r["label"] for r in runs] == ["baseline", "bf16"]
    alt, line, ok = tool.caption(runs)
    assert ok and alt == ("the dashboard in JupyterLab after 2 run(s) (baseline, then bf16) on a 2-CPU "
                          "machine, measured on a quiet machine")
    assert line == ("Measured while the picture was taken: #0 baseline: 38,660 tokens/s, machine quiet "
                    "(tasks waited for a CPU 3% of the time); #1 bf16: 47,130 tokens/s, machine quiet "
                    "(tasks waited for a CPU 0% of the time).")
    # with what the log records of a run: when, where, which model, how many steps
    setting = dict(time="2026-11-24 00:30:12", device="cpu (2 threads)", model="GPT", n_params=426624, steps=5,
                   warmup=2)
    alt, line, ok = tool.caption([{**r, **setting} for r in quiet])
    assert ok and line.startswith(
        "Measured while the picture was taken on 2026-11-24 00:30:12, cpu (2 threads) of a 2-CPU machine, "
        "GPT (426.6k params), 5 timed steps after 2 warm-up per run: #0 baseline: 38,660 tokens/s, machine quiet")


def test_screenshot_caption_refuses_a_busy_or_unknown_run():
    tool = _screenshot_tool()
    busy = [_run(0, "baseline", 951.0, "busy", "other processes used 1.0 of 2 CPUs"), _run(1, "bf16", 786.0)]
    alt, line, ok = tool.caption(busy)
    assert not ok and alt.endswith("measured on a BUSY machine")
    assert line.startswith("BUSY machine: these throughputs measured other work too, do not quote them. "
                           "Measured: #0 baseline: 951 tokens/s")
    assert "machine busy (other processes used 1.0 of 2 CPUs)" in line
    assert "machine unknown (no conditions recorded)" in line
    assert tool.caption([])[2] is False


@pytest.mark.parametrize("page, picture", [("README.md", "docs/dashboard.png"), ("docs/lab.md", "dashboard.png")])
def test_dashboard_picture_says_how_the_machine_was(page, picture):
    text = (ROOT / page).read_text()
    alt = re.search(r"!\[([^\]]*)\]\(" + re.escape(picture) + r"\)", text).group(1)
    assert re.search(r"quiet|BUSY", alt), alt
    after = text[text.index(f"({picture})"):][:1200]
    assert "lab.run(steps=20)" in after and re.search(r"quiet", after)
