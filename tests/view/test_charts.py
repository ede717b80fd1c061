"""Charts that cannot mislead: axis ranges, log ticks, slowed cells, baselines, labels by
difference (tunekit.view.axes, tunekit.core.baseline, the figures built on them)."""
import math

import pandas as pd
import pytest

from tunekit.core.baseline import comm_lines, comm_total, difference, layout, pick, toggles_of
from tunekit.core.results import RunResult, results_frame
from tunekit.core.toggles import Toggles
from tunekit.view.axes import log_ticks, nice_ticks, slowed_by, tick_label, value_range


@pytest.mark.parametrize("values,expected", [
    ([0.00603], [0.0, 0.006633]),            # one point: above zero, not plotly's [-1, 1]
    ([2.0, 2.0, 2.0], [0.0, 2.2]),           # a flat series
    ([0.0, 0.0], [0.0, 1.0]),                # all zero
    ([], [0.0, 1.0]),                        # nothing measured
    ([math.nan, None, 4.0], [0.0, 4.4]),     # missing figures are skipped
    ([-1.0, 3.0], [-1.4, 3.4]),              # below zero only for negative values
])
def test_value_range_starts_at_zero_and_shows_one_point(values, expected):
    assert value_range(values) == expected


@pytest.mark.parametrize("values,ticks,texts", [
    ([1, 2, 4, 8, 16], [1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"]),   # every k, 16 included
    ([16.0, 1.0, 4.0, 4.0], [1, 4, 16], ["1", "4", "16"]),
    (list(range(1, 1001, 7)), [1, 2, 5, 10, 20, 50, 100, 200, 500], ["1", "2", "5", "10", "20", "50", "100",
                                                                      "200", "500"]),
    ([0.5, 1.5], [0.5, 1.5], ["0.5", "1.5"]),
    ([0, -3], [], []),
])
def test_log_ticks_label_the_values_not_minor_ticks(values, ticks, texts):
    assert log_ticks(values) == (ticks, texts)


def test_nice_ticks_and_labels():
    assert nice_ticks(89.0, 110.7) == [90.0, 95.0, 100.0, 105.0, 110.0]
    assert nice_ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert [tick_label(v) for v in (0, 1.0, 2500.0, 0.30000000000000004, 1234.5, 3e7, 1e-5)] == \
        ["0", "1", "2,500", "0.3", "1,234", "3e+07", "1e-05"]


@pytest.mark.parametrize("row,why", [
    ({"flops_source": "counted"}, "FLOP counting"),
    ({"flops_source": "cached", "trace": None, "memory": None}, None),
    ({"flops_source": "cached", "trace": "12 ops", "memory": math.nan}, "profiler trace"),
    ({"flops_source": "counted", "trace": None, "memory": "3 MiB peak"}, "FLOP counting and memory history"),
])
def test_slowed_by_names_what_slowed_a_cell(row, why):
    assert slowed_by(row) == why


def _run(run_id, label="baseline", tps=1000.0, **toggles):
    """A finished run as the Lab logs it: seq_len and attention resolved to the model's."""
    r = RunResult.from_dict({"run_id": run_id, "label": label, "steps": 2, "warmup": 0, "tokens_per_step": 32,
                             "tokens_per_s": tps, "step_s": 0.032, "model": "GPT", "device": "cpu",
                             "params_bytes": 1, "grads_bytes": 1, "optimizer_bytes": 2,
                             "peak_tflops_source": "given", "peak_source": "rss"})
    r.toggles = Toggles(seq_len=128, attention="sdpa").replace(**toggles)
    return r


def test_the_baseline_is_the_run_with_default_toggles_not_the_first_and_labels_say_the_difference():
    runs = [_run(0, "bf16", precision="bf16"), _run(1), _run(2, "ckpt", checkpointing=True),
            _run(3, "mb=16", micro_batch=16)]
    i, why = pick(runs)
    assert i == 1 and why.startswith("run #1, the newest run with every toggle at its default")
    assert [difference(r, runs[i]) for r in runs] == ["bf16", "baseline", "ckpt", "mb=16"]
    # against the bf16 run, the fp32 runs say so
    i, why = pick(runs, baseline=0)
    assert i == 0 and why == "run #0 (bf16), the baseline asked for"
    assert [difference(r, runs[0]) for r in runs] == ["baseline", "fp32", "fp32 ckpt", "fp32 mb=16"]
    with pytest.raises(ValueError, match="no run #7 to compare with: the runs are #0, #1, #2, #3"):
        pick(runs, baseline=7)
    # no default run: the first that finished, said
    bad = RunResult.failed(Toggles(micro_batch=64), "mb=64", "out of memory", [], run_id=5)
    i, why = pick([bad, runs[0], runs[2]])
    assert i == 1 and "the first run that finished: no run has every toggle at its default" in why
    assert difference(_run(9), runs[1]) == "= baseline"


def test_toggles_come_back_from_a_dataframe_row_and_distributed_runs_show_layout_and_bytes():
    runs = [_run(0), _run(1, "ddp", micro_batch=16)]
    runs[1].world_size, runs[1].parallel, runs[1].nodes = 2, "ddp", 1
    runs[1].comm = {"by_kind": {"all_reduce": {"count": None, "bytes": 3 * 2**20},
                                "broadcast": {"count": 1, "bytes": 512}},
                    "by_scope": {"intra": {"count": None, "bytes": 3 * 2**20 + 512}}}
    rows = [dict(r) for _, r in results_frame(runs).iterrows()]
    assert [toggles_of(r) for r in rows] == [r.toggles for r in runs]
    assert [layout(r) for r in rows] == ["1 process", "ddp · 2 ranks · 1 node"]
    assert difference(rows[1], rows[0]) == "ddp · 2 ranks · 1 node mb=16"
    assert comm_lines(runs[1].comm) == ["by kind: all_reduce 3.0 MiB · broadcast 512 B (1 call)",
                                        "by scope: within a node 3.0 MiB"]
    assert comm_lines(None) == [] and math.isnan(comm_total(None))
    assert comm_total(runs[1].comm) == 3 * 2**20 + 512


def test_the_runs_table_has_no_raw_none_and_compares_with_the_baseline(tmp_path):
    from tunekit.cli.report_html import runs_report, runs_table

    runs = [_run(0, "bf16", tps=2000.0, precision="bf16"), _run(1, tps=1000.0),
            _run(2, "ckpt", tps=800.0, checkpointing=True)]
    view = runs_table(runs, 1)
    assert view["run"].tolist() == ["bf16", "baseline", "ckpt"]
    assert view["vs baseline"].tolist() == ["2.00x", "1.00x", "0.80x"]
    assert "layout" not in view  # single-process runs: no distributed columns at all
    page = runs_report(runs, tmp_path / "r.html").read_text()
    assert "<b>baseline</b>: run #1, the newest run with every toggle at its default" in page
    assert ">None<" not in page and "#2 ckpt (ok)" in page
    page = runs_report(runs, tmp_path / "r.html", baseline=0).read_text()
    assert "#2 fp32 ckpt (ok)" in page and "run #0 (bf16), the baseline asked for" in page


def test_compare_figure_names_runs_by_difference_and_draws_memory_components():
    from tunekit.lab.plots import compare_figure
    from tunekit.view.axes import BASE_COLOR, RUN_COLOR

    runs = [_run(0, "bf16", tps=2000.0, precision="bf16"), _run(1, tps=1000.0),
            _run(2, "ckpt", tps=800.0, checkpointing=True)]
    for r, saved in zip(runs, (15, 22, 3)):
        r.params_bytes, r.grads_bytes, r.optimizer_bytes, r.saved_bytes = 2**20, 2**20, 2 * 2**20, saved * 2**20
        r.peak_mem_bytes, r.peak_mem_source = 500 * 2**20, "CPU process RSS peak (VmHWM)"
    fig = compare_figure(results_frame(runs), baseline=None)
    speed, *memory = fig.data
    assert list(speed.x) == ["#0 bf16", "#1 baseline", "#2 ckpt"]
    assert list(speed.marker.color) == [RUN_COLOR, BASE_COLOR, RUN_COLOR]
    assert list(speed.text) == ["2.00x", "1.00x", "0.80x"]
    assert [t.name for t in memory] == ["parameters", "gradients", "optimizer state",
                                        "saved activations (one micro-batch)"]
    assert list(memory[-1].y) == [15.0, 22.0, 3.0]  # the saving shows; RSS is the text above
    assert list(memory[-1].text) == ["RSS 500.0 MiB"] * 3
    assert list(fig.layout.yaxis2.range) == [0.0, 32.5]   # 26 MiB on top + 25%
    assert compare_figure(pd.DataFrame(results_frame(runs)), baseline=2).layout.meta["baseline"] == 2


def test_plot_history_marks_slowed_cells_and_keeps_one_point_above_zero():
    from tunekit.profiling.plots import plot_history
    from tunekit.view.axes import RUN_COLOR, SLOWED_COLOR

    df = pd.DataFrame({"name": ["a", "a", "b"], "wall_s": [2.9, 0.32, 4.5], "flops_source": ["counted", "cached",
                                                                                           "counted"],
                       "error": [None, None, None], "cpu_peak_delta_bytes": [0.0, 2**20, 2**21],
                       "gpu_peak_delta_bytes": [math.nan] * 3, "tflops": [math.nan, 0.00603, math.nan],
                       "mfu": [math.nan, 0.03, math.nan], "trace": [None] * 3, "memory": [None] * 3})
    fig = plot_history(df)
    wall = fig.data[0]
    assert list(wall.marker.color) == [SLOWED_COLOR, RUN_COLOR, SLOWED_COLOR]
    assert list(wall.marker.pattern.shape) == ["/", "", "/"]
    assert list(wall.text) == ["slowed: FLOP counting", "", "slowed: FLOP counting"]
    assert list(fig.layout.yaxis3.range) == [0.0, 0.006633]  # the one TFLOPS point is not on zero
    assert "slowed by the measuring" in fig.layout.annotations[0].text


def test_the_history_table_says_which_times_were_slowed():
    from tunekit.core.summary import history_view

    df = pd.DataFrame({"name": ["a", "a"], "wall_s": [2.9, 0.32], "flops": [8.56e9, 8.56e9],
                       "flops_source": ["counted", "cached"], "tflops": [math.nan, 0.0268], "mfu": [math.nan, 0.13],
                       "hfu": [math.nan, 0.13], "cpu_peak_delta_bytes": [2**20, 0.0],
                       "gpu_peak_delta_bytes": [math.nan] * 2, "conditions": ["quiet", "busy"],
                       "error": [None, None], "above_peak": [None, None], "trace": [None, None],
                       "memory": [None, None]})
    view = history_view(df)
    assert view["time (s)"].tolist() == ["2.9 (slowed: FLOP counting)", 0.32]
    assert view["GFLOP"].tolist() == [8.56, 8.56] and view["machine"].tolist() == ["quiet", "⚠ busy"]
    assert "MFU/HFU of" not in view                    # no peak column in the frame: nothing said
    # cells of two dtypes: each MFU against its own dtype's peak, which the table says per row
    view = history_view(df.assign(dtype=["fp32", "bf16"], peak_tflops=[math.nan, 0.2]))
    assert view["MFU/HFU of"].tolist() == ["n/a", "bf16 0.2 TFLOPS"]
    assert list(view.columns[view.columns.get_loc("HFU"):][:2]) == ["HFU", "MFU/HFU of"]
    from tunekit.core.summary import mfu_peaks

    assert mfu_peaks([None, math.nan], [1.0, 2.0]) == ["1 TFLOPS", "2 TFLOPS"]   # a peak whose dtype is unknown


def _history_with_every_slower():
    """A History of four cells: counted, traced (torch.profiler), memory timeline, clean."""
    from tunekit.core.breakdown import Breakdown, MemoryTimeline
    from tunekit.core.records import History, ProfileRecord

    h = History()
    h.append(ProfileRecord("count", wall_s=2.9, flops_source="counted"))
    # a trace whose one-line summary is "" (no wall time to share out) still slowed the cell
    h.append(ProfileRecord("trace", wall_s=1.5, flops_source="cached",
                           trace=Breakdown(device="cpu", wall_s=math.nan, seconds={})))
    h.append(ProfileRecord("mem", wall_s=0.9, flops_source="cached",
                           memory=MemoryTimeline(device="cpu", times_s=[0.0], bytes={})))
    h.append(ProfileRecord("clean", wall_s=0.32, flops_source="cached"))
    return h.to_frame()


def test_history_default_view_marks_cells_slowed_by_trace_and_memory_too():
    from tunekit.core.summary import HISTORY_COLUMNS, history_view, readable, table_text

    df = _history_with_every_slower()
    assert [s if isinstance(s, str) else None for s in df["slowed_by"]] == [
        "FLOP counting", "profiler trace", "memory history", None]
    curated = readable(df[list(HISTORY_COLUMNS)], history_view)  # what tunekit.history() returns
    assert "trace" not in curated.columns                         # the mark survives the curation
    assert history_view(curated)["time (s)"].tolist() == [
        "2.9 (slowed: FLOP counting)", "1.5 (slowed: profiler trace)", "0.9 (slowed: memory history)", 0.32]
    assert "(slowed: profiler trace)" in table_text(history_view(curated))


def test_plot_history_marks_traced_cells_from_the_default_history_view():
    from tunekit.core.summary import HISTORY_COLUMNS
    from tunekit.profiling.plots import plot_history
    from tunekit.view.axes import RUN_COLOR, SLOWED_COLOR

    wall = plot_history(_history_with_every_slower()[list(HISTORY_COLUMNS)]).data[0]
    assert list(wall.marker.color) == [SLOWED_COLOR] * 3 + [RUN_COLOR]
    assert list(wall.text) == ["slowed: FLOP counting", "slowed: profiler trace", "slowed: memory history", ""]


def test_the_report_marks_a_traced_cell(monkeypatch):
    from tunekit.cli.summary import SessionSummary
    from tunekit.core.breakdown import Breakdown
    from tunekit.core.records import History, ProfileRecord
    from tunekit.measure import history as hist

    h = History()
    h.append(ProfileRecord("t", wall_s=1.5, flops_source="cached",
                           trace=Breakdown(device="cpu", wall_s=1.5, seconds={"matmul/linear": 1.0})))
    monkeypatch.setattr(hist, "HISTORY", h)
    assert "1.5 (slowed: profiler trace)" in SessionSummary().html
