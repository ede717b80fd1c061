"""Where lab.run starts its peak meter among the steps: before the last warm-up step when there
are two or more, so the pages the CPU meter's settled start hands back (malloc_trim) are faulted
in again off the clock, not inside the first timed step. And the timed steps' page faults: counted
(a fake counter here), recorded per step, said in a note past a share of the step."""
import math

import pytest

from tunekit.core.notes import kind_of
from tunekit.lab import run as single
from tunekit.train.record import TUNABLES


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


def fake_faults(monkeypatch, counts):
    """lab.run's fault counter replaced by one that reads ``counts`` in turn (its start, its stop)."""
    it = iter(counts)
    monkeypatch.setattr(single, "minor_faults", lambda: next(it))


def test_a_run_records_its_timed_steps_page_faults_and_says_so_past_the_share(make_lab, monkeypatch):
    lab = make_lab(peak_tflops=1.0, micro_batch=2, seq_len=32)
    # read once before the first timed step, once after the last: 3 steps, 2,304,000 faults, 768,000 a step;
    # 768,000 pages of 4 KiB = 3,000 MiB; at ~1 us a fault 0.768 s: 1% or more of any step under 76.8 s
    fake_faults(monkeypatch, [1_000, 2_305_000])
    monkeypatch.setattr(single.run_result.__globals__["resource"], "getpagesize", lambda: 4096)
    r = lab.run(steps=3, warmup=1)
    assert r.minor_faults_per_step == 768_000
    said = [n for n in r.notes if kind_of(n) == "measure.page_faults"]
    text = str(said[0]) if len(said) == 1 else ""
    assert text.startswith("the timed steps faulted in 3000.0 MiB of fresh pages per step (768,000 page faults, ~")
    assert text.endswith("MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 in the environment "
                         "keeps glibc's")
    assert TUNABLES == {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824"}


def test_a_run_with_few_faults_has_no_note(make_lab, monkeypatch):
    lab = make_lab(peak_tflops=1.0, micro_batch=2, seq_len=32)
    # 2 steps, 0 faults each: recorded as 0.0, nothing said
    fake_faults(monkeypatch, [500, 500])
    r = lab.run(steps=2, warmup=0)
    assert r.minor_faults_per_step == 0.0
    assert not [n for n in r.notes if kind_of(n) == "measure.page_faults"]


def test_the_fault_note_at_the_share():
    from tunekit.train.record import FAULT_S, FAULT_SHARE, fault_notes

    assert (FAULT_S, FAULT_SHARE) == (1.0e-6, 0.01)
    # 360 faults at 1 us = 0.36 ms of a 36 ms step: 1.0%, at the share: a note; 359: 0.997%, none
    assert kind_of(fault_notes(360, 0.036, 4096)[0]) == "measure.page_faults"
    assert fault_notes(359, 0.036, 4096) == []
    # 4,162 faults of 4 KiB in a 36 ms step: 16.26 MiB, 4.162 ms = 11.6% of the step
    text = str(fault_notes(4162, 0.036, 4096)[0])
    assert text.startswith("the timed steps faulted in 16.3 MiB of fresh pages per step (4,162 page faults, "
                           "~12% of the step at ~1 us each)")
    # 64 KiB pages (aarch64 kernels): 256 faults = 16 MiB; 256 us of a 10 ms step, 2.6%
    big = str(fault_notes(256, 0.010, 65536)[0])
    assert big.startswith("the timed steps faulted in 16.0 MiB of fresh pages per step (256 page faults, ~3%")
    assert fault_notes(5, math.nan, 4096) == [] and fault_notes(5, 0.0, 4096) == []
