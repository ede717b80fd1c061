"""tunekit.Monitor inside a plain loop: rows, tokens, FLOPs counted once per input signature,
failures, bad input, and the summary record. Timings are never compared: only counts, FLOPs,
flags and the arithmetic between a row's own columns."""
import math

import pytest
import torch

import tunekit
from tunekit.measure.flops import counting_active
from tunekit.monitor import steps
from tunekit.monitor import view as monitor_view


def tiny():
    torch.manual_seed(0)
    model = tunekit.GPT(tunekit.GPTConfig.preset("cpu-tiny"))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def batches(n, b=2, s=32):
    return [torch.randint(0, 256, (2, b, s)) for _ in range(n)]


def train(model, opt, x, y):
    _, loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


# cpu-tiny: 425,984 matmul weights, 2 layers, d=128. Per trained token at S=32:
# 6 x 425,984 + 12 x 2 x 128 x 32 / 2 (causal) = 2,555,904 + 49,152 = 2,605,056 FLOPs
PER_TOKEN_S32 = 2_605_056


def test_plain_loop_rows_tokens_and_flops_counted_once():
    model, opt = tiny()
    mon = tunekit.Monitor(model, name="t", live=False, peak=1.0)
    for x, y in mon.iter(batches(5)):
        mon.log(loss=train(model, opt, x, y))
    rec = mon.close()
    rows = mon.rows
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["counted"] for r in rows] == [True, False, False, False, False]
    assert [r["flops_source"] for r in rows] == ["counted"] + ["cached"] * 4
    assert [r["warmup"] for r in rows] == [False, True, False, False, False]  # the first step not counted
    assert all(r["tokens"] == 2 * 32 and r["samples"] == 2 for r in rows)   # B x S from GPT's idx
    assert len({r["flops"] for r in rows}) == 1                              # one count, reused
    assert all(r["model_flops"] == PER_TOKEN_S32 * 64 for r in rows)        # the Lab's convention
    for r in rows[2:]:
        assert r["tokens_per_s"] == pytest.approx(64 / r["wall_s"])
        assert r["tflops"] == pytest.approx(r["flops"] / r["wall_s"] / 1e12)
        assert r["mfu"] == pytest.approx(r["model_flops"] / r["wall_s"] / 1e12 / 1.0)  # peak=1 TFLOPS
        assert r["wall_s"] >= r["step_s"] >= 0 and r["wait_s"] >= 0
        assert isinstance(r["loss"], float) and r["loss"] == r["loss"]
    assert math.isnan(rows[0]["tokens_per_s"])                             # counted: no speed
    assert all(r["machine"] in ("quiet", "busy", "unknown") for r in rows)  # every window judged
    assert mon.summary.measured == 3 and mon.summary.counted == 1 and mon.summary.warmup == 1
    assert tunekit.last() is rec and rec.name == "t" and rec.notes[0].startswith("5 steps (1 warm-up, 1 counted)")
    assert rec.flops == sum(r["flops"] for r in rows[2:])
    assert mon.close() is rec and tunekit.history(all=True).name.tolist().count("t") == 1  # idempotent
    assert not counting_active() and not model._forward_pre_hooks               # nothing left behind


def test_new_shapes_are_counted_on_the_step_that_brings_them():
    model, opt = tiny()
    data = batches(3, s=32) + batches(2, s=16) + batches(1, s=32)
    mon = tunekit.Monitor(model, live=False, warmup=0)
    for x, y in mon.iter(data):
        train(model, opt, x, y)
    mon.close()
    rows = mon.rows
    assert [r["counted"] for r in rows] == [True, False, False, True, False, False]
    assert rows[3]["flops"] < rows[0]["flops"] and rows[4]["flops"] == rows[3]["flops"]
    assert rows[5]["flops"] == rows[0]["flops"]                   # back to S=32: the first count
    assert rows[3]["tokens"] == 2 * 16


def test_grad_accumulation_sums_the_tokens_of_every_forward():
    model, opt = tiny()
    mon = tunekit.Monitor(model, live=False)
    for _ in range(2):
        with mon.step():
            for x, y in batches(3):
                model(x, y)[1].backward()
            opt.step()
            opt.zero_grad()
    mon.close()
    assert [r["tokens"] for r in mon.rows] == [3 * 64, 3 * 64]
    assert mon.rows[1]["model_flops"] == PER_TOKEN_S32 * 3 * 64


def test_a_model_without_a_sequence_reports_samples_per_second():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
    mon = tunekit.Monitor(mlp, live=False)
    for x in [torch.randn(5, 16) for _ in range(4)]:
        with mon.step():
            mlp(x).square().mean().backward()
            opt.step()
    mon.close()
    df = mon.results()
    assert "samples_per_s" in df.columns and "tokens_per_s" not in df.columns
    assert mon.rows[2]["samples"] == 5 and math.isnan(mon.rows[2]["tokens"])
    # Linear 16->32 and 32->1 on 5 samples, forward 2*5*(16*32 + 32*1) = 5,440 FLOPs, backward
    # twice that less the input gradient of the first layer (2*5*16*32 = 5,120): 16,320 - 5,120
    assert mon.rows[2]["flops"] == 11_200
    assert mon.summary.unit == "samples/s" and "samples/s" in mon.record.notes[0]


def test_a_failing_step_is_recorded_raised_and_leaves_no_counter():
    model, opt = tiny()
    mon = tunekit.Monitor(model, live=False)
    with pytest.raises(RuntimeError, match="boom"):
        with mon.step():
            model(*batches(1)[0])
            raise RuntimeError("boom")
    assert mon.rows[0]["error"] == "RuntimeError: boom" and not counting_active()
    with mon.step():                                   # the next step is counted afresh
        train(model, opt, *batches(1)[0])
    mon.close()
    assert mon.summary.failed == 1 and "1 failed" in mon.record.notes[0]


def test_leaving_the_loop_marks_the_step_not_finished():
    model, opt = tiny()
    mon = tunekit.Monitor(model, live=False)
    for i, (x, y) in enumerate(mon.iter(batches(5))):
        train(model, opt, x, y)
        if i == 2:
            break
    assert len(mon.rows) == 3 and mon.rows[2]["left"] and mon.rows[2]["error"] is None
    assert not mon.rows[1]["left"]
    mon.close()
    assert mon.record.error is None and "1 left" in mon.record.notes[0]   # a break is no failure


@pytest.mark.parametrize("call, message", [
    (lambda m: tunekit.Monitor("model"), "torch.nn.Module"),
    (lambda m: tunekit.Monitor(torch.nn.ReLU()), "no parameters"),
    (lambda m: tunekit.Monitor(m, tokens=0), "tokens must be"),
    (lambda m: tunekit.Monitor(m, flops="sometimes"), "flops"),
    (lambda m: tunekit.Monitor(m, warmup=-1), "warmup"),
    (lambda m: tunekit.Monitor(m, live="yes"), "live"),
    (lambda m: tunekit.Monitor(m, peak=float("nan")), "peak"),
])
def test_bad_input_is_refused_before_the_loop(call, message):
    model, _ = tiny()
    with pytest.raises((ValueError, TypeError), match=message):
        call(model)
    assert not model._forward_pre_hooks


def test_misuse_says_what_to_do():
    model, _ = tiny()
    mon = tunekit.Monitor(model, live=False)
    with pytest.raises(RuntimeError, match="no step yet"):
        mon.log(loss=1.0)
    mon.start_step()
    with pytest.raises(RuntimeError, match="already going"):
        mon.start_step()
    with pytest.raises(ValueError, match="a column tunekit fills"):
        mon.log(mfu=0.5)
    with pytest.raises(ValueError, match="a number"):
        mon.log(loss="low")
    mon.end_step()
    with pytest.raises(RuntimeError, match="no step is going"):
        mon.end_step()
    mon.close()
    with pytest.raises(RuntimeError, match="closed"):
        mon.start_step()


def test_transformers_model_tokens_from_input_ids():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids = [torch.randint(0, 256, (2, 16)) for _ in range(3)]
    mon = tunekit.Monitor(model, live=False)
    for batch in mon.iter([{"input_ids": i, "labels": i} for i in ids]):
        out = model(**batch)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(loss=out.loss)
    mon.close()
    assert [r["tokens"] for r in mon.rows] == [32, 32, 32]
    assert mon.rows[2]["model_flops"] > 0 and mon.rows[2]["flops_source"] == "cached"


# --- the pure summary and the view -----------------------------------------------------------

def row(step, wall, tokens=100.0, wait=0.0, flops=1e12, model=5e11, warmup=False, counted=False, error=None):
    return dict(step=step, wall_s=wall, wait_s=wait, tokens=tokens, samples=1.0, flops=flops, model_flops=model,
                cpu_peak_bytes=2.0**20 * step, gpu_peak_bytes=math.nan, warmup=warmup, counted=counted,
                error=error, tokens_per_s=tokens / wall, samples_per_s=1 / wall, mfu=0.5, loss=1.0)


def test_summary_is_over_the_measured_steps_only():
    rows = [row(0, 5.0, warmup=True, counted=True), row(1, 0.1, wait=0.05), row(2, 0.3), row(3, 9.0, error="X")]
    s = steps.summarize(rows, peak_tflops=10.0)
    assert (s.steps, s.measured, s.warmup, s.counted, s.failed) == (4, 2, 1, 0, 1)
    assert s.per_s == pytest.approx(200 / 0.4)              # 2 x 100 tokens in 0.1 + 0.3 s: 500 tokens/s
    assert s.median_step_s == pytest.approx(0.2)            # between 0.1 and 0.3
    assert s.p90_step_s == pytest.approx(0.28)              # 0.1 + 0.9 x (0.3 - 0.1)
    assert s.wait_share == pytest.approx(0.05 / 0.4)        # 12.5% of the measured time
    assert s.tflops == pytest.approx(2e12 / 0.4 / 1e12)     # 5 TFLOPS ...
    assert s.hfu == pytest.approx(0.5) and s.mfu == pytest.approx(0.25)  # ... of 10; model FLOPs half
    assert s.cpu_peak_bytes == 3 * 2**20                    # memory over every step
    assert steps.quantile([1, 2, 3, 4], 0.9) == pytest.approx(3.7)


def test_view_status_and_figure_stay_small():
    rows = [row(i, 0.1) for i in range(1000)]
    line = monitor_view.status("run", rows, 2000, 100.0)
    assert line.startswith("run: step 1000/2000 · 100.0 s, ETA 100.0 s") and "1,000 tokens/s" in line
    fig = monitor_view.figure(rows, "run")
    assert [len(t["x"]) for t in fig["data"]] == [250] * 4     # 1000 rows, every ceil(1000/300) = 4th
    assert fig["data"][1]["y"][0] == 50.0                      # MFU in percent


def test_results_read_as_a_table_and_keep_the_raw_numbers():
    model, opt = tiny()
    mon = tunekit.Monitor(model, live=False)
    for x, y in mon.iter(batches(4)):
        mon.log(loss=train(model, opt, x, y))
    mon.close()
    df = mon.results()
    text = repr(df)
    head = text.splitlines()[0].split()
    assert head[:6] == ["step", "step", "(ms)", "wait", "(ms)", "tokens/s"] and "status" in head and "loss" in head
    assert "FLOP count" in text and "warm-up" in text and "mon.results(all=True)" in text
    assert df["wall_s"].iloc[2] == mon.rows[2]["wall_s"]          # raw seconds behind the ms column


def test_memory_figures_are_above_the_runs_start_and_a_peak_is_never_below_it(monkeypatch):
    # issue 33: 'CPU RAM RSS 0 B · peak -4.0 KiB' came from figures taken against the RSS at the end
    # of the first window, which a lagging counter read 4 KiB above the window's peak. The start is
    # read before the first step; readings the test decides: RSS 100 MiB at the start, 100 MiB +
    # 8 KiB at the end, a window peak 4 KiB below the start
    from tunekit.core.summary import to_text
    from tunekit.monitor import monitor as monitor_mod

    MiB = 2**20
    rss = iter([100 * MiB] + [100 * MiB + 8192] * 20)
    monkeypatch.setattr(monitor_mod, "cpu_rss_bytes", lambda: next(rss))
    model, opt = tiny()
    mon = tunekit.Monitor(model, name="mem", live=False, peak=1.0, flops="never")
    monkeypatch.setattr(mon._cpu, "peak", lambda: float(100 * MiB - 4096))
    for x, y in mon.iter(batches(3)):
        train(model, opt, x, y)
    rec = mon.close()
    assert mon.rss0 == 100 * MiB
    assert rec.cpu_rss_delta_bytes == 8192      # (100 MiB + 8 KiB) - 100 MiB
    assert rec.cpu_peak_delta_bytes == 0        # the start is a point of the run: max(start, peak) - start
    assert "CPU RAM    RSS +8.0 KiB · peak 0 B" in to_text(rec)
    # the reason that applies: none counted because flops='never', not "some steps have no count"
    assert "TFLOPS/HFU n/a: flops='never': no step counted" in rec.notes
    unrun = tunekit.Monitor(model, name="unrun", live=False).close()   # no step: nothing measured
    assert math.isnan(unrun.cpu_rss_delta_bytes) and math.isnan(unrun.cpu_peak_delta_bytes)
    assert "CPU RAM    RSS n/a · peak n/a" in to_text(unrun)


def test_a_due_calibration_runs_when_the_monitor_is_made_never_among_its_steps(calibrations, monkeypatch):
    # issue 33: with no calibration cached, the first measured step of a new process ran the
    # CPU's peak calibration (a 3.1 s step in a 0.2 s loop); now it runs before any step, said once
    from tunekit.measure import peaks

    model, opt = tiny()
    mon = tunekit.Monitor(model, name="cal", live=False)
    assert calibrations.sweeps == 1 and set(mon.flop_rates.peaks) == {"fp32"}
    assert sum("peak was calibrated before the first step" in str(n) for n in mon.notes) == 1
    ran = []
    monkeypatch.setattr(peaks, "calibrate", lambda *a, **k: ran.append(a))
    for x, y in mon.iter(batches(3)):
        train(model, opt, x, y)
    rec = mon.close()
    assert ran == [] and rec.mfu == rec.mfu        # the steps' MFU against the peak found before them
    again = tunekit.Monitor(model, name="cached", live=False)   # cached now: nothing runs, nothing said
    assert calibrations.sweeps == 1 and not any("calibrated before" in str(n) for n in again.notes)
    again.close()


def test_dynamo_first_imported_in_a_step_is_no_compile(monkeypatch):
    # Dynamo unused when the Monitor is made (None), imported by the first step's FLOP counter
    # without compiling (0): that step is the counted one, not also a "compiled" warm-up
    from tunekit.monitor import monitor as monitor_mod

    graphs = iter([None] + [0] * 10)
    monkeypatch.setattr(monitor_mod, "compiled_graphs", lambda: next(graphs))
    model, opt = tiny()
    mon = tunekit.Monitor(model, live=False, peak=1.0)
    for x, y in mon.iter(batches(3)):
        train(model, opt, x, y)
    mon.close()
    assert [(r["counted"], r["warmup"]) for r in mon.rows] == [(True, False), (False, True), (False, False)]
