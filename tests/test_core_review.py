"""Regressions from the review of the measurement core: each test reproduced a real bug, now fixed."""
import json
import math
import threading

import pytest
import torch
from IPython.core.error import UsageError
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import tunekit
from tunekit.measure import mamf_cache, peaks, probe

# Linear 128x128 no bias, x needs no grad: forward 2 + weight-grad 2 FLOPs per weight per row
PER_ROW = 4 * 128 * 128  # 65536; 8 rows -> 524288


def _flop_modes():
    return [m for m in _get_current_dispatch_mode_stack() if type(m).__name__ == "_FlopCounterMode"]


@pytest.fixture(autouse=True)
def _no_leaked_counter():
    """A leaked FlopCounterMode would slow and distort every later test: always clean up."""
    yield
    for mode in reversed(_flop_modes()):
        mode.counter.__exit__(None, None, None)


def flops_of(run, src):
    run(src)
    rec = tunekit.last()
    return rec.flops, rec.flops_source


# --- leaks: a FLOP counter left active forever ----------------------------------------------------


@pytest.mark.parametrize("last_line", ["%gpuprofile off", "%unload_ext tunekit"])
def test_turning_off_from_inside_a_cell_leaves_no_counter_active(ip, run, last_line):
    run("%gpuprofile on -q")
    run(f"y = model(torch.randn(2, 128))\n{last_line}")
    assert _flop_modes() == []
    if last_line.startswith("%unload"):
        ip.run_line_magic("load_ext", "tunekit")  # the fixture unloads


def test_stop_exits_the_counter_even_if_synchronize_raises(monkeypatch):
    p = probe.Probe("sync", flops="always", history=None).start()
    assert _flop_modes()

    def boom(*a):
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(probe, "synchronize", boom)
    with pytest.raises(RuntimeError):
        p.stop()
    assert _flop_modes() == []


# --- stale FLOP counts: the fingerprint misses a changed input -----------------------------------


def test_cell_that_grows_its_own_input_recounts(run):
    run("x = torch.randn(4, 128)")
    cell = "%%gpuprofile -q -n grow\nx = torch.cat([x, x])\nmodel(x).sum().backward()"
    got = [flops_of(run, cell)[0] for _ in range(3)]
    assert got == [8 * PER_ROW, 16 * PER_ROW, 32 * PER_ROW]   # 4 -> 8 -> 16 -> 32 rows


def test_block_that_changes_its_own_input_recounts(run):
    run("bs = 4\ndef grow():\n    global bs\n    bs *= 2\n"
            "def step():\n    model(torch.randn(bs, 128)).sum().backward()")
    cell = "%%gpuprofile -q -n selfmod\ngrow()\nstep()"
    got = [flops_of(run, cell)[0] for _ in range(3)]
    assert got == [8 * PER_ROW, 16 * PER_ROW, 32 * PER_ROW]   # bs 4 -> 8 -> 16 -> 32


def test_del_at_the_end_of_a_cell_does_not_hide_its_input(run):
    cell = "%%gpuprofile -q -n del\nmodel(x).sum().backward()\ndel x"
    run("x = torch.randn(8, 128)")
    assert flops_of(run, cell) == (8 * PER_ROW, "counted")
    run("x = torch.randn(16, 128)")
    assert flops_of(run, cell) == (16 * PER_ROW, "counted")  # 2 * 524288


def test_config_dict_change_recounts(run):
    cell = "%%gpuprofile -q -n cfg\nmodel(torch.randn(cfg['bs'], 128)).sum().backward()"
    run("cfg = {'bs': 8}")
    assert flops_of(run, cell) == (8 * PER_ROW, "counted")
    run("cfg = {'bs': 16}")
    assert flops_of(run, cell) == (16 * PER_ROW, "counted")


def test_numpy_input_shape_change_recounts(run):
    cell = "%%gpuprofile -q -n np\nmodel(torch.from_numpy(arr)).sum().backward()"
    run("arr = np.zeros((8, 128), np.float32)")
    assert flops_of(run, cell) == (8 * PER_ROW, "counted")
    run("arr = np.zeros((16, 128), np.float32)")
    assert flops_of(run, cell) == (16 * PER_ROW, "counted")


def test_redefined_function_recounts(run):
    cell = "%%gpuprofile -q -n f\nf()"
    seen = []
    for bs in (8, 16, 8, 16, 8, 16):
        # two definitions per round: the second can take the freed address of an older code object
        run(f"def f():\n    model(torch.randn({24 - bs}, 128)).sum().backward()")
        run(f"def f():\n    model(torch.randn({bs}, 128)).sum().backward()")
        seen.append(flops_of(run, cell)[0])
    assert seen == [bs * PER_ROW for bs in (8, 16, 8, 16, 8, 16)]


def _linear_step(x):
    with tunekit.profile(name="blk", inputs=(x,)) as fwd:
        MODEL(x)
    with tunekit.profile(name="blk", inputs=(x,)) as fwd_bwd:
        MODEL(x).sum().backward()
    return fwd, fwd_bwd


MODEL = torch.nn.Linear(128, 128, bias=False)


def test_two_blocks_with_the_same_name_do_not_share_a_count():
    fwd, fwd_bwd = _linear_step(torch.randn(8, 128))
    assert fwd.flops == 2 * 128 * 128 * 8            # forward only: 262144
    assert fwd_bwd.flops == 8 * PER_ROW              # forward + weight grad: 524288


def test_profile_in_a_loop_that_grows_its_input_recounts():
    def steps():
        x, out = torch.randn(4, 128), []
        for _ in range(3):
            with tunekit.profile(name="grow") as rec:
                x = torch.cat([x, x])
                MODEL(x)
            out.append(rec.flops)
        return out

    assert steps() == [2 * 128 * 128 * r for r in (8, 16, 32)]


# --- robustness: the user's cell must run and its outcome reach the user unchanged ---------------


def test_cell_reading_a_lazy_module_still_runs(ip, run):
    run("lazy = torch.nn.LazyLinear(8)")
    r = run("%%gpuprofile -q -n lazy\ny = lazy(torch.randn(2, 4))")
    assert r.error_in_exec is None and ip.user_ns["y"].shape == (2, 8)


def test_top_level_await_in_the_cell_magic_is_a_clear_usage_error(run):
    # IPython hands the magic the cell body as text; compiling it outside the kernel's event loop
    # fails on `await`, and the magic turns that into a UsageError before any measurement starts
    run("import asyncio")
    n0 = len(tunekit.history())
    r = run("%%gpuprofile -q -n aw\nawait asyncio.sleep(0)\n1")
    assert type(r.error_in_exec) is UsageError
    msg = str(r.error_in_exec)
    assert "cannot run top-level `await`" in msg and "use `%gpuprofile on`" in msg
    assert r.result is None
    assert len(tunekit.history()) == n0         # nothing ran, so nothing was recorded


def test_unwritable_calibration_cache_does_not_fail_the_block(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TUNEKIT_CACHE", str(blocker / "sub"))   # mkdir under a file: NotADirectoryError
    monkeypatch.setattr(peaks, "default_sizes", lambda kind: [32])
    x = torch.randn(8, 128)
    for _ in range(2):  # the second (cached) run resolves the peak
        with tunekit.profile(name="peak", inputs=(x,)) as rec:
            MODEL(x)
    assert tunekit.last() is rec and rec.flops_source == "cached"


@pytest.mark.parametrize("content", ["null", "[]", "bad-entry"])
def test_corrupt_calibration_cache_is_ignored(monkeypatch, tmp_path, content):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    if content == "bad-entry":
        content = json.dumps({peaks._cache_key(peaks.device_name("cpu"), "fp32"): {"tflops": 1.0}})
    (tmp_path / "mamf.json").write_text(content)
    assert peaks.cached_calibration("cpu", "fp32") is None


def test_concurrent_cache_writers_do_not_fail(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    errors = []

    def writer(i):
        for k in range(300):
            try:
                mamf_cache.save({f"{i}-{k}": {"pad": "x" * 20000}})
            except OSError as e:
                errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# --- numbers: wrong peaks, TFLOPS from a counted run, 0 instead of unknown -------------------------


def test_nested_profile_keeps_the_outer_cpu_peak():
    with tunekit.profile(name="outer", flops="never") as outer:
        # freed before the inner block; 128 MiB, more than the free heap glibc may keep resident (<= 64 MiB): RSS moves
        t = torch.ones(128 * 2**20 // 4)
        del t
        with tunekit.profile(name="inner", flops="never"):
            pass
    assert outer.cpu_peak_delta_bytes >= 128 * 2**20 * 0.95


def _inner_block(x):
    with tunekit.profile(name="inner", inputs=(x,)) as rec:
        MODEL(x)
    return rec


def test_no_tflops_from_a_block_run_under_an_outer_counter():
    x = torch.randn(64, 128)
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


def test_compact_display_says_why_tflops_is_missing(run, capsys):
    run("%gpuprofile on")
    run("y = model(torch.randn(4, 128))")
    out = capsys.readouterr().out
    assert "n/a" in out and "re-run" in out
