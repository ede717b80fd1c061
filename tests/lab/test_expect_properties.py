"""``lab.expect``'s properties over sizes of the built-in GPT, on real plans from fixed CPU figures
(tests/planning/conftest.py's ``fixed_cpu``: nothing measured) and base runs whose timings the test
makes: checkpointing (a forward's recompute added, nothing removed) and a doubled micro-batch are
never expected faster than the run they are calibrated by (issue 39 item 1), whatever each op's
measured factor, a burst of load on the update or an op far past its group included."""
from types import SimpleNamespace

import pytest

from tests.planning.conftest import fixed_cpu  # noqa: F401 - the fixture, used by name
from tunekit.core.breakdown import Breakdown
from tunekit.core.setting import Setting
from tunekit.core.toggles import Toggles
from tunekit.lab import expect as ex
from tunekit.lab.plan import cached_plan
from tunekit.planning.target import lab_setting

SIZES = [(1, 16), (2, 32), (4, 64), (8, 128)]
# measured over expected per op, in turn: ops the device model over-counts (0.2x), ones near it, ones
# far past their group (a burst: 40x, 900x); the update at 60x (far past the other groups) or at 1x
FACTORS = (0.2, 1.0, 3.0, 40.0, 900.0)


def base_run(plan, shift: int, update: float, traced: bool = True):
    """A finished run of ``plan``'s setting whose trace has each op at ``FACTORS`` (from ``shift`` on)
    times its expected seconds, the update at ``update`` times and the host's rows 5x as time with no
    op running; its step is the trace's wall (no profiler time to take out)."""
    ops, host = [], 0.0
    for i, (op, cat, calls, secs, _bound, _src) in enumerate(plan.expected.rows):
        if cat == "host":
            host += 5 * secs
        elif cat == "optimizer":
            ops.append({"op": "Optimizer.step#AdamW.step", "category": "optimizer", "self_s": update * secs,
                        "calls": 1})
        else:
            f = FACTORS[(i + shift) % len(FACTORS)]
            ops.append({"op": "aten::" + op, "category": "op", "self_s": f * secs, "calls": calls})
    wall = sum(o["self_s"] for o in ops) + host
    trace = Breakdown("cpu", wall, {}, ops, untraced_s=host) if traced else None
    return SimpleNamespace(run_id=1, status="ok", parallel=None, device="cpu", toggles=Toggles(), label="run 1",
                           trace=trace, step_s=wall, conditions=None, peak_mem_bytes=float("nan"))


@pytest.mark.parametrize("mb, seq", SIZES)
def test_more_work_is_never_expected_faster_than_its_base_run(fixed_cpu, make_lab, mb, seq):  # noqa: F811
    lab = make_lab(peak_tflops=1.0)
    base_s = Setting(**lab_setting(lab, micro_batch=mb, seq_len=seq))
    base_plan = cached_plan(lab, "cpu", base_s)
    more = {"checkpointing": Setting(**lab_setting(lab, micro_batch=mb, seq_len=seq, checkpointing=True)),
            "micro_batch x2": Setting(**lab_setting(lab, micro_batch=2 * mb, seq_len=seq))}
    made = SimpleNamespace(device=SimpleNamespace(type="cpu"))   # the peak is not asked here (no floor read)
    for what, s in more.items():
        plan = cached_plan(lab, "cpu", s)
        for shift in range(len(FACTORS)):
            for update in (1.0, 60.0):
                for traced in (True, False):
                    run = base_run(base_plan, shift, update, traced)
                    e = ex.expectation(made, s, "cpu", plan, base_plan, run)
                    # the base setting itself is expected at its run's step, whatever was carried
                    same = ex.expectation(made, base_s, "cpu", base_plan, base_plan, run)
                    assert same.step_s == pytest.approx(run.step_s, rel=1e-9), (what, shift, update, traced)
                    assert e.step_s >= run.step_s * (1 - 1e-9), (what, mb, seq, shift, update, traced,
                                                                 e.step_s / run.step_s)
