"""train.record: the figures a run's timed steps are summarized by (no timing of its own)."""
import math

import pytest

from tunekit.core.results import RunResult
from tunekit.train.record import iqr


def test_iqr_of_the_timed_steps():
    # "inclusive" quartiles of 1..5: q1 = 2, q3 = 4; 4 - 2 = 2
    assert iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == 2.0
    # of 10, 20, 30, 100 (one slow step): q1 = 10 + 0.75 * 10 = 17.5, q3 = 30 + 0.25 * 70 = 47.5; 30
    assert iqr([0.010, 0.020, 0.030, 0.100]) == pytest.approx(0.030)
    assert iqr([0.5]) == 0.0


def test_steady_step_is_the_median_where_kept():
    r = RunResult.from_dict({"label": "a", "step_s": 0.040, "step_s_median": 0.032, "step_s_iqr": 0.002})
    assert r.steady_step_s == 0.032 and r.step_s_iqr == 0.002
    old = RunResult.from_dict({"label": "b", "step_s": 0.040})   # a log line from before: the mean
    assert math.isnan(old.step_s_median) and old.steady_step_s == 0.040
