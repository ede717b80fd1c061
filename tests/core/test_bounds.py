"""No figure past its physical bound unflagged (issue 18): MFU/HFU/TFLOPS against the peak, the
re-check of a calibrated peak, and the views that show a flagged figure. The trace's shares and
the profiler's overhead are in tests/measure/test_trace.py."""
import math
from types import SimpleNamespace

import pytest
import torch

import tunekit
from tunekit.core.bounds import above_peak, mark
from tunekit.core.records import History, ProfileRecord
from tunekit.core.summary import history_view, table_html, to_html, to_line, to_text
from tunekit.measure import peaks

CALIBRATED = ("MFU 150% / HFU 151% of 0.085 TFLOPS: the calibrated peak is too low (calibrated MAMF); "
              "recalibrate on a quiet machine: tunekit.calibrate(force=True)")


# --- the pure check ---------------------------------------------------------------------------------


def test_above_peak_says_why_for_each_kind_of_peak():
    assert above_peak(1.5, 1.5058823529411764, 0.085, "calibrated MAMF", "calibrated") == CALIBRATED
    assert above_peak(1.2, 1.2, 989.0, "H100 SXM bf16", "spec") == (
        "MFU 120% / HFU 120% of 989 TFLOPS: above the spec-sheet peak (H100 SXM bf16); the dtype whose peak "
        "was used does not match what ran (--dtype), or the FLOPs are over-counted")
    assert above_peak(2.0, 2.0, 1.0, "given: 1.0 TFLOPS", "given") == (
        "MFU 200% / HFU 200% of 1 TFLOPS: above the given peak (given: 1.0 TFLOPS), which is too low")
    # the executed FLOPs fit under the peak: the model FLOPs are what is wrong, not the peak
    assert above_peak(1.2, 0.9, 1.0, "x", "calibrated") == (
        "MFU 120% / HFU 90% of 1 TFLOPS: MFU is above 100% while HFU is not, so the model FLOPs exceed the "
        "FLOPs that ran (a --model-flops or formula that does not match the work)")
    assert above_peak(1.0, 1.0, 1.0) is None and above_peak(math.nan, math.nan, None) is None  # 100% is no bound
    assert mark("MFU 150.0%", 1.5, "why") == "MFU 150.0% ⚠" and mark("MFU 90.0%", 0.9, "why") == "MFU 90.0%"
    assert mark("MFU 150.0%", 1.5, None) == "MFU 150.0%"   # a record nobody flagged is shown as it is


# --- the re-check of a calibrated peak ----------------------------------------------------------------


@pytest.fixture
def matmul_in(monkeypatch):
    """The re-check's timed matmul takes ``matmul_in.s`` seconds; ``matmul_in.calls`` counts them."""
    state = SimpleNamespace(s=1e-6, calls=0)

    def fake(fn, device, warmup=0, repeats=1, **kw):
        state.calls += 1
        return [2 * state.s, state.s]

    monkeypatch.setattr(peaks, "time_repeats", fake)
    return state


def test_a_figure_above_a_calibrated_peak_rechecks_it_once_and_a_faster_matmul_replaces_it(calibrations, matmul_in):
    calibrations.cache(tflops=0.05)  # quiet and fresh: trusted
    peak = peaks.resolve_peak("cpu", "fp32")
    assert (peak.kind, peak.tflops) == ("calibrated", 0.05)
    # 6e8 FLOPs in 0.01 s = 0.06 TFLOPS = 120% of 0.05: re-checked; the 32x32x32 matmul in 1 us reached
    # 2*32**3 / 1e-6 / 1e12 = 0.065536 TFLOPS, the peak now: 0.06 / 0.065536 = 91.6%, within the bound
    r = peaks.rates(6e8, 6e8, 0.01, peak, "cpu", "fp32")
    assert r.peak.tflops == 0.065536 and r.hfu == pytest.approx(0.06 / 0.065536) and r.above_peak is None
    assert "raised from 0.05 by a re-check" in r.peak.source and r.tflops == pytest.approx(0.06)
    cached = peaks.cached_calibration("cpu", "fp32")   # the faster matmul replaced the cached peak
    assert cached.tflops == 0.065536 and cached.raised.startswith("raised from 0.05 by a re-check")
    assert cached.sweep[-1] == [32, 32, 32, 0.065536]
    # 1e9 FLOPs in 0.01 s = 0.1 TFLOPS = 152.6% of 0.065536: no second matmul in this process, flagged
    r = peaks.rates(1e9, 1e9, 0.01, peaks.resolve_peak("cpu", "fp32"), "cpu", "fp32")
    assert matmul_in.calls == 1 and r.above_peak.startswith(
        "MFU 153% / HFU 153% of 0.0655 TFLOPS: the calibrated peak is too low (calibrated MAMF on ")
    assert ("re-checked once in this process already (a re-check at 32x32x32 reached 0.0655 TFLOPS, above "
            "the calibrated 0.05)") in r.above_peak


def test_a_recheck_no_faster_than_the_peak_leaves_it_and_flags_the_figure(calibrations, matmul_in):
    calibrations.cache(tflops=0.05)
    matmul_in.s = 1.0  # 2*32**3 / 1 s = 6.5536e-08 TFLOPS: slower than the calibration
    r = peaks.rates(1e9, 1e9, 0.01, peaks.resolve_peak("cpu", "fp32"), "cpu", "fp32")
    # 0.1 TFLOPS against 0.05 = 200%
    assert r.peak.tflops == 0.05 and r.mfu == pytest.approx(2.0)
    assert peaks.cached_calibration("cpu", "fp32").raised is None
    assert r.above_peak.startswith("MFU 200% / HFU 200% of 0.05 TFLOPS: the calibrated peak is too low") and (
        "a re-check at 32x32x32 reached 6.55e-08 TFLOPS, no faster than the calibration" in r.above_peak)


def test_spec_and_given_peaks_are_flagged_without_a_recheck(calibrations, matmul_in):
    given = peaks.rates(3e9, 3e9, 1.0, peaks.resolve_peak("cpu", "fp32", given=0.001), "cpu", "fp32")
    # 3e9 FLOPs in 1 s = 0.003 TFLOPS = 300% of the given 0.001
    assert given.mfu == pytest.approx(3.0) and given.above_peak.startswith("MFU 300% / HFU 300% of 0.001 TFLOPS: "
                                                                          "above the given peak")
    spec = peaks.rates(2e15, 2e15, 1.0, peaks.Peak(989.0, "H100 SXM bf16", "spec"), "cpu", "bf16")
    assert "above the spec-sheet peak" in spec.above_peak and matmul_in.calls == 0 and calibrations.sweeps == 0


def test_a_profiled_block_above_a_calibrated_peak_is_flagged_where_it_is_read(calibrations, matmul_in):
    calibrations.cache(tflops=1e-9)
    matmul_in.s = 1.0  # the re-check reaches 6.5536e-08 TFLOPS: raised, yet any real matmul is faster
    x, w = torch.randn(64, 64), torch.randn(64, 64)
    for _ in range(2):  # the second run reuses the count and has a clean clock: TFLOPS and MFU
        with tunekit.profile(name="mm", inputs=(x, w)) as rec:
            x @ w
    assert rec.flops_source == "cached" and rec.mfu > 1 and rec.peak_tflops == 6.5536e-08
    assert rec.above_peak.startswith("MFU ") and "the calibrated peak is too low" in rec.above_peak
    assert "a re-check at 32x32x32 reached 6.55e-08 TFLOPS, above the calibrated 1e-09" in rec.above_peak
    row = tunekit.history().iloc[-1]
    assert row["above_peak"] == rec.above_peak and row["mfu"] == rec.mfu   # raw numbers in the DataFrame
    view = history_view(tunekit.history())
    assert view["MFU"].iloc[-1].endswith("% ⚠") and view["TFLOPS"].iloc[-1].endswith(" ⚠")


def test_a_lab_run_above_a_calibrated_peak_is_rechecked_then_flagged(calibrations, matmul_in, make_lab):
    # the user's case: a peak calibrated low (here 1e-9 TFLOPS), a Lab run on a quiet machine
    from tunekit.core.results import runs_view
    from tunekit.core.run_text import summary_lines

    calibrations.cache(tflops=1e-9)
    matmul_in.s = 1.0
    lab = make_lab(micro_batch=2, seq_len=32)
    r = lab.run(steps=1, warmup=0)
    assert r.mfu > 1 and r.peak_tflops == 6.5536e-08 and lab.peaks["fp32"].tflops == 6.5536e-08
    assert r.above_peak.startswith("MFU ") and "a re-check at 32x32x32 reached 6.55e-08 TFLOPS" in r.above_peak
    view = runs_view(lab.results())
    assert view["MFU"].iloc[-1].endswith("% ⚠") and view["HFU"].iloc[-1].endswith("% ⚠")
    assert "% ⚠</td>" in table_html(view)
    assert any(f"⚠ above the peak: {r.above_peak}" in line for line in summary_lines(r))
    back = tunekit.lab.runlog.RunLog.load(lab.log.path)[-1]      # the log keeps the flag
    assert back.above_peak == r.above_peak


@pytest.mark.parametrize("matmul_s", [1e-6, 1.0])   # the re-check beats the peak / does not
def test_a_distributed_run_is_rechecked_and_flagged_by_the_lab(calibrations, matmul_in, make_lab, monkeypatch,
                                                              matmul_s):
    from tunekit.core.results import RunResult
    from tunekit.parallel import launch

    calibrations.cache(tflops=0.05)
    matmul_in.s = matmul_s
    # rank 0's result: 1.2e9 FLOPs per step in 0.01 s on 2 ranks = 0.06 TFLOPS each, 120% of 0.05; the
    # workers know the peak only as a number, so the Lab judges it
    sent = {"label": "ddp", "flops_per_step": 1.2e9, "model_flops_per_step": 1.2e9, "step_s": 0.01,
            "world_size": 2, "mfu": 1.2, "hfu": 1.2, "above_peak": "judged by the worker", "notes": []}
    monkeypatch.setattr(launch, "launch", lambda spec, nproc, **kw: RunResult.from_dict(sent))
    lab = make_lab(micro_batch=2, seq_len=32)
    r = lab.run(steps=1, warmup=0, parallel="ddp", nproc=2)
    if matmul_s == 1e-6:  # 0.065536 TFLOPS per device now: 0.06 / 0.065536 = 91.6%
        assert r.peak_tflops == 0.065536 and r.mfu == pytest.approx(0.06 / 0.065536) and r.above_peak is None
    else:
        assert r.peak_tflops == 0.05 and r.mfu == pytest.approx(1.2)
        assert r.above_peak.startswith("MFU 120% / HFU 120% of 0.05 TFLOPS: the calibrated peak is too low")


# --- the views ---------------------------------------------------------------------------------------


def _record(**changes):
    rec = ProfileRecord(name="step", wall_s=0.01, flops=1.28e9, flops_source="cached", model_flops=1.275e9,
                        tflops=0.128, mfu=1.5, hfu=1.5058823529411764, peak_tflops=0.085,
                        peak_tflops_source="calibrated MAMF", device="cpu", above_peak=CALIBRATED)
    for k, v in changes.items():
        setattr(rec, k, v)
    return rec


def test_a_flagged_figure_is_marked_in_every_view_of_a_record():
    rec = _record()
    text = to_text(rec)
    assert text.splitlines()[0] == "⏱ step · cpu · ⚠ above the peak"
    assert "  speed      0.128 TFLOPS ⚠ · MFU 150.0% ⚠ · HFU 150.6% ⚠ of 0.085 TFLOPS [calibrated MAMF]" in text
    assert f"  bound      ⚠ above the peak: {CALIBRATED}" in text
    assert f" · 1.3 GFLOP · 0.128 TFLOPS ⚠ · MFU 150.0% ⚠ · ⚠ above the peak ({CALIBRATED})" in to_line(rec)
    html = to_html(rec)
    assert "class='tk-bound'" in html and "MFU 150.0% ⚠" in html
    plain = _record(mfu=0.5, hfu=0.5, tflops=0.0425, above_peak=None)   # within the bound: no mark anywhere
    assert "⚠" not in to_text(plain) + to_line(plain) + to_html(plain)


def test_the_line_says_why_tflops_is_missing_from_the_note_of_that_kind():
    from tunekit.core.notes import Note

    rec = _record(tflops=math.nan, mfu=math.nan, hfu=math.nan, above_peak=None,
                  notes=["CPU peak is exact only where /proc/self/clear_refs works",   # 'peak', not why
                         Note("rates.none", "slowed by something (any words)"), Note("rates.none", "a second")])
    # 1.28e9 FLOPs -> '1.3 GFLOP'; each figure a part of its own, the missing rate named
    assert to_line(rec).endswith(" · 1.3 GFLOP · TFLOPS n/a · MFU n/a · slowed by something (any words)")
    # no note of that kind: none shown (matching words, 'peak' showed this one)
    assert "clear_refs" not in to_line(_record(tflops=math.nan, above_peak=None, notes=rec.notes[:1]))


def test_tables_mark_only_the_figures_past_the_bound():
    h = History()
    h.append(_record())
    h.append(_record(name="model flops too high", mfu=1.2, hfu=0.9, tflops=0.0765,
                     above_peak=above_peak(1.2, 0.9, 0.085, "calibrated MAMF", "calibrated")))
    h.append(_record(name="fine", mfu=0.5, hfu=0.5, tflops=0.0425, above_peak=None))
    view = history_view(h.to_frame())
    assert list(view["MFU"]) == ["150.0% ⚠", "120.0% ⚠", 0.5]
    assert list(view["HFU"]) == ["150.6% ⚠", 0.9, 0.5]       # HFU 90% is within the peak
    assert list(view["TFLOPS"]) == ["0.128 ⚠", 0.0765, 0.0425]
    html = table_html(view)
    assert "<td>150.0% ⚠</td>" in html and "<td>90.0%</td>" in html and "<td>50.0%</td>" in html
