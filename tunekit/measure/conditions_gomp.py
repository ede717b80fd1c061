"""libgomp's wait policy: how long torch's OpenMP worker threads spin before they sleep, a
condition of a CPU calibration like the load. Measurement layer.

torch's CPU build runs its intra-op pool on libgomp (``ldd libtorch_cpu.so``: its own
``torch/lib/libgomp.so.1``). Between parallel regions a worker spins ``GOMP_SPINCOUNT`` times,
then sleeps on a futex; the next region must wake it. libgomp reads ``OMP_WAIT_POLICY`` and
``GOMP_SPINCOUNT`` once, as it loads (GCC's libgomp manual, "OMP_WAIT_POLICY" and
"GOMP_SPINCOUNT"): unset, 300,000 spins, but 100 while the process holds more libgomp threads than
CPUs (a second thread's parallel region adds a team: two states in one process); ``ACTIVE``, 30
billion (1,000 in that state); ``GOMP_SPINCOUNT=N``, N (min(N, 100) in that state); ``PASSIVE``,
none in either state. On a 2-vCPU VM the 64-cube matmuls of a calibration ran at one of two speeds
under the default (0.031-0.036 or 0.065-0.074 TFLOPS, flipping within one process), so two fresh
calibrations disagreed by 1.2x (issue 39); ``PASSIVE`` is the one policy with a single state, so it
is tunekit's (`PINNED`): slower small matmuls, every time (benchmarks/RESULTS.md).

A process's policy is fixed once torch has loaded: this module never changes a user's process.
`pin` is for the processes tunekit owns (the ``tunekit`` command, a Slurm rank, the benchmark
scripts), called before torch is imported; `policy` says what this process's libgomp read, for
the calibration record (measure.stream) and the note a CPU plan carries when its record was taken
under a policy of two states (`repeatable`).

    >>> pin()            # in a process tunekit starts, before ``import torch``
    >>> policy()         # 'OMP_WAIT_POLICY=PASSIVE' (or 'default')
"""
from __future__ import annotations

import os
import sys

VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
PINNED = {"OMP_WAIT_POLICY": "PASSIVE"}   # what tunekit's own processes run under (benchmarks/RESULTS.md)
DEFAULT = "default"
ONE_STATE = ("OMP_WAIT_POLICY=PASSIVE", "GOMP_SPINCOUNT=0", "OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=0")   # no spinning

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


def pin(environ=None) -> bool:
    """Set `PINNED` in ``environ`` (``os.environ``) for a process tunekit owns, before torch is
    imported; a variable the user set is left as set. Returns whether libgomp will read it
    (False once libgomp has loaded: then nothing is changed)."""
    environ = os.environ if environ is None else environ
    if environ is os.environ and _loaded():
        return False
    if not any(environ.get(k, "").strip() for k in VARS):   # the user's own choice wins
        environ.update(PINNED)
    return True


def repeatable(recorded: str) -> bool:
    """Whether a calibration taken under the policy ``recorded`` (`policy`'s words) is one whose small
    matmuls repeat between calibrations: a policy of one state, no spinning (libgomp reads its
    values case-blind)."""
    return recorded.upper() in ONE_STATE


def advice(recorded: str) -> str:
    """A note's words for a CPU calibration taken under the wait policy ``recorded``, not the pinned one."""
    env = describe(PINNED)
    return (f"this CPU's figures were calibrated under libgomp's wait policy {recorded!r}, under which its "
            f"small matmuls run at one of two speeds (two calibrations may differ by 1.2x or more): for "
            f"figures that repeat, start Python with {env} (a notebook: `%env {env}` in the first cell, "
            "before torch is imported, or in the kernel's env), then plan again (a calibration is taken "
            "once under that policy)")
