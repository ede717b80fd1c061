"""libgomp's wait policy (tunekit.measure.conditions_gomp): what an environment gives it, set only in
processes tunekit owns and only before torch loads, and what a CPU calibration records of it."""
import os
import subprocess
import sys
import types
from pathlib import Path

from tunekit.measure import conditions_gomp, stream
from tunekit.measure.conditions_gomp import DEFAULT, PINNED, describe, pin, repeatable

ROOT = Path(__file__).resolve().parents[2]


def test_an_environment_reads_as_the_variables_it_sets():
    assert describe({}) == DEFAULT == "default"
    assert describe({"OMP_WAIT_POLICY": " ", "PATH": "/bin"}) == "default"   # blank: libgomp's default too
    assert describe({"GOMP_SPINCOUNT": "1000", "OMP_WAIT_POLICY": "passive "}) == \
        "OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=1000"   # in VARS' order, stripped


def test_pin_sets_the_policy_only_where_the_user_set_none():
    env = {"PATH": "/bin"}
    assert pin(env) is True and env == {"PATH": "/bin", **PINNED}
    own = {"GOMP_SPINCOUNT": "1000"}
    assert pin(own) is True and own == {"GOMP_SPINCOUNT": "1000"}   # the user's choice is kept, nothing added


def test_pin_changes_nothing_in_a_process_whose_libgomp_has_loaded(monkeypatch):
    import torch  # noqa: F401 (loads libgomp: its environment is read)

    for k in conditions_gomp.VARS:
        monkeypatch.delenv(k, raising=False)
    assert pin() is False
    assert not any(k in os.environ for k in conditions_gomp.VARS)


def _run(code, **env):
    base = {k: v for k, v in os.environ.items() if k not in conditions_gomp.VARS}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return out.strip().splitlines()[-1]


def test_the_command_and_a_rank_pin_it_before_torch_loads_and_a_users_choice_wins():
    # the `tunekit` command's main(): pinned before any torch import (its --help exits after it)
    cli = ("import contextlib, io, runpy, sys\n"
           "from tunekit.cli.main import main\n"
           "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()): main(['--help'])\n"
           "sys.argv = ['worker']\n"   # a rank's entry without a spec: usage, exit 2, after pinning
           "with contextlib.suppress(SystemExit), contextlib.redirect_stderr(io.StringIO()):\n"
           "    runpy.run_module('tunekit.parallel.worker', run_name='__main__')\n"
           "import torch\n"
           "from tunekit.measure.conditions_gomp import policy\n"
           "print(policy(), 'libgomp' in open('/proc/self/maps').read())")
    assert _run(cli) == "OMP_WAIT_POLICY=PASSIVE True"
    assert _run(cli, GOMP_SPINCOUNT="1000") == "GOMP_SPINCOUNT=1000 True"
    # a Python process that loaded torch first (a notebook's kernel): main() leaves it as it started
    late = "import torch\n" + cli.replace("import torch\n", "", 1)
    assert _run(late) == "default True"


def test_a_record_of_another_policy_is_another_calibration(monkeypatch):
    monkeypatch.setattr(stream, "policy", lambda: "default")
    a = stream._key("cpu X")
    monkeypatch.setattr(stream, "policy", lambda: describe(PINNED))
    b = stream._key("cpu X")
    assert a.endswith("|omp default") and b.endswith("|omp OMP_WAIT_POLICY=PASSIVE") and a[:-7] == b[:-23]


def test_only_a_record_taken_under_another_policy_than_the_pinned_one_gets_a_note():
    assert all(map(repeatable, ("OMP_WAIT_POLICY=PASSIVE", "OMP_WAIT_POLICY=passive", "GOMP_SPINCOUNT=0")))
    # default, or a spin count: a second state (100 spins) beside it
    assert not any(map(repeatable, ("default", "GOMP_SPINCOUNT=1000", "OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=1000")))
    assert stream.policy_note(types.SimpleNamespace(wait_policy="OMP_WAIT_POLICY=PASSIVE")) is None
    note = stream.policy_note(types.SimpleNamespace(wait_policy="default"))
    assert note.kind == "expected.wait_policy"
    assert "'default'" in str(note) and "`%env OMP_WAIT_POLICY=PASSIVE`" in str(note)
