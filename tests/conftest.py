import os
import signal
import tempfile

import pytest

# Calibrations are cached per machine; tests must not read or write the user's cache.
os.environ.setdefault("TUNEKIT_CACHE", tempfile.mkdtemp(prefix="tunekit-cache-"))

# A run started with `&` from a script (no job control) inherits SIGINT ignored, and Python then
# installs no Ctrl-C handler of its own: tunekit rightly stays out of a signal the user ignores, so
# the tests of its Ctrl-C handling (and of what a cell reads) need Python's handler, as a terminal's
# or Jupyter's Python has it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run with the device tool)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:   # not `in item.keywords`: a folder named gpu is one too
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_history():
    from tunekit.measure import history, peaks

    history.clear_history()
    peaks._resolved.clear()   # a peak resolved under a test's mocked CUDA must not answer the next test
    yield


def _active_flop_counters():
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return [m for m in _get_current_dispatch_mode_stack() if type(m).__name__ == "_FlopCounterMode"]


@pytest.fixture(autouse=True)
def _no_leaked_flop_counter():
    """A FlopCounterMode left active would slow and distort every later test: exit any after each test."""
    yield
    for mode in reversed(_active_flop_counters()):
        mode.counter.__exit__(None, None, None)


def _main_thread_priority():
    import threading

    tid = threading.main_thread().native_id
    return os.sched_getscheduler(tid) & ~getattr(os, "SCHED_RESET_ON_FORK", 0), os.getpriority(os.PRIO_PROCESS, tid)


@pytest.fixture(autouse=True)
def _no_leaked_priority():
    """The main thread starts every test's subprocesses: a real-time policy or a raised nice left on
    it (a calibration trial's, measure.priority) would pass to them, and a child that spins would
    starve the tests. Fail the test that left it, and put it back."""
    if not hasattr(os, "sched_getscheduler"):   # not Linux
        yield
        return
    before = _main_thread_priority()
    yield
    after = _main_thread_priority()
    if after != before:
        import threading

        tid = threading.main_thread().native_id
        os.sched_setscheduler(tid, before[0], os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, tid, before[1])
        pytest.fail(f"the main thread's (policy, nice) went {before} -> {after}")


@pytest.fixture
def flop_counters():
    """`flop_counters()`: the FLOP counters active now (a test asserts there are none left)."""
    return _active_flop_counters


# --- a real IPython shell with the extension loaded (magics tests) -------------------------------


@pytest.fixture
def shell():
    """The process-wide InteractiveShell, left as found: one made here is cleared at the end (a shell that
    outlives its test puts every later test "in IPython": a Monitor made then registers a cell hook)."""
    from IPython.core.interactiveshell import InteractiveShell

    existed = InteractiveShell.initialized()
    yield InteractiveShell.instance()
    if not existed:
        InteractiveShell.clear_instance()


@pytest.fixture
def ip():
    """The process-wide InteractiveShell with `%load_ext tunekit` and a small model in its namespace."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "tunekit")
    shell.run_cell("import torch, numpy as np\nmodel = torch.nn.Linear(128, 128, bias=False)\nbatch_size = 8")
    yield shell
    shell.run_cell("%gpuprofile off")
    shell.run_line_magic("unload_ext", "tunekit")


@pytest.fixture
def run(ip):
    """`run(src)`: run a cell in `ip` as a notebook would (stored in history); returns the ExecutionResult."""

    def run_cell(src):
        return ip.run_cell(src, store_history=True)

    return run_cell


# --- calibrations whose conditions the test decides -----------------------------------------------


@pytest.fixture
def calibrations(monkeypatch, tmp_path):
    """An empty calibration cache in tmp_path, default sweeps of one 32x32 size, no peak resolved,
    re-measured or re-checked yet in this process, and the sweeps' conditions injected: each sweep
    takes the next verdict of ``.verdicts`` (quiet when empty); ``.sweeps`` counts them. A real
    meter would call a sweep on a loaded CI machine busy."""
    from types import SimpleNamespace

    from tunekit.core.conditions import Conditions
    from tunekit.measure import peaks, priority

    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(peaks, "default_sizes", lambda kind: [32])
    for memo in ("_resolved", "_rechecked"):
        monkeypatch.setattr(peaks, memo, {})
    monkeypatch.setattr(peaks, "_remeasured", set())
    # trials at normal priority, as a user without CAP_SYS_NICE runs them (root here would run them
    # ahead of the load, and a busy verdict would then not be distrusted: tests/measure/test_priority.py)
    monkeypatch.setattr(priority, "_denied", {priority.REALTIME, priority.NICE})
    state = SimpleNamespace(verdicts=[], sweeps=0)

    class Meter:
        def __init__(self, cuda_index=None):
            pass

        def start(self):
            return self

        def stop(self, wall_s=None, threads=None):
            state.sweeps += 1
            verdict = state.verdicts.pop(0) if state.verdicts else "quiet"
            return Conditions(verdict, f"injected {verdict}", wall_s=wall_s)

    def cache(**changes):
        """Write a cache holding one entry: this CPU, fp32, as a quiet 32x32x32 sweep wrote it
        now at 0.5 TFLOPS, with ``changes`` (a field changed to ``...`` is left out, as in an older
        cache file); returns the entry."""
        import dataclasses
        import json
        import time

        import torch

        cal = peaks.Calibration(peaks.device_name("cpu"), "fp32", 0.5, (32, 32, 32), [(32, 32, 32, 0.5)], 0.01,
                                torch.__version__, torch.get_num_threads(), layout="nn", taken_at=time.time(),
                                conditions=Conditions("quiet", "injected quiet"))
        entry = {**dataclasses.asdict(cal), **changes}
        key = peaks._cache_key(cal.device, "fp32")
        (tmp_path / "mamf.json").write_text(json.dumps({key: {k: v for k, v in entry.items() if v is not ...}}))
        return entry

    monkeypatch.setattr(peaks, "ConditionsMeter", Meter)
    state.cache = cache
    return state


# --- Labs of the tiny CPU GPT (a folder's own `lab` fixture is in its conftest.py) -----------------


@pytest.fixture
def make_lab(tmp_path):
    """``make_lab(model=None, **kw)``: a new Lab (the cpu-tiny GPT unless a model is given) that logs
    its runs to this test's ``tmp_path / "runs.jsonl"``; each call builds a fresh one."""
    from tunekit.lab.lab import Lab

    def make(model=None, **kw):
        return Lab(model, **{"log_path": tmp_path / "runs.jsonl", **kw})

    return make


@pytest.fixture
def dash(make_lab):
    """A dashboard over a cpu-tiny Lab of 4 x 64 whose runs take two steps, no warm-up, with the
    expectation line a widget frontend gets (plain Python, where these tests run, gets none)."""
    from tunekit.lab.dashboard import Dashboard

    d = Dashboard(make_lab(peak_tflops=1.0, micro_batch=4, seq_len=64), expect=True)
    d.controls["steps"].value = 2
    d.controls["warmup"].value = 0
    return d


@pytest.fixture
def reworded(monkeypatch):
    """``reworded(module, ...)``: the Notes those modules write say 'REWORDED <kind>' instead of
    their words, so a test shows that what reads them reads the kind (tunekit.core.notes)."""
    from tunekit.core.notes import Note

    def reword(*modules):
        for m in modules:
            monkeypatch.setattr(m, "Note", lambda kind, text: Note(kind, f"REWORDED {kind}"))

    return reword
