"""The max-batch search's stopping rules: converged, the search limit, the time budget.

The budget is read from ``maxbatch.clock``; these tests put a fake clock there and fake trials
(each advancing the fake clock by a set cost), so every expectation is exact whatever the machine
is doing.
"""
import pytest

from tests.helpers import Tty  # stderr: what is written, a terminal or not
from tunekit.core.notes import Note
from tunekit.core.toggles import ToggleError
from tunekit.lab import maxbatch
from tunekit.lab.maxbatch import MaxBatchResult, Trial


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def fake_search(monkeypatch, largest: int, cost, start=1, limit=1024, budget_s=None):
    """`_search` over trials where ``b <= largest`` fits and the trial at ``b`` takes ``cost(b)``
    fake seconds. Returns the result."""
    clock = FakeClock()
    monkeypatch.setattr(maxbatch, "clock", clock)
    result = MaxBatchResult(best=None, limit=limit, budget_s=budget_s)

    def attempt(b):
        clock.now += cost(b)
        result.trials.append(Trial(b, b <= largest, None, "ok" if b <= largest else "OOM", cost(b)))
        return b <= largest

    maxbatch._search(attempt, start, limit, result, budget_s)
    return result


def tried(result):
    return [t.micro_batch for t in result.trials]


def test_converged_brackets_the_answer(monkeypatch):
    found = fake_search(monkeypatch, largest=37, cost=lambda b: 1.0)
    assert tried(found) == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]
    assert (found.best, found.too_big, found.stopped, found.elapsed_s) == (37, 38, "converged", 12.0)
    assert found.verdict == "largest micro-batch that fits: 37 (38 does not; 12 trials, 12.0 s)"


def test_the_search_limit_says_the_maximum_may_be_higher(monkeypatch):
    found = fake_search(monkeypatch, largest=10**6, cost=lambda b: 0.5, limit=1024)
    assert tried(found) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert (found.best, found.too_big, found.stopped) == (1024, None, "search limit")
    assert found.verdict == ("largest micro-batch that fits: 1024, the search limit (limit=1024); the true "
                             "maximum may be higher: search again with a bigger limit (e.g. limit=2048) "
                             "(11 trials, 5.5 s)")
    assert repr(found).splitlines()[0].startswith("MaxBatchResult(best=1024, stopped='search limit', trials=[1✓")


def test_the_budget_stops_before_a_trial_that_would_end_past_it(monkeypatch):
    # a trial costs 1 s per sample: 1+2+4+8 = 15 s spent; the trial at 16 is expected to take
    # 8 s * 16/8 = 16 s and would end at 31 s > 30 s, so it is not started
    found = fake_search(monkeypatch, largest=100, cost=lambda b: float(b), budget_s=30.0)
    assert tried(found) == [1, 2, 4, 8]
    assert (found.best, found.too_big, found.stopped, found.elapsed_s) == (8, None, "budget", 15.0)
    assert found.verdict == ("stopped by the time budget (budget_s=30): the next trial would have ended past "
                             "it. The search is not finished: largest micro-batch that fit: 8, none failed "
                             "yet; the maximum is between 8 and the limit, 1024. A bigger budget_s finishes "
                             "it (4 trials, 15.0 s)")
    # one second more and the trial at 16 runs (ending exactly at the budget)
    assert tried(fake_search(monkeypatch, largest=100, cost=lambda b: float(b), budget_s=31.0))[-1] == 16


def test_the_budget_in_the_bisection_gives_the_bracket(monkeypatch):
    # 1 s a trial: 1, 2, 4, 8 fit and 16 fails (5 s); bisecting, 12 fits (6 s), then the budget of
    # 6.5 s pays for no more: the bracket is [12, 16)
    found = fake_search(monkeypatch, largest=13, cost=lambda b: 1.0, budget_s=6.5)
    assert tried(found) == [1, 2, 4, 8, 16, 12]
    assert (found.best, found.too_big, found.stopped) == (12, 16, "budget")
    assert "largest micro-batch that fit: 12, smallest that did not: 16; the maximum is in between" \
        in found.verdict


def test_the_first_trial_runs_whatever_the_budget(monkeypatch):
    found = fake_search(monkeypatch, largest=100, cost=lambda b: 5.0, budget_s=1.0)
    assert tried(found) == [1] and (found.best, found.stopped) == (1, "budget")


def refused_from_16(monkeypatch, refusal_s: float, reason: Note) -> MaxBatchResult:
    """A search whose sizes from 16 up are refused by prediction (taking ``refusal_s`` of the clock,
    with ``reason``), the others run in 2 s each, within a 12 s budget."""
    clock = FakeClock()
    monkeypatch.setattr(maxbatch, "clock", clock)
    result = MaxBatchResult(best=None, limit=64, budget_s=12.0)

    def attempt(b):
        fits = b < 16
        clock.now += 2.0 if fits else refusal_s
        result.trials.append(Trial(b, True, 1.0, "ok", 2.0) if fits else Trial(b, False, None, reason, 0.0))
        return fits

    maxbatch._search(attempt, 1, 64, result, 12.0)
    return result


def test_a_trial_refused_by_prediction_costs_no_time(monkeypatch):
    # "predicted over ..." trials are not run: they take no time and are no trial's cost estimate;
    # the search knows them by their reason's kind, whatever its words say
    result = refused_from_16(monkeypatch, 0.0, Note("trial.predicted_over_budget", "refused: too big"))
    # 1, 2, 4, 8 take 8 s; 16 (expected 2 s * 16/8 = 4 s, ending at 12 s) is refused for free;
    # 12 (expected 3 s) runs in 2 s; 14 is expected to take 2 s * 14/12 and would end past 12 s
    assert tried(result) == [1, 2, 4, 8, 16, 12]
    assert (result.best, result.too_big, result.stopped, result.elapsed_s) == (12, 16, "budget", 10.0)


def test_a_trial_refused_by_prediction_is_known_by_its_reason_s_kind(monkeypatch):
    # a prediction that took time (tunekit.lab.fit's estimate) is no trial's cost: were its 1.5 s
    # taken as the trial at 16's, 12 would be expected to take 1.5 s and run
    result = refused_from_16(monkeypatch, 1.5, Note("trial.predicted_over_available", "too big"))
    # 1, 2, 4, 8 take 8 s, 16 is refused at 9.5 s; 12 is expected to take 2 s * 12/8 = 3 s: past 12 s
    assert tried(result) == [1, 2, 4, 8, 16]
    assert (result.best, result.too_big, result.stopped, result.elapsed_s) == (8, 16, "budget", 9.5)


def test_not_even_the_first_size_fits(monkeypatch):
    found = fake_search(monkeypatch, largest=0, cost=lambda b: 1.0, start=4)  # then below the start
    assert tried(found) == [4, 2, 1] and (found.best, found.too_big, found.stopped) == (None, 1, "converged")
    assert found.verdict == "not even micro-batch 1 fits (OOM) (3 trials, 3.0 s)"


def test_a_lab_search_stops_on_its_budget_and_says_so(monkeypatch, make_lab):
    # the public path: the Lab's search with a fake trial and a fake clock
    lab = make_lab(peak_tflops=1.0, micro_batch=4, seq_len=16)
    clock = FakeClock()
    monkeypatch.setattr(maxbatch, "clock", clock)

    def trial(lab, t, *args, **kwargs):
        clock.now += 4.0
        return Trial(t.micro_batch, True, 1.0, "ok", 4.0)

    monkeypatch.setattr(maxbatch, "_trial", trial)
    found = lab.find_max_batch_size(limit=64, budget_s=12.5, memory_budget_bytes=2**30)
    # 1 takes 4 s; 2 is expected to take 4 s * 2/1 (ending at 12 s) and runs in 4 s; 4 would take
    # 4 s * 4/2 = 8 s more
    assert tried(found) == [1, 2] and (found.best, found.stopped, found.budget_s) == (2, "budget", 12.5)
    assert "stopped by the time budget (budget_s=12.5)" in repr(found)


@pytest.mark.parametrize("budget_s", [0, -1, float("nan"), "60", True])
def test_a_bad_budget_is_refused(budget_s, make_lab):
    lab = make_lab(peak_tflops=1.0, micro_batch=4, seq_len=16)
    with pytest.raises(ToggleError, match="budget_s must be a finite number > 0"):
        lab.find_max_batch_size(budget_s=budget_s)


def _shown_search(monkeypatch, tmp_path, tty: bool, **kwargs):
    """lab.find_max_batch_size over fake trials (2 fake seconds each, micro-batches up to 4 fit,
    larger ones run out of memory) with stderr a terminal or not: (result, what stderr got, the
    trials the caller's progress callback saw)."""
    from tunekit.lab.lab import Lab
    from tunekit.view import progress

    lab = Lab(log_path=tmp_path / "runs.jsonl", peak_tflops=1.0, micro_batch=4, seq_len=16)
    clock = FakeClock()
    monkeypatch.setattr(maxbatch, "clock", clock)
    monkeypatch.setattr(progress, "clock", clock)

    def trial(lab, t, *args, **kw):
        clock.now += 2.0
        b = t.micro_batch
        # the display counts OOMs by the reason's kind: these words do not start with "OOM"
        return Trial(b, b <= 4, 1.0, Note("trial.ok", "ok") if b <= 4 else Note("trial.oom", "CUDA out of memory"), 2.0)

    monkeypatch.setattr(maxbatch, "_trial", trial)
    stream = Tty(tty)
    monkeypatch.setattr(progress.sys, "stderr", stream)
    seen = []
    found = lab.find_max_batch_size(limit=64, budget_s=60, memory_budget_bytes=2**30, progress=seen.append,
                                    **kwargs)
    return found, stream.text, seen


def test_a_lab_search_shows_the_trial_going_and_one_line_at_the_end(monkeypatch, tmp_path):
    found, text, seen = _shown_search(monkeypatch, tmp_path, tty=True)
    # doubling 1, 2, 4 (fit), 8 (OOM), then bisecting 6, 5 (OOM): 6 trials of 2 s
    assert tried(found) == [1, 2, 4, 8, 6, 5] == [t.micro_batch for t in seen]  # the caller's callback too
    line = "find_max_batch_size: largest micro-batch that fits: 4 (5 does not; 6 trials, 12.0 s)"
    assert text.endswith("\r" + line + "\x1b[K\n") and text.count("\n") == 1   # one display, redrawn
    # before the trial at 6: 3 fit and 1 OOM in 4 trials x 2 s = 8 s; 8/60 of the bar's 20 = 2.7 -> 3
    assert ("\rfind_max_batch_size: trying micro_batch=6 · 3 fit, 1 OOM · 8.0 s / budget 60 s "
            "[###.................]\x1b[K") in text
    assert "\rfind_max_batch_size: trying micro_batch=1 · 0 fit, 0 OOM · 0.0 s / budget 60 s" in text


def test_a_lab_search_off_a_terminal_prints_its_line_only_and_nothing_when_quiet(monkeypatch, tmp_path):
    found, text, _ = _shown_search(monkeypatch, tmp_path, tty=False)
    assert text == f"find_max_batch_size: {found.verdict}\n"
    found, text, seen = _shown_search(monkeypatch, tmp_path, tty=True, verbose=False)
    assert text == "" and found.best == 4 and len(seen) == 6
    with pytest.raises(ValueError, match="verbose must be True or False"):
        _shown_search(monkeypatch, tmp_path, tty=False, verbose="yes")


def test_a_prediction_never_refuses_a_size_below_every_measured_one():
    MiB = 2**20
    over = Note("trial.over_available", "over available")
    trials = [Trial(9, False, 40 * MiB, over, 0.1), Trial(4, False, 36 * MiB, over, 0.1)]
    # between and above the measured sizes: the line through them, 36 + (40 - 36) / 5 per sample
    assert maxbatch._predict_used(6, trials) == pytest.approx(36 * MiB + 2 * 0.8 * MiB)
    assert maxbatch._predict_used(14, trials) == pytest.approx(40 * MiB + 5 * 0.8 * MiB)
    # below both (noisy RSS peaks drawn downward said 34.4 and 33.6 MiB: over a 32 MiB limit): run it
    assert maxbatch._predict_used(2, trials) is None and maxbatch._predict_used(1, trials) is None
