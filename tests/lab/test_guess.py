"""tunekit.lab.check_guess: a learner's guess and lab.expect's answer set against the measured
change, with exact ratios (the runs and the expectation are plain records: no timing here)."""
from types import SimpleNamespace

import pytest

from tunekit.core.conditions import Conditions
from tunekit.lab import check_guess

QUIET = Conditions(verdict="quiet", reason="no other work")
BUSY = Conditions(verdict="busy", reason="other processes used 1.0 of 2 CPUs")


def run(step_s, run_id, conditions=QUIET, status="ok"):
    return SimpleNamespace(step_s=step_s, run_id=run_id, conditions=conditions, status=status)


def expectation(step_s, base_step_s, base_run):
    return SimpleNamespace(step_s=step_s, base_step_s=base_step_s, base_run=base_run)


def test_each_prediction_is_judged_against_the_measured_ratio():
    base, changed = run(0.100, 1), run(0.125, 2)
    # measured 0.125 / 0.100 = 1.25; lab.expect 0.120 / 0.100 (its base's step) = 1.20, off
    # 1.20 / 1.25 - 1 = -4%; the guess 1.5 is off 1.5 / 1.25 - 1 = +20%
    c = check_guess(1.5, expectation(0.120, 0.100, 1), changed, base)
    assert c.measured == pytest.approx(1.25) and c.expected == pytest.approx(1.2)
    assert c.guess_off == pytest.approx(0.20) and c.expected_off == pytest.approx(-0.04)
    assert c.verdict == ("measured 1.25x; your guess 1.50x (+20% off), lab.expect 1.20x (-4% off): "
                         "lab.expect was closer (machine quiet)")
    assert list(c.table.index) == ["your guess", "lab.expect", "measured"]
    assert c.table["ratio"].tolist() == pytest.approx([1.5, 1.2, 1.25])


def test_a_closer_guess_wins_and_the_expectation_keeps_its_own_base():
    # the base was re-measured slower (0.110) than the run that calibrated lab.expect (0.100):
    # lab.expect's ratio stays 0.130 / 0.100 = 1.30; measured 0.132 / 0.110 = 1.20
    c = check_guess(1.2, expectation(0.130, 0.100, 1), run(0.132, 3), run(0.110, 1))
    assert c.expected == pytest.approx(1.3) and c.measured == pytest.approx(1.2)
    assert "your guess was closer" in c.verdict


def test_a_busy_run_makes_the_check_uncertain_not_a_judgement():
    c = check_guess(1.3, expectation(0.12, 0.1, 1), run(0.125, 2, BUSY), run(0.1, 1))
    # the learner still sees the figures (1.3 / 1.25 - 1 = +4%, 1.2 / 1.25 - 1 = -4%); only who was closer is withheld
    assert c.verdict == ("measured 1.25x; your guess 1.30x (+4% off), lab.expect 1.20x (-4% off); which was closer "
                         "is uncertain: 1 of 2 measurements ran on a busy machine (other processes used 1.0 of 2 "
                         "CPUs); re-run when it is quiet")
    assert c.measured == pytest.approx(1.25)


def test_an_expectation_calibrated_by_another_run_says_so():
    c = check_guess(1.3, expectation(0.12, 0.1, 7), run(0.125, 2), run(0.1, 1))
    assert "calibrated by run #7, not by the base run given" in c.verdict


@pytest.mark.parametrize("guess", [0, -1.0, float("nan"), float("inf"), "-1.3", None, True])
def test_a_guess_that_is_not_a_positive_ratio_is_refused(guess):
    with pytest.raises(ValueError, match="the guess is a ratio"):
        check_guess(guess, expectation(0.12, 0.1, 1), run(0.125, 2), run(0.1, 1))


def test_an_unfinished_run_or_a_missing_expectation_is_refused():
    with pytest.raises(ValueError, match="run is not a finished run"):
        check_guess(1.3, expectation(0.12, 0.1, 1), run(0.125, 2, status="failed"), run(0.1, 1))
    with pytest.raises(ValueError, match="base is not a finished run"):
        check_guess(1.3, expectation(0.12, 0.1, 1), run(0.125, 2), run(float("nan"), 1))
    with pytest.raises(ValueError, match="lab.expect"):
        check_guess(1.3, None, run(0.125, 2), run(0.1, 1))


def test_the_figure_has_both_predictions_and_the_measured_line():
    fig = check_guess(1.5, expectation(0.12, 0.1, 1), run(0.125, 2), run(0.1, 1)).figure()
    assert list(fig.data[0].x) == ["your guess", "lab.expect"]
    assert list(fig.data[0].y) == pytest.approx([1.5, 1.2])
    assert fig.layout.shapes[0].y0 == pytest.approx(1.25)


@pytest.mark.parametrize("typed, ratio", [("1.5", 1.5), ("1.5x", 1.5), (" 1.5 X", 1.5), ("1.5×", 1.5),
                                          ("+50%", 1.5), ("-20%", 0.8)])
def test_a_guess_typed_as_a_ratio_or_a_signed_change_is_read_as_the_ratio(typed, ratio):
    # "+50%": 50% longer, 1 + 0.50 = 1.5; "-20%": 1 - 0.20 = 0.8; measured 0.125 / 0.100 = 1.25
    c = check_guess(typed, expectation(0.120, 0.100, 1), run(0.125, 2), run(0.1, 1))
    assert c.guess == pytest.approx(ratio)


@pytest.mark.parametrize("typed, says", [("30ms", "'30ms' is a time"), ("0.03 s", "'0.03 s' is a time"),
                                         ("30%", "'30%' could be 30% longer (+30%) or 30% of the time (0.3)"),
                                         ("fast", "'fast' is not a positive number"),
                                         ("-1.3", "'-1.3' is not a positive number")])
def test_a_guess_in_another_unit_is_refused_saying_what_to_write(typed, says):
    with pytest.raises(ValueError) as e:
        check_guess(typed, expectation(0.12, 0.1, 1), run(0.125, 2), run(0.1, 1))
    assert says in str(e.value) and "1.3 (30% longer)" in str(e.value)


@pytest.mark.parametrize("guess", [0.03, 30.0])
def test_a_guess_far_from_any_step_ratio_is_judged_and_asks_whether_it_was_a_time(guess):
    # 0.03: the step in 3% of the base's time (33x faster); 30: 30 times longer
    c = check_guess(guess, expectation(0.120, 0.100, 1), run(0.125, 2), run(0.1, 1))
    assert c.guess == guess
    assert c.verdict.endswith(f"your guess {guess:.2f}x is a ratio of step times: was it a time or a percent? "
                              "1.3 means 30% longer (machine quiet)")


@pytest.mark.parametrize("chapter", ["04_batch_size", "05_checkpointing", "06_optimizers"])
def test_a_chapters_guess_cell_reads_the_guess_at_once(chapter):
    # the guess cell itself reads the guess (as_ratio): a badly typed one is refused there, before the
    # runs, not in the check cell after them
    from pathlib import Path

    import tunekit

    text = (Path(__file__).parents[2] / "notebooks" / f"{chapter}.py").read_text()
    cell = next(c for c in text.split("# %%") if "\nmy_guess = " in c)
    typed = cell.replace("my_guess = ", "my_guess = '0.7x'  # ", 1)   # the learner's edit
    space = {"tunekit": tunekit}
    exec(typed, space)
    assert space["my_guess"] == 0.7
    with pytest.raises(ValueError, match="is a time"):
        exec(cell.replace("my_guess = ", "my_guess = '1.3 s'  # ", 1), {"tunekit": tunekit})
