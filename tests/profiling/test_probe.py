"""tunekit.profile(): records, staleness of reused FLOP counts, failures, missing hardware."""
import math

import pytest
import torch

import tunekit
from tunekit.core.records import COLUMNS
from tunekit.profiling import probe, probe_figures

MODEL = torch.nn.Linear(256, 256, bias=False)


def _step(bs, name="step"):
    x = torch.randn(bs, 256)
    with tunekit.profile(name=name, inputs=(x,)) as rec:
        MODEL(x).sum().backward()
    return rec


def test_count_then_reuse_then_recount_when_batch_changes():
    # Linear 256x256, no bias; x needs no grad, so forward 2 + weight-grad 2 FLOPs per weight
    # per row: 4*65536*8 = 2097152
    first, second = _step(8), _step(8)
    assert (first.flops, first.flops_source) == (2097152, "counted")
    assert math.isnan(first.tflops)                 # never timed under the counter
    assert (second.flops, second.flops_source) == (2097152, "cached")
    assert second.tflops == pytest.approx(2097152 / second.wall_s / 1e12)
    doubled = _step(16)
    assert (doubled.flops, doubled.flops_source) == (2 * 2097152, "counted")
    assert "recounted" in "; ".join(doubled.notes)


def test_block_fingerprint_from_source_without_inputs():
    bs = 4
    recs = []
    for bs in (4, 4, 8):
        x = torch.randn(bs, 256)
        with tunekit.profile(name="implicit") as rec:
            MODEL(x).sum().backward()
        recs.append(rec)
    assert [r.flops_source for r in recs] == ["counted", "cached", "counted"]
    assert recs[2].flops == 2 * recs[0].flops   # 4*65536*8 vs 4*65536*4


def test_flops_modes_and_given_model_flops():
    x = torch.randn(4, 256)
    with tunekit.profile(name="never", flops="never", model_flops=1e6, peak=1.0) as rec:
        MODEL(x).sum()
    assert (rec.flops, rec.flops_source, rec.model_flops) == (1e6, "given", 1e6)
    assert rec.mfu == pytest.approx(1e6 / rec.wall_s / 1e12 / 1.0)
    assert rec.peak_tflops_source.startswith("given")
    with pytest.raises(ValueError, match="flops must be one of"):
        tunekit.profile(name="bad", flops="sometimes").__enter__()


def test_failure_is_recorded_and_reraised_unchanged():
    err = KeyError("missing")
    with pytest.raises(KeyError) as info:
        with tunekit.profile(name="fails"):
            raise err
    assert info.value is err
    rec = tunekit.last()
    assert rec.name == "fails" and rec.error == "KeyError: 'missing'"
    assert not math.isnan(rec.wall_s)


def test_interrupt_is_recorded():
    with pytest.raises(KeyboardInterrupt):
        with tunekit.profile(name="ctrl-c"):
            raise KeyboardInterrupt()
    assert tunekit.last().error.startswith("KeyboardInterrupt")


def test_oom_is_explained_and_memory_freed():
    with pytest.raises(RuntimeError):
        with tunekit.profile(name="oom"):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert any("out of memory" in n and "freed" in n for n in tunekit.last().notes)


def test_missing_hardware_is_nan_not_zero_and_history_has_the_columns():
    _step(2)
    df = tunekit.history(all=True)
    assert list(df.columns) == list(COLUMNS)
    for col in ("name", "wall_s", "flops", "flops_source", "model_flops", "tflops", "mfu", "hfu",
                "peak_tflops", "cpu_rss_delta_bytes", "cpu_peak_delta_bytes", "gpu_alloc_delta_bytes",
                "gpu_peak_delta_bytes", "gpu_reserved_bytes", "nvml_used_bytes", "device", "error"):
        assert col in df.columns
    if not torch.cuda.is_available():
        row = df.iloc[-1]
        for col in ("gpu_alloc_delta_bytes", "gpu_peak_delta_bytes", "gpu_reserved_bytes", "nvml_used_bytes"):
            assert math.isnan(row[col])
        assert row["device"].startswith("cpu")
        assert "no CUDA device" in row["notes"]


def test_mfu_on_cpu_uses_the_calibrated_peak(monkeypatch):
    import time

    from tunekit.measure import peaks

    # a fresh calibration taken on a quiet machine, which no re-check can beat (0.5 TFLOPS on CPU)
    monkeypatch.setattr(peaks, "cached_calibration", lambda device=None, dtype="fp32": peaks.Calibration(
        "test cpu", dtype, 0.5, (512, 512, 512), [], 0.0, torch.__version__, 2, busy=0.0,
        layout="nn", taken_at=time.time()))
    monkeypatch.setattr(peaks, "device_name", lambda device=None: "test cpu")
    monkeypatch.setattr(peaks, "_resolved", {})  # forget peaks resolved by earlier tests
    _step(8, "mfu")
    rec = _step(8, "mfu")
    assert rec.peak_tflops == 0.5 and "calibrated MAMF" in rec.peak_tflops_source
    assert rec.hfu == pytest.approx(rec.tflops / 0.5)
    assert rec.mfu == pytest.approx(rec.hfu)  # no checkpointing: model == executed FLOPs


def test_fingerprint_ignores_side_effect_state_but_sees_shapes_and_settings():
    from tunekit.profiling.fingerprint import describe

    opt = torch.optim.AdamW(MODEL.parameters())
    before = describe(opt)
    MODEL(torch.randn(2, 256)).sum().backward()
    opt.step()                                  # fills opt.state: not an input change
    assert describe(opt) == before
    assert describe([1.0, 2.0]) == describe([1.0, 2.0, 3.0])  # a growing losses list
    assert describe([torch.zeros(2, 3)]) != describe([torch.zeros(4, 3)])
    assert describe((8, 128)) != describe((16, 128))
    m = torch.nn.Linear(4, 4)
    d0 = describe(m)
    m.in_features = 8                           # a module setting: it can change the work
    assert describe(m) != d0
    d1 = describe(m)
    m.eval()
    assert describe(m) != d1


def test_stop_exits_the_counter_even_if_synchronize_raises(monkeypatch, flop_counters):
    p = probe.Probe("sync", flops="always", history=None).start()
    assert flop_counters()

    def boom(*a):
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(probe, "synchronize", boom)
    with pytest.raises(RuntimeError):
        p.stop()
    assert flop_counters() == []


def test_two_blocks_with_the_same_name_do_not_share_a_count():
    x = torch.randn(8, 256)
    with tunekit.profile(name="blk", inputs=(x,)) as fwd:
        MODEL(x)
    with tunekit.profile(name="blk", inputs=(x,)) as fwd_bwd:
        MODEL(x).sum().backward()
    assert fwd.flops == 2 * 256 * 256 * 8            # forward only: 1048576
    assert fwd_bwd.flops == 4 * 256 * 256 * 8        # forward + weight grad: 2097152


def test_profile_in_a_loop_that_grows_its_input_recounts():
    x, flops = torch.randn(4, 256), []
    for _ in range(3):
        with tunekit.profile(name="grow") as rec:
            x = torch.cat([x, x])
            MODEL(x)
        flops.append(rec.flops)
    assert flops == [2 * 256 * 256 * r for r in (8, 16, 32)]


def _inner_block(x):
    with tunekit.profile(name="inner", inputs=(x,)) as rec:
        MODEL(x)
    return rec


def test_no_tflops_from_a_block_run_under_an_outer_counter():
    x = torch.randn(64, 256)
    _inner_block(x)                                # counted: cache filled
    with tunekit.profile(name="outer", flops="always"):
        inner = _inner_block(x)                    # cached count, but the outer counter is slowing it
    assert inner.flops_source == "cached"
    assert math.isnan(inner.tflops)
    assert any("outer FLOP counter" in n for n in inner.notes)
    assert not math.isnan(_inner_block(x).tflops)  # on its own again: clean TFLOPS


def test_ops_without_a_flop_formula_are_reported():
    @torch.library.custom_op("tunekit_review::mm", mutates_args=())
    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    a = torch.randn(64, 64)
    recs = []
    for _ in range(2):
        with tunekit.profile(name="custom", inputs=(a,)) as rec:
            mm(a, a)
        recs.append(rec)
    counted, cached = recs
    # only an op without a formula ran: executed FLOPs are unknown (NaN), not 0, so every rate is
    # unknown too, on the counted run and on the run that reuses its count
    assert [r.flops_source for r in recs] == ["counted", "cached"]
    for r in recs:
        assert math.isnan(r.flops) and math.isnan(r.model_flops)
        assert math.isnan(r.tflops) and math.isnan(r.mfu) and math.isnan(r.hfu)
    assert "not counted (no FLOP formula): tunekit_review.mm" in counted.notes
    assert "the count misses ops without a FLOP formula: tunekit_review.mm" in cached.notes


# --- issue 33: notes that state the reason that applies; a profile object used again --------------


def test_dynamo_first_imported_by_a_block_is_no_compile(monkeypatch):
    # Dynamo unused before the block (None), imported by it without compiling (0): the counted
    # run says it counted, not that it compiled 0 graph(s)
    graphs = iter([None, 0])
    for where in (probe, probe_figures):  # read at the start (the probe) and after the clock (its figures)
        monkeypatch.setattr(where, "compiled_graphs", lambda: next(graphs))
    rec = _step(8, name="dynamo_imported")
    assert not any("compiled" in str(n) for n in rec.notes)
    assert "FLOPs counted in this run, which the counter slows: re-run for TFLOPS/MFU" in rec.notes
    graphs = iter([None, 2])   # two graphs compiled inside a block: said, with their number
    for where in (probe, probe_figures):
        monkeypatch.setattr(where, "compiled_graphs", lambda: next(graphs))
    rec = _step(8, name="dynamo_imported")
    assert "torch.compile compiled 2 graph(s) during this run" in " ".join(map(str, rec.notes))


def test_a_recount_names_the_globals_a_function_read_not_the_function():
    global batch
    recs = []
    for bs in (4, 8):
        batch = torch.randn(bs, 256)
        with tunekit.profile(name="via_function") as rec:
            _uses_batch()
        recs.append(rec)
    assert "recounted: batch (read by _uses_batch) changed since the counted run" in recs[1].notes


def _uses_batch():
    MODEL(batch).sum().backward()


def test_a_profile_object_entered_twice_makes_two_records():
    p = tunekit.profile(name="twice", flops="never")
    with p as first:
        torch.ones(4).sum()
    with p as second:
        torch.ones(4).sum()
    assert first is not second and tunekit.history(all=True).iloc[-2:].name.tolist() == ["twice", "twice"]
    from tunekit.measure.history import HISTORY

    assert HISTORY.records()[-2:] == [first, second] and first is not second   # the first run kept
    with p, pytest.raises(RuntimeError, match="'twice' is measuring already"):
        with p:
            pass


def test_profile_as_a_decorator_profiles_each_call():
    @tunekit.profile(name="decorated")
    def step(x):
        MODEL(x).sum().backward()
        return x.shape[0]

    assert step.__name__ == "step"
    assert [step(torch.randn(bs, 256)) for bs in (8, 8, 16)] == [8, 8, 16]
    recs = tunekit.history(all=True).iloc[-3:]
    # 4 FLOPs per weight per row (test_count_then_reuse...): 4*65536*8 = 2097152, doubled for 16 rows
    assert list(recs.name) == ["decorated"] * 3 and list(recs.flops) == [2097152, 2097152, 2 * 2097152]
    assert list(recs.flops_source) == ["counted", "cached", "counted"]
    with pytest.raises(TypeError, match="decorates a function, got int"):
        tunekit.profile(name="x")(3)
