"""core.noise: the one judgement of whether two timings differ beyond noise, with exact numbers."""
from types import SimpleNamespace as R

from tunekit.core import noise
from tunekit.lab.runlog import repeat_agreement
from tunekit.measure.timing import verdict


def test_disagreement_is_the_worst_slowest_over_fastest():
    # [1.0, 1.3, 1.1]: 1.3 / 1.0 = 1.3; [2.0, 2.2]: 2.2 / 2.0 = 1.1 -> worst 1.3
    assert noise.disagreement([[1.0, 1.3, 1.1], [2.0, 2.2]]) == 1.3 / 1.0
    # only the two fastest of each: 1.1 / 1.0 = 1.1 and 2.2 / 2.0 = 1.1 -> 1.1
    assert noise.disagreement([[1.0, 1.3, 1.1], [2.0, 2.2]], fastest=2) == max(1.1 / 1.0, 2.2 / 2.0)
    assert noise.disagreement([[0.5], []]) == 1.0  # one time, or none, agrees with itself


def test_band_is_the_gap_of_the_two_fastest_repeats_at_least_the_floor():
    # gaps 1.02 / 1.00 - 1 = 2% and 0.51 / 0.50 - 1 = 2%: the 5% floor is wider
    assert noise.band([[1.00, 1.02, 1.30], [0.50, 0.51]], floor=0.05) == 0.05
    # gaps 1.2 / 1.0 - 1 = 20% and 1.15 / 1.1 - 1 = 4.5%: 20% beats the 5% floor
    assert noise.band([[1.0, 1.2], [1.1, 1.15]], floor=0.05) == 1.2 / 1.0 - 1


def test_word_needs_a_speedup_beyond_the_band():
    assert noise.word(2.0, 0.05) == "helped"         # 2.0 > 1.05
    assert noise.word(1.05, 0.05) == "within noise"  # 1.05 is not > 1.05
    assert noise.word(1 / 1.2, 0.05) == "hurt"       # 0.833 < 1 / 1.05 = 0.952
    assert noise.word(0.96, 0.05) == "within noise"  # 0.96 >= 0.952


def test_verdict_and_repeat_agreement_judge_through_it():
    before, after = [1.0, 1.2], [1.1, 1.15]
    v = verdict(before, after)
    # speed-up 1.0 / 1.1 = 0.909; band max(5%, 20%, 4.5%) = 20%; 0.909 >= 1 / 1.2 = 0.833
    assert (v.speedup, v.band, v.word) == (1.0 / 1.1, noise.band([before, after], 0.05), "within noise")
    runs = [[R(step_s_min=0.100), R(step_s_min=0.125)], [R(step_s_min=0.2)]]
    # 0.125 / 0.100 = 1.25 (the second setting's one run agrees with itself)
    assert repeat_agreement(runs)[0] == noise.disagreement([[0.100, 0.125], [0.2]]) == 0.125 / 0.100
