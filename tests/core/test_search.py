"""The one batch-size search (tunekit.core.search), pure: predicates over whole numbers, every
size asked checked in order. lab.maxbatch, the plan's search and lab.fit's Line run it."""
import pytest

from tunekit.core.search import largest_fitting


def test_doubling_then_bisection_between_the_last_fit_and_the_first_miss():
    found = largest_fitting(lambda b: b <= 37, limit=1024)
    # doubling: 1..32 fit, 64 does not; bisection of (32, 64): 48 no, 40 no, 36 yes, 38 no, 37 yes
    assert found.tried == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]
    assert (found.best, found.too_big, found.stopped) == (37, 38, "converged")


def test_an_answer_that_is_a_power_of_two_is_bracketed_by_the_next():
    found = largest_fitting(lambda b: b <= 32)
    # 64 fails: (32, 64) bisected by 48, 40, 36, 34, 33, each a miss
    assert found.tried == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 34, 33]
    assert (found.best, found.too_big, found.stopped) == (32, 33, "converged")


def test_the_limit_is_tried_itself_and_ends_the_search_when_it_fits():
    found = largest_fitting(lambda b: True, limit=100)
    # doubling capped at the limit: 64 -> min(128, 100) = 100
    assert found.tried == [1, 2, 4, 8, 16, 32, 64, 100]
    assert (found.best, found.too_big, found.stopped) == (100, None, "search limit")


def test_a_limit_that_does_not_fit_is_bisected_below():
    found = largest_fitting(lambda b: b <= 70, limit=100)
    # 100 fails: (64, 100) bisected: 82 no, 73 no, 68 yes, 70 yes, 71 no
    assert found.tried == [1, 2, 4, 8, 16, 32, 64, 100, 82, 73, 68, 70, 71]
    assert (found.best, found.too_big, found.stopped) == (70, 71, "converged")


def test_nothing_fits_not_even_one():
    found = largest_fitting(lambda b: False)
    assert found.tried == [1] and (found.best, found.too_big, found.stopped) == (None, 1, "converged")


def test_a_first_guess_above_the_answer_bisects_down_to_it():
    found = largest_fitting(lambda b: b <= 5, start=40, limit=1024)
    # 40 fails: (0, 40) bisected: 20 no, 10 no, 5 yes, 7 no, 6 no
    assert found.tried == [40, 20, 10, 5, 7, 6]
    assert (found.best, found.too_big, found.stopped) == (5, 6, "converged")


def test_a_first_guess_below_the_answer_doubles_from_it():
    found = largest_fitting(lambda b: b <= 37, start=36, limit=1024)
    # 36 fits, 72 does not; (36, 72): 54 no, 45 no, 40 no, 38 no, 37 yes
    assert found.tried == [36, 72, 54, 45, 40, 38, 37]
    assert (found.best, found.too_big, found.stopped) == (37, 38, "converged")


def test_a_first_guess_at_the_limit_that_fits_is_one_try():
    found = largest_fitting(lambda b: True, start=8, limit=8)
    assert found.tried == [8] and (found.best, found.too_big, found.stopped) == (8, None, "search limit")


def test_a_predicate_that_returns_none_stops_the_search_with_the_bracket_so_far():
    # the caller cannot pay for a try at 12 (a time budget): 8 fit, 16 did not
    found = largest_fitting(lambda b: None if b == 12 else b <= 13)
    assert found.tried == [1, 2, 4, 8, 16, 12]
    assert (found.best, found.too_big, found.stopped) == (8, 16, "stopped")
    found = largest_fitting(lambda b: None if b == 16 else True)   # while doubling: nothing failed yet
    assert found.tried == [1, 2, 4, 8, 16] and (found.best, found.too_big, found.stopped) == (8, None, "stopped")
    found = largest_fitting(lambda b: None)   # not even the first try
    assert found.tried == [1] and (found.best, found.too_big, found.stopped) == (None, None, "stopped")


def test_a_predicate_that_raises_ends_the_search_with_its_exception():
    asked = []

    def fits(b):
        asked.append(b)
        if b == 8:
            raise KeyboardInterrupt   # Ctrl-C in a trial: not caught, not turned into a miss
        return True

    with pytest.raises(KeyboardInterrupt):
        largest_fitting(fits)
    assert asked == [1, 2, 4, 8]
    with pytest.raises(ZeroDivisionError):
        largest_fitting(lambda b: 1 / (4 - b) > 0)   # 1 and 2 fit, 4 divides by zero


@pytest.mark.parametrize("start, limit", [(0, 8), (9, 8), (1, 0), (1.5, 8), (1, 8.0), (-1, 8)])
def test_a_start_or_limit_out_of_order_is_refused(start, limit):
    with pytest.raises(ValueError, match=r"need whole numbers 1 <= start <= limit"):
        largest_fitting(lambda b: True, start, limit)


@pytest.mark.parametrize("answer", range(0, 70))
def test_every_answer_up_to_the_limit_is_found(answer):
    found = largest_fitting(lambda b: b <= answer, limit=64)
    assert found.best == (min(answer, 64) or None)
    assert found.too_big == (answer + 1 if answer < 64 else None)
    assert len(found.tried) == len(set(found.tried))   # no size asked twice
