"""``tunekit.Monitor(..., trace=N)``: one step of the user's loop under torch.profiler, its
Breakdown on the summary record for ``tunekit.explain``. Timings are never compared: only flags,
counts, the record's fields and whether a profiler is left running."""
import pytest
import torch

import tunekit
from tests.monitor.test_monitor import batches, tiny, train  # the same tiny loop
from tunekit.core.breakdown import Breakdown
from tunekit.core.fmt import fmt_ms
from tunekit.core.notes import kind_of
from tunekit.measure.flops import counting_active


def profiling() -> bool:
    return torch.autograd.profiler._is_profiler_enabled or torch._C._autograd._profiler_enabled()


def test_the_traced_step_is_marked_left_out_of_the_summary_and_explained():
    model, opt = tiny()
    # step 0 counted (first inputs), step 1 warm-up (warmup=1), step 2 traced, steps 3-4 measured
    mon = tunekit.Monitor(model, name="traced loop", live=False, peak=1.0, trace=2)
    for x, y in mon.iter(batches(5)):
        mon.log(loss=train(model, opt, x, y))
    rec = mon.close()
    rows = mon.rows
    assert [r["traced"] for r in rows] == [False, False, True, False, False]
    assert [r["counted"] for r in rows] == [True, False, False, False, False]   # never under the profiler
    assert rows[2]["tokens_per_s"] != rows[2]["tokens_per_s"]                   # traced: no speed (NaN)
    assert mon.summary.measured == 2 and mon.summary.traced == 1                # steps 3 and 4 only
    assert rec.notes[0].startswith("5 steps (1 warm-up, 1 counted, 1 traced)")
    assert rec.flops == rows[3]["flops"] + rows[4]["flops"]
    assert steps_status(mon) == ["FLOP count", "warm-up", "traced", "ok", "ok"]
    assert isinstance(rec.trace, Breakdown) and rec.trace.device == "cpu"
    assert rec.trace.wall_s == rows[2]["step_s"]             # the step's own boundaries
    assert rec.trace.seconds["matmul/linear"] > 0
    assert rec.trace.untimed_wall_s == pytest.approx((rows[3]["step_s"] + rows[4]["step_s"]) / 2)  # median of 2
    assert not profiling() and not counting_active()
    e = tunekit.explain(rec, tunekit.plan(model, "cpu", micro_batch=2, seq_len=32))
    assert e.label == "traced loop" and e.measured_s == rec.trace.wall_s    # steps=1: one step traced
    assert e.line.startswith(fmt_ms(rec.trace.wall_s) + " per step")


def steps_status(mon):
    from tunekit.monitor.steps import status

    return [status(r) for r in mon.rows]


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_bad_trace_is_refused_before_the_loop(bad):
    model, _ = tiny()
    with pytest.raises(ValueError, match="trace must be a whole number >= 0"):
        tunekit.Monitor(model, live=False, trace=bad)
    assert not model._forward_pre_hooks   # refused before any hook


def test_a_traced_warm_up_step_says_so():
    model, opt = tiny()
    mon = tunekit.Monitor(model, live=False, trace=0)   # step 0: traced, not counted, so the warm-up
    for x, y in mon.iter(batches(2)):
        train(model, opt, x, y)
    rec = mon.close()
    assert [(r["traced"], r["warmup"], r["counted"]) for r in mon.rows] == [(True, True, False), (False, False, True)]
    assert "step 0 was a warm-up step: first-run costs are in its time (trace a later, steady step)" in rec.trace.notes


def test_a_loop_that_ends_before_the_traced_step_says_so():
    model, opt = tiny()
    mon = tunekit.Monitor(model, live=False, trace=7)
    for x, y in mon.iter(batches(3)):
        train(model, opt, x, y)
    rec = mon.close()
    assert rec.trace is None and not any(r["traced"] for r in mon.rows)
    notes = [n for n in rec.notes if kind_of(n) == "monitor.untraced"]
    assert notes == ["no step traced: the loop ended after 3 steps, before step 7"]


def test_an_exception_in_the_traced_step_stops_the_profiler_and_reaches_the_user():
    model, opt = tiny()
    mon = tunekit.Monitor(model, live=False, trace=1)
    with pytest.raises(RuntimeError, match="boom"):
        for i, (x, y) in enumerate(mon.iter(batches(4))):
            train(model, opt, x, y)
            if i == 1:
                assert profiling()            # the step is being traced
                raise RuntimeError("boom")
    assert not profiling()
    rec = mon.close()
    assert rec.trace is None and mon.rows[1]["traced"] and mon.rows[1]["left"]
    assert [kind_of(n) for n in rec.notes if "no step traced" in n] == ["monitor.untraced"]
    mon2 = tunekit.Monitor(model, live=False, trace=0)       # the first step, by ``with mon.step()``
    with pytest.raises(ValueError, match="boom2"), mon2.step():
        train(model, opt, *batches(1)[0])
        raise ValueError("boom2")
    assert not profiling() and mon2.rows[0]["error"] == "ValueError: boom2"
    notes = [n for n in mon2.close().notes if kind_of(n) == "monitor.untraced"]
    assert notes == ["no step traced: the traced step raised ValueError: no trace kept"]
