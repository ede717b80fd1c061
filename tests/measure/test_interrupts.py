"""Ctrl-C at every line of tunekit's entry and exit paths leaves nothing behind (issue 19, item 5).

`Injector` delivers a real SIGINT (``signal.raise_signal``) at the k-th line event inside
tunekit's own frames (``sys.settrace``), and for a double Ctrl-C a second one a few line events
later; k is spread over the whole path, deterministically (line events, not timers, so a loaded
machine changes nothing). After each delivery nothing may be left installed (dispatch modes, a
FLOP counter, module, global and autograd hooks, meters, a profiler, autocast, warning filters,
a SIGINT handler, a shield) and each path must have recorded what it owes, once.
"""

import ctypes
import gc
import math
import os
import signal
import sys
import warnings
import weakref

import pytest
import torch
from torch.nn.modules import module as M
from torch.utils._python_dispatch import TorchDispatchMode

import tunekit
from tunekit.lab.lab import Lab
from tunekit.measure import history, interrupts, meters
from tunekit.measure.flops import counting_active
from tunekit.measure.torch_private import dispatch_mode_stack
from tunekit.profiling import probe

TUNEKIT = os.path.dirname(os.path.abspath(tunekit.__file__)) + os.sep
GLOBAL_HOOKS = [n for n in dir(M) if n.startswith("_global_") and n.endswith("hooks")]
MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


@pytest.fixture(autouse=True)
def no_leaked_exception():
    """A KeyboardInterrupt raised from a trace function while a ``with`` block's ``__exit__`` runs
    (where `Injector` delivers it) can stay behind as CPython 3.11's "exception being handled" after
    every frame has returned: each later test's failure then reads "During handling of the above
    exception (KeyboardInterrupt) ...". It is the interpreter's state, not tunekit's: cleared here
    (``PyErr_SetHandledException``, CPython >= 3.11) so no later test inherits it."""
    yield
    _clear_handled()


def _clear_handled():
    if sys.exc_info()[1] is not None and hasattr(ctypes.pythonapi, "PyErr_SetHandledException"):
        ctypes.pythonapi.PyErr_SetHandledException.argtypes = [ctypes.py_object]
        ctypes.pythonapi.PyErr_SetHandledException(None)


class Injector:
    """``with Injector(k, k2): path()`` sends SIGINT at line events k and k2 (counted from 0)
    inside tunekit's files; ``n`` counts them all, ``fired`` says where each signal landed.
    With no k it notes where a Ctrl-C is most likely to tear something: ``entries``, the first
    line of each tunekit function called from outside tunekit, and ``changes``, the lines where
    what is installed changes."""

    def __init__(self, first=None, second=None):
        self.first, self.second, self.n, self.fired, self.late, self.touched = first, second, 0, [], 0, []
        self.entries, self.changes, self.last, self.entry = {}, set(), None, None

    def __enter__(self):
        Injector.current = self
        sys.settrace(self.trace)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)
        sys.setprofile(None)

    def trace(self, frame, event, arg):
        if not frame.f_code.co_filename.startswith(TUNEKIT):
            return None
        if event == "call" and not frame.f_back.f_code.co_filename.startswith(TUNEKIT):
            self.entry = frame.f_code
        if event == "line":
            k, self.n = self.n, self.n + 1
            if self.first is None:
                self._note(k)
            elif k in (self.first, self.second):
                where = f"{os.path.relpath(frame.f_code.co_filename, TUNEKIT)}:{frame.f_lineno}"
                self.fired.append((k, where, shielded(), len(history.HISTORY)))
                if k == self.first and self.second is not None:
                    sys.setprofile(self.rearm)  # a signal that raises here ends tracing: re-arm it
                signal.raise_signal(signal.SIGINT)  # Python runs the SIGINT handler right here
                sys.setprofile(None)  # it did not raise: tracing goes on by itself
        return self.trace

    def user(self):
        self.late += bool(self.fired)
        self.touched.append(self.n)

    def _note(self, k):
        if self.entry is not None:
            self.entries.setdefault(self.entry, k)
            self.entry = None
        handler = signal.getsignal(signal.SIGINT)
        now = (len(dispatch_mode_stack()), len(meters._ACTIVE_CPU), len(M._global_forward_hooks), handler,
               getattr(getattr(handler, "__self__", None), "open", None), torch._C._autograd._profiler_enabled(),
               torch._C._autograd._top_saved_tensors_default_hooks(False) is not None)
        if now != self.last:
            self.changes.add(k)
        self.last = now

    def rearm(self, frame, event, arg):
        if sys.gettrace() is None:
            sys.settrace(self.trace)
            while frame is not None:
                if frame.f_code.co_filename.startswith(TUNEKIT):
                    frame.f_trace = self.trace
                frame = frame.f_back
        sys.setprofile(None)


def touch():
    """The user's code in a path calls this: none may start once a Ctrl-C came."""
    Injector.current.user()


def state(models=()):
    """What an interrupted path could leave behind."""
    return {
        "dispatch modes": [type(m).__name__ for m in dispatch_mode_stack()],
        "FLOP counter": counting_active(),
        "global module hooks": {n: len(getattr(M, n)) for n in GLOBAL_HOOKS},
        "module hooks": sum(len(getattr(m, h)) for model in models for m in model.modules() for h in MODULE_HOOKS),
        "saved-tensor hooks": torch._C._autograd._top_saved_tensors_default_hooks(False) is not None,
        "meters": (len(meters._ACTIVE_CPU), len(meters._ACTIVE_CUDA)),
        "profiler": torch._C._autograd._profiler_enabled(),
        "autocast": torch.is_autocast_enabled("cpu"),
        "warning filters": len(warnings.filters),
        "SIGINT handler": signal.getsignal(signal.SIGINT),
    }


def shielded():
    """A Ctrl-C now lands in a tunekit path (tunekit's SIGINT handler is on)."""
    return getattr(signal.getsignal(signal.SIGINT), "__module__", None) == interrupts.__name__


def spread(total, n):
    return sorted({round(i * (total - 1) / max(n - 1, 1)) for i in range(n)})


def timings(dry, n):
    """Where to deliver: every line where what is installed changes and the line before it,
    each entry and the line after it, the first lines after the user's code first ran (its
    tensors are alive there), and n more spread over the path (None: every line)."""
    if n is None or n >= dry.n:
        return list(range(dry.n))
    picked = ({k + d for k in dry.changes for d in (-1, 0)} | {k + d for k in dry.entries.values() for d in (0, 1)}
              | {k + d for k in dry.touched[:1] for d in (0, 1, 2)} | set(spread(dry.n, n)))
    return sorted(k for k in picked if 0 <= k < dry.n)


def sweep(case, n, double=True):
    """``case(injector) -> [problems]`` at n line events spread over the path, each once with one
    SIGINT and (``double``) once with a second 1-4 line events after the first; returns what went
    wrong. A dense sweep (over 100 line events) sends one Ctrl-C or two at each line, by turns:
    every line still takes a first Ctrl-C, in half the time."""
    for _ in range(2):  # the first run warms caches (compiled cells, options): count the second
        dry = Injector()
        assert case(dry) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # else tunekit stays out of it
    before = state(case.models)
    failed = []
    gc.freeze()  # the paths collect garbage (free_memory): keep that cheap, the heap as it is
    try:
        _deliver(case, n, dry, before, failed, double)
    finally:
        gc.unfreeze()
    return failed


def _deliver(case, n, dry, before, failed, double):
    total = dry.n
    ks = timings(dry, n)
    print(f"{total} line events, {len(dry.entries)} entries, {len(dry.changes)} changes, SIGINT at {len(ks)}")
    by_turns = len(ks) > 100
    for i, k in enumerate(ks):
        seconds = (None, k + 1 + i % 4) if double else (None,)
        for second in seconds[i % 2:i % 2 + 1] if by_turns and double else seconds:
            inj = Injector(k, second)
            # each delivery starts as a Ctrl-C in a fresh cell finds the interpreter: a KeyboardInterrupt
            # an earlier one raised from the trace function can stay "being handled" (`no_leaked_exception`),
            # and tunekit's handler takes a Ctrl-C that comes while one is handled for a second Ctrl-C
            # (measure.interrupts): it waits for the next gate, and the trial's forward runs first
            _clear_handled()
            problems = case(inj)
            after = state(case.models)
            problems += [f"{what}: {before[what]} -> {after[what]}" for what in before if after[what] != before[what]]
            # a path that took fewer line events this time (a branch timing or memory state chose)
            # ended before event k: nothing to deliver; one that passed k and never fired is a bug
            if not inj.fired and k < inj.n:
                problems.append("the signal was never delivered")
            if problems:
                failed.append(f"SIGINT at {inj.fired}: {problems}")
    if failed:
        sent = len(ks) if by_turns or not double else 2 * len(ks)
        failed.insert(0, f"{len(failed)} of {sent} deliveries left something behind:")


def _one_record(caught, inj, records):
    """A path that holds a shield when the Ctrl-C comes owes exactly one record, with error
    KeyboardInterrupt when the Ctrl-C reached the caller and came before the record was kept."""
    if not inj.fired:
        return [] if len(records) == 1 and records[0].error is None else [f"records {records}"]
    _, _, shielded, kept = inj.fired[0]
    if len(records) > 1 or (shielded and not records):
        return [f"{len(records)} records"]
    if records and isinstance(caught, KeyboardInterrupt) and not kept and records[0].error != "KeyboardInterrupt":
        return [f"recorded error {records[0].error!r}"]
    return []


# --- the shield itself -----------------------------------------------------------------------------


def test_a_ctrl_c_waits_for_the_set_up_stops_the_users_code_and_waits_for_the_clean_up():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.deferred_interrupt() as shield:
            signal.raise_signal(signal.SIGINT)  # during the set-up: remembered
            done.append("set-up")
            try:
                with shield.gate():  # raised here, before the user's code
                    done.append("user's code")
            finally:
                signal.raise_signal(signal.SIGINT)  # a second one, during the clean-up: waits
                done.append("clean-up")
    assert done == ["set-up", "clean-up"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_in_tunekit_inside_the_users_except_block_is_raised_at_once():
    # tunekit called inside the user's `except KeyboardInterrupt:` block (a retry loop): the exception they
    # handle is no first Ctrl-C travelling through tunekit, so a Ctrl-C landing in tunekit's code in the
    # user's step is raised there, not held to the next gate while the step (here: 'forward') runs on
    in_tunekit = compile("signal.raise_signal(signal.SIGINT)\ndone.append('forward')",
                         os.path.join(os.path.dirname(interrupts.__file__), "step.py"), "exec")
    done = []
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        with pytest.raises(KeyboardInterrupt):
            with interrupts.deferred_interrupt() as shield:
                with shield.gate():
                    exec(in_tunekit, {"signal": signal, "done": done})
                done.append("next step")
    assert done == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_nested_path_hands_its_ctrl_c_to_the_enclosing_one():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.deferred_interrupt():
            with interrupts.deferred_interrupt():
                signal.raise_signal(signal.SIGINT)
                done.append("inner")
            done.append("outer's clean-up")  # not cut short: raised when the outer path ends
    assert done == ["inner", "outer's clean-up"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_in_held_observer_code_waits_for_it_then_stops_the_users_code():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.deferred_interrupt() as shield:
            with shield.gate():  # the user's code, calling an observer's callback
                interrupts.held(lambda: (signal.raise_signal(signal.SIGINT), done.append("callback")))
                done.append("user's code after the callback")
    assert done == ["callback"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_tunekit_raises_says_it_is_the_users():
    # its traceback ends in this module: the note says whose Ctrl-C it is and why it came there
    with pytest.raises(KeyboardInterrupt) as held:
        with interrupts.deferred_interrupt() as shield:
            with shield.gate():
                interrupts.held(lambda: signal.raise_signal(signal.SIGINT))
    with pytest.raises(KeyboardInterrupt) as at_once:
        with interrupts.deferred_interrupt() as shield:
            with shield.gate():
                signal.raise_signal(signal.SIGINT)   # the user's code: raised where it landed
    assert held.value.__notes__ == ["tunekit: your Ctrl-C, held until what tunekit measures was whole, "
                                    "then raised here"]
    assert at_once.value.__notes__ == ["tunekit: your Ctrl-C, raised at once by tunekit's handler, in the "
                                       "frame above"]


def test_a_ctrl_c_inside_the_counters_dispatch_leaves_no_mode_on_the_stack():
    # torch's counter pushes itself again around a decomposition (`with self:` in its dispatch
    # handler): a real Ctrl-C landing as that push returns used to leave it on the stack for good
    enter = TorchDispatchMode.__enter__.__code__
    fired = []

    def at_return(frame, event, arg):
        if event == "return" and not fired and frame.f_back.f_code.co_name == "__torch_dispatch__":
            fired.append(frame.f_back.f_code.co_filename)
            signal.raise_signal(signal.SIGINT)
        return at_return

    def tracer(frame, event, arg):
        return at_return if frame.f_code is enter else None

    x = torch.randn(4, 4)
    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            tunekit.count_flops(lambda: x.relu())  # relu has no formula: the counter decomposes it
    finally:
        sys.settrace(None)
    assert fired and dispatch_mode_stack() == []


# --- the paths ------------------------------------------------------------------------------------


def depth(n, dense):
    """n timings per path by default; ``dense`` (None: every line) in the slow variant."""
    return pytest.mark.parametrize("n", [n, pytest.param(dense, marks=pytest.mark.slow)], ids=["spread", "dense"])


CELL = "touch()\nx = torch.randn(8, 128)\nmodel(x).sum().backward()\ntouch()"


def _cell_case(ip, src):
    """The cell ``src`` run in ``ip``. IPython swallows a KeyboardInterrupt raised in its
    callbacks (pre_run_cell, post_run_cell) and runs the cell anyway; one that lands while the
    cell's own code runs must stop it."""
    magics = tunekit.profiling.magics._STATE["magics"]
    ip.user_ns["touch"] = touch

    def callbacks():
        return [ip.events.callbacks[e].count(f) for e, f in (("pre_run_cell", magics.pre_run_cell),
                                                              ("post_run_cell", magics.post_run_cell))]

    registered = callbacks()

    def case(inj):
        history.clear_history()  # the count runs every time, and the cell's records are all there is
        with inj:
            result = ip.run_cell(src)  # not stored in IPython's history: that formats every traceback
        problems = _one_record(result.error_in_exec, inj, history.HISTORY.records())
        start, end = (inj.touched + [math.inf, math.inf])[:2]  # the cell's code ran from start to end
        inside = [k for k, *_ in inj.fired if start < k < end]
        if inside and not isinstance(result.error_in_exec, KeyboardInterrupt):
            problems.append(f"the cell went on after a Ctrl-C at {inside} inside it")
        if getattr(magics, "_shield", None) is not None or magics._probe is not None:
            problems.append("a cell left in flight")
        if callbacks() != registered:
            problems.append(f"IPython callbacks {registered} -> {callbacks()}")
        return problems

    case.models = [ip.user_ns["model"]]
    return case


@depth(12, None)
def test_ctrl_c_anywhere_in_gpuprofile_cell_magic(ip, monkeypatch, n):
    monkeypatch.setattr(ip, "showtraceback", lambda *a, **k: None)  # tracebacks are slow and beside the point
    failed = sweep(_cell_case(ip, f"%%gpuprofile -q -n cell --flops always\n{CELL}"), n)
    assert not failed, "\n".join(failed[:10])


@depth(12, None)
def test_ctrl_c_anywhere_in_gpuprofile_on(ip, run, monkeypatch, n):
    monkeypatch.setattr(ip, "showtraceback", lambda *a, **k: None)
    run("%gpuprofile on -q --flops always")
    failed = sweep(_cell_case(ip, CELL), n)
    run("%gpuprofile off")
    assert not failed, "\n".join(failed[:10])
    assert not run("%unload_ext tunekit").error_in_exec
    assert not any("tunekit" in getattr(f, "__module__", "") for e in ("pre_run_cell", "post_run_cell")
                   for f in ip.events.callbacks[e])
    ip.run_line_magic("load_ext", "tunekit")  # the fixture unloads again


@pytest.mark.parametrize("options", [{"flops": "always"}, {"flops": "never", "trace": True}], ids=["counted", "traced"])
@depth(16, 800)
def test_ctrl_c_anywhere_in_tunekit_profile(n, options, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_DATA_DIR", str(tmp_path))  # the traced runs' Chrome traces
    net, x = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()), torch.randn(8, 64)

    def case(inj):
        history.clear_history()
        caught = None
        with inj:
            try:
                with tunekit.profile(name="block", **options):
                    touch()
                    net(x).sum().backward()
            except KeyboardInterrupt as e:
                caught = e
        problems = _one_record(caught, inj, history.HISTORY.records())
        if inj.fired and caught is None:
            problems.append("the Ctrl-C never reached the caller")
        return problems + ["the block ran after the Ctrl-C"] * bool(inj.late)

    case.models = [net]
    failed = sweep(case, n)
    assert not failed, "\n".join(failed[:10])


@depth(12, None)
def test_one_ctrl_c_anywhere_in_probe_start_by_hand(n):
    # Probe.start() hands back a running probe, so a Ctrl-C after it has returned is the caller's
    # (as after open()), and a second one while start() stops the probe for the first, too:
    # tunekit.profile holds Ctrl-C from its start to its end. One Ctrl-C inside start() must not
    # leave a probe running that the caller never got.
    net, x = torch.nn.Linear(64, 64), torch.randn(8, 64)

    def case(inj):
        history.clear_history()
        p, caught = probe.Probe("by hand", flops="always", models=lambda: [("net", net)]), None
        with inj:
            try:
                p.start()
            except KeyboardInterrupt as e:
                caught = e
        if caught is None:  # started: the block and the stop, with no Ctrl-C
            net(x).sum().backward()
            p.stop()
        problems = _one_record(caught, inj, history.HISTORY.records())
        return problems + ["a probe left running"] * p.running

    case.models = [net]
    failed = sweep(case, n, double=False)
    assert not failed, "\n".join(failed[:10])


@depth(16, None)
def test_ctrl_c_anywhere_in_count_flops(n):
    net, x = torch.nn.Linear(64, 64), torch.randn(8, 64)

    def case(inj):
        caught = None
        with inj:
            try:
                tunekit.count_flops(lambda: (touch(), net(x).sum().backward()))
            except KeyboardInterrupt as e:
                caught = e
        return (["the Ctrl-C never reached the caller"] * bool(inj.fired and caught is None)
                + ["the function ran after the Ctrl-C"] * bool(inj.late))

    case.models = [net]
    failed = sweep(case, n)
    assert not failed, "\n".join(failed[:10])


class _Net(torch.nn.Module):
    """Every forward's hidden activation is watched (weakly): an interrupted run must free it."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 64), torch.nn.Linear(64, 8)
        self.seen, self.on_forward = [], None

    def forward(self, x):
        if self.on_forward is not None:
            self.on_forward()
        h = self.a(x).relu()
        self.seen.append(weakref.ref(h))
        return self.b(h)


@pytest.fixture
def lab(tmp_path):
    lab = Lab(_Net(), batch_fn=lambda b, s: (torch.randn(b, 16), torch.randn(b, 8)),
              loss_fn=lambda m, x, y: (m(x) - y).square().mean(), log_path=tmp_path / "runs.jsonl",
              peak_tflops=1.0, micro_batch=4)
    lab.run(steps=1, warmup=0)  # the optimizer exists: a run starts from a trained state
    return lab


def _lab_problems(lab, caught, inj):
    lab.model.on_forward = None
    problems = ["a forward ran after the Ctrl-C"] * bool(inj.late)
    if any(p.grad is not None for p in lab.model.parameters()):
        problems.append("gradients left")
    alive = sum(r() is not None for r in lab.model.seen)
    if alive:  # `caught` is kept, as IPython keeps the last traceback
        problems.append(f"{alive} activations still alive while the KeyboardInterrupt is kept")
    lab.model.seen.clear()
    return problems


def _weights(lab):
    opt = [v.clone() for s in lab.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return [p.detach().clone() for p in lab.model.parameters()] + opt


@depth(8, 600)
def test_ctrl_c_anywhere_in_lab_run_and_its_flop_probe(lab, n):
    def case(inj):
        lab.trainer._probes.clear()  # the FLOP probe step is part of the path every time
        before, runs, caught = _weights(lab), len(lab.runs), None
        lab.model.on_forward = touch
        with inj:
            try:
                lab.run(steps=1, warmup=1)
            except KeyboardInterrupt as e:
                caught = e
        problems = _lab_problems(lab, caught, inj)
        added = len(lab.runs) - runs
        lines = lab.log.path.read_text().count("\n")
        if lines != len(lab.runs) or added not in (0, 1) or (added and lab.runs[-1].status != "ok"):
            problems.append(f"{added} runs added, {lines} log lines for {len(lab.runs)} runs")
        if inj.fired and caught is None:
            problems.append("the Ctrl-C never reached the caller")
        if not added and not all(torch.equal(a, b) for a, b in zip(before, _weights(lab))):
            problems.append("an interrupted run changed the weights or optimizer state")
        return problems

    case.models = [lab.model]
    failed = sweep(case, n)
    assert not failed, "\n".join(failed[:10])
    assert lab.run(steps=1, warmup=0).status == "ok"  # the next run works


@depth(8, None)
def test_ctrl_c_anywhere_in_find_max_batch_size(lab, n):
    def case(inj):
        caught, lab.model.on_forward = None, touch
        with inj:
            try:
                lab.find_max_batch_size(limit=2, memory_budget_bytes=2**30, progress=lambda trial: touch())
            except KeyboardInterrupt as e:
                caught = e
        problems = _lab_problems(lab, caught, inj)
        if inj.fired and caught is None:
            problems.append("the Ctrl-C never reached the caller")
        return problems

    case.models = [lab.model]
    failed = sweep(case, n)
    assert not failed, "\n".join(failed[:10])
    assert lab.find_max_batch_size(limit=4, memory_budget_bytes=2**30).best == 4  # and the next search works


# --- a second Ctrl-C while the first travels to its clean-up --------------------------------------


class _Second:
    """Sends one SIGINT at the k-th line event in tunekit's files after ``arm()`` (called in the
    user's ``finally``, so the first Ctrl-C's KeyboardInterrupt is already on its way)."""

    def __init__(self, k):
        self.k, self.n, self.armed, self.fired, self.handling = k, 0, False, None, False

    def arm(self):
        self.armed = True

    def trace(self, frame, event, arg):
        if not frame.f_code.co_filename.startswith(TUNEKIT):
            return None
        if event == "line" and self.armed:
            if self.n == self.k:
                self.fired = f"{os.path.relpath(frame.f_code.co_filename, TUNEKIT)}:{frame.f_lineno}"
                # the first's KeyboardInterrupt is handled (an except, finally or with-exit block
                # runs). A line event can come just before that, as a frame's handler block starts:
                # a real signal cannot (Python runs handlers at calls and jumps, after it)
                self.handling = isinstance(sys.exc_info()[1], KeyboardInterrupt)
                signal.raise_signal(signal.SIGINT)
            self.n += 1
        return self.trace


def _second_notes(e, err):
    return [n for n in [*getattr(e, "__notes__", ()), *err.splitlines()] if "second Ctrl-C" in n]


@pytest.mark.parametrize("every", [9, pytest.param(1, marks=pytest.mark.slow)], ids=["spread", "dense"])
def test_a_second_ctrl_c_while_the_cell_is_recorded_stops_with_one_traceback_and_a_note(ip, monkeypatch, capsys,
                                                                                        every):
    # A second Ctrl-C that landed in tunekit's frames while the first's KeyboardInterrupt left the
    # cell (the gate still open) raised a KeyboardInterrupt of its own inside tunekit: a chained
    # traceback ending in interrupts.py, or IPython's "Error in callback" for post_run_cell. Now it
    # waits for the record, and the first's says "second Ctrl-C: stopped while saving the record of cell".
    shown = []
    monkeypatch.setattr(ip, "showtraceback", lambda *a, **k: shown.append(sys.exc_info()[1]))
    src = ("%%gpuprofile -q -n cell\nx = torch.randn(8, 128)\ntry:\n    signal.raise_signal(signal.SIGINT)\n"
           "finally:\n    second.arm()\nmodel(x).sum()")
    ip.user_ns["signal"] = signal
    problems, k = [], 0
    while True:
        history.clear_history()
        shown.clear()
        capsys.readouterr()
        second = ip.user_ns["second"] = _Second(k)
        _clear_handled()   # an earlier case's KeyboardInterrupt would be every later one's __context__
        sys.settrace(second.trace)
        try:
            result = ip.run_cell(src)
        finally:
            sys.settrace(None)
        if second.fired is None:
            break
        e, err = result.error_in_exec, capsys.readouterr().err
        records = history.HISTORY.records()
        if not isinstance(e, KeyboardInterrupt) or len(shown) != 1 or isinstance(e.__context__, KeyboardInterrupt) \
                or len(records) != 1 or (second.handling and not _second_notes(e, err)):
            problems.append(f"second at {second.fired}: {type(e).__name__}, {len(shown)} tracebacks, "
                            f"context {type(e.__context__).__name__}, {len(records)} records, notes {e.__notes__}")
        k += every
    assert k > 100 and not problems, "\n".join(problems[:10])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_while_lab_run_cleans_up_is_said_on_the_first(lab):
    # the first Ctrl-C in the model's forward; the second at tunekit's next lines, as the first
    # travels to lab.run's clean-up: it waits for it, and the first's exception says so
    handled = 0
    for k in (0, 1, 5, 8, 12, 20):
        second, calls = _Second(k), []
        _clear_handled()   # the last case's KeyboardInterrupt, left "handled" by CPython, is no first Ctrl-C here

        def forward_hook():
            calls.append(1)
            if len(calls) == 2:      # a timed step's forward
                try:
                    signal.raise_signal(signal.SIGINT)
                finally:
                    second.arm()

        lab.model.on_forward = forward_hook
        sys.settrace(second.trace)
        try:
            with pytest.raises(KeyboardInterrupt) as caught:
                lab.run(steps=2, warmup=1)
        finally:
            sys.settrace(None)
            lab.model.on_forward = None
        assert second.fired is not None
        handled += second.handling
        assert _second_notes(caught.value, "") == ["tunekit: second Ctrl-C: stopped while lab.run undid the "
                                                   "interrupted run (that was finished first: nothing is lost)"] \
            or not second.handling, (second.fired, caught.value.__notes__)
        assert all(p.grad is None for p in lab.model.parameters())
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert handled >= 4   # (k=0 and 1 land on line events before step.py's handler block starts: see _Second)
