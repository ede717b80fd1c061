"""The timing helpers' verdict: helped / hurt / within noise from repeated measurements."""
import pytest

from tunekit import verdict
from tunekit.core.conditions import Conditions
from tunekit.core.records import ProfileRecord
from tunekit.core.results import RunResult
from tunekit.measure import conclude, time_records


def test_verdict_compares_best_repeats_against_the_noise_band():
    v = verdict([1.00, 1.02, 1.30], [0.50, 0.51])
    # best 1.00 vs 0.50 -> 2.00x; gaps 2% and 2% -> band = floor 5%
    assert (v.speedup, v.band, v.word) == (2.0, 0.05, "helped") and str(v) == "helped (2.00x, noise band ±5%)"
    v = verdict([1.0, 1.2], [1.1, 1.15])
    # 1.0/1.1 = 0.909x; band = max(5%, 20%, 4.5%) = 20%: 0.909 > 1/1.2 = 0.833 -> within noise
    assert v.word == "within noise" and abs(v.band - 0.2) < 1e-12
    assert verdict([1.0, 1.01], [1.2, 1.21]).word == "hurt"   # 0.833x, band 5%
    with pytest.raises(ValueError, match="at least 2"):
        verdict([1.0], [1.0, 1.1])
    with pytest.raises(ValueError, match="positive finite"):
        verdict([1.0, float("nan")], [1.0, 1.1])


# --- records: their conditions decide whether a difference is judged --------------------------

QUIET = Conditions("quiet", "tasks waited for a CPU 0% of the time")
BUSY = Conditions("busy", "tasks waited for a CPU 97% of the time")


def run(step_s_min, tokens=100, cond=QUIET, **kw):
    return RunResult.from_dict({"label": "x", "step_s_min": step_s_min, "tokens_per_step": tokens,
                                "conditions": cond, **kw})


def block(wall_s, cond=QUIET, **kw):
    return ProfileRecord("x", wall_s=wall_s, conditions=cond, **kw)


def test_runs_are_repeats_timed_by_their_fastest_step_per_token():
    # before 1.0 s / 100 tokens = 0.010, 1.02 s -> 0.0102; after 1.0 s / 200 tokens = 0.005, 0.0051
    # -> 0.010 / 0.005 = 2.00x; gaps 2% and 2% -> band = floor 5%
    v = verdict([run(1.0), run(1.02)], [run(1.0, 200), run(1.02, 200)])
    assert (v.speedup, v.band, v.word) == (2.0, 0.05, "helped") and not v.busy
    assert v.before_conditions.verdict == v.after_conditions.verdict == v.conditions.verdict == "quiet"
    assert str(v) == "helped (2.00x, noise band ±5%; machine quiet)"
    assert v.conclusion(helped="bigger batches pay", hurt="no") == \
        "helped (2.00x, noise band ±5%; machine quiet) -> bigger batches pay"
    assert v.conclusion(hurt="no") == str(v)  # nothing said for this word: the verdict alone


def test_a_busy_side_is_shown_but_never_judged():
    # measured 2.00x, far beyond the band, but the after side's repeats were both busy
    v = verdict([run(1.0), run(1.02)], [run(0.5, cond=BUSY), run(0.51, cond=BUSY)])
    assert v.word == "machine busy" and v.busy and (v.speedup, v.band) == (2.0, 0.05)
    assert v.after_conditions.busy and v.before_conditions.verdict == "quiet" and v.conditions.busy
    assert (v.repeats, v.set_aside) == ((2, 2), (0, 2))
    text = str(v)
    assert text == ("machine busy: 2.00x, noise band ±5% measured, uncertain: 0 of 2 repeats before and 2 of 2 "
                    "after ran on a busy machine (tasks waited for a CPU 97% of the time). Re-run when "
                    "the machine is quiet, or take more repeats: busy ones are set aside, each side needs 2 quiet ones")
    assert v.conclusion(helped="bigger batches pay") == text  # no meaning drawn from busy runs
    # one busy repeat of two leaves one quiet: still too few to judge
    assert verdict([block(1.0, BUSY), block(1.01)], [block(0.5), block(0.51)]).word == "machine busy"


def test_busy_repeats_are_set_aside_and_quiet_ones_judged():
    # the busy repeat (1.6 s) is left out; quiet 1.0 and 1.01 vs 0.5 and 0.51: 2.00x, band 5%
    v = verdict([block(1.0), block(1.6, BUSY), block(1.01)], [block(0.5), block(0.51)])
    assert (v.speedup, v.word, v.repeats, v.set_aside) == (2.0, "helped", (3, 2), (1, 0))
    assert str(v) == "helped (2.00x, noise band ±5%; machine quiet, 1 busy repeat set aside)"
    # had it been kept, its side would still be best 1.0 / 1.01: the same figures, now from quiet repeats only
    unknown = Conditions("unknown", "no counters")
    v = verdict([block(1.0, unknown), block(1.01, unknown)], [block(1.0, unknown), block(1.02, unknown)])
    assert v.word == "within noise" and str(v) == "within noise (1.00x, noise band ±5%; machine unknown)"


def test_plain_seconds_have_no_conditions_and_read_as_before():
    v = verdict([1.0, 1.01], [1.2, 1.21])
    assert v.before_conditions is None and v.conditions is None and v.set_aside == (0, 0) and v.busy_reason == ""
    assert str(v) == "hurt (0.83x, noise band ±5%)"  # 1.0 / 1.2


@pytest.mark.parametrize("before,after,words", [
    (run(1.0), [run(1.0), run(1.1)], "one record, which is one repeat"),
    ([run(1.0), 1.0], [run(1.0), run(1.1)], "mixes records and numbers"),
    ([run(1.0), block(1.0)], [run(1.0), run(1.1)], "mixes runs"),
    ([run(1.0), run(1.1)], [block(1.0), block(1.1)], "before holds runs and after profiled blocks"),
    ([run(1.0), run(1.1)], [run(1.0), run(float("nan"), status="failed")], "at least 2 runs with a measured"),
    ([block(1.0), block(1.1, error="RuntimeError: x")], [block(1.0), block(1.1)], "profiled blocks that ran"),
    ([1.0, 1.1], [1.0, 1.1], None),
])
def test_bad_sides_are_refused_with_the_reason(before, after, words):
    if words is None:
        assert verdict(before, after).word == "within noise"
        return
    with pytest.raises(ValueError, match=words):
        verdict(before, after)


@pytest.mark.parametrize("floor", [-0.1, 1.0, True, "5%", float("nan")])
def test_bad_floor_is_refused(floor):
    with pytest.raises(ValueError, match="floor must be"):
        verdict([1.0, 1.1], [1.0, 1.1], floor=floor)


def test_conclusion_refuses_unknown_words():
    with pytest.raises(ValueError, match="helped=, within_noise=, hurt="):
        verdict([1.0, 1.1], [1.0, 1.1]).conclusion(within="x")


def test_conclude_puts_the_machine_beside_a_conclusion_or_says_uncertain():
    assert conclude("matmuls dominate", [block(1.0), block(1.1)]) == "matmuls dominate (machine quiet)"
    assert conclude("matmuls dominate", block(1.0, cond=None)) == "matmuls dominate (machine unknown)"
    said = conclude("matmuls dominate", [block(1.0), run(1.0, cond=BUSY)])
    assert said == ("uncertain: 1 of 2 measurements ran on a busy machine (tasks waited for a CPU 97% "
                    "of the time); re-run when it is quiet")
    two = Conditions("busy", "tasks waited for a CPU 97% of the time; other processes used 1.5 of 2 CPUs")
    assert conclude("x", [two]).startswith("uncertain: 1 of 1 measurements ran on a busy machine (tasks waited "
                                           "for a CPU 97% of the time); ")  # the first clause only
    with pytest.raises(ValueError, match="records with a .conditions"):
        conclude("x", [1.0])
    with pytest.raises(ValueError, match="as text"):
        conclude(None, [block(1.0)])


def test_time_records_gives_one_record_per_repeat_with_its_conditions(monkeypatch):
    from tunekit.measure import conditions as mc
    from tunekit.profiling.probe import HISTORY

    said = iter([QUIET, BUSY, QUIET])  # what the meter says after each repeat
    monkeypatch.setattr(mc.ConditionsMeter, "stop", lambda self, wall_s=None, threads=None: next(said))
    calls, before = [], len(HISTORY.records())
    recs = time_records(lambda: calls.append(1), repeats=3, warmup=2, name="noop")
    assert len(calls) == 5  # 2 warm-up calls + 3 timed
    assert [r.name for r in recs] == ["noop 1", "noop 2", "noop 3"]
    assert [r.conditions.verdict for r in recs] == ["quiet", "busy", "quiet"]
    assert all(r.wall_s > 0 for r in recs) and recs[0].device.startswith("cpu")
    assert len(HISTORY.records()) == before  # not profiled cells: history() is left alone
    v = verdict(recs, recs)  # the busy repeat is set aside: 2 quiet repeats remain on each side
    assert v.set_aside == (1, 1) and v.word == "within noise" and v.speedup == 1.0
    with pytest.raises(ValueError, match="repeats"):
        time_records(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="fn must be a function"):
        time_records(3)
