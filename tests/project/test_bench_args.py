"""Every benchmarks/*.py script refuses an unknown option with argparse's usage line and exit status 2
before any work, and lists its options under ``--help`` (a misspelt option was once ignored:
``bench_expect.py --help`` started the ten-minute three-model ladder).

One interpreter imports what the scripts import at their top once (torch, tunekit, ...), then runs
each script as ``__main__`` with its argv in a forked child: what ``python benchmarks/X.py ARG`` does,
without the 2-3 s of imports each of ~40 fresh interpreters would repeat on 2 cores. A child still
running after ``TIMEOUT_S`` has started work: it is killed and its script fails."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60
# none excluded: every script parses its options with argparse
EXCLUDED: set[str] = set()
# scripts that still import torch before reading their options (test_a_refused_option_costs_no_heavy_import)
IMPORTS_FIRST: set[str] = set()

DRIVER = r"""
import ast, importlib, json, os, runpy, signal, sys, tempfile, time
scripts, args, timeout = json.loads(sys.argv[1])
for path in scripts:   # the modules the scripts import at their top, once here: every child has them
    for node in ast.parse(open(path).read()).body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module] if (
            isinstance(node, ast.ImportFrom) and node.module and not node.level) else []
        for name in names:
            try:
                importlib.import_module(name)
            except ImportError:
                pass
got = []
for path in scripts:
    for arg in args:
        out = tempfile.TemporaryFile()
        pid = os.fork()
        if pid == 0:   # the child: the script as `python PATH ARG` runs it
            os.setpgid(0, 0)
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            sys.argv, sys.path[0] = [path, arg], os.path.dirname(os.path.abspath(path))
            code = 0
            try:
                runpy.run_path(path, run_name="__main__")
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        end, rc = time.monotonic() + timeout, None
        while time.monotonic() < end:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.02)
        else:   # still running: it started work
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        out.seek(0)
        got.append([os.path.basename(path), arg, rc, out.read().decode(errors="replace")[:20000]])
print(json.dumps(got))
"""


def scripts() -> list[str]:
    return sorted(f"benchmarks/{p.name}" for p in (ROOT / "benchmarks").glob("*.py") if p.name not in EXCLUDED)


def run_all(args: list[str]) -> dict:
    """{(script, arg): (exit status, None where killed at ``TIMEOUT_S``; what it printed)} of every script."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps([scripts(), args, TIMEOUT_S])], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=TIMEOUT_S * 4, check=True)
    return {(name, arg): (rc, text) for name, arg, rc, text in json.loads(done.stdout.splitlines()[-1])}


def test_every_benchmark_refuses_an_unknown_option_and_lists_its_own():
    got = run_all(["--no-such-option", "--help"])
    assert len(got) == 2 * len(scripts()) and len(scripts()) >= 20
    for (name, arg), (rc, text) in got.items():
        if arg == "--help":
            assert rc == 0 and "usage:" in text and "--help" in text, (name, rc, text)
        else:
            assert rc == 2 and "unrecognized arguments: --no-such-option" in text, (name, rc, text)
            assert f"usage: {name}" in text, (name, text)


PARSE_FIRST = r"""
import importlib.abc, json, os, runpy, sys
scripts = json.loads(sys.argv[1])
HEAVY = {"torch", "transformers", "pandas", "plotly"}   # 2-3 s of imports before an option is read


class Refused(Exception):
    pass


class NoHeavyImports(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise Refused(f"imported {name} before refusing the option")
        return None


got = []
for path in scripts:
    pid = os.fork()
    if pid == 0:   # the child: the script as `python PATH --no-such-option` runs it, heavy imports refused
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        sys.meta_path.insert(0, NoHeavyImports())
        sys.argv, sys.path[0] = [path, "--no-such-option"], os.path.dirname(os.path.abspath(path))
        try:
            runpy.run_path(path, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            code = 3   # the heavy import refused (or anything else before the options were parsed)
        os._exit(code)
    got.append([os.path.basename(path), os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])])
print(json.dumps(got))
"""


def test_a_refused_option_costs_no_heavy_import():
    # each script reads its options before torch (and transformers, pandas, plotly) is imported: a
    # misspelt option is refused at once, not after 2-3 s of imports. The script runs with those
    # imports refused: argparse's exit status 2 means it never reached them (3: it tried one first)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", PARSE_FIRST, json.dumps(scripts())], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S * 4, check=True)
    got = dict(json.loads(done.stdout.splitlines()[-1]))
    assert len(got) == len(scripts())
    assert {name: rc for name, rc in got.items() if rc != 2 and name not in IMPORTS_FIRST} == {}
    # each still imports first (3): the set only shrinks
    assert {name: got[name] for name in IMPORTS_FIRST} == dict.fromkeys(IMPORTS_FIRST, 3)
