"""The first hour of a new user (issue 33), replayed from a wheel: fails on anything that would make
that user pause.

    python tools/first_hour.py [--keep]       # tests/project/test_first_hour.py runs it under `make test-slow`

What it does, each step timed on one line, then a summary (exit 1 if any finding):

1. builds the wheel from a copy of the checkout (`pip wheel --no-deps --no-build-isolation
   --no-index`: no network, nothing left in the checkout; where the running venv has no
   setuptools, pip takes it from the package index into an isolated build);
2. makes a temporary venv and installs that wheel in it with `pip install --no-deps`. The venv
   gets its DEPENDENCIES (torch, transformers, jupyter...) from the venv running this script
   through a `.pth` file naming that venv's site-packages folder (a plain path line: that folder's
   own `.pth` files, the editable tunekit's among them, are not run), so nothing multi-GB is
   downloaded and tunekit itself comes from the wheel only (each step checks `tunekit.__file__`);
3. from a temporary folder outside the repository, with a fresh HOME, HF_HUB_OFFLINE=1, and no
   display nor BROWSER (headless, as CI and a server are):
   - `tunekit --version`;
   - a shell user's slips, each refused in one line naming what was meant (no traceback):
     `tunekit explain` (the Python API's tunekit.explain, not 'plan'), `tunekit diff 0 1` before any
     run (what a side is), `tunekit plan --device RTX3090 --precision half` ('fp16');
   - a plain `python script.py`: `tunekit.profile` and `tunekit.Monitor` on a small torch model,
     `tunekit.profiling.plot_history().show()` (the chart must land in a file whose path is printed) and
     `tunekit.estimate_memory` (no cuda_context row on a CPU machine);
   - a transformers `Trainer` with `TunekitCallback` on a random-init tiny Llama (built from a
     config, nothing downloaded), then `tunekit.measure_memory(model, (input_ids,))` on it and
     `tunekit.advise` on a config whose feed-forward width, 688, is not a multiple of 64;
   - `tunekit plan --model cfg.json` with the `hf` extra (an H100 plan: no CPU kernel named) and
     without it (a sitecustomize hides transformers and accelerate from the import system, as if
     never installed: the command must name `pip install 'tunekit[hf]'`);
   - two plans of a small Llama read as a person would (issue 39): on an H100 in bf16 (no CPU kernel
     named, no CPU FLOP correction, flash attention, an expected step) and on a T4 in bf16 (no bound
     and no expected step from another dtype's figures; fp16 named as what the card runs instead);
   - the Lab's first runs (fp32 and bf16, traced): `lab.results()` names each row's MFU peak,
     `tunekit.explain` shows no 0% for an op that ran, `diff(a, b).table` holds the few rows that
     matter, `tunekit.explain(42)` and `tunekit.Lab('gpt2-124m')` are refused in words that help;
   - chapter 18 under nbval three times, each with a cache of its own (the CPU calibrated afresh):
     its conclusions must hold every time;
   - a notebook with `%load_ext tunekit` and `%%gpuprofile` cells executed by `python -m nbconvert
     --execute` (`jupyter nbconvert`: the venv has no `jupyter-nbconvert` script of its own), with
     a cell that is a SyntaxError (no run in `history()`, no tunekit frame in its traceback) and a
     first `--trace` run (it must trace);
4. checks that nothing was written inside the installed package (site-packages/tunekit; Python's
   own `__pycache__` folders aside, which pip fills at install).

What the user is shown (a command's stdout and stderr; a notebook's outputs, its HTML as text) is
searched for: a traceback; a warning; a negative figure (a minus sign before a number with a unit:
B/KiB/MiB/GiB, s/ms/µs, %, FLOP(S), /s); NaN; and notes that contradict the run (nothing in this
session uses torch.compile, so a note that says it compiled is wrong; between the notebook's
profiled runs only the batch's values change, so a note that the code changed is wrong).
No check compares timings.
"""
from __future__ import annotations

import argparse
import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300

TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\w*(Error|Exception): ", re.M)
WARNING = re.compile(r"\b\w*Warning\b|^\s*warn(ing)?\b", re.M | re.I)
UNITS = r"(?:[KMGTP]i?B|B|bytes?|µs|us|ms|s|%|[KMGTP]?FLOPS?|FLOP|tok(?:ens)?/s|samples?/s|steps?/s|/s)"
NEGATIVE = re.compile(r"(?<![\w.\-])[-\u2212]\s?\d[\d,]*(?:\.\d+)?\s?" + UNITS + r"(?![\w])")
# Signed differences, where a minus is a reading and not a wrong figure: "RSS +14.9 MiB", the
# resident set's change over the run ("+" on growth), a diff's change after its two sides, and the
# last column of a table headed "... error" (measured vs estimated). Peaks, times, rates and sizes
# are never below zero, and a negative zero ("-0%") is wrong anywhere.
SIGNED_CHANGE = re.compile(r"\bRSS\s+[-+\u2212]\s?\d[\d,.]*\s?[KMGT]?i?B\b"
                           # a diff's "a -> b (change)": "matmul/linear 83.3 ms -> 25.6 ms (-57.6 ms)"
                           r"|->\s*[\d,.]+\s?\S+\s+\([-+\u2212]\s?\d[\d,.]*\s?" + UNITS + r"\)")
ERROR_HEADER = re.compile(r"\s{2,}error\s*$")
ERROR_CELL = re.compile(r"\s[-+\u2212]\d+(?:\.\d+)?%\s*$")
NEGATIVE_ZERO = re.compile(r"(?<![\w.\-])[-\u2212]\s?0(?:\.0+)?\s?" + UNITS + r"(?![\w])")
NAN = re.compile(r"\bnan\b", re.I)
COMPILED = re.compile(r"torch\.compile compiled (\d+) graph")
JUPYTER_LOG = re.compile(r"\[(NbConvertApp|IPKernelApp)\] ")
RECOUNTED = re.compile(r"recounted: (.*?) changed since")

MODEL = """\
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))

    def forward(self, x):
        return self.body(x)


def batch():
    return torch.randn(32, 64), torch.randint(0, 10, (32,))


def train_step(x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss
"""

SCRIPT = MODEL + """
import tunekit

print("tunekit from", tunekit.__file__)
torch.manual_seed(0)
with tunekit.profile(name="first step") as rec:   # the model and its optimizer built inside
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_step(*batch())
print(rec)
for i in range(3):
    x, y = batch()
    with tunekit.profile(name="step") as rec:
        train_step(x, y)
    print(rec)

mon = tunekit.Monitor(model, name="my loop")
for x, y in mon.iter([batch() for _ in range(12)]):
    mon.log(loss=train_step(x, y))
print(mon.close())
tunekit.profiling.plot_history().show()   # headless: no browser, no display; the chart must land somewhere it says
print("=== estimate")
print(tunekit.estimate_memory(tunekit.GPTConfig.preset("cpu-tiny"), micro_batch=2, seq_len=16))
"""

TRAINER = """\
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

import tunekit
from tunekit.integrations.transformers import TunekitCallback

print("tunekit from", tunekit.__file__)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
model = LlamaForCausalLM(cfg)


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.randint(0, 256, (32,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


args = TrainingArguments(output_dir="trainer-out", max_steps=8, per_device_train_batch_size=4, logging_steps=2,
                         save_strategy="no", report_to="none", use_cpu=True)
cb = TunekitCallback()
Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[cb]).train()
print(cb.monitor.record)

# from the outside: a causal LM given only its inputs trains on them as labels, as the Trainer does
print(tunekit.measure_memory(model, (torch.randint(0, 256, (2, 32)),)))
# a feed-forward width that is not a multiple of 64 (the documents' matrix-shape rule)
print("=== advise")
print(tunekit.advise(LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                 num_attention_heads=4, max_position_embeddings=512)))
"""

# Two plans of one small Llama, read as a person would (issue 39): the H100's names the GPU's
# kernels and none of the CPU's; the T4 in bf16 (no bf16 tensor cores) prints no bound and names
# what the card runs instead
PLANS = """\
import tunekit
from transformers import LlamaConfig

print("tunekit from", tunekit.__file__)
cfg = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512)
for device in ("H100 SXM", "T4"):
    p = tunekit.plan(cfg, device, precision="bf16", micro_batch=2, seq_len=256)
    print(f"=== plan {device}")
    print(p)
    if p.expected is not None:
        print(p.expected)
        print(p.expected.by_op[["op", "category", "calls", "expected_s"]].to_string())
"""

# The Lab's first runs read as a person would: two traced runs of the built-in GPT (fp32, bf16), their
# table, explain and diff, and two mistakes a newcomer makes (issue 39)
LAB = """\
import tunekit

print("tunekit from", tunekit.__file__)
lab = tunekit.Lab()
a = lab.run(steps=3, trace=True, verbose=False)
b = lab.run(steps=3, precision="bf16", trace=True, verbose=False)
print("=== results")
print(lab.results())
print("=== explain")
print(tunekit.explain(b))
d = tunekit.diff(a, b)
print("=== diff")
print(d.summary)
print(f"diff table rows: {len(d.table)} of {len(d.table_all)}")
for wrong in ("tunekit.explain(42)", "tunekit.Lab('gpt2-124m')"):
    try:
        eval(wrong)
        print(f"=== {wrong} raised nothing")
    except (TypeError, ValueError) as e:
        print(f"=== {wrong} refused with {type(e).__name__} saying: {e}")
"""

PLAN_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
               "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4,
               "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 2048}

# hides transformers and accelerate from every import (and importlib.util.find_spec) of the
# process, as if they were not installed: the path finder sees nothing under those names
NO_HF = """\
import sys


class _Hidden:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("transformers", "accelerate"):
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.finder, attr)


sys.meta_path[:] = [_Hidden(f) if getattr(f, "__name__", "") == "PathFinder" else f for f in sys.meta_path]
"""

NOTEBOOK_CELLS = [
    "%load_ext tunekit",
    MODEL + "torch.manual_seed(0)\nmodel = Net()\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n\n"
    "import tunekit\nprint('tunekit from', tunekit.__file__)",
    "x, y = batch()",
    "%%gpuprofile\ntrain_step(x, y)",
    "x, y = batch()   # new values, same shapes: the count stays valid",
    "%%gpuprofile\ntrain_step(x, y)",
    "x, y = batch()",
    "%%gpuprofile\ntrain_step(x, y)",
    "tunekit.history()",
    # a cell that never runs: a SyntaxError, no tunekit frame in its traceback, no run in history()
    "%%gpuprofile\ntrain_step(x, y))",
    "print('history rows after the SyntaxError cell:', len(tunekit.history()))",
    # what a person asks for, they get on the first try
    "%%gpuprofile --trace\ntrain_step(x, y)  # traced",
    "print('trace on the first --trace run:', tunekit.last().trace is not None)",
]
SYNTAX_ERROR_CELL = NOTEBOOK_CELLS.index("%%gpuprofile\ntrain_step(x, y))")
EXPECT_PRINTED = ("history rows after the SyntaxError cell: 3", "trace on the first --trace run: True")


class Session:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.work, self.home = tmp / "work", tmp / "home"
        self.work.mkdir()
        self.home.mkdir()
        self.venv = tmp / "venv"
        self.findings: list[tuple[str, str]] = []
        self.steps: list[tuple[str, float, int]] = []
        self.site = None
        self.logs = 0

    # --- running and reading ------------------------------------------------------------------

    def env(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TUNEKIT_", "XDG_", "PLOTLY_", "JUPYTER_", "PYTHON", "VIRTUAL_ENV", "HF_",
                                    "BROWSER", "DISPLAY", "WAYLAND_DISPLAY"))}
        # headless, as CI and a server are: no display, no browser (nothing can open a window)
        env.update(HOME=str(self.home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VIRTUAL_ENV=str(self.venv), PATH=f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
        env.update(extra)
        return env

    def run(self, argv, check=True, **extra) -> subprocess.CompletedProcess:
        out = subprocess.run([str(a) for a in argv], cwd=self.work, env=self.env(**extra), capture_output=True,
                             text=True, timeout=TIMEOUT_S)
        self.logs += 1   # what the user saw, for --keep
        (self.tmp / f"{self.logs:02d}-{Path(str(argv[0])).name}.log").write_text(
            " ".join(map(str, argv)) + "\n--- stdout\n" + out.stdout + "\n--- stderr\n" + out.stderr)
        if check and out.returncode != 0:
            self.find("exit status", f"{Path(str(argv[0])).name} exited {out.returncode}: {tail(out)}")
        return out

    def find(self, what: str, detail: str) -> None:
        self.findings.append((self.current, f"{what}: {detail}"))

    def scan(self, text: str, where: str = "output") -> None:
        """Everything a user should never be shown."""
        lines = text.splitlines()
        for pattern, what in ((TRACEBACK, "traceback"), (WARNING, "warning"), (NAN, "NaN figure"),
                              (NEGATIVE_ZERO, "negative zero")):
            for line in lines:
                if pattern.search(line):
                    self.find(what, f"{where}: {line.strip()[:200]}")
                    break
        in_error_table = False
        for line in lines:
            in_error_table = bool(ERROR_HEADER.search(line)) or (in_error_table and line.startswith(" "))
            unsigned = SIGNED_CHANGE.sub(" ", ERROR_CELL.sub(" ", line) if in_error_table else line)
            if NEGATIVE.search(unsigned) and not NEGATIVE_ZERO.search(line):
                self.find("negative figure", f"{where}: {line.strip()[:200]}")
                break
        for m in COMPILED.finditer(text):
            self.find("note contradicts the run",
                      f"{where}: says torch.compile compiled {m.group(1)} graph(s); nothing here uses torch.compile")
        for m in RECOUNTED.finditer(text):
            self.find("note contradicts the run",
                      f"{where}: says {m.group(1)} changed; only the batch's values (same shapes) changed")

    def from_wheel(self, text: str, where: str) -> None:
        m = re.search(r"tunekit from (\S+)", text)
        if not m or not m.group(1).startswith(str(self.site / "tunekit")):
            self.find("not the wheel", f"{where}: tunekit imported from {m.group(1) if m else '?'}")

    def step(self, name: str, fn) -> None:
        self.current, n0, t0 = name, len(self.findings), time.perf_counter()
        try:
            fn()
        except Exception as e:  # a step that cannot go on is a finding, and the next steps still run
            self.find("step failed", f"{type(e).__name__}: {e}")
        dt, n = time.perf_counter() - t0, len(self.findings) - n0
        self.steps.append((name, dt, n))
        print(f"{'ok  ' if n == 0 else 'FAIL'} {name:<34} {dt:6.1f} s" + (f"  ({n} finding(s))" if n else ""),
              flush=True)

    # --- the steps ----------------------------------------------------------------------------

    def build_wheel(self) -> None:
        src = self.tmp / "src"  # a copy: an in-tree build leaves build/ and egg-info in the checkout
        shutil.copytree(ROOT / "tunekit", src / "tunekit", ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copy2(ROOT / name, src / name)
        # offline with this venv's setuptools; a venv without one (Python 3.12+ venvs have none)
        # lets pip fetch it from the package index into an isolated build environment
        offline = ["--no-build-isolation", "--no-index"] if importlib.util.find_spec("setuptools") else []
        out = subprocess.run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", "wheel", "--no-deps",
                              *offline, "-w", self.tmp / "dist", src],
                             timeout=TIMEOUT_S, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"pip wheel failed: {tail(out)}")
        (self.wheel,) = (self.tmp / "dist").glob("tunekit-*.whl")

    def make_venv(self) -> None:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", self.venv], check=True, timeout=TIMEOUT_S)
        py = self.venv / "bin" / "python"
        site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   check=True, capture_output=True, text=True).stdout.strip())
        (site / "_first_hour_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        # this venv's pip, found through the .pth, installs into the new venv (its sys.prefix);
        # --ignore-installed: the dependency venv's tunekit is neither read nor uninstalled
        out = subprocess.run([py, "-m", "pip", "-q", "--disable-pip-version-check", "install", "--no-deps",
                              "--no-index", "--ignore-installed", "--no-warn-script-location", self.wheel],
                             capture_output=True, text=True, timeout=TIMEOUT_S, env=self.env())
        if out.returncode != 0:
            raise RuntimeError(f"pip install of the wheel failed: {tail(out)}")
        self.site = site
        self.before = tree(site / "tunekit")

    def version(self) -> None:
        out = self.run(["tunekit", "--version"])
        version = re.search(r'__version__ = "(.+?)"', (ROOT / "tunekit" / "__init__.py").read_text()).group(1)
        if not out.stdout.startswith(f"tunekit {version} (torch "):
            self.find("version", f"`tunekit --version` printed {out.stdout.strip()!r}")
        self.scan(out.stdout + out.stderr, "tunekit --version")

    def slips(self) -> None:
        for argv, must in ((["explain"], "is tunekit.explain() in Python, not a command"),
                           (["diff", "0", "1"], "0: no such log file"),
                           (["plan", "--device", "RTX3090", "--precision", "half"], "did you mean 'fp16'?")):
            out = self.run(["tunekit", *argv], check=False)
            said = f"tunekit {' '.join(argv)}"
            if out.returncode != 2 or must not in out.stderr or len(out.stderr.strip().splitlines()) != 1:
                self.find("refusal", f"{said} exited {out.returncode} (2: refused) saying {out.stderr.strip()[-300:]!r}"
                                     f", not one line with {must!r}")
            self.scan(out.stdout + out.stderr, said)

    def script(self) -> None:
        (self.work / "script.py").write_text(SCRIPT)
        out = self.run(["python", "script.py"])
        text = out.stdout + out.stderr
        self.from_wheel(text, "script.py")
        self.scan(text, "script.py")
        if "my loop" not in text:
            self.find("missing", "script.py: no Monitor summary printed")
        estimate = out.stdout.partition("=== estimate")[2]
        if re.search(r"^\s*cuda_context\b", estimate, re.M):
            self.find("CUDA row on a CPU machine", "script.py: estimate_memory on a CPU-only machine has a "
                      "cuda_context row")
        chart = re.search(r"chart: (\S+\.html)", out.stdout)
        if chart is None or not Path(chart.group(1)).is_file():
            self.find("fig.show() did nothing", "script.py: headless, `tunekit.profiling.plot_history().show()` "
                      + (f"printed {chart.group(1)}, which does not exist" if chart else "printed no path"))

    def trainer(self) -> None:
        (self.work / "train_hf.py").write_text(TRAINER)
        out = self.run(["python", "train_hf.py"])
        text = out.stdout + out.stderr
        self.from_wheel(text, "train_hf.py")
        self.scan(text, "train_hf.py")
        if "tunekit/" not in out.stdout:
            self.find("missing", "train_hf.py: no tunekit/ figures in the Trainer's printed logs")
        advice = out.stdout.partition("=== advise")[2]
        if advice and "688" not in advice:
            self.find("missing advice", "tunekit.advise says nothing of intermediate_size=688 (not a multiple of 64)")

    def plan_hf(self) -> None:
        (self.work / "cfg.json").write_text(json.dumps(PLAN_CONFIG))
        out = self.run(["tunekit", "plan", "--model", "cfg.json", "--micro-batch", "1", "--seq-len", "512"],
                       check=False)
        if out.returncode not in (0, 1):  # 0 fits, 1 does not: both are answers
            self.find("exit status", f"tunekit plan exited {out.returncode}: {tail(out)}")
        self.scan(out.stdout + out.stderr, "tunekit plan")
        for line in out.stdout.splitlines():  # the plan is for an H100: the names it prints are a GPU's
            if line.strip().startswith("bound by") and re.search(r"_for_cpu|\bcpu\b", line, re.I):
                self.find("CPU kernels in a GPU plan", line.strip()[:200])

    def plans_read(self) -> None:
        (self.work / "plans.py").write_text(PLANS)
        out = self.run(["python", "plans.py"])
        text = out.stdout + out.stderr
        self.from_wheel(text, "plans.py")
        self.scan(text, "plans.py")
        h100, _, t4 = out.stdout.partition("=== plan T4")
        h100 = h100.partition("=== plan H100 SXM")[2]
        # a GPU plan shows the GPU's ops: no CPU kernel, no CPU FLOP correction (the notes that
        # say the fake step itself ran on the CPU are about the method, and allowed)
        for line in h100.splitlines():
            if re.search(r"_for_cpu|CPU SDPA|\bcpu\b", line, re.I) and "CPU-device fake step" not in line \
                    and "real CPU step" not in line:
                self.find("CPU internals in a GPU plan", line.strip()[:200])
        if "_scaled_dot_product_flash_attention" not in h100:
            self.find("missing", "the H100 plan in bf16 names no flash attention kernel")
        if not re.search(r"^\s*expected\s+step", h100, re.M):
            self.find("missing", "the H100 plan has no expected step")
        # T4 in bf16: no bound from another dtype's figures, and what the card runs instead
        if re.search(r"^\s*bound\s+step", t4, re.M) or re.search(r"^\s*expected\s+step", t4, re.M):
            self.find("contradiction", "the T4 plan in bf16 prints a bound or an expected step (no bf16 peak)")
        if "precision='fp16'" not in t4:
            self.find("missing", "the T4 plan in bf16 does not name fp16 (what the card runs instead)")

    def lab_read(self) -> None:
        (self.work / "lab.py").write_text(LAB)
        out = self.run(["python", "lab.py"])
        text = out.stdout + out.stderr
        self.from_wheel(text, "lab.py")
        refusals = "\n".join(line for line in out.stdout.splitlines() if line.startswith("=== tunekit."))
        self.scan(text.replace(refusals, ""), "lab.py")
        results = out.stdout.partition("=== results")[2].partition("=== explain")[0]
        if "MFU/HFU of" not in results:
            self.find("MFU without its peak", "lab.results() mixes fp32 and bf16 MFUs and names no peak per row")
        explained = out.stdout.partition("=== explain")[2].partition("=== diff")[0]
        for pattern in (r"efficiency 0\.0\b", r"\bat 0% of\b", r"\b0\.0% of the expected"):
            m = re.search(pattern, explained)
            if m:
                self.find("0% for an op that ran", f"explain: {m.group(0)!r}")
        m = re.search(r"diff table rows: (\d+) of (\d+)", out.stdout)
        if m is None or int(m.group(1)) > 20:
            self.find("long table", f"diff(a, b).table: {m.group(0) if m else 'not printed'} (the few that matter)")
        said = dict(re.findall(r"^=== (tunekit\.\S+) (.*)$", out.stdout, re.M))
        # 42 is not a run (not: "no plan"); a preset's name where a model goes names preset=
        for call, must, mustnt in (("tunekit.explain(42)", "refused", "plan"),
                                   ("tunekit.Lab('gpt2-124m')", "preset='gpt2-124m'", None)):
            words = said.get(call, "")
            if must not in words or (mustnt and mustnt in words):
                self.find("unclear refusal", f"{call}: {words!r}")

    def chapter_fresh(self, n: int) -> None:
        """Chapter 18 under nbval with a cache made for this run alone: the CPU calibrated afresh."""
        cache = self.tmp / f"cache-{n}"
        out = self.run(["python", "-m", "pytest", "-q", "--nbval-lax", "-p", "no:cacheprovider",
                        ROOT / "notebooks" / "18_expected.ipynb"], check=False, TUNEKIT_CACHE=str(cache))
        if out.returncode != 0:
            self.find("chapter failed", f"18_expected with a fresh cache (run {n}): {tail(out)}")

    def plan_no_hf(self) -> None:
        hide = self.tmp / "no_hf"
        hide.mkdir(exist_ok=True)
        (self.work / "cfg.json").write_text(json.dumps(PLAN_CONFIG))
        (hide / "sitecustomize.py").write_text(NO_HF)
        out = self.run(["tunekit", "plan", "--model", "cfg.json"], check=False, PYTHONPATH=str(hide))
        text = out.stdout + out.stderr
        if out.returncode != 2:
            self.find("exit status", f"tunekit plan without transformers exited {out.returncode} (2: refused)")
        if "pip install 'tunekit[hf]'" not in text:
            self.find("missing pip command", f"tunekit plan without transformers printed {text.strip()[-300:]!r}")
        self.scan(text.replace("No module named 'transformers'", ""), "tunekit plan (no hf)")

    def notebook(self) -> None:
        import nbformat

        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in NOTEBOOK_CELLS])
        nb.cells[SYNTAX_ERROR_CELL].metadata["tags"] = ["raises-exception"]  # nbconvert goes on past it
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, self.work / "first.ipynb")
        out = self.run(["python", "-m", "nbconvert", "--to", "notebook", "--execute", "first.ipynb",
                        "--output", "first.out.ipynb", "--ExecutePreprocessor.timeout=120"])
        # Jupyter's own log lines ("[IPKernelApp] WARNING | Kernel is running over TCP without
        # encryption" from ipykernel 7 among them) are the notebook stack's, whatever is imported
        self.scan("\n".join(line for line in out.stderr.splitlines() if not JUPYTER_LOG.match(line)), "nbconvert")
        if out.returncode != 0:
            return
        done = nbformat.read(self.work / "first.out.ipynb", as_version=4)
        shown = []
        for i, cell in enumerate(done.cells):
            for o in cell.get("outputs", []):
                if o.output_type == "error" and i == SYNTAX_ERROR_CELL:
                    if o.ename != "SyntaxError":
                        self.find("wrong error", f"cell {i}: {o.ename}: {o.evalue} (a SyntaxError expected)")
                    frames = [f for f in o.traceback if re.search(r"tunekit[/\\]", strip_ansi(f))]
                    if frames:
                        self.find("tunekit frames in a user's traceback",
                                  f"cell {i} (SyntaxError): {len(frames)} frame(s), first "
                                  f"{strip_ansi(frames[0]).strip().splitlines()[0][:160]!r}")
                elif o.output_type == "error":
                    self.find("traceback", f"cell {i}: {o.ename}: {o.evalue}")
                elif o.output_type == "stream":
                    shown.append(o.text)
                    if o.name == "stderr":
                        self.find("stderr", f"cell {i} wrote to stderr: {o.text.strip()[:200]!r}")
                else:
                    data = o.get("data", {})
                    shown.append(as_text(data["text/html"]) if "text/html" in data else data.get("text/plain", ""))
        text = "\n".join(shown)
        for line in EXPECT_PRINTED:
            if line not in text:
                said = re.search(re.escape(line.split(":")[0]) + r":.*", text)
                self.find("wrong answer", f"notebook printed {said.group(0) if said else 'nothing'!r}, not {line!r}")
        self.from_wheel(text, "notebook")
        self.scan(text, "notebook")
        if text.count("In[") < 3 and "gpuprofile" not in text:
            self.find("missing", "notebook: no %%gpuprofile summaries shown")

    def package_untouched(self) -> None:
        after = tree(self.site / "tunekit")
        for name in sorted(set(after) - set(self.before)):
            self.find("written into the package", f"new: site-packages/tunekit/{name}")
        for name in sorted(n for n in set(after) & set(self.before) if after[n] != self.before[n]):
            self.find("written into the package", f"changed: site-packages/tunekit/{name}")
        for name in sorted(set(self.before) - set(after)):
            self.find("written into the package", f"removed: site-packages/tunekit/{name}")


def tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if "__pycache__" not in p.parts}


def as_text(markup: str) -> str:
    """What a page shows of ``markup``: its text, without styles and scripts."""
    markup = re.sub(r"<(style|script)\b.*?</\1>", " ", markup, flags=re.S | re.I)
    markup = re.sub(r"<(br|/?p|/?div|/?tr|/?li)\b[^>]*>", "\n", markup, flags=re.I)
    return html.unescape(re.sub(r"<[^>]+>", " ", markup))


def strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def tail(out: subprocess.CompletedProcess, n: int = 600) -> str:
    return (out.stdout + out.stderr).strip()[-n:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (printed) to look at")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tunekit-first-hour-"))
    t0 = time.perf_counter()
    s = Session(tmp)
    try:
        s.step("build the wheel", s.build_wheel)
        s.step("venv with the wheel (--no-deps)", s.make_venv)
        if s.site is not None:
            s.step("tunekit --version", s.version)
            s.step("a shell user's slips", s.slips)
            s.step("python script.py (profile, Monitor)", s.script)
            s.step("Trainer + TunekitCallback", s.trainer)
            s.step("tunekit plan (hf extra)", s.plan_hf)
            s.step("tunekit plan (no transformers)", s.plan_no_hf)
            s.step("two plans read (H100, T4 bf16)", s.plans_read)
            s.step("Lab: results, explain, diff", s.lab_read)
            for n in range(1, 4):
                s.step(f"chapter 18, fresh cache ({n} of 3)", lambda n=n: s.chapter_fresh(n))
            s.step("notebook: %%gpuprofile (nbconvert)", s.notebook)
            s.step("nothing written into the package", s.package_untouched)
    finally:
        if args.keep:
            print("kept:", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"first hour: {len(s.steps)} steps in {time.perf_counter() - t0:.1f} s, {len(s.findings)} finding(s)")
    for where, what in s.findings:
        print(f"  - [{where}] {what}")
    return 1 if s.findings or s.site is None else 0


if __name__ == "__main__":
    sys.exit(main())
