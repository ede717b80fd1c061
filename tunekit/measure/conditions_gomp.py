"""libgomp's wait policy: how long torch's OpenMP worker threads spin before they sleep, a
condition of a CPU calibration like the load. Measurement layer.

torch's CPU build runs its intra-op pool on libgomp (``ldd libtorch_cpu.so``: its own
``torch/lib/libgomp.so.1``). Between parallel regions a worker spins, then sleeps on a futex; the
next region must wake it. libgomp reads ``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` once, as it
loads (GCC's libgomp manual, "OMP_WAIT_POLICY" and "GOMP_SPINCOUNT"): unset, 300,000 spins (100
while the process holds more libgomp threads than CPUs); ``ACTIVE``, 30 billion (1,000);
``PASSIVE``, none. So a process's policy is fixed once torch has loaded, and tunekit never sets it
in a user's process.

The policy changes what a calibration measures: on the 2-vCPU VM (2026-12-06, load 14-26,
benchmarks/bench_calibration.py --policy) the stream record's 64-cube fp32 matmul read 0.032-0.074
TFLOPS under the default and 0.007-0.024 under ``PASSIVE`` (each in two states: a worker still
spinning or asleep as the next region comes under the default, a VM's wake-up latency under
``PASSIVE``). So the stream record holds the policy its trials ran under (`policy`) and its cache
key does too: a record taken under one policy is another calibration, never read under another.
No policy made two fresh calibrations repeat: the cpu-tiny step's pairs (busy/as is) were
1.019/1.203/1.049 under the default and 1.019/1.088/1.025 under ``PASSIVE``, six caches each
1.20x and 1.18x apart, ``PASSIVE``'s steps 1.13x slower; tunekit's own processes keep the
environment they were given (benchmarks/RESULTS.md).

    >>> policy()         # 'default', or each variable set: 'OMP_WAIT_POLICY=PASSIVE'
"""
from __future__ import annotations

import os
import sys

VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
DEFAULT = "default"

_at_load: str | None = None   # this process's policy, read before libgomp loaded (see `policy`)


def _loaded() -> bool:
    """Whether libgomp is mapped into this process (it has read its environment)."""
    try:
        with open("/proc/self/maps") as f:
            return "libgomp" in f.read()
    except OSError:        # not Linux: as torch's import loads it
        return "torch" in sys.modules


def describe(environ) -> str:
    """The wait policy an environment gives libgomp, as words: ``'default'`` where it sets
    neither variable, else each one set (``'OMP_WAIT_POLICY=PASSIVE'``)."""
    got = [f"{k}={environ[k].strip()}" for k in VARS if environ.get(k, "").strip()]
    return " ".join(got) or DEFAULT


def policy() -> str:
    """The wait policy this process's libgomp runs under. Before libgomp loads, the environment
    it will read (remembered, so a later change is not mistaken for it); after, what was
    remembered then, else the environment now (a ``%env`` before ``import torch`` is read;
    one after it is not, and cannot be told apart here)."""
    global _at_load
    if _at_load is not None:
        return _at_load
    now = describe(os.environ)
    if not _loaded():
        _at_load = now
    return now
