"""tunekit.diff: what changed between two runs, from records built by hand (exact numbers) and from
two real Lab runs (only what holds on a busy machine is asserted)."""
import math
import warnings

import pytest

import tunekit
from tunekit.core.breakdown import Breakdown
from tunekit.core.conditions import Conditions
from tunekit.core.records import ProfileRecord
from tunekit.core.results import RunResult
from tunekit.core.toggles import Toggles

MiB = 2**20


def _run(run_id, label="baseline", step_s=0.032, trace=None, **toggles):
    r = RunResult.from_dict({"run_id": run_id, "label": label, "steps": 2, "warmup": 0, "tokens_per_step": 32,
                             "tokens_per_s": 32 / step_s, "step_s": step_s, "model": "GPT", "n_params": 1000,
                             "device": "cpu", "params_bytes": 4000, "grads_bytes": 4000, "optimizer_bytes": 8000,
                             "peak_mem_bytes": 100 * MiB, "peak_tflops_source": "given", "peak_source": "rss"})
    r.toggles = Toggles(seq_len=128, attention="sdpa").replace(**toggles)
    r.trace = trace
    return r


def _trace(seconds, ops):
    return Breakdown(device="cpu", wall_s=sum(seconds.values()), seconds=seconds,
                     top_ops=[{"op": o, "category": "x", "self_s": s, "calls": c} for o, s, c in ops])


def test_two_runs_say_what_changed_and_what_moved_the_step_most():
    a = _run(0, step_s=0.040, trace=_trace({"matmul/linear": 0.030, "optimizer": 0.010},
                                           [("aten::mm", 0.030, 12), ("aten::mul_", 0.010, 28)]))
    b = _run(1, "bf16", step_s=0.025, precision="bf16",
             trace=_trace({"matmul/linear": 0.012, "optimizer": 0.010, "memory copy": 0.003},
                          [("aten::mm", 0.012, 12), ("aten::mul_", 0.010, 28), ("aten::_to_copy", 0.003, 24)]))
    b.peak_mem_bytes = 120 * MiB
    d = tunekit.diff(a, b)
    assert d.changed == [("precision", "fp32", "bf16")]
    lines = d.summary.splitlines()
    assert lines[0] == "run #1 (bf16) vs run #0 (baseline)"
    assert lines[1] == "changed: precision fp32 -> bf16"
    assert lines[2] == "step 40.0 ms -> 25.0 ms (1.60x faster)"        # 40 / 25 = 1.6
    assert lines[3] == "peak memory 100.0 MiB -> 120.0 MiB (+20.0 MiB)"
    assert lines[4] == "moved most: matmul/linear 30.0 ms -> 12.0 ms (-18.0 ms)"   # optimizer moved 0
    assert lines[5] == "ops added: aten::_to_copy (3.0 ms, 24 calls)"
    assert [o["op"] for o in d.added] == ["aten::_to_copy"] and d.removed == []
    t = d.table
    step = t[(t.section == "step") & (t.what == "step time")].iloc[0]
    assert step.change == pytest.approx(0.025 / 0.040 - 1)                 # -37.5%
    cats = t[t.section == "time by category"]
    assert list(cats.what) == ["matmul/linear", "optimizer", "memory copy"]   # largest first
    assert math.isnan(cats.iloc[2].change)                                 # 0 -> 3 ms: no ratio
    assert "ops added/removed" not in d.summary        # both traces kept every op (under the cut)
    fig = d.figure()
    assert [tr.name for tr in fig.data] == ["run #0 (baseline)", "run #1 (bf16)"]
    assert list(fig.data[1].y) == pytest.approx([12.0, 10.0, 3.0])


def test_mfus_against_different_peaks_say_each_peak():
    # fp32 at 1.0% of a T4's 8.1 TFLOPS, bf16 at 8.1% of its 65: each against its own dtype's peak
    a, b = _run(0, step_s=0.040), _run(1, "bf16", step_s=0.050, precision="bf16")
    a.mfu, a.peak_tflops, a.compute_dtype = 0.01, 8.1, "fp32"
    b.mfu, b.peak_tflops, b.compute_dtype = 0.081, 65.0, "bf16"
    d = tunekit.diff(a, b)
    peak = d.table[d.table.what == "MFU's peak"].iloc[0]
    assert (peak.a, peak.b, peak.unit) == (8.1, 65.0, "tflops")
    assert list(d.table.what[:4]) == ["step time", "tokens/s", "MFU", "MFU's peak"]   # no fastest step, TFLOPS here
    [note] = [n for n in d.notes if n.kind == "diff.peaks"]
    assert note == ("each side's MFU is against its own peak (fp32 8.1 TFLOPS -> bf16 65 TFLOPS): the MFUs do not "
                    "compare, the step times do")
    assert "MFU's peak" in d.text() and "8.1 TFLOPS" in d.text()
    b.peak_tflops, b.compute_dtype = 8.1, "fp32"                     # one peak: nothing to say
    assert not [n for n in tunekit.diff(a, b).notes if n.kind == "diff.peaks"]


def test_the_table_shows_the_rows_that_changed_most_and_says_how_to_see_the_rest():
    ops_a = [(f"op{i}", 0.001, 1) for i in range(20)]
    ops_b = [(f"op{i}", 0.001 + 0.0001 * i, 1) for i in range(20)]      # op i moved by i * 0.1 ms
    a = _run(0, step_s=0.040, trace=_trace({"matmul/linear": 0.030, "optimizer": 0.010}, ops_a))
    b = _run(1, "b", step_s=0.020, trace=_trace({"matmul/linear": 0.010, "optimizer": 0.010}, ops_b))
    d = tunekit.diff(a, b)
    # 28 rows: 6 figures (step time, tokens/s, peak memory, parameters, gradients, optimizer
    # states: the others measured on neither side), 2 categories, 20 ops
    assert len(d.table_all) == 28 and len(d.table) == 15
    # weights: tokens/s 800 -> 1600 is +100%; step time 40 -> 20 ms is -50%; matmul moved 20 ms of
    # the 40 ms traced step (0.5); op i moved i * 0.1 ms of 40 ms (op19 0.0475 ... op8 0.02, op7
    # 0.0175 is the 16th); memory and the optimizer did not move (0)
    assert list(d.table.what) == ["step time", "tokens/s", "matmul/linear"] + [f"op{i}" for i in range(19, 7, -1)]
    assert "13 more rows left out" in repr(d.table) and ".table_all" in repr(d.table)
    assert d.table.loc[0, "change"] == pytest.approx(-0.5)      # the DataFrame keeps raw numbers
    everything = tunekit.diff(a, b, rows=None).table
    assert len(everything) == 28 and "left out" not in repr(everything)
    assert len(tunekit.diff(a, b, rows=3).table) == 3
    with pytest.raises(ValueError, match="rows must be a whole number >= 1, got 0"):
        tunekit.diff(a, b, rows=0)


def test_runs_read_back_from_the_log_diff_like_the_live_ones():
    a, b = _run(0, step_s=0.040), _run(1, "mb=16", step_s=0.080, micro_batch=16)
    assert tunekit.diff(a.to_dict(), b.to_dict()).summary == tunekit.diff(a, b).summary
    assert "step 40.0 ms -> 80.0 ms (2.00x slower)" in tunekit.diff(a, b).summary


def test_untraced_runs_are_compared_without_inventing_op_figures():
    d = tunekit.diff(_run(0), _run(1, "ckpt", checkpointing=True, trace=_trace({"matmul/linear": 0.02}, [])))
    assert not (d.table.section == "time by category").any()
    assert [n.kind for n in d.notes] == ["diff.one_trace"]
    with pytest.raises(ValueError, match="trace both runs"):
        d.figure()


def test_a_busy_or_failed_side_is_said():
    b = _run(1, "bf16", precision="bf16")
    b.conditions = Conditions(verdict="busy", reason="other processes used 1.0 of 2 CPUs")
    b.status, b.step_s = "failed", math.nan
    d = tunekit.diff(_run(0), b)
    assert sorted(n.kind for n in d.notes) == ["diff.busy", "diff.failed_run"]
    step = d.table[d.table.what == "step time"].iloc[0]
    assert math.isnan(step.b) and math.isnan(step.change)
    assert "step " not in d.summary.splitlines()[2]      # no speed-up claimed from a failed run


def test_what_cannot_be_compared_is_refused_before_any_work():
    other = _run(1)
    other.model, other.n_params = "LlamaForCausalLM", 5000
    with pytest.raises(ValueError, match=r"different models \(GPT, 1k parameters vs LlamaForCausalLM, 5k\)"):
        tunekit.diff(_run(0), other)
    with pytest.raises(TypeError, match="records of one kind: got a RunResult and a ProfileRecord"):
        tunekit.diff(_run(0), ProfileRecord("cell"))
    with pytest.raises(TypeError, match="got str"):
        tunekit.diff("run 0", "run 1")


def test_two_profiled_records_compare_time_and_memory_and_leave_out_what_neither_measured():
    a = ProfileRecord("fp32", wall_s=0.5, flops=2e9, cpu_peak_delta_bytes=10 * MiB)
    b = ProfileRecord("bf16", wall_s=0.25, flops=2e9, cpu_peak_delta_bytes=12 * MiB)
    d = tunekit.diff(a, b)
    assert d.summary.splitlines()[:3] == ["bf16 vs fp32", "step 500.0 ms -> 250.0 ms (2.00x faster)",
                                          "peak memory 10.0 MiB -> 12.0 MiB (+2.0 MiB)"]
    assert list(d.table.what) == ["time", "FLOPs", "CPU peak"]     # no GPU row: neither side measured one


def test_a_real_bf16_toggle_adds_casts_to_the_trace():
    lab = tunekit.Lab(seq_len=32)
    a = lab.run(steps=1, warmup=0, micro_batch=2, trace=True, verbose=False)
    b = lab.run(steps=1, warmup=0, micro_batch=2, precision="bf16", trace=True, verbose=False)
    d = tunekit.diff(a, b)
    assert d.changed == [("precision", "fp32", "bf16")]
    # autocast casts weights and activations to bf16: copy ops run that the fp32 step has not
    assert any("ToCopy" in o["op"] or "_to_copy" in o["op"] for o in d.added) or \
        any(r["what"] == "aten::_to_copy" and r["calls_b"] > r["calls_a"] for r in d.rows if r["section"] == "ops")
    t = d.table_all     # every row: the unchanged ones (parameters) too
    assert t[t.what == "weight casts"].iloc[0].b > 0 and t[t.what == "parameters"].iloc[0].change == 0.0
    # the model's module scopes, where the profiler records them (not once torch._dynamo is loaded in
    # the process, as after test_bench's compile run): one step of one model, as many calls each
    modules = t[t.section == "modules"]
    assert (modules.calls_a == modules.calls_b).all() and (modules.calls_a > 0).all()
    assert "diff.top_ops" not in [n.kind for n in d.notes]   # each trace kept every op: nothing cut off


def test_the_command_diffs_two_runs_of_a_log_and_refuses_what_it_cannot_read(tmp_path, capsys):
    from tunekit.cli.main import main
    from tunekit.lab.runlog import RunLog

    log = tmp_path / "runs.jsonl"
    for r in (_run(0, step_s=0.040), _run(1, "mb=16", step_s=0.020, micro_batch=16)):
        RunLog(log).add(r)
    assert main(["diff", f"{log}#0", str(log)]) == 0       # a log alone: its last run
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == ["run #1 (mb=16) vs run #0 (baseline)", "changed: micro_batch 8 -> 16",
                       "step 40.0 ms -> 20.0 ms (2.00x faster)"]
    assert any(line.split()[:3] == ["step", "step", "time"] and line.endswith("-50.0%") for line in out)
    assert main(["diff", f"{log}#9", str(log)]) == 2
    assert "no run #9 in the log (its runs: #0, #1)" in capsys.readouterr().err
    assert main(["diff", str(tmp_path / "none.jsonl"), str(log)]) == 2
    assert "none.jsonl: no such log file" in capsys.readouterr().err
    # both sides one run (a log alone is its last run): refused, not a table of +0.0% and "1.00x faster"
    assert main(["diff", str(log), f"{log}#1"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"tunekit diff: error: {log} and {log}#1 both name run #1 (mb=16): name two runs, "
        f"as {log}#0 {log}#1")


def test_a_run_id_that_several_sessions_of_a_shared_log_hold_is_refused_with_a_name_for_each(tmp_path, capsys):
    from tunekit.cli.main import main
    from tunekit.lab.runlog import RunLog

    log = tmp_path / "lab-2026-12-06.jsonl"     # the day's log: each Lab a session numbering from 0
    for session, step_s in (("s1", 0.040), ("s2", 0.020)):
        r = _run(0, f"from {session}", step_s=step_s)
        r.time = "2026-12-06T08:00:00"
        RunLog(log, session=session).add(r)
    assert main(["diff", f"{log}#0", str(log)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"tunekit diff: error: {log}#0 could be any of 2 runs, one per Lab session that shared the log: name one "
        f"as {log}#s1/0 (from s1, 2026-12-06T08:00:00); {log}#s2/0 (from s2, 2026-12-06T08:00:00)")
    assert main(["diff", f"{log}#s1/0", f"{log}#s2/0"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "step 40.0 ms -> 20.0 ms (2.00x faster)"   # no setting changed
    assert main(["diff", f"{log}#s3/0", str(log)]) == 2
    assert "no run #0 of session 's3' in the log (its runs: #s1/0, #s2/0)" in capsys.readouterr().err


def test_the_summary_takes_the_fastest_steps_where_both_runs_have_them():
    a, b = _run(0, step_s=0.050), _run(1, "bf16", step_s=0.040, precision="bf16")
    a.step_s_min, b.step_s_min = 0.030, 0.020        # load slowed b's mean: its fastest step says more
    assert "fastest step 30.0 ms -> 20.0 ms (1.50x faster)" in tunekit.diff(a, b).summary


def test_steps_of_different_sizes_are_compared_per_token():
    # micro_batch 8 -> 16 doubles the tokens of a step (32 -> 64 here): a step 1.5x longer is
    # 2 / 1.5 = 1.33x faster per token, not "1.50x slower"
    a, b = _run(0, step_s=0.040), _run(1, "mb=16", step_s=0.060, micro_batch=16)
    b.tokens_per_step, b.tokens_per_s = 64, 64 / 0.060
    lines = tunekit.diff(a, b).summary.splitlines()
    assert lines[2] == "step 40.0 ms -> 60.0 ms (32 -> 64 tokens a step: 1.33x faster per token)"
    b.precision, b.peak_tflops, a.peak_tflops = "bf16", 65.0, 8.1
    [note] = [n for n in tunekit.diff(a, b).notes if n.kind == "diff.peaks"]
    assert note.endswith("the MFUs do not compare, the times per token do")
    b.tokens_per_step = 32                            # same size: the step times compare as they are
    assert tunekit.diff(a, b).summary.splitlines()[2] == "step 40.0 ms -> 60.0 ms (1.50x slower)"


def test_traces_slowed_by_the_profiler_say_their_categories_are_not_the_step_times():
    # a busy machine and the profiler made the traced steps 12x the timed ones: the matmuls' +2.5 s
    # in the traces is not the step's, whose time fell
    ta = _trace({"matmul/linear": 0.650, "optimizer": 0.800}, [("aten::mm", 0.650, 45)])
    tb = _trace({"matmul/linear": 3.187, "optimizer": 0.451}, [("aten::mm", 3.187, 59)])
    ta.overhead, tb.overhead = 1.34, 11.9
    d = tunekit.diff(_run(0, step_s=0.620, trace=ta), _run(1, "ckpt", step_s=0.523, trace=tb, checkpointing=True))
    [note] = [n for n in d.notes if n.kind == "diff.profiler"]
    assert note == ("the profiler slowed the traced steps (by 134% and 1190%): the time by category is of those "
                    "steps and need not add up to, or move with, the step time")
    ta.overhead, tb.overhead = 0.03, math.nan      # within the 5% explain also leaves unsaid, and unknown
    assert not [n for n in tunekit.diff(_run(0, trace=ta), _run(1, trace=tb)).notes if n.kind == "diff.profiler"]


def test_a_run_against_itself_is_said_so():
    r = _run(3, "ckpt")
    d = tunekit.diff(r, r)
    assert [str(n) for n in d.notes] == ["both sides are run #3 (ckpt): nothing can have changed; "
                                         "tunekit.diff(lab.runs[-2], lab.runs[-1]) compares a Lab's last two runs"]
    assert not tunekit.diff(_run(3), _run(4)).notes      # two runs: no such note


def test_a_file_that_is_no_run_log_is_refused_in_one_line_without_a_python_warning(tmp_path, capsys):
    from tunekit.cli.main import main
    from tunekit.lab.runlog import RunLog

    log, page = tmp_path / "runs.jsonl", tmp_path / "report.html"
    RunLog(log).add(_run(0))
    page.write_text("<html>\n<body>runs</body>\n</html>\n")     # 3 lines, none a run record
    with warnings.catch_warnings():
        warnings.simplefilter("error")                            # a UserWarning would fail here
        assert main(["diff", str(page), str(log)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"tunekit diff: error: {page}: not a run log: none of its 3 lines is a run record "
        "(tunekit run --log and lab.run write one)")


def test_a_figure_zero_on_both_sides_is_unchanged_not_n_a():
    a, b = _run(0), _run(1, "mb=16", micro_batch=16)
    a.weight_cast_bytes = b.weight_cast_bytes = 0    # weight casts: none on either side
    row = tunekit.diff(a, b).table_all.set_index("what").loc["weight casts"]
    assert row.change == 0.0                   # 0 -> 0: +0%, as 4000 -> 4000 B of parameters is


def test_steps_equal_to_the_hundredth_are_the_same_not_faster():
    # 40.0 ms -> 40.1 ms: 40.0 / 40.1 = 0.9975, 1.00 at two decimals: "1.00x slower" would say nothing
    d = tunekit.diff(_run(0, step_s=0.0400), _run(1, "lr", step_s=0.0401, lr=0.01))
    assert d.summary.splitlines()[2] == "step 40.0 ms -> 40.1 ms (the same, within 0.5%)"


def test_a_sub_millisecond_step_keeps_its_digits_and_a_large_ratio_three_significant_ones():
    # the user's report: 207.8 ms -> 0.516 ms a step with 32 -> 64 tokens: 207.8 / 0.516 x 64 / 32
    # = 805.4x faster per token (three significant digits: 805x, not 805.43x); 0.516 ms is 516.0 µs
    a, b = _run(0, step_s=0.050), _run(1, "compiled", step_s=0.040, micro_batch=16)
    a.step_s_min, b.step_s_min, b.tokens_per_step = 0.2078, 0.000516, 64
    a.flops_per_step, b.flops_per_step = 385.9e6, 771.8e6
    d = tunekit.diff(a, b)
    assert d.summary.splitlines()[2] == ("fastest step 207.8 ms -> 516.0 µs "
                                         "(32 -> 64 tokens a step: 805x faster per token)")
    rows = [line.split() for line in d.text().splitlines()]
    # FLOP counts as the rest of tunekit writes them (core.fmt.fmt_flops): 385.9e6 -> 385.9 MFLOP
    assert "step FLOPs per step 385.9 MFLOP 771.8 MFLOP +100.0%".split() in rows     # 771.8 / 385.9 = 2
    assert "step fastest step 207.8 ms 516.0 µs -99.8%".split() in rows             # 0.516 / 207.8 - 1


@pytest.mark.parametrize("ratio, words", [(1.6, "1.60x"), (80.49, "80.5x"), (804.92, "805x"), (12345.6, "12346x")])
def test_ratios_keep_three_significant_digits(ratio, words):
    from tunekit.core.fmt import fmt_ratio

    assert fmt_ratio(ratio) == words


def test_a_side_that_is_a_run_id_alone_is_refused_with_the_side_it_probably_meant(tmp_path, capsys, monkeypatch):
    from tunekit.cli.main import LOG, main
    from tunekit.lab.runlog import RunLog

    monkeypatch.chdir(tmp_path)
    assert main(["diff", "0", "1"]) == 2   # no log here: what a side is, no guess
    assert capsys.readouterr().err.strip() == "tunekit diff: error: 0: no such log file"
    RunLog(tmp_path / LOG).add(_run(0, step_s=0.040))   # the log `tunekit run` writes here
    assert main(["diff", "0", "1"]) == 2
    assert capsys.readouterr().err.strip() == ("tunekit diff: error: 0: no such log file (a side is LOG.jsonl#ID): "
                                               "did you mean tunekit-runs.jsonl#0?")
    assert main(["diff", "#1", "0"]) == 2
    assert capsys.readouterr().err.strip().endswith("did you mean tunekit-runs.jsonl#1?")
    assert main(["diff", "run.jsonl#0", "0"]) == 2   # a log misnamed: the logs of this folder
    assert capsys.readouterr().err.strip() == (
        "tunekit diff: error: run.jsonl#0: no such log file (a side is LOG.jsonl, LOG.jsonl#ID or "
        "LOG.jsonl#SESSION/ID; the .jsonl files here: tunekit-runs.jsonl)")
