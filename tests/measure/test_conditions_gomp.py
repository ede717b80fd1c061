"""libgomp's wait policy (tunekit.measure.conditions_gomp): what an environment gives it, what this
process's libgomp read, and a CPU calibration keyed by it."""
import os
import subprocess
import sys
from pathlib import Path

from tunekit.measure import conditions_gomp, stream
from tunekit.measure.conditions_gomp import DEFAULT, describe

ROOT = Path(__file__).resolve().parents[2]


def test_an_environment_reads_as_the_variables_it_sets():
    assert describe({}) == DEFAULT == "default"
    assert describe({"OMP_WAIT_POLICY": " ", "PATH": "/bin"}) == "default"   # blank: libgomp's default too
    assert describe({"GOMP_SPINCOUNT": "1000", "OMP_WAIT_POLICY": "passive "}) == \
        "OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=1000"   # in VARS' order, stripped


def test_the_policy_read_before_torch_loads_is_kept_and_a_later_change_is_not_taken_for_it():
    code = ("import os\n"
            "from tunekit.measure.conditions_gomp import policy\n"
            "first = policy()\n"                         # before libgomp loads: what it will read
            "import torch\n"
            "os.environ['OMP_WAIT_POLICY'] = 'ACTIVE'\n"   # too late: libgomp has read its environment
            "print(first, '|', policy(), '|', 'libgomp' in open('/proc/self/maps').read())")
    env = {k: v for k, v in os.environ.items() if k not in conditions_gomp.VARS}
    out = subprocess.run([sys.executable, "-c", code], env={**env, "GOMP_SPINCOUNT": "1000", "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert out.strip().splitlines()[-1] == "GOMP_SPINCOUNT=1000 | GOMP_SPINCOUNT=1000 | True"


def test_a_record_of_another_policy_is_another_calibration(monkeypatch):
    monkeypatch.setattr(stream, "policy", lambda: "default")
    a = stream._key("cpu X")
    monkeypatch.setattr(stream, "policy", lambda: "OMP_WAIT_POLICY=PASSIVE")
    b = stream._key("cpu X")
    # the same machine, torch, threads and version; only the policy differs
    assert a.endswith("|omp default") and b.endswith("|omp OMP_WAIT_POLICY=PASSIVE") and a[:-7] == b[:-23]
