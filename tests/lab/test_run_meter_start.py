"""Where lab.run starts its peak meter among the steps: before the last warm-up step when there
are two or more, so the pages the CPU meter's settled start hands back (malloc_trim) are faulted
in again off the clock, not inside the first timed step."""
import pytest

from tunekit.lab import run as single


@pytest.fixture
def order(make_lab, monkeypatch):
    """(lab, events): events lists 'step' per training step and 'meter' where the meter started."""
    lab = make_lab(peak_tflops=1.0, micro_batch=2, seq_len=32)
    events = []
    step = lab.train_step
    monkeypatch.setattr(lab, "train_step", lambda t: (events.append("step"), step(t))[1])
    start = single.DeviceMeter.start
    monkeypatch.setattr(single.DeviceMeter, "start", lambda self: (events.append("meter"), start(self))[1])
    return lab, events


def test_with_two_warmup_steps_the_last_one_runs_inside_the_meter(order):
    lab, events = order
    r = lab.run(steps=3, warmup=2)
    # 1 warm-up step, the meter, the 2nd warm-up step (untimed), 3 timed steps
    assert events == ["step", "meter", "step", "step", "step", "step"]
    assert (r.steps, r.warmup) == (3, 2)


@pytest.mark.parametrize("warmup, expected", [
    (0, ["meter", "step", "step"]),            # no warm-up: nothing to move
    (1, ["step", "meter", "step", "step"]),    # one: it is the first step after a change, kept outside
])
def test_with_fewer_the_meter_starts_at_the_clock(order, warmup, expected):
    lab, events = order
    lab.run(steps=2, warmup=warmup)
    assert events == expected
