"""benchmarks/bench_expect.py's measured side (issue 42): the interleaving schedule, a setting's time
from its blocks, the A/A check and the judged / not-judged rule, on fake timings (exact numbers)."""
import math

import pytest

from tests.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_expect.py")


def test_each_round_measures_the_base_twice_and_every_change_once_turned_by_one(bench):
    A, A2 = bench.A, bench.A2
    # 3 changes: the base again after the first ceil(3/2) = 2 of them; round r starts at change r
    assert bench.schedule(3, 3) == [[A, 0, 1, A2, 2], [A, 1, 2, A2, 0], [A, 2, 0, A2, 1]]
    # 4 changes: half = 2; round 1 turned by one: 1, 2 | 3, 0
    assert bench.schedule(4, 2) == [[A, 0, 1, A2, 2, 3], [A, 1, 2, A2, 3, 0]]
    assert bench.schedule(0, 2) == [[A, A2], [A, A2]]
    assert bench.schedule(1, 1) == [[A, 0, A2]]


def test_over_the_rounds_a_change_takes_every_place_once(bench):
    # 4 changes x 4 rounds: change 0 comes first after A once, second once, ... (the order turns)
    rounds = bench.schedule(4, 4)
    positions = sorted(r.index(0) for r in rounds)
    assert positions == [1, 2, 4, 5]   # slots after A: 1, 2; after A': 4, 5
    assert all(r.count(bench.A) == r.count(bench.A2) == 1 for r in rounds)


def test_a_setting_takes_its_fastest_block(bench):
    assert bench.setting_time([0.052, 0.047, 0.049]) == 0.047
    assert math.isnan(bench.setting_time([]))


def test_the_aa_spread_is_the_larger_fastest_over_the_smaller(bench):
    # A fastest 0.040, A' fastest 0.041: 0.041 / 0.040 - 1 = 0.025, whichever series is slower
    assert bench.aa_spread([0.044, 0.040, 0.050], [0.041, 0.045]) == pytest.approx(0.025)
    assert bench.aa_spread([0.041, 0.045], [0.044, 0.040, 0.050]) == pytest.approx(0.025)
    assert math.isnan(bench.aa_spread([0.040], []))


def test_the_error_is_the_expected_ratio_over_the_measured_ratio(bench):
    # expected 60 / 40 = 1.5x the base; measured 66 / 48 = 1.375x its interleaved base; 1.5 / 1.375 - 1 = 0.0909..
    assert bench.ratio_error(0.060, 0.040, 0.066, 0.048) == pytest.approx(1.5 / 1.375 - 1)
    # a host 20% slower over the whole ladder moves both measured figures alike: the same error
    assert bench.ratio_error(0.060, 0.040, 0.066 * 1.2, 0.048 * 1.2) == pytest.approx(1.5 / 1.375 - 1)


def test_a_row_is_judged_only_under_the_aa_bound_and_quiet(bench):
    assert bench.AA_LIMIT == pytest.approx(0.035)   # half the 7% median goal
    assert bench.row_status(0.025, ["quiet", "quiet"]) == "judged"
    assert bench.row_status(0.025, ["quiet", "busy, measured ahead of it"]) == "judged"
    assert bench.row_status(0.048, ["quiet", "quiet"]) == "not judged (A/A spread 4.8%)"
    assert bench.row_status(0.035, ["quiet", "quiet"]) == "not judged (A/A spread 3.5%)"   # at the bound: not under
    assert bench.row_status(math.nan, ["quiet"]) == "not judged (A/A spread nan%)"
    assert bench.row_status(0.01, ["quiet", "busy"]) == "not judged (busy)"


def test_the_row_verdict_is_its_fastest_blocks(bench):
    g = {"medians": [0.050, 0.045, 0.047], "verdicts": ["busy", "quiet", "busy"]}
    assert bench.fastest_verdict(g) == "quiet"
    assert bench.fastest_verdict({"medians": [], "verdicts": []}) == "unknown"


def test_judge_counts_only_the_judged_rows(bench, capsys):
    rows = [("m", "a", 0.04, 0.01, "judged"), ("m", "b", -0.08, 0.02, "judged"),
            ("m", "c", 0.40, 0.03, "not judged (A/A spread 4.8%)")]
    bench.judge(rows, [("m", 0.02)])
    out = capsys.readouterr().out
    # judged: |0.04|, |-0.08| -> median 6.0%, worst 8.0%; all: 4, 8, 40 -> median 8.0%, worst 40.0%
    assert "all rows: step time |error| median 8.0% (goal <= 7%), worst 40.0%" in out
    assert "judged rows: step time |error| median 6.0% (goal <= 7%), worst 8.0%" in out
    assert "step time goal met, peak goal met; 1 of 3 rows not judged" in out


def test_the_summary_by_model_with_and_without_the_bf16_rows(bench):
    rows = [("GPT", "mb x2", -0.10, 0.01, "judged"), ("GPT", "bf16", 0.30, -0.02, "judged"),
            ("GPT", "sgd", 0.02, 0.03, "not judged (busy)"),
            ("Llama", "ckpt on + bf16", -0.50, 0.04, "judged"), ("Llama", "seq x2", 0.06, math.nan, "judged")]
    lines = bench.by_model(rows, [("GPT", 0.02), ("Llama", 0.031)]).split("\n")
    # GPT: |errors| 10, 30, 2 -> median 10.0%, worst 30.0% (bf16); without bf16: 10, 2 -> median 6.0%, worst 10.0%
    assert lines[1].split() == ["GPT", "3", "10.0%", "30.0%", "(bf16)", "6.0%,", "10.0%", "3.0%", "2.0%"]
    # Llama: 50, 6 -> median 28.0%; without bf16: 6 alone; the peak's worst 4% (NaN left out)
    assert lines[2].split() == ["Llama", "2", "28.0%", "50.0%", "(ckpt", "on", "+", "bf16)", "6.0%,", "6.0%", "4.0%",
                                "3.1%"]
    # all five: 2, 6, 10, 30, 50 -> median 10.0%; without bf16: 2, 6, 10 -> 6.0%; no A/A of its own
    assert lines[3].split() == ["all", "5", "10.0%", "50.0%", "(ckpt", "on", "+", "bf16)", "6.0%,", "10.0%",
                                "4.0%", "-"]


def test_the_uncalibrated_share_of_an_expectation(bench):
    from types import SimpleNamespace

    # rows (op, category, calls, plan s, factor, expected s, by): 3 ms of 12 at the device model: 25%
    e = SimpleNamespace(step_s=0.012, rows=[("mm", "matmul", 1, 0.003, 1.0, 0.003, "device model"),
                                            ("add", "memory-bound", 1, 0.006, 1.5, 0.009, "group")])
    assert bench.uncalibrated_share(e) == pytest.approx(0.25)


def test_the_measured_process_keeps_glibcs_freed_heap_pages_unless_the_user_says(bench):
    kept = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824"}
    # re-executed with both tunables added to the user's environment
    assert bench.heap_env({"PATH": "/bin"}, False) == {"PATH": "/bin", **kept}
    # either one set by the user: theirs stand, no re-execution; --glibc-heap: glibc's defaults
    assert bench.heap_env({"MALLOC_TRIM_THRESHOLD_": "0"}, False) is None
    assert bench.heap_env({}, True) is None
