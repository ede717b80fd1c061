"""``lab.expect``'s long first wait (issue 39 item 6): over 2 s, a first CPU calibration's rounds
included, it shows one progress line, its two plans' stages on it (one home: tunekit.view.progress), silent
with ``verbose=False`` and from the dashboard's thread; Ctrl-C inside it keeps no plan half-made.
The calibration is faked (fixed figures, its rounds said by a stand-in) and the clock is fake: no
timing is compared."""
from types import SimpleNamespace

import pytest

from tests.helpers import Tty
from tests.planning.conftest import fixed_cpu  # noqa: F401 - the fixture, used by name
from tunekit.lab import plan as lab_plans
from tunekit.lab.expect_line import ExpectLine
from tunekit.measure import stream
from tunekit.view import progress


class _Ticking:
    """A clock that moves 1 s each time it is read: past 2 s every draw shows."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0
        return self.now


@pytest.fixture
def shown(monkeypatch, fixed_cpu):  # noqa: F811
    """``shown()``: stderr as a terminal from now on (set in the test itself: pytest's capture sets
    sys.stderr again between a fixture and its test), the fake clock, no heartbeat; the step figures'
    first measurement faked: it says two rounds (as measure.trials' rounds do) and reads the fixed figures."""
    monkeypatch.setattr(progress, "clock", _Ticking())
    monkeypatch.setattr(progress, "HEARTBEAT_S", 1e9)

    def start():
        err = Tty(True)
        monkeypatch.setattr(progress.sys, "stderr", err)
        return err
    real = stream.measure_stream

    def calibrating(refresh=False, say=None):
        for k in (1, 2):
            if say is not None:
                say(f"round {k} of 2")
        return real(refresh, say=None)

    monkeypatch.setattr(stream, "measure_stream", calibrating)
    return start


def test_a_first_expect_says_the_calibrations_rounds_then_how_long_it_took(shown, make_lab):
    lab, err = make_lab(peak_tflops=1.0), shown()
    e = lab.expect(micro_batch=2, seq_len=32)
    assert e.step_s > 0
    said = "\rlab.expect: the expected step: this CPU's figures (measured once, then cached): " \
           "this CPU's step figures, round 2 of 2 · "
    assert said in err.text
    # two plans (the setting's and the base's) on the one line of the one thing asked, which ends once
    assert err.text.count(": done in ") == 1 and "tunekit.plan" not in err.text
    assert err.text.endswith("\x1b[K\n") and err.text.rsplit("\r", 1)[-1].startswith("lab.expect: done in ")


def test_verbose_false_and_the_dashboards_line_are_silent(shown, make_lab):
    # the Labs are built before the capture: a build shows its own line past 2 s (the fake clock passes it)
    lab, other, third = make_lab(peak_tflops=1.0), make_lab(peak_tflops=1.0), make_lab(peak_tflops=1.0)
    err = shown()
    lab.expect(micro_batch=2, seq_len=32, verbose=False)
    assert err.text == ""
    with pytest.raises(ValueError, match="verbose must be True or False"):
        other.expect(verbose="yes")
    line = ExpectLine(third, SimpleNamespace(value=""))
    line.request({"micro_batch": 2, "seq_len": 32})
    assert line.wait(120) and line.last is not None and line.last.step_s > 0
    assert err.text == ""


def test_ctrl_c_in_the_calibration_keeps_no_plan(shown, make_lab, monkeypatch):
    def interrupted(refresh=False, say=None):
        say("round 1 of 2")
        raise KeyboardInterrupt

    monkeypatch.setattr(stream, "measure_stream", interrupted)
    lab, err = make_lab(peak_tflops=1.0), shown()
    with pytest.raises(KeyboardInterrupt):
        lab.expect(micro_batch=2, seq_len=32)
    assert "lab.expect stopped after " in err.text and err.text.endswith("KeyboardInterrupt\x1b[K\n")
    assert not lab_plans._PLANS.get(lab)   # nothing cached half-made: the next expect plans again


def test_a_run_stops_the_dashboards_expectation_before_it_measures(make_lab, monkeypatch):
    # the line's plan goes on stage after stage until told to stop (view.progress.cancellable): lab.run
    # stops it at its next stage before any step is measured, and says so in the run's notes
    import threading

    from tunekit.core.notes import kind_of
    from tunekit.lab import run as single

    lab, events, planning = make_lab(peak_tflops=1.0, micro_batch=2, seq_len=32), [], threading.Event()

    def endless_plan(**changes):
        with progress.wait_progress("tunekit.plan", False) as shown:
            try:
                for k in range(3000):   # at most 30 s: a line never stopped fails below, never hangs
                    shown.say(f"phase {k}")
                    planning.set()
                    threading.Event().wait(0.01)
            finally:
                events.append("plan stopped")
        events.append("plan finished")   # not reached: cancelled
    monkeypatch.setattr(lab, "expect", endless_plan)
    real = single.measure_steps
    monkeypatch.setattr(single, "measure_steps", lambda *a, **k: events.append("measured") or real(*a, **k))
    widget = SimpleNamespace(value="expected: as before")
    line = ExpectLine(lab, widget)
    line.request({"micro_batch": 4})
    assert planning.wait(30)
    r = lab.run(steps=1, warmup=0, verbose=False)
    assert events == ["plan stopped", "measured"]
    assert "run.expect_stopped" in [kind_of(n) for n in r.notes]
    assert line._thread is None and line.wait(1) and widget.value == "expected: as before"
    again = lab.run(steps=1, warmup=0, verbose=False)   # nothing planning now: nothing to stop, no note
    assert "run.expect_stopped" not in [kind_of(n) for n in again.notes]
