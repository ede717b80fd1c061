"""``lab.expect``'s long first wait (issue 39 item 6): a plan over 2 s, a first CPU calibration's
rounds included, shows ``tunekit.plan``'s progress line (one home: tunekit.view.progress), silent
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
    said = "\rtunekit.plan: the expected step: this CPU's figures (measured once, then cached): " \
           "this CPU's step figures, round 2 of 2 · "
    assert said in err.text
    # two plans (the setting's and the base's), each ends its own line
    assert err.text.count("tunekit.plan: done in ") == 2 and err.text.endswith("\x1b[K\n")


def test_verbose_false_and_the_dashboards_line_are_silent(shown, make_lab):
    err = shown()
    make_lab(peak_tflops=1.0).expect(micro_batch=2, seq_len=32, verbose=False)
    assert err.text == ""
    with pytest.raises(ValueError, match="verbose must be True or False"):
        make_lab(peak_tflops=1.0).expect(verbose="yes")
    line = ExpectLine(make_lab(peak_tflops=1.0), SimpleNamespace(value=""))
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
    assert "tunekit.plan stopped after " in err.text and err.text.endswith("KeyboardInterrupt\x1b[K\n")
    assert not lab_plans._PLANS.get(lab)   # nothing cached half-made: the next expect plans again
