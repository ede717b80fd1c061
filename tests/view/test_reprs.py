"""Terminal-first reprs: a run, a Lab, a profiled cell, an autotune search and the memory reports print
a short aligned summary (the same as HTML in a notebook); lab.run shows its steps and ends with one
line; results()/history() show the columns read first; a batch with no sequence counts samples."""
import io
import math

import pytest

from tunekit.core.conditions import Conditions
from tunekit.core.memory.estimate import estimate_memory
from tunekit.core.records import ProfileRecord
from tunekit.core.results import RESULT_COLUMNS, RunResult, results_frame, runs_view
from tunekit.core.run_text import lab_rows, lab_text, result_line, summary_lines
from tunekit.core.summary import readable, to_text

MiB = 2**20
QUIET = Conditions("quiet", "tasks waited for a CPU 1% of the time")
BUSY = Conditions("busy", "other processes used 1.0 of 2 CPUs")
RUN = dict(run_id=3, label="bf16", precision="bf16", micro_batch=8, seq_len=128, steps=20, warmup=2,
           tokens_per_step=1024, tokens_per_s=20480.0, step_s=0.05, step_s_min=0.048, step_s_max=0.061,
           flops_per_step=1.2e9, model_flops_per_step=1.0e9, flops_source="counted", tflops=0.024, mfu=0.2,
           hfu=0.24, peak_tflops=0.1,
           peak_tflops_source="calibrated MAMF on AMD EPYC, fp32, best 2048x2048x2048 matmul (2 threads)",
           peak_mem_bytes=400 * MiB, peak_mem_source="CPU process RSS peak (VmHWM): includes Python and torch",
           params_bytes=1.5 * MiB, grads_bytes=1.5 * MiB, optimizer_bytes=3 * MiB, saved_bytes=10 * MiB,
           loss=4.0456, loss_first=5.2881, device="cpu (2 threads)", attention_ran="sdpa", compute_dtype="bf16",
           model="GPT", n_params=426624, notes=["added CPU SDPA FLOPs (torch counts 0 for them)"], conditions=QUIET)


def run(**changes) -> RunResult:
    return RunResult.from_dict({**RUN, **changes})


# --- a run ------------------------------------------------------------------------------------------


def test_a_run_prints_a_dozen_aligned_lines_with_units_and_the_machine():
    r = run()
    assert repr(r) == str(r) == "\n".join(summary_lines(r)) == """\
run #3 bf16 · GPT 426.6k params · cpu (2 threads)
  speed    20,480 tokens/s · step 50 ms (min 48 ms, max 61 ms) over 20 steps
  compute  0.024 TFLOPS · MFU 20.0% · HFU 24.0% of 0.1 TFLOPS [calibrated MAMF on AMD EPYC]
  memory   peak 400.0 MiB (CPU process RSS peak) · params 1.5 MiB · grads 1.5 MiB · optimizer 3.0 MiB
  loss     5.288 -> 4.046
  machine  quiet: tasks waited for a CPU 1% of the time
  note     added CPU SDPA FLOPs (torch counts 0 for them)"""
    assert result_line(r) == "run #3 bf16 · 20,480 tokens/s · step 50 ms · MFU 20.0% · peak 400.0 MiB · quiet"
    page = r._repr_html_()
    assert "20,480 tokens/s" in page and "tk-busy" not in page and page.startswith("<div")
    assert r == run() and r.tokens_per_s == 20480.0   # a dataclass as before: fields and equality


def test_a_busy_run_of_samples_says_so_and_keeps_to_a_dozen_lines():
    r = run(conditions=BUSY, throughput_unit="samples", model="Vec", n_params=544, tokens_per_s=337.2,
            notes=[f"note {i}" for i in range(9)])
    lines = summary_lines(r)
    assert len(lines) == 12 and lines[0] == "run #3 bf16 · Vec 544 params · cpu (2 threads) · ⚠ BUSY MACHINE"
    assert lines[1] == "  speed    337 samples/s · step 50 ms (min 48 ms, max 61 ms) over 20 steps"
    assert lines[5] == ("  machine  busy: other processes used 1.0 of 2 CPUs; these figures measure the other "
                        "work too: re-run when it is quiet")
    assert lines[-2:] == ["  note     note 4", "  note     (+4 more in .notes)"]
    assert result_line(r) == "run #3 bf16 · 337 samples/s · step 50 ms · MFU 20.0% · peak 400.0 MiB · ⚠ busy"
    assert "tk-busy" in r._repr_html_()


def test_a_failed_run_says_why():
    r = run(status="failed", error="the loss of step 3 is not finite", notes=[])
    assert repr(r) == """\
run #3 bf16 · GPT 426.6k params · cpu (2 threads)
  FAILED   the loss of step 3 is not finite
  machine  quiet: tasks waited for a CPU 1% of the time"""
    assert result_line(r) == "run #3 bf16 · FAILED: the loss of step 3 is not finite · quiet"


def test_a_traced_run_shows_its_line_against_the_expected_step():
    line = ("61.0 ms per step, 42% of the expected speed (25.7 ms expected by the device model, uncalibrated); "
            "the matmuls take 70% of the step at "
            "40% of the expected speed")
    r = run(explained=line)
    assert summary_lines(r)[5:7] == [f"  traced   {line}", "  machine  quiet: tasks waited for a CPU 1% of the time"]
    assert line in r._repr_html_() and RunResult.from_dict(r.to_dict()).explained == line   # the log keeps it
    assert result_line(r) == result_line(run())     # the line lab.run ends with stays one line
    assert run().explained is None and not any(x.startswith("  traced") for x in summary_lines(run()))


def test_a_log_written_before_the_unit_counted_tokens():
    old = {k: v for k, v in RUN.items()}
    assert RunResult.from_dict(old).throughput_unit == "tokens"


# --- tables -----------------------------------------------------------------------------------------


def test_results_show_the_columns_read_first_and_keep_raw_numbers():
    df = readable(results_frame([run()])[list(RESULT_COLUMNS)], runs_view, "lab.results(all=True)")
    assert repr(df) == """\
 #  run tokens/s step (ms) TFLOPS   MFU   HFU      MFU/HFU of peak (MiB) machine status
 3 bf16   20,480      50.0  0.024 20.0% 24.0% bf16 0.1 TFLOPS      400.0   quiet     ok
[1 row; numbers formatted for reading, the DataFrame holds them raw; lab.results(all=True) has every column]"""
    assert df["step_s"].iloc[0] == 0.05 and df["peak_mem_bytes"].iloc[0] == 400 * MiB
    assert "lab.results(all=True) has every column" in df._repr_html_()


def test_rows_of_several_dtypes_say_the_peak_each_mfu_is_against():
    # bf16 at 8.1% of a T4's 65 TFLOPS beside fp32 at 1.0% of its 8.1: each MFU is against its own
    # dtype's peak, which the table names per row (a run without a peak: n/a)
    rows = [run(run_id=0, label="fp32", compute_dtype="fp32", peak_tflops=8.1, mfu=0.01, hfu=0.01),
            run(run_id=1, label="bf16", compute_dtype="bf16", peak_tflops=65.0, mfu=0.081, hfu=0.081),
            run(run_id=2, label="tf32", compute_dtype="tf32", peak_tflops=None, mfu=math.nan, hfu=math.nan)]
    df = readable(results_frame(rows)[list(RESULT_COLUMNS)], runs_view)
    assert runs_view(df)["MFU/HFU of"].tolist() == ["fp32 8.1 TFLOPS", "bf16 65 TFLOPS", "n/a"]
    assert df["peak_tflops"].tolist()[:2] == [8.1, 65.0] and df["compute_dtype"].tolist() == ["fp32", "bf16", "tf32"]


def test_load_results_shows_what_lab_results_shows(tmp_path, monkeypatch):
    from tunekit import Lab
    from tunekit.lab.runlog import RunLog

    log = RunLog(tmp_path / "runs.jsonl")
    whole = dict(params_bytes=3 * 2**19, grads_bytes=3 * 2**19)   # the log keeps byte counts as ints
    log.add(run(**whole)), log.add(run(label="fp32", **whole))
    df, every = Lab.load_results(log.path), Lab.load_results(log.path, all=True)
    assert list(df.columns) == list(RESULT_COLUMNS)        # the curated set, as lab.results()
    assert "Lab.load_results(all=True) has every column" in repr(df)
    assert repr(df).splitlines()[1].split() == ["0", "bf16", "20,480", "50.0", "0.024", "20.0%", "24.0%", "bf16",
                                                "0.1", "TFLOPS", "400.0", "quiet",
                                                "ok"]  # run ids renumbered from 0 by the log
    assert "session" in every.columns and "notes" in every.columns and type(every).__name__ == "DataFrame"
    assert df["tokens_per_s"].tolist() == every["tokens_per_s"].tolist() == [20480.0, 20480.0]  # raw numbers
    monkeypatch.setenv("TUNEKIT_DATA_DIR", str(tmp_path))   # path=None: the newest lab-*.jsonl
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs.jsonl").rename(tmp_path / "runs" / "lab-2026-01-01.jsonl")
    assert list(Lab.load_results().columns) == list(RESULT_COLUMNS)
    assert list(Lab.load_results(all=True).columns) == list(every.columns)


def test_a_table_of_samples_is_headed_samples_per_second():
    df = results_frame([run(throughput_unit="samples")])
    assert "samples/s" in runs_view(df).columns and "tokens/s" not in runs_view(df).columns
    assert "tokens or samples/s" in runs_view(results_frame([run(), run(throughput_unit="samples")])).columns


# --- a Lab, a profiled cell, the memory reports, an autotune search -----------------------------------


def test_a_lab_prints_its_model_toggles_and_runs():
    r = run()
    rows = lab_rows("GPT", 426624, "cpu", r.toggles.asdict(), "data='corpus'",
                    [r, run(run_id=4, status="failed", error="interrupted", notes=[])], "/tmp/lab.jsonl")
    assert lab_text(rows) == """\
tunekit Lab
  model    GPT · 426.6k params · cpu · data='corpus'
  toggles  precision bf16 · micro_batch 8 · grad_accum 1 · seq_len 128 · optimizer adamw
  runs     2 (1 failed)
  last     run #4 bf16 · FAILED: interrupted · quiet
  fastest  run #3 bf16 · 20,480 tokens/s · step 50 ms · MFU 20.0% · peak 400.0 MiB · quiet
  log      /tmp/lab.jsonl
  see      lab.results() · lab.compare() · lab.dashboard() · lab.autotune() · lab.plan(device)"""
    none = lab_text(lab_rows("Vec", 544, "cpu", {"precision": "fp32", "checkpointing": True}, "your batch_fn",
                             [], "l.jsonl"))
    assert none.splitlines()[1:4] == ["  model    Vec · 544 params · cpu · your batch_fn",
                                      "  toggles  precision fp32 · checkpointing",
                                      "  runs     none yet: lab.run(steps=20, precision='bf16', ...)"]


def test_a_profile_record_prints_its_summary():
    rec = ProfileRecord(name="mm", wall_s=0.022, flops=33.6e6, flops_source="counted", device="cpu",
                        cpu_rss_delta_bytes=396 * 1024, cpu_peak_delta_bytes=396 * 1024, conditions=QUIET)
    assert repr(rec) == to_text(rec) == """\
⏱ mm · cpu
  time       22 ms
  FLOPs      33.6 MFLOP (counted)
  speed      n/a · MFU n/a · HFU n/a
  CPU RAM    RSS +396.0 KiB · peak +396.0 KiB
  machine    quiet: tasks waited for a CPU 1% of the time"""   # no row of n/a's for a GPU it has not


def test_a_profile_records_notes_are_a_list_one_per_line_under_the_label():
    long = ("not traced: this run counts FLOPs, and the counter would be traced as the work; run it again "
            "to trace it (or count none: --flops never)")   # 130 characters: wrapped at 90
    rec = ProfileRecord(name="mm", wall_s=0.022, device="cpu", cpu_rss_delta_bytes=0.0, cpu_peak_delta_bytes=0.0,
                        notes=["added CPU SDPA FLOPs (torch counts 0 for them)", long, "no CUDA device"])
    assert to_text(rec).splitlines()[5:] == [
        "  notes      added CPU SDPA FLOPs (torch counts 0 for them)",
        "             not traced: this run counts FLOPs, and the counter would be traced as the work; run it",
        "               again to trace it (or count none: --flops never)",
        "             no CUDA device"]   # "  " + "notes".ljust(10) + " ": every note starts at column 13
    page = rec._repr_html_()
    assert page.count("<tr>") == 4 + 3   # time, FLOPs, speed, CPU RAM, then one row per note
    assert ("<th style='text-align:left;padding:1px 8px 1px 0;font-weight:600'></th>"
            "<td style='text-align:left;padding:1px 0'>no CUDA device</td>") in page
    assert "<td style='text-align:left;padding:1px 0'>added CPU SDPA FLOPs (torch counts 0 for them)</td>" in page


def test_the_memory_estimate_prints_its_total_and_lines():
    est = estimate_memory(124e6, n_layer=12, n_embd=768, n_head=12, seq_len=1024, micro_batch=8, device="cuda")
    assert repr(est) == """\
memory estimate · 124M params · mixed · adamw · micro_batch 8 × seq_len 1024 · cuda
  total            10.6 GiB (11.34 GB) per device; a lower bound: buffers unknown
  weights           236.5 MiB    2%
  master_weights    473.0 MiB    4%
  gradients         473.0 MiB    4%
  optimizer_states  946.0 MiB    9%
  activations         8.0 GiB   76%
  cuda_context      481.3 MiB    4%"""   # 0.47 GiB = 481.28 MiB (core.memory.options.CUDA_CONTEXT)
    assert "8.0 GiB" in est._repr_html_()


def test_the_memory_report_prints_measured_against_estimated():
    from tunekit.measure.memory import MemoryReport

    est = estimate_memory(1e6, device="cpu")
    rep = MemoryReport({"weights": 4e6, "gradients": 4e6, "optimizer_states": 8e6, "activations": 2e6},
                       est, "cpu", "fp32", notes=["no CUDA device: allocator peak, NVML total and 'other' are "
                                                  "not measured here"])
    assert repr(rep) == """\
memory of one training step · fp32 on cpu · measured vs estimated
  component          measured   estimated   error
  total              17.2 MiB         n/a
  weights             3.8 MiB     1.9 MiB    -50%
  gradients           3.8 MiB     3.8 MiB     +0%
  optimizer_states    7.6 MiB     7.6 MiB     +0%
  activations         1.9 MiB         n/a     n/a
  note             no CUDA device: allocator peak, NVML total and 'other' are not measured here"""


def test_an_autotune_result_prints_winner_noise_machine_and_state():
    from tunekit.autotune.result import AutotuneResult, Candidate

    a, b = run(run_id=1, conditions=QUIET), run(run_id=2, step_s_min=0.024, conditions=QUIET)
    start = a.toggles
    fast = b.toggles.replace(checkpointing=True)
    found = AutotuneResult(fast, b, [Candidate("precision", start, [a], "kept"),
                                     Candidate("checkpointing", fast, [b], "winner")],
                           within_noise=False, runner_up=None, band=0.03, elapsed_s=12.34, budget_s=60,
                           status="complete", state="winner applied (lab.defaults)", start=start)
    assert repr(found) == """\
autotune
  search   2 candidates, 2 measured · 12.3 s of 60 s · complete
  winner   ckpt at 42,667 tokens/s · 2.00x the start
  judged   beyond the noise band ±3%
  machine  quiet in all 2 trials
  state    winner applied (lab.defaults)
  see      found.verdict · found.evidence · found.figure"""
    assert "42,667 tokens/s" in found._repr_html_()
    # a candidate that measured faster without winning its race is said, found by its note's kind
    from dataclasses import replace

    from tunekit.core.notes import Note

    said = replace(found, notes=["bf16 measured faster than the winner (a plain note: not read)",
                                 Note("autotune.unconfirmed", "bf16 beat it once (its words do not matter)")])
    assert ". Not confirmed: bf16 beat it once (its words do not matter)." in said.verdict
    assert "Not confirmed" not in found.verdict and "a plain note" not in said.verdict


# --- lab.run's progress ---------------------------------------------------------------------------------


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_one_line_at_the_end_off_a_terminal_and_redrawn_on_one(monkeypatch):
    from tunekit.view import progress

    calls = []
    for stream in (io.StringIO(), _Tty()):
        monkeypatch.setattr(progress.sys, "stderr", stream)
        with progress.RunProgress(3, progress=lambda d, t: calls.append((d, t))) as shown:
            for i in range(4):
                shown.tick(i, 3)
            shown.result = run()
        if isinstance(stream, _Tty):
            out = stream.getvalue()
            assert out.startswith("\rlab.run: warm-up and FLOP count (untimed)\x1b[K\rlab.run: step 0/3")
            assert "[####################]" in out
            assert out.endswith("\r" + result_line(run()) + "\x1b[K\n")
        else:
            assert stream.getvalue() == result_line(run()) + "\n"
    assert calls == [(0, 3), (1, 3), (2, 3), (3, 3)] * 2   # the caller's callback is still called


def test_progress_says_where_a_run_stopped(monkeypatch):
    from tunekit.view import progress

    monkeypatch.setattr(progress.sys, "stderr", io.StringIO())
    with pytest.raises(KeyboardInterrupt), progress.RunProgress(5) as shown:
        shown.tick(2, 5)
        raise KeyboardInterrupt
    assert progress.sys.stderr.getvalue() == "lab.run stopped at step 2/5: KeyboardInterrupt\n"


def test_a_refused_run_says_nothing_ran_not_a_step_it_never_reached(monkeypatch):
    from tunekit.core.toggles import ToggleError
    from tunekit.view import progress

    monkeypatch.setattr(progress.sys, "stderr", io.StringIO())
    # lab.run(steps=0): refused before any work; not "stopped at step 0/0"
    with pytest.raises(ToggleError), progress.RunProgress(0):
        raise ToggleError(["steps must be a whole number >= 1 (got 0): nothing would be timed."])
    assert progress.sys.stderr.getvalue() == "lab.run refused before any work (ToggleError): nothing ran\n"


def test_a_notebook_gets_one_updating_display_per_cell(monkeypatch):
    import IPython
    import IPython.display

    from tunekit.view import frontend, progress

    shown = []

    class Handle:
        def update(self, obj):
            shown.append(obj.data)

    class Shell:
        execution_count = 7
        kernel = object()

    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell())
    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: Handle())
    monkeypatch.setattr(progress._NotebookView, "_cell", {})
    assert frontend.in_notebook()   # the one home of "which IPython shell"
    for i in range(6):   # six runs in one cell: one block, the last four listed
        with progress.RunProgress(2) as p:
            p.tick(2, 2)
            p.result = run(run_id=i)
    assert "<progress value='1.000'" in shown[-2] and "(+2 earlier runs in this cell)" in shown[-1]
    assert "run #5 bf16" in shown[-1] and "run #1 bf16" not in shown[-1] and "run #2 bf16" in shown[-1]
    # a search in the same cell: the same block, its trial as a bar of the budget, then its line
    from tunekit.lab.maxbatch import MaxBatchResult, Trial

    now = iter([0.0, 0.0, 15.0])     # start, "starting", the trial at 64 after 15 s of a 60 s budget
    monkeypatch.setattr(progress, "clock", lambda: next(now))
    with progress.SearchProgress("find_max_batch_size", 60.0) as p:
        p.tried(Trial(32, True, 1.0, "ok", 15.0))
        p.trying(64)
        p.result = MaxBatchResult(best=32, stopped="budget", too_big=None, limit=1024, budget_s=60.0, elapsed_s=15.0)
    assert ("find_max_batch_size: trying micro_batch=64 · 1 fit, 0 OOM · 15.0 s / budget 60 s "
            "<progress value='0.250'") in shown[-2]   # 15/60
    assert "find_max_batch_size: stopped by the time budget (budget_s=60)" in shown[-1]
    assert "run #5 bf16" in shown[-1]   # one block per cell: the runs before are still listed


@pytest.mark.slow
def test_lab_run_shows_one_line_and_results_show_the_columns_read_first(make_lab, capsys):
    lab = make_lab(peak_tflops=1.0, micro_batch=2, seq_len=16)
    r = lab.run(steps=2, warmup=0)
    assert capsys.readouterr().err == result_line(r) + "\n"
    lab.run(steps=1, warmup=0, verbose=False)
    assert capsys.readouterr() == ("", "")
    with pytest.raises(ValueError, match="verbose must be True or False"):
        lab.run(steps=1, verbose="yes")
    df, every = lab.results(), lab.results(all=True)
    assert list(df.columns) == list(RESULT_COLUMNS) and len(every.columns) > 50
    assert df["tokens_per_s"].iloc[0] == r.tokens_per_s == every["tokens_per_s"].iloc[0]  # raw numbers
    assert "tokens/s" in repr(df) and "lab.results(all=True)" in repr(df)
    text = repr(lab)
    assert text.startswith("tunekit Lab\n  model    GPT") and "runs     2" in text and len(text.splitlines()) <= 12
    assert math.isfinite(r.tokens_per_s) and r.throughput_unit == "tokens"
