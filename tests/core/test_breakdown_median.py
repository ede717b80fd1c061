"""core.breakdown.median_breakdown: several traced steps of one setting as one Breakdown, part by part
and op by op their median (exact numbers on made-up steps)."""
import math

import pytest

from tunekit.core.breakdown import Breakdown, median_breakdown

MM, ADD, OPT = "matmul/linear", "activation/elementwise", "optimizer"


def step(mm, add, opt, untraced, calls=10, path=None):
    ops = [{"op": "aten::mm", "category": MM, "self_s": mm, "calls": calls},
           {"op": "Optimizer.step#AdamW.step", "category": OPT, "self_s": opt, "calls": 1}]
    ops += [{"op": "aten::add", "category": ADD, "self_s": add, "calls": 4}] if add else []
    return Breakdown("cpu", mm + add + opt + untraced, {MM: mm, ADD: add, OPT: opt}, ops, untraced_s=untraced,
                     path=path, notes=["first's"] if path else [])


def test_one_slowed_step_moves_no_median():
    # three steps; the second's update slowed 18x by other work, the third ran no add (a missing op
    # counts 0 there): mm median(20, 21, 19) = 20 ms; add median(4, 4, 0) = 4; the update
    # median(2, 36, 2.2) = 2.2; untraced median(3, 3.5, 2.5) = 3; wall 20 + 4 + 2.2 + 3 = 29.2 ms
    b = median_breakdown([step(0.020, 0.004, 0.002, 0.003, path="first.json"),
                          step(0.021, 0.004, 0.036, 0.0035, calls=12), step(0.019, 0.0, 0.0022, 0.0025)])
    assert b.seconds == {MM: pytest.approx(0.020), ADD: pytest.approx(0.004), OPT: pytest.approx(0.0022)}
    assert b.untraced_s == pytest.approx(0.003) and b.wall_s == pytest.approx(0.0292)
    # op by op, largest first; calls their median too (10, 12, 10 -> 10)
    assert [(o["op"], o["self_s"], o["calls"]) for o in b.top_ops] == [
        ("aten::mm", pytest.approx(0.020), 10), ("aten::add", pytest.approx(0.004), 4),
        ("Optimizer.step#AdamW.step", pytest.approx(0.0022), 1)]
    assert sum(b.shares().values()) == pytest.approx(1.0)
    assert b.path == "first.json" and b.notes[0] == "first's" and "median of 3 traced steps" in b.notes[1]


def test_one_step_is_itself():
    one = step(0.020, 0.004, 0.002, 0.003)
    assert median_breakdown([one]) is one
    gpu = Breakdown("cuda", 0.01, {MM: 0.006, "idle": 0.004}, [], untraced_s=math.nan)
    both = median_breakdown([gpu, Breakdown("cuda", 0.02, {MM: 0.008, "idle": 0.012}, [], untraced_s=math.nan)])
    # no untraced time on a GPU: the wall is the parts' medians, 0.007 + 0.008 = 0.015
    assert math.isnan(both.untraced_s) and both.wall_s == pytest.approx(0.015)
